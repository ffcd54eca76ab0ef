// CPU features (the SIMD level zoe's kernels dispatch on) and host facts for `zoe info`.
#pragma once

#include <cstdint>
#include <string>

namespace zoe {

enum class SimdLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;  // vcvtne2ps2bf16
  bool avx512_fp16 = false;
};

// Detected once with cpuid/xgetbv (OS support for the wider registers included).
const CpuFeatures& cpu_features();
// The best level this CPU and OS support: AVX-512 needs F+BW+VL+DQ, AVX2 needs FMA+F16C too.
SimdLevel detected_simd_level();
// detected_simd_level(), lowered by the environment variable ZOE_SIMD=scalar|avx2|avx512 (read
// once; a bad or unsupported value is warned about and ignored): what zoe's kernels use.
SimdLevel environment_simd_level();
const char* simd_level_name(SimdLevel level);

struct HostMemory {
  uint64_t total_bytes = 0;
  uint64_t available_bytes = 0;
  // RLIMIT_MEMLOCK soft limit; UINT64_MAX when unlimited.
  uint64_t memlock_limit_bytes = 0;
  bool can_lock_unlimited = false;  // root or CAP_IPC_LOCK
};
HostMemory host_memory();

// From /proc/cpuinfo "model name", or "unknown".
std::string cpu_model_name();

// The cores this process may use: its affinity mask (taskset, numactl, a launcher's binding) and
// its cgroup's CPU quota (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us: a
// container's --cpus), whichever is lower, at least 1. zoe's thread pools are sized from it, so a
// process given 2 of 64 cores does not run 64 threads on them.
struct CpuAllowance {
  int affinity = 0;        // CPUs in the affinity mask (0: unknown)
  double quota = 0.0;      // cores the cgroup quota allows (0: no quota)
  int usable = 1;          // min(affinity, ceil(quota)), at least 1
  std::string limited_by;  // "affinity", "cgroup quota" or "" (all online CPUs)
};
// Read once per process.
const CpuAllowance& cpu_allowance();
inline int usable_cores() { return cpu_allowance().usable; }
// The rule, from its inputs: `online` CPUs, `affinity` of them allowed (0: unknown), the text of
// cgroup v2's cpu.max ("max 100000", "150000 100000"), or of v1's quota and period ("-1", "50000").
CpuAllowance cpu_allowance_from(int online, int affinity, const std::string& cpu_max,
                                const std::string& v1_quota = "", const std::string& v1_period = "");

}  // namespace zoe
