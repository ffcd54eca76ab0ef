// The cost model, the partition cache: which NVMe-homed stage-3 partitions the tier manager's host
// cache holds, and which fetches move bytes under its device tier's eviction (Belady over the
// recorded order), simulated over the first micro-batches of a step.
#include "plan/step_model.h"

#include <algorithm>
#include <limits>

namespace zoe::plan::detail {

std::vector<bool> host_cached(const zero::Placement& pl) {
  std::vector<bool> out(pl.modules.size(), false);
  auto alloc = [&](const zero::ModulePlacement& m) {
    return (static_cast<uint64_t>(m.part) * pl.compute_bytes + 4095) / 4096 * 4096;
  };
  uint64_t parts = 0, biggest = 0;
  for (const auto& m : pl.modules) {
    if (m.partitioned_params && m.param_home == offload::Tier::kNvme)
      parts += alloc(m), biggest = std::max(biggest, alloc(m));
  }
  const bool all = pl.tm_host_cache >= parts;
  uint64_t room = all ? parts : (pl.tm_host_cache > 2 * biggest ? pl.tm_host_cache - 2 * biggest : 0);
  for (size_t i = 0; i < pl.modules.size(); ++i) {
    const auto& m = pl.modules[i];
    if (!m.partitioned_params || m.param_home != offload::Tier::kNvme || alloc(m) > room) {
      if (!all && m.partitioned_params && m.param_home == offload::Tier::kNvme)
        room = 0;  // in order: no gaps
      continue;
    }
    out[i] = true;
    room -= alloc(m);
  }
  return out;
}

CacheSim simulate_cache(const zero::Placement& pl, int64_t micro, const std::vector<bool>& cached) {
  const size_t n = pl.modules.size();
  const int64_t sim_micro = std::min<int64_t>(micro, 4);
  CacheSim sim;
  sim.micro = micro;
  std::vector<std::array<uint64_t, 2>>& loaded = sim.loaded;
  loaded.assign(static_cast<size_t>(sim_micro), {0, 0});
  sim.cached.assign(static_cast<size_t>(sim_micro), {0, 0});
  std::vector<size_t> order;
  std::vector<uint8_t> phase;  // 0 forward, 1 backward
  std::vector<int64_t> mb;
  for (int64_t j = 0; j < sim_micro; ++j) {
    for (size_t m = 0; m < n; ++m) order.push_back(m), phase.push_back(0), mb.push_back(j);
    for (size_t m = n; m-- > 0;) order.push_back(m), phase.push_back(1), mb.push_back(j);
  }
  // next[t]: the next position of order[t]'s module after t (SIZE_MAX: none).
  constexpr size_t kNever = std::numeric_limits<size_t>::max();
  std::vector<size_t> next(order.size(), kNever), seen(n, kNever);
  for (size_t t = order.size(); t-- > 0;) {
    next[t] = seen[order[t]];
    seen[order[t]] = t;
  }
  const uint64_t capacity = pl.tm_device_budget ? pl.tm_device_budget : pl.device_budget;
  std::vector<bool> in(n, false);
  std::vector<size_t> next_use(n, kNever);
  uint64_t used = 0;
  auto bytes_of = [&](size_t m) { return static_cast<uint64_t>(pl.modules[m].part) * pl.compute_bytes; };
  for (size_t t = 0; t < order.size(); ++t) {
    const size_t m = order[t];
    const zero::ModulePlacement& mp = pl.modules[m];
    if (!mp.partitioned_params || mp.param_home == offload::Tier::kDevice) continue;
    next_use[m] = next[t];
    if (in[m]) continue;
    const uint64_t b = bytes_of(m);
    while (used + b > capacity) {  // evict the copy used furthest ahead
      size_t victim = n;
      for (size_t c = 0; c < n; ++c) {
        if (in[c] && (victim == n || next_use[c] > next_use[victim])) victim = c;
      }
      if (victim == n) break;
      in[victim] = false;
      used -= bytes_of(victim);
    }
    in[m] = true;
    used += b;
    loaded[static_cast<size_t>(mb[t])][phase[t]] += b;
    if (cached[m]) sim.cached[static_cast<size_t>(mb[t])][phase[t]] += b;
  }
  return sim;
}

}  // namespace zoe::plan::detail
