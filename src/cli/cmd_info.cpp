// `zoe info`: what this host offers zoe (CPU, SIMD, memory, io_uring, MPI/gloo/NCCL/CUDA, paths).
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/drive_smart.h"
#include "core/cpu.h"
#include "core/topology.h"
#include "core/units.h"
#include "io/file.h"
#include "io/io_engine.h"
#include "zoe/cli.h"
#include "zoe/features.h"

#if ZOE_HAVE_MPI
#include <mpi.h>
#endif
#if ZOE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#if ZOE_HAVE_NCCL
#include <nccl.h>
#endif

namespace zoe::cli {
namespace {

using nlohmann::json;

json gather(const std::vector<std::string>& paths) {
  json j;
  const Topology& t = topology();
  const CpuFeatures& f = cpu_features();
  json numa = json::array();
  for (const auto& n : t.numa_nodes) {
    numa.push_back({{"os_index", n.os_index}, {"memory_bytes", n.memory_bytes}, {"cpus", n.cpus}});
  }
  j["cpu"] = {{"model", cpu_model_name()},
              {"packages", t.packages},
              {"cores", t.cores},
              {"threads", t.pus},
              {"usable_cores", cpu_allowance().usable},
              {"affinity_cpus", cpu_allowance().affinity},
              {"cgroup_cpu_quota", cpu_allowance().quota},
              {"numa_nodes", numa},
              {"topology_source", t.source},
              {"simd", simd_level_name(detected_simd_level())},
              {"features",
               {{"avx2", f.avx2},
                {"fma", f.fma},
                {"f16c", f.f16c},
                {"avx512f", f.avx512f},
                {"avx512bw", f.avx512bw},
                {"avx512vl", f.avx512vl},
                {"avx512_bf16", f.avx512_bf16},
                {"avx512_fp16", f.avx512_fp16}}}};
  HostMemory hm = host_memory();
  j["memory"] = {{"total_bytes", hm.total_bytes},
                 {"available_bytes", hm.available_bytes},
                 {"memlock_limit_bytes",
                  hm.memlock_limit_bytes == UINT64_MAX ? json(nullptr) : json(hm.memlock_limit_bytes)},
                 {"memlock_unlimited", hm.memlock_limit_bytes == UINT64_MAX},
                 {"can_lock_beyond_limit", hm.can_lock_unlimited}};
  std::string why = io::probe_uring();
  j["io_uring"] = {{"built", ZOE_HAVE_URING == 1}, {"works", why.empty()}};
  if (!why.empty()) j["io_uring"]["error"] = why;

  json mpi = {{"built", ZOE_HAVE_MPI == 1}};
#if ZOE_HAVE_MPI
  char ver[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(ver, &len);
  std::string v(ver, static_cast<size_t>(len));
  auto nl = v.find_first_of("\n,");
  mpi["library"] = v.substr(0, nl);
#endif
  j["mpi"] = mpi;
  j["gloo"] = {{"built", ZOE_HAVE_GLOO == 1}};  // the host collectives under torchrun

  json nccl = {{"built", ZOE_HAVE_NCCL == 1}};
#if ZOE_HAVE_NCCL
  int nv = 0;
  if (ncclGetVersion(&nv) == ncclSuccess) {
    nccl["version"] =
        std::to_string(nv / 10000) + "." + std::to_string((nv / 100) % 100) + "." + std::to_string(nv % 100);
  }
#endif
  j["nccl"] = nccl;

  json cuda = {{"built", ZOE_HAVE_CUDA == 1}, {"devices", json::array()}};
#if ZOE_HAVE_CUDA
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cuda["error"] = cudaGetErrorString(e);
  } else {
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp p;
      if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
      cuda["devices"].push_back(
          {{"index", i},
           {"name", p.name},
           {"memory_bytes", p.totalGlobalMem},
           {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)}});
    }
  }
#else
  cuda["error"] = "zoe was built without CUDA";
#endif
  j["cuda"] = cuda;

  json jp = json::array();
  for (const auto& p : paths) {
    auto r = io::probe_fs(p);
    if (!r.is_ok()) {
      jp.push_back({{"path", p}, {"error", r.status().message()}});
      continue;
    }
    const io::FsInfo& fi = r.value();
    json entry = {{"path", p},
                  {"fs_type", fi.fs_type},
                  {"total_bytes", fi.total_bytes},
                  {"free_bytes", fi.free_bytes},
                  {"o_direct", fi.direct_io}};
    if (!fi.direct_io) entry["o_direct_error"] = fi.direct_io_error;
    if (fi.dio_offset_align) {
      entry["dio_mem_align"] = fi.dio_mem_align;
      entry["dio_offset_align"] = fi.dio_offset_align;
    }
    jp.push_back(entry);
  }
  j["paths"] = jp;
  // The drive of the first --path (else the current directory's) and its wear, where SMART says.
  j["drive"] = drive_json(paths.empty() ? std::string(".") : paths.front());
  j["zoe_version"] = ZOE_VERSION_STRING;
  return j;
}

void print_human(const json& j) {
  const json& c = j["cpu"];
  printf("zoe %s\n\n", j["zoe_version"].get<std::string>().c_str());
  printf("CPU        %s\n", c["model"].get<std::string>().c_str());
  printf("           %d package(s), %d cores, %d hardware threads, %zu NUMA node(s) (%s)\n",
         c["packages"].get<int>(), c["cores"].get<int>(), c["threads"].get<int>(), c["numa_nodes"].size(),
         c["topology_source"].get<std::string>().c_str());
  printf(
      "           this process may use %d of them (affinity %d CPU(s)%s); zoe's threads are sized to that\n",
      c["usable_cores"].get<int>(), c["affinity_cpus"].get<int>(),
      c["cgroup_cpu_quota"].get<double>() > 0
          ? fmt(", cgroup quota %.2f cores", c["cgroup_cpu_quota"].get<double>()).c_str()
          : ", no cgroup quota");
  std::string feats;
  for (auto& [k, v] : c["features"].items()) {
    if (v.get<bool>()) feats += (feats.empty() ? "" : " ") + k;
  }
  printf("SIMD       %s  (%s)\n", c["simd"].get<std::string>().c_str(), feats.c_str());
  const json& m = j["memory"];
  printf("RAM        %s total, %s available\n", format_bytes(m["total_bytes"].get<uint64_t>()).c_str(),
         format_bytes(m["available_bytes"].get<uint64_t>()).c_str());
  std::string lim = m["memlock_unlimited"].get<bool>()
                        ? "unlimited"
                        : format_bytes(m["memlock_limit_bytes"].get<uint64_t>());
  printf("memlock    ulimit -l: %s%s\n", lim.c_str(),
         m["can_lock_beyond_limit"].get<bool>() ? " (root/CAP_IPC_LOCK: larger pins allowed)" : "");
  const json& u = j["io_uring"];
  if (u["works"].get<bool>())
    printf("io_uring   works\n");
  else
    printf("io_uring   unavailable: %s (the thread-pool engine is used)\n",
           u["error"].get<std::string>().c_str());
  const json& mpi = j["mpi"];
  printf("MPI        %s\n",
         mpi["built"].get<bool>() ? mpi.value("library", std::string("yes")).c_str() : "not built in");
  printf("gloo       %s\n", ZOE_HAVE_GLOO ? "yes (torchrun launches)" : "not built in (torchrun is refused)");
  const json& nccl = j["nccl"];
  printf("NCCL       %s\n", nccl["built"].get<bool>()
                                ? ("yes, " + nccl.value("version", std::string("?"))).c_str()
                                : "not built in");
  const json& cu = j["cuda"];
  if (!cu["devices"].empty()) {
    for (const auto& d : cu["devices"]) {
      printf("CUDA       [%d] %s, %s, sm_%s\n", d["index"].get<int>(), d["name"].get<std::string>().c_str(),
             format_bytes(d["memory_bytes"].get<uint64_t>()).c_str(),
             d["compute_capability"].get<std::string>().c_str());
    }
  } else {
    printf("CUDA       none, CUDA runtime says: %s\n", cu.value("error", std::string("no devices")).c_str());
  }
  for (const auto& p : j["paths"]) {
    if (p.contains("error")) {
      printf("path       %s: %s\n", p["path"].get<std::string>().c_str(),
             p["error"].get<std::string>().c_str());
      continue;
    }
    printf("path       %s: %s, %s free of %s, O_DIRECT %s\n", p["path"].get<std::string>().c_str(),
           p["fs_type"].get<std::string>().c_str(), format_bytes(p["free_bytes"].get<uint64_t>()).c_str(),
           format_bytes(p["total_bytes"].get<uint64_t>()).c_str(),
           p["o_direct"].get<bool>() ? "works"
                                     : ("no (" + p["o_direct_error"].get<std::string>() + ")").c_str());
  }
  printf("%s\n", drive_line(j["drive"]).c_str());
}

}  // namespace

static void add_info_command(CLI::App& app) {
  struct Opts {
    std::vector<std::string> paths;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("info",
                                     "Show what this host offers zoe: CPU, SIMD, memory, io_uring, "
                                     "MPI/NCCL/CUDA, and for each --path its file system, free "
                                     "space and whether O_DIRECT works there; the drive of the first "
                                     "--path (else the current directory) and its wear where SMART "
                                     "gives it (nvme-cli or smartctl, if installed)");
  cmd->add_option("--path", o->paths, "A directory to check (repeatable)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    json j = gather(o->paths);
    if (o->json)
      print_json(j);
    else
      print_human(j);
  });
}

// Joins every program this file is linked into (the `zoe` program links all of src/cli).
static const CommandRegistrar kRegister(10, "", "", add_info_command);

}  // namespace zoe::cli
