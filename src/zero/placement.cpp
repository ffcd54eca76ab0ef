// The placement planner: the arithmetic behind every placement decision, with no side effects.
#include "zero/placement.h"

#include <algorithm>

#include "core/units.h"
#include "offload/optimizer_swapper.h"
#include "optim/adam.h"

namespace zoe::zero {

using config::OffloadDevice;

const char* home_name(Home h) {
  switch (h) {
    case Home::kDevice:
      return "device";
    case Home::kHost:
      return "host";
    case Home::kNvme:
      return "nvme";
  }
  return "?";
}

namespace {

Home home_of(OffloadDevice d) {
  return d == OffloadDevice::kNone ? Home::kDevice : d == OffloadDevice::kCpu ? Home::kHost : Home::kNvme;
}

uint64_t u64(size_t v) { return static_cast<uint64_t>(v); }

}  // namespace

Result<Placement> plan_placement(const config::Config& cfg, const std::vector<ModuleShape>& shapes, int world,
                                 int rank, const PlanTarget& target) {
  if (world < 1 || rank < 0 || rank >= world) {
    return invalid_argument("placement: rank %d of world size %d", rank, world);
  }
  if (shapes.empty()) return invalid_argument("placement: no modules");
  Placement pl;
  pl.stage = cfg.zero.stage;
  pl.world = world;
  pl.rank = rank;
  pl.compute_bytes = cfg.bf16 || cfg.fp16.enabled ? 2 : 4;
  pl.state_bytes = cfg.zoe.bf16_optimizer_states ? 2 : 4;
  pl.device_budget = target.device_budget              ? target.device_budget
                     : cfg.zoe.device_budget_bytes > 0 ? static_cast<uint64_t>(cfg.zoe.device_budget_bytes)
                                                       : 64ull << 30;
  const OffloadDevice opt_off = cfg.zero.offload_optimizer.device, param_off = cfg.zero.offload_param.device;
  const uint64_t es = pl.compute_bytes, sb = pl.state_bytes;
  const uint64_t db = pl.device_budget;

  // 1. Flat groups and partitions.
  for (const ModuleShape& s : shapes) {
    ModulePlacement mp;
    mp.name = s.name;
    if (s.param_numel.empty()) return invalid_argument("module %s has no parameters", s.name.c_str());
    for (size_t n : s.param_numel) {
      if (n == 0) return invalid_argument("module %s has a parameter with no elements", s.name.c_str());
      mp.offset.push_back(mp.total);
      mp.numel.push_back(n);
      mp.total += n;
    }
    const size_t unit = kPartAlign * static_cast<size_t>(world);
    mp.padded = (mp.total + unit - 1) / unit * unit;
    mp.part = mp.padded / static_cast<size_t>(world);
    mp.partitioned_params =
        pl.stage == 3 && static_cast<int64_t>(mp.total) >= cfg.zero.stage3_param_persistence_threshold;
    mp.param_home = mp.partitioned_params ? home_of(param_off) : Home::kDevice;
    if (mp.partitioned_params && static_cast<int64_t>(mp.padded) > cfg.zero.stage3_max_live_parameters) {
      return invalid_argument(
          "module %s gathers %zu parameters (padded to %zu ranks), above "
          "zero_optimization.stage3_max_live_parameters %lld: its fetch could never run; raise it to at "
          "least %zu",
          s.name.c_str(), mp.padded, static_cast<size_t>(world),
          static_cast<long long>(cfg.zero.stage3_max_live_parameters), mp.padded);
    }
    if (pl.stage == 0) {
      mp.opt_begin = 0;
      mp.opt_n = mp.padded;
    } else {
      mp.opt_begin = static_cast<size_t>(rank) * mp.part;
      mp.opt_n = mp.part;
    }
    // The device must hold one gathered module with its gradients and their reduction.
    const uint64_t need = u64(mp.padded) * es * 2 + u64(mp.part) * es;
    if (need > db) {
      return out_of_budget(
          "module %s has %zu parameters and needs %llu bytes (%s) on the device (gathered parameters, "
          "gradients and their reduction), more than the device budget of %llu bytes (%s); raise "
          "zoe.device_budget or split the module",
          mp.name.c_str(), mp.total, static_cast<unsigned long long>(need), format_bytes(need).c_str(),
          static_cast<unsigned long long>(db), format_bytes(db).c_str());
    }
    pl.modules.push_back(std::move(mp));
  }

  // 2. Partial offload: the first modules, in registration order, up to the fraction
  //    zoe.offload_ratio of this rank's optimizer elements, go to the offload device; the others
  //    stay on the device. The split depends only on the model and the config, so every rank
  //    makes the same one.
  {
    uint64_t total = 0, off = 0;
    for (const auto& m : pl.modules) total += m.opt_n;
    const double want = cfg.zoe.offload_ratio * static_cast<double>(total);
    for (auto& m : pl.modules) {
      const bool offload = opt_off != OffloadDevice::kNone &&
                           static_cast<double>(off) + static_cast<double>(m.opt_n) / 2.0 < want;
      m.opt_home = offload ? home_of(opt_off) : Home::kDevice;
      if (offload) off += m.opt_n;
    }
  }

  // 3. What is allocated once.
  size_t biggest = 0, biggest_part_nvme = 0;
  bool any_partitioned = false, any_opt_nvme = false;
  for (const auto& m : pl.modules) {
    biggest = std::max(biggest, m.padded);
    const uint64_t states = u64(m.opt_n) * (4 + 2 * sb + 4);  // master, m, v, gradient accumulator
    switch (m.opt_home) {
      case Home::kDevice:
        pl.resident.device += states;
        break;
      case Home::kHost:
        pl.resident.host += states;
        // zoe.speculative_step: master, m and v saved before the update in the backward, and the
        // new compute parameters it holds until the step confirms it.
        if (cfg.zoe.speculative_step) pl.resident.host += u64(m.opt_n) * (4 + 2 * sb + es);
        break;
      case Home::kNvme:
        pl.resident.nvme += states;
        any_opt_nvme = true;
        break;
    }
    if (!m.partitioned_params) {
      pl.resident.device += u64(m.padded) * es;  // the full compute parameters, always on the device
      continue;
    }
    any_partitioned = true;
    const uint64_t part = u64(m.part) * es;
    switch (m.param_home) {
      case Home::kDevice:
        pl.resident.device += part;
        break;
      case Home::kHost:
        pl.resident.host += part;
        break;
      case Home::kNvme:
        pl.resident.nvme += part;
        biggest_part_nvme = std::max<size_t>(biggest_part_nvme, m.part);
        break;
    }
  }
  const bool nvme_tier = opt_off == OffloadDevice::kNvme || param_off == OffloadDevice::kNvme;
  if (pl.resident.device > db) {
    return out_of_budget(
        "the states that live on the device (parameters%s) need %llu bytes (%s) on rank %d, more than the "
        "device "
        "budget of %llu bytes (%s); offload them (zero_optimization.offload_optimizer.device, "
        "zero_optimization.offload_param.device at stage 3) or raise zoe.device_budget",
        opt_off == OffloadDevice::kNone || cfg.zoe.offload_ratio < 1.0 ? " and optimizer states" : "",
        static_cast<unsigned long long>(pl.resident.device), format_bytes(pl.resident.device).c_str(), rank,
        static_cast<unsigned long long>(db), format_bytes(db).c_str());
  }

  // 4. Stage-3 partitions: the tier manager's device share and the gather window. Device memory
  //    kept free for a gathered module, its gradients and their reduction (the reserve), and the
  //    cost per element of a gathered module queued ahead of use (the module and a copy of the
  //    partition).
  const uint64_t reserve = 4ull * biggest * es;
  const uint64_t per_elem = es + (es + static_cast<uint64_t>(world) - 1) / static_cast<uint64_t>(world);
  uint64_t tm_budget = 0;
  if (any_partitioned) {
    pl.tier_manager = true;
    const uint64_t bucket = static_cast<uint64_t>(std::max<int64_t>(0, cfg.zero.stage3_prefetch_bucket_size));
    const uint64_t avail = db > reserve * 2 ? db - reserve : db / 2;
    // Gathered modules queued ahead of use: up to stage3_prefetch_bucket_size elements, in at
    // most half of what is left, and within stage3_max_live_parameters beside the module in use
    // (at most the largest gathered one). What they leave goes to the partitions' device cache.
    size_t biggest_gathered = 0;
    for (const auto& m : pl.modules)
      biggest_gathered = std::max(biggest_gathered, m.partitioned_params ? m.padded : 0);
    const uint64_t live = static_cast<uint64_t>(std::max<int64_t>(0, cfg.zero.stage3_max_live_parameters));
    const uint64_t live_room = live > biggest_gathered ? live - biggest_gathered : 0;
    const uint64_t gather_bytes = std::min<uint64_t>({bucket * per_elem, avail / 2, live_room * per_elem});
    pl.gather_window = static_cast<size_t>(gather_bytes / per_elem);
    // The rest holds partitions moving towards the device (their window and the one in use).
    const uint64_t window = bucket * es / static_cast<uint64_t>(world) + 2ull * (biggest / world) * es;
    pl.tm_device_budget = std::min<uint64_t>(window, avail - gather_bytes);
    if (param_off == OffloadDevice::kNone) {
      // The partitions live on the device: all of them count in the tier's budget.
      for (const auto& m : pl.modules) pl.tm_device_budget += m.partitioned_params ? u64(m.part) * es : 0;
    }
    tm_budget = pl.tm_device_budget ? std::min(pl.tm_device_budget, db) : db;  // as the tier manager caps it
    if (nvme_tier) {
      // Staging for NVMe <-> device pieces: offload_param.buffer_count buffers (one of them the
      // synchronous one) of offload_param.buffer_size elements, 4 KiB multiples, at least 64 KiB
      // and at most the largest NVMe-homed partition (a larger piece is never filled).
      const uint64_t top = std::max<uint64_t>(u64(biggest_part_nvme) * es, 64u << 10);
      const uint64_t asked = u64(std::max<int64_t>(1, cfg.zero.offload_param.buffer_size)) * es;
      pl.tm_staging_bytes =
          static_cast<size_t>((std::clamp<uint64_t>(asked, 64u << 10, top) + 4095) / 4096 * 4096);
      pl.tm_staging_count =
          static_cast<size_t>(std::clamp<int64_t>(cfg.zero.offload_param.buffer_count, 2, 1 << 10) - 1);
      pl.resident.host += u64(pl.tm_staging_bytes) * (pl.tm_staging_count + 1);  // + the sync one
    }
    if (param_off == OffloadDevice::kNvme) {
      // Host copies of NVMe-homed partitions: the step updates one while the previous one is
      // written back, and keeps up to offload_param.max_in_cpu elements of them (clean, as a
      // cache the next fetches into the device copy from) within the tier's host budget.
      auto alloc = [](uint64_t b) { return (b + 4095) / 4096 * 4096; };
      uint64_t parts = 0;
      for (const auto& m : pl.modules) {
        if (m.partitioned_params && m.param_home == Home::kNvme) parts += alloc(u64(m.part) * es);
      }
      const uint64_t work = 2 * alloc(u64(biggest_part_nvme) * es);
      const uint64_t keep = u64(std::max<int64_t>(0, cfg.zero.offload_param.max_in_cpu)) * es;
      pl.tm_host_cache = std::max(std::min(keep, parts), std::min(work, parts));
      pl.tm_host_budget = u64(pl.tm_staging_bytes) * (pl.tm_staging_count + 1) + pl.tm_host_cache;
    }
    // Device memory the states take (persistent modules, device-resident optimizer states,
    // device-homed partitions) comes out of the gather window too: keep the tier's budget and
    // the reserve free.
    const uint64_t used = pl.resident.device + tm_budget;
    const uint64_t room = db > used + reserve ? (db - used - reserve) / per_elem : 0;
    pl.gather_window = std::min<size_t>(pl.gather_window, static_cast<size_t>(room));
    if (!target.queued_gathers) pl.gather_window = 0;
  }

  // 5. The optimizer swapper for NVMe-resident states: chunks of sub_group_size elements (a
  //    multiple of the norm chunk, at most 1 Mi), at least three pipeline slots (read ahead,
  //    update, write back) of one buffer per state (master, m, v, gradient).
  if (any_opt_nvme) {
    constexpr size_t kStates = 4;
    pl.swapper = true;
    const int64_t sub =
        std::clamp<int64_t>(cfg.zero.sub_group_size, 1, static_cast<int64_t>(kMaxSwapChunkElems));
    pl.swap_chunk_elems =
        (static_cast<size_t>(sub) + optim::kChunkElems - 1) / optim::kChunkElems * optim::kChunkElems;
    pl.swap_buffer_bytes = pl.swap_chunk_elems * 4;
    const int64_t asked = std::max<int64_t>(1, cfg.zero.offload_optimizer.buffer_count);
    pl.swap_buffer_count =
        std::max<size_t>(static_cast<size_t>(std::min<int64_t>(asked, 1 << 20)), 3 * kStates);
    size_t chunks = 0;
    for (const auto& m : pl.modules) {
      if (m.opt_home == Home::kNvme)
        chunks = std::max(chunks, (m.opt_n + pl.swap_chunk_elems - 1) / pl.swap_chunk_elems);
    }
    pl.swap_async_buffers =
        std::clamp<size_t>(chunks, offload::kAsyncWriteBuffers, offload::kMaxAsyncWriteBuffers);
    pl.resident.host +=
        u64(pl.swap_buffer_bytes) * (pl.swap_buffer_count / kStates * kStates + pl.swap_async_buffers);
  }

  // 6. Peaks. Device: what is resident, the tier manager's share beyond the homes it already
  //    counts, queued gathers, and what one module in use moves; a placement whose peak is above
  //    the budget is refused here rather than failing in the middle of a step. Host: the step
  //    writes each NVMe-homed partition through a host copy, one module at a time with the
  //    previous one's write-back in flight.
  pl.peak = pl.resident;
  if (pl.tier_manager) {
    uint64_t device_homes = 0;
    for (const auto& m : pl.modules) {
      if (m.partitioned_params && m.param_home == Home::kDevice) device_homes += u64(m.part) * es;
    }
    pl.peak.device +=
        (tm_budget > device_homes ? tm_budget - device_homes : 0) + u64(pl.gather_window) * per_elem;
    pl.peak.host += pl.tm_host_cache;
  }
  // One module in use at a time. While module m's reduction starts: (stage 3) its gathered
  // parameters, its gradient buffer, the receive buffer and, with reduce buckets smaller than a
  // partition, the bucket-packed send copy. While the next module m' computes its gradients,
  // m's reduction is still in flight (kMaxPendingReductions is 1: a reduction starts only after
  // the previous one was accumulated): m' parameters and gradients, m's send and receive buffers.
  // Then the step's gather of an updated partition.
  const size_t per_rank_bucket = static_cast<size_t>(
      std::max<int64_t>(1, std::max<int64_t>(world, cfg.zero.reduce_bucket_size) / world));
  uint64_t moving = 0, top_use[2] = {0, 0}, top_red[2] = {0, 0};
  size_t top_use_m = SIZE_MAX, top_red_m = SIZE_MAX;
  for (size_t i = 0; i < pl.modules.size(); ++i) {
    const auto& m = pl.modules[i];
    const uint64_t full = u64(m.padded) * es, recv = (pl.stage >= 2 ? u64(m.part) : u64(m.padded)) * es;
    const uint64_t params = m.partitioned_params ? full : 0;
    const uint64_t packed = pl.stage >= 2 && per_rank_bucket < m.part ? full : 0;
    moving = std::max(moving, params + full + recv + packed);
    moving = std::max(moving, u64(m.part) * es);
    const uint64_t use = params + full, red = full + recv;  // in use; in flight
    if (use > top_use[0]) {
      top_use[1] = top_use[0];
      top_use[0] = use;
      top_use_m = i;
    } else if (use > top_use[1]) {
      top_use[1] = use;
    }
    if (red > top_red[0]) {
      top_red[1] = top_red[0];
      top_red[0] = red;
      top_red_m = i;
    } else if (red > top_red[1]) {
      top_red[1] = red;
    }
  }
  if (pl.modules.size() > 1) {  // the module computing and the one reducing differ
    const uint64_t pair = top_use_m != top_red_m ? top_use[0] + top_red[0]
                                                 : std::max(top_use[0] + top_red[1], top_use[1] + top_red[0]);
    moving = std::max(moving, pair);
  }
  const uint64_t fixed = pl.peak.device;
  pl.peak.device += moving;
  if (pl.peak.device > db) {
    return out_of_budget(
        "this placement needs up to %llu bytes (%s) of device memory at once on rank %d: %llu (%s) for the "
        "states, partitions and queued gathers it keeps there and %llu (%s) for the module in use (its "
        "parameters, gradients and reduction buffers), more than the device budget of %llu bytes (%s); "
        "raise zoe.device_budget, offload more (zero_optimization.offload_optimizer / offload_param) or "
        "use a higher zero_optimization.stage",
        static_cast<unsigned long long>(pl.peak.device), format_bytes(pl.peak.device).c_str(), rank,
        static_cast<unsigned long long>(fixed), format_bytes(fixed).c_str(),
        static_cast<unsigned long long>(moving), format_bytes(moving).c_str(),
        static_cast<unsigned long long>(db), format_bytes(db).c_str());
  }

  const int64_t host_budget = cfg.zoe.host_budget_bytes;
  if (host_budget > 0 && pl.peak.host > static_cast<uint64_t>(host_budget)) {
    return out_of_budget(
        "zoe.host_budget: this placement needs up to %llu bytes (%s) of host memory on rank %d (optimizer "
        "states, parameter partitions and staging buffers), more than the budget of %lld bytes (%s); raise "
        "zoe.host_budget or offload to nvme",
        static_cast<unsigned long long>(pl.peak.host), format_bytes(pl.peak.host).c_str(), rank,
        static_cast<long long>(host_budget), format_bytes(static_cast<uint64_t>(host_budget)).c_str());
  }
  return pl;
}

}  // namespace zoe::zero
