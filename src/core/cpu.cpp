// cpuid-based feature detection and host memory facts.
#include "core/cpu.h"

#include "core/log.h"

#include <cpuid.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>

namespace zoe {
namespace {

uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  bool osxsave = c & (1u << 27);
  bool fma = c & (1u << 12);
  bool f16c = c & (1u << 29);
  bool avx = c & (1u << 28);
  if (!osxsave || !avx) return f;
  uint64_t xcr0 = xgetbv0();
  bool ymm_ok = (xcr0 & 0x6) == 0x6;
  bool zmm_ok = (xcr0 & 0xe6) == 0xe6;
  if (!ymm_ok) return f;
  f.fma = fma;
  f.f16c = f16c;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = b & (1u << 5);
    if (zmm_ok) {
      f.avx512f = b & (1u << 16);
      f.avx512dq = b & (1u << 17);
      f.avx512bw = b & (1u << 30);
      f.avx512vl = b & (1u << 31);
      f.avx512_fp16 = d & (1u << 23);
    }
  }
  if (zmm_ok && __get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avx512_bf16 = a & (1u << 5);
  }
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

SimdLevel detected_simd_level() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) return SimdLevel::kAvx512;
  if (f.avx2 && f.fma && f.f16c) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return "avx512";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kScalar:
      return "scalar";
  }
  return "?";
}

HostMemory host_memory() {
  HostMemory m;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemTotal:") m.total_bytes = value * 1024;
    if (key == "MemAvailable:") m.available_bytes = value * 1024;
  }
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    m.memlock_limit_bytes = rl.rlim_cur == RLIM_INFINITY ? std::numeric_limits<uint64_t>::max() : rl.rlim_cur;
  }
  m.can_lock_unlimited = geteuid() == 0;
  // CAP_IPC_LOCK (bit 14) in the effective set also lifts the limit.
  std::ifstream st("/proc/self/status");
  std::string line;
  while (std::getline(st, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      unsigned long long caps = strtoull(line.c_str() + 7, nullptr, 16);
      if (caps & (1ull << 14)) m.can_lock_unlimited = true;
    }
  }
  return m;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) {
        std::string v = line.substr(pos + 1);
        while (!v.empty() && v[0] == ' ') v.erase(0, 1);
        return v;
      }
    }
  }
  return "unknown";
}

namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// This process's cgroup v2 directory under /sys/fs/cgroup ("0::/a/b" in /proc/self/cgroup).
std::string cgroup_v2_dir() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  }
  return "/sys/fs/cgroup";
}

}  // namespace

CpuAllowance cpu_allowance_from(int online, int affinity, const std::string& cpu_max,
                                const std::string& v1_quota, const std::string& v1_period) {
  CpuAllowance a;
  a.affinity = affinity;
  double quota = 0, period = 0;
  char q[32] = {0};
  if (!cpu_max.empty() && sscanf(cpu_max.c_str(), "%31s %lf", q, &period) == 2 &&
      std::strcmp(q, "max") != 0) {
    quota = strtod(q, nullptr);
  } else if (!v1_quota.empty() && !v1_period.empty()) {
    quota = strtod(v1_quota.c_str(), nullptr);
    period = strtod(v1_period.c_str(), nullptr);
  }
  if (quota > 0 && period > 0) a.quota = quota / period;
  int usable = online > 0 ? online : 1;
  if (affinity > 0 && affinity < usable) {
    usable = affinity;
    a.limited_by = "affinity";
  }
  if (a.quota > 0) {
    const int by_quota = std::max(1, static_cast<int>(std::ceil(a.quota - 1e-9)));
    if (by_quota < usable) {
      usable = by_quota;
      a.limited_by = "cgroup quota";
    }
  }
  a.usable = std::max(1, usable);
  return a;
}

const CpuAllowance& cpu_allowance() {
  static const CpuAllowance a = [] {
    const int online = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    cpu_set_t set;
    CPU_ZERO(&set);
    const int affinity = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
    const std::string dir = cgroup_v2_dir();
    std::string cpu_max = read_first_line(dir + "/cpu.max");
    if (cpu_max.empty() && dir != "/sys/fs/cgroup") cpu_max = read_first_line("/sys/fs/cgroup/cpu.max");
    return cpu_allowance_from(online, affinity, cpu_max,
                              read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
                              read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_period_us"));
  }();
  return a;
}

namespace {

bool parse_simd(const char* s, SimdLevel* out) {
  if (std::strcmp(s, "scalar") == 0)
    *out = SimdLevel::kScalar;
  else if (std::strcmp(s, "avx2") == 0)
    *out = SimdLevel::kAvx2;
  else if (std::strcmp(s, "avx512") == 0)
    *out = SimdLevel::kAvx512;
  else
    return false;
  return true;
}

}  // namespace

SimdLevel environment_simd_level() {
  static const SimdLevel level = [] {
    SimdLevel best = detected_simd_level();
    const char* e = std::getenv("ZOE_SIMD");
    if (e == nullptr || *e == '\0') return best;
    SimdLevel want;
    if (!parse_simd(e, &want)) {
      ZOE_LOG_WARN("ZOE_SIMD=%s: expected scalar, avx2 or avx512; using %s", e, simd_level_name(best));
      return best;
    }
    if (static_cast<int>(want) > static_cast<int>(best)) {
      ZOE_LOG_WARN("ZOE_SIMD=%s: this CPU supports only %s; using it", e, simd_level_name(best));
      return best;
    }
    return want;
  }();
  return level;
}

}  // namespace zoe
