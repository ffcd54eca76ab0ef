// Host topology from hwloc: packages, NUMA nodes, cores, PUs, and binding threads to a node.
#pragma once

#include <string>
#include <vector>

#include "zoe/status.h"

namespace zoe {

struct NumaNode {
  int os_index = 0;
  uint64_t memory_bytes = 0;
  std::vector<int> cpus;  // OS indices of the PUs in this node
};

struct Topology {
  int packages = 0;
  int cores = 0;  // physical cores
  int pus = 0;    // hardware threads
  std::vector<NumaNode> numa_nodes;
  std::string source;  // "hwloc" or "sysconf" when hwloc is not built in
};

// Discovered once and cached; without hwloc, falls back to sysconf (one NUMA node).
const Topology& topology();

// Binds the calling thread to the PUs of NUMA node `node` (its OS index).
Status bind_current_thread_to_numa_node(int node);

}  // namespace zoe
