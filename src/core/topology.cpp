// hwloc-backed topology discovery, with a sysconf fallback.
#include "core/topology.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include "zoe/features.h"
#if ZOE_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace zoe {
namespace {

Topology discover() {
  Topology t;
#if ZOE_HAVE_HWLOC
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) == 0 && hwloc_topology_load(topo) == 0) {
    t.source = "hwloc";
    t.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    t.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    t.pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    int nn = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < nn; ++i) {
      hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, i);
      NumaNode n;
      n.os_index = static_cast<int>(obj->os_index);
      n.memory_bytes = obj->attr ? obj->attr->numanode.local_memory : 0;
      unsigned id;
      hwloc_bitmap_foreach_begin(id, obj->cpuset) { n.cpus.push_back(static_cast<int>(id)); }
      hwloc_bitmap_foreach_end();
      t.numa_nodes.push_back(std::move(n));
    }
    hwloc_topology_destroy(topo);
    if (t.pus > 0) return t;
  }
#endif
  t = Topology{};
  t.source = "sysconf";
  t.pus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  t.cores = t.pus;
  t.packages = 1;
  NumaNode n;
  n.os_index = 0;
  n.memory_bytes =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (int i = 0; i < t.pus; ++i) n.cpus.push_back(i);
  t.numa_nodes.push_back(n);
  return t;
}

}  // namespace

const Topology& topology() {
  static const Topology t = discover();
  return t;
}

Status bind_current_thread_to_numa_node(int node) {
  const Topology& t = topology();
  for (const auto& n : t.numa_nodes) {
    if (n.os_index != node) continue;
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : n.cpus) CPU_SET(c, &set);
    int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    if (rc != 0) return sys_error("pthread_setaffinity_np to NUMA node", std::to_string(node), rc);
    return Status::ok();
  }
  return invalid_argument("NUMA node %d does not exist (this host has %zu)", node, t.numa_nodes.size());
}

}  // namespace zoe
