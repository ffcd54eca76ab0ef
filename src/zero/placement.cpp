// The placement planner: the arithmetic behind every placement decision, with no side effects but
// one warning per config value it uses other than as given.
#include "zero/placement.h"

#include "zero/placement_internal.h"

#include <algorithm>

#include "config/value_used.h"
#include "core/units.h"
#include "offload/swapper_limits.h"
#include "optim/adam.h"
#include "optim/muon.h"

namespace zoe::zero {

// Every rank's owned range starts at a multiple of kPartAlign, so the packed states' blocks never
// straddle two ranks (a shard's m and v are whole blocks, resharded as bytes).
static_assert(kPartAlign % 256 == 0 && kPartAlign % 128 == 0, "low-bit state blocks must tile a partition");

using detail::Extent;
using detail::moving_device_bytes;
using detail::nvme_part_bytes;
using detail::served_in_place;
using detail::u64;

namespace {

// Device bytes of module mp's reduction beside its gradient buffer (it runs in place there): at
// stage 2/3 with reduce buckets smaller than a partition, the bucket-packed send buffers; nothing
// at world size 1, where nothing is reduced.
// Device bytes of the held modules (ModuleShape::held) beside every other module in use: the
// gathered parameters of a partitioned one (a persistent one is counted with the resident states)
// and, for a trained one, its gradient buffer, which stays allocated from its first gradient in
// the backward to its last (a tied head and embedding: the whole backward).

uint64_t held_gathered_bytes(const Placement& pl) {
  uint64_t held = 0;
  for (const auto& m : pl.modules) {
    if (!m.held) continue;
    held += m.partitioned_params && !served_in_place(m) ? u64(m.padded) * pl.compute_bytes : 0;
    held += m.frozen ? 0 : u64(m.padded) * pl.compute_bytes;
  }
  return held;
}

uint64_t reduce_pack_bytes(const Placement& pl, const ModulePlacement& mp) {
  const size_t per_rank = std::max<size_t>(1, pl.reduce_bucket / static_cast<size_t>(pl.world));
  if (pl.stage < 2 || pl.world == 1 || per_rank >= mp.part) return 0;
  return u64(kReducePackBuffers) * u64(per_rank) * static_cast<uint64_t>(pl.world) * pl.compute_bytes;
}

// 1. Flat groups and partitions; stage-3 parameter homes (modules of at least `persist` elements
//    are partitioned); the device must hold one gathered module with its gradients and their
//    reduction.
// optimizer.type Muon: which of the module's parameters are matrices (optim/muon.h's rule, as
// DeepSpeed tags use_muon) and the Newton-Schulz flops of those overlapping this rank's range.
void muon_cost(const ModuleShape& s, ModulePlacement* mp) {
  for (size_t p = 0; p < s.specs.size() && p < mp->numel.size(); ++p) {
    const ParamSpec& ps = s.specs[p];
    if (!optim::is_muon_matrix(s.name.empty() ? ps.name : s.name + "." + ps.name, ps.shape.size())) continue;
    mp->muon_matrices = true;
    const size_t b = mp->offset[p], e = b + mp->numel[p];
    if (e <= mp->opt_begin || b >= mp->opt_begin + mp->opt_n) continue;
    const size_t rows = static_cast<size_t>(ps.shape[0]);
    mp->muon_flops += optim::newton_schulz_flops(rows, mp->numel[p] / rows, optim::MuonParams{}.ns_steps);
  }
  if (s.specs.empty()) mp->muon_matrices = true;  // unknown: assume some
}

Status lay_out_modules(const config::Config& cfg, const std::vector<ModuleShape>& shapes, int64_t persist,
                       Placement* pl) {
  const uint64_t es = pl->compute_bytes, db = pl->device_budget;
  for (const ModuleShape& s : shapes) {
    ModulePlacement mp;
    mp.name = s.name;
    mp.frozen = s.frozen;
    mp.held = s.held;
    if (s.param_numel.empty()) return invalid_argument("module %s has no parameters", s.name.c_str());
    for (size_t n : s.param_numel) {
      if (n == 0) return invalid_argument("module %s has a parameter with no elements", s.name.c_str());
      mp.offset.push_back(mp.total);
      mp.numel.push_back(n);
      mp.total += n;
    }
    const size_t unit = kPartAlign * static_cast<size_t>(pl->world);
    mp.padded = (mp.total + unit - 1) / unit * unit;
    mp.part = mp.padded / static_cast<size_t>(pl->world);
    mp.partitioned_params = pl->stage == 3 && static_cast<int64_t>(mp.total) >= persist;
    mp.param_home =
        mp.partitioned_params ? offload_tier(cfg.zero.offload_param.device) : offload::Tier::kDevice;
    if (mp.partitioned_params) pl->max_live_parameters = std::max(pl->max_live_parameters, mp.padded);
    if (pl->stage == 0) {
      mp.opt_begin = 0;
      mp.opt_n = mp.padded;
    } else {
      mp.opt_begin = static_cast<size_t>(pl->rank) * mp.part;
      mp.opt_n = mp.part;
    }
    if (pl->optimizer == optim::OptimizerKind::kMuon && !mp.frozen) muon_cost(s, &mp);
    // A frozen module has no gradients: its gathered parameters only.
    const uint64_t need =
        mp.frozen ? u64(mp.padded) * es : u64(mp.padded) * es * 2 + reduce_pack_bytes(*pl, mp);
    if (need > db) {
      return out_of_budget(
          "module %s has %zu parameters and needs %llu bytes (%s) on the device (gathered parameters, "
          "gradients and their reduction), more than the device budget of %llu bytes (%s); raise "
          "zoe.device_budget or split the module",
          mp.name.c_str(), mp.total, static_cast<unsigned long long>(need), format_bytes(need).c_str(),
          static_cast<unsigned long long>(db), format_bytes(db).c_str());
    }
    pl->modules.push_back(std::move(mp));
  }
  return Status::ok();
}

// 2. Partial offload: the first modules, in registration order, up to the fraction
//    zoe.offload_ratio of this rank's optimizer elements, go to the offload device; the others
//    stay on the device. The split depends only on the model and the config, so every rank
//    makes the same one.
void split_optimizer_homes(const config::Config& cfg, Placement* pl) {
  const Offload opt_off = cfg.zero.offload_optimizer.device;
  uint64_t total = 0, off = 0;
  for (const auto& m : pl->modules) total += m.frozen ? 0 : m.opt_n;
  const double want = cfg.zoe.offload_ratio * static_cast<double>(total);
  for (auto& m : pl->modules) {
    if (m.frozen) continue;  // no states to place
    const bool offload =
        opt_off != Offload::kNone && static_cast<double>(off) + static_cast<double>(m.opt_n) / 2.0 < want;
    m.opt_home = offload ? offload_tier(opt_off) : offload::Tier::kDevice;
    if (offload) off += m.opt_n;
  }
}

// 3. What is allocated once for the states, per tier; the states that live on the device must fit
//    its budget.
Result<Extent> count_resident_states(const config::Config& cfg, Placement* pl) {
  const Offload opt_off = cfg.zero.offload_optimizer.device, param_off = cfg.zero.offload_param.device;
  const uint64_t es = pl->compute_bytes, db = pl->device_budget;
  Extent x;
  for (const auto& m : pl->modules) {
    x.biggest = std::max(x.biggest, m.padded);
    const uint64_t states = pl->opt_bytes(m.opt_n) + u64(m.opt_n) * 4;  // master, states, gradient sums
    switch (m.frozen ? offload::Tier::kDevice : m.opt_home) {
      case offload::Tier::kDevice:
        pl->resident.device += m.frozen ? 0 : states;
        break;
      case offload::Tier::kHost:
        pl->resident.host += states;
        // zoe.speculative_step: the master and states saved before the update in the backward, and the
        // new compute parameters it holds until the step confirms it.
        if (cfg.zoe.speculative_step) pl->resident.host += pl->opt_bytes(m.opt_n) + u64(m.opt_n) * es;
        break;
      case offload::Tier::kNvme:
        pl->resident.nvme +=
            pl->opt_nvme_bytes(m.opt_n, swap_chunk_elems(cfg.zero.sub_group_size, false)) + u64(m.opt_n) * 4;
        x.any_opt_nvme = true;
        break;
    }
    if (!m.partitioned_params) {
      pl->resident.device += u64(m.padded) * es;  // the full compute parameters, always on the device
      continue;
    }
    x.any_partitioned = true;
    const uint64_t part = u64(m.part) * es;
    switch (m.param_home) {
      case offload::Tier::kDevice:
        pl->resident.device += part;
        break;
      case offload::Tier::kHost:
        pl->resident.host += part;
        break;
      case offload::Tier::kNvme:
        pl->resident.nvme += part;
        x.biggest_part_nvme = std::max<size_t>(x.biggest_part_nvme, m.part);
        break;
    }
  }
  x.nvme_tier = opt_off == Offload::kNvme || param_off == Offload::kNvme;
  if (pl->resident.device > db) {
    return out_of_budget(
        "the states that live on the device (parameters%s) need %llu bytes (%s) on rank %d, more than the "
        "device "
        "budget of %llu bytes (%s); offload them (zero_optimization.offload_optimizer.device, "
        "zero_optimization.offload_param.device at stage 3) or raise zoe.device_budget",
        opt_off == Offload::kNone || cfg.zoe.offload_ratio < 1.0 ? " and optimizer states" : "",
        static_cast<unsigned long long>(pl->resident.device), format_bytes(pl->resident.device).c_str(),
        pl->rank, static_cast<unsigned long long>(db), format_bytes(db).c_str());
  }
  // A gathered module and its gradients (a frozen one: its gathered copy and a queued one), and
  // the largest reduction's bucket buffers (frozen modules have no reduction).
  uint64_t packs = 0;
  for (const auto& m : pl->modules) {
    if (!m.frozen) packs = std::max(packs, reduce_pack_bytes(*pl, m));
  }
  x.reserve = 2ull * x.biggest * es + packs + held_gathered_bytes(*pl);
  x.per_elem = es + (es + static_cast<uint64_t>(pl->world) - 1) / static_cast<uint64_t>(pl->world);
  return x;
}

// Host bytes of the optimizer swapper's pool of `count` buffers: whole slots of one buffer per
// state it holds (Placement::swap_states()); the buffers past the last whole slot are not allocated.
uint64_t swap_pool_bytes(const Placement& pl, size_t count) {
  return u64(count / pl.swap_states() * pl.swap_states()) * pl.swap_buffer_bytes;
}

// 5. The optimizer swapper for NVMe-resident states: chunks of sub_group_size elements, buffers of
//    offload_optimizer.buffer_count (both as swap_chunk_elems() and swap_buffer_count() resolve
//    them), and one write buffer per chunk of the largest NVMe-resident module, within the
//    swapper's bounds.
void plan_swapper(const config::Config& cfg, Placement* pl) {
  pl->swapper = true;
  pl->swap_chunk_elems =
      swap_chunk_elems(cfg.zero.sub_group_size, cfg.given("zero_optimization.sub_group_size"));
  pl->swap_buffer_bytes = pl->swap_chunk_elems * 4;
  const bool own = pl->host_share && !cfg.given("zero_optimization.offload_optimizer.buffer_count");
  // Not given: the fewest slots to start with; size_own_buffers() adds read-ahead slots.
  pl->swap_buffer_count =
      own ? kMinSwapSlots * kSwapStates
          : swap_buffer_count(cfg.zero.offload_optimizer.buffer_count,
                              cfg.given("zero_optimization.offload_optimizer.buffer_count"));
  size_t chunks = 0;
  for (const auto& m : pl->modules) {
    if (!m.frozen && m.opt_home == offload::Tier::kNvme)
      chunks = std::max(chunks, (m.opt_n + pl->swap_chunk_elems - 1) / pl->swap_chunk_elems);
  }
  pl->swap_async_buffers =
      std::clamp<size_t>(chunks, offload::kAsyncWriteBuffers, offload::kMaxAsyncWriteBuffers);
  pl->resident.host +=
      swap_pool_bytes(*pl, pl->swap_buffer_count) + u64(pl->swap_buffer_bytes) * pl->swap_async_buffers;
  if (cfg.zoe.schedule == "layer-major" && cfg.gradient_accumulation_steps > 1) {
    for (const auto& m : pl->modules) {
      if (!m.frozen && m.opt_home == offload::Tier::kNvme)
        pl->grad_hold_bytes = std::max<uint64_t>(pl->grad_hold_bytes, u64(m.opt_n) * 4);
    }
    pl->resident.host += pl->grad_hold_bytes;
  }
}

// 5a. A zoe.host_budget below what the sizes zoe starts from hold: the swapper's write buffers for
//     the backward's gradient sums drop to offload::kAsyncWriteBuffers (the backward may then wait
//     on their writes) and the staging pieces zoe sized (offload_param.buffer_size not given) are
//     cut to what fits, at least kMinOwnStagingBytes, before check_peaks() refuses a plan that
//     still does not fit. Sizes the config gives are kept as given.
void fit_own_buffers(const config::Config& cfg, Placement* pl) {
  if (cfg.zoe.host_budget_bytes <= 0) return;
  const uint64_t budget = static_cast<uint64_t>(cfg.zoe.host_budget_bytes);
  auto used = [pl] { return pl->resident.host + pl->tm_host_cache; };
  if (used() <= budget) return;
  if (pl->swapper && pl->swap_async_buffers > offload::kAsyncWriteBuffers) {
    pl->resident.host -= u64(pl->swap_async_buffers - offload::kAsyncWriteBuffers) * pl->swap_buffer_bytes;
    pl->swap_async_buffers = offload::kAsyncWriteBuffers;
  }
  const bool own_staging = std::find(pl->chosen.begin(), pl->chosen.end(),
                                     "zero_optimization.offload_param.buffer_size") != pl->chosen.end();
  if (used() <= budget || !own_staging || pl->tm_staging_bytes <= kMinOwnStagingBytes) return;
  const uint64_t n = u64(pl->tm_staging_count) + 1, have = u64(pl->tm_staging_bytes) * n,
                 over = used() - budget;
  const uint64_t fits = have > over ? (have - over) / n / 4096 * 4096 : 0;
  const uint64_t bytes = std::max<uint64_t>(fits, kMinOwnStagingBytes);
  pl->resident.host -= (u64(pl->tm_staging_bytes) - bytes) * n;
  if (pl->tm_host_budget) pl->tm_host_budget -= (u64(pl->tm_staging_bytes) - bytes) * n;  // 0: unlimited
  pl->tm_staging_bytes = static_cast<size_t>(bytes);
}

// 5b. The sizes the config leaves to zoe (Placement::chosen), within the host share: first the
//     swapper's read-ahead slots, up to one more than the chunks of a step (the backward then
//     reads the whole next update ahead) and at most kAutoMaxSwapSlots, from half of what the
//     share leaves; then the cache of NVMe-homed partitions (offload_param.max_in_cpu) holds all
//     of them when what is left allows, else the step's two. Both count in the host peak.
void size_own_buffers(const config::Config& cfg, Placement* pl) {
  if (!pl->host_share) return;
  auto left = [pl] {
    const uint64_t used = pl->resident.host + pl->tm_host_cache;
    return pl->host_share > used ? pl->host_share - used : 0;
  };
  if (pl->swapper && !cfg.given("zero_optimization.offload_optimizer.buffer_count")) {
    size_t chunks = 0;
    for (const auto& m : pl->modules) {
      if (!m.frozen && m.opt_home == offload::Tier::kNvme)
        chunks += (m.opt_n + pl->swap_chunk_elems - 1) / pl->swap_chunk_elems;
    }
    const uint64_t slot_bytes = u64(kSwapStates) * pl->swap_buffer_bytes;
    const size_t want = std::min(kAutoMaxSwapSlots, chunks + 1), have = pl->swap_buffer_count / kSwapStates;
    const size_t extra =
        want > have ? static_cast<size_t>(std::min<uint64_t>(want - have, left() / 2 / slot_bytes)) : 0;
    const uint64_t before = swap_pool_bytes(*pl, pl->swap_buffer_count);
    pl->swap_buffer_count += extra * kSwapStates;
    pl->resident.host += swap_pool_bytes(*pl, pl->swap_buffer_count) - before;
    pl->chosen.push_back("zero_optimization.offload_optimizer.buffer_count");
  }
  if (pl->tm_host_budget && !cfg.given("zero_optimization.offload_param.max_in_cpu")) {
    // All of them or only the step's two: each step visits the partitions in a cycle (forward,
    // backward, update), so a cache smaller than all of them saves few reads for its memory.
    const uint64_t all = nvme_part_bytes(*pl);
    if (all > pl->tm_host_cache && all - pl->tm_host_cache <= left()) {
      pl->tm_host_budget += all - pl->tm_host_cache;
      pl->tm_host_cache = all;
    }
    pl->chosen.push_back("zero_optimization.offload_param.max_in_cpu");
  }
}

}  // namespace

// Device bytes one module in use moves at once. Module m in use: (stage 3) its gathered
// parameters, its gradient buffer, reduced in place, and with reduce buckets smaller than a
// partition the bucket-packed send buffers. m's reduction is still in flight (kMaxPendingReductions
// is 1) while the next module m' is fetched: m' parameters beside m's gradients and bucket buffers;
// m' gradient buffer is allocated only once m's reduction has been accumulated. Then the step's
// gather of an updated partition.
uint64_t detail::moving_device_bytes(const Placement& pl) {
  const uint64_t es = pl.compute_bytes;
  uint64_t moving = 0, top_use[2] = {0, 0}, top_red[2] = {0, 0};
  size_t top_use_m = SIZE_MAX, top_red_m = SIZE_MAX;
  // The two largest values seen, and the module of the largest.
  auto keep_top = [](uint64_t v, size_t i, uint64_t* top, size_t* top_m) {
    if (v > top[0]) {
      top[1] = top[0];
      top[0] = v;
      *top_m = i;
    } else if (v > top[1]) {
      top[1] = v;
    }
  };
  for (size_t i = 0; i < pl.modules.size(); ++i) {
    const auto& m = pl.modules[i];
    const uint64_t full = u64(m.padded) * es;
    // Served in place, the parameters are the partition in the tier manager's share.
    const uint64_t params = m.partitioned_params && !served_in_place(m) ? full : 0;
    if (m.frozen) {  // no gradients, no reduction, no update: its gathered parameters only
      moving = std::max(moving, params);
      keep_top(params, i, top_use, &top_use_m);
      continue;
    }
    const uint64_t use = params, red = full + reduce_pack_bytes(pl, m);  // fetched; gradients reducing
    moving = std::max(moving, use + red);
    moving = std::max(moving, u64(m.part) * es);
    keep_top(use, i, top_use, &top_use_m);
    keep_top(red, i, top_red, &top_red_m);
  }
  if (pl.modules.size() > 1) {  // the module fetched and the one reducing differ
    const uint64_t pair = top_use_m != top_red_m ? top_use[0] + top_red[0]
                                                 : std::max(top_use[0] + top_red[1], top_use[1] + top_red[0]);
    moving = std::max(moving, pair);
  }
  return moving + held_gathered_bytes(pl);  // the held modules stay fetched beside it
}

namespace {

// 6. Peaks. Device: what is resident, the tier manager's share beyond the homes it already
//    counts, queued gathers, and what one module in use moves; a placement whose peak is above
//    the budget is refused here rather than failing in the middle of a step. Host: the step
//    writes each NVMe-homed partition through a host copy, one module at a time with the
//    previous one's write-back in flight; it must fit zoe.host_budget.
Status check_peaks(const config::Config& cfg, const Extent& x, Placement* pl) {
  const uint64_t es = pl->compute_bytes, db = pl->device_budget;
  pl->peak = pl->resident;
  if (pl->tier_manager) {
    uint64_t device_homes = 0;
    for (const auto& m : pl->modules) {
      if (m.partitioned_params && m.param_home == offload::Tier::kDevice) device_homes += u64(m.part) * es;
    }
    pl->peak.device +=
        (x.tm_budget > device_homes ? x.tm_budget - device_homes : 0) + u64(pl->gather_window) * x.per_elem;
    pl->peak.host += pl->tm_host_cache;
  }
  const uint64_t moving = moving_device_bytes(*pl);
  const uint64_t fixed = pl->peak.device;
  pl->peak.device += moving;
  if (pl->peak.device > db) {
    return out_of_budget(
        "this placement needs up to %llu bytes (%s) of device memory at once on rank %d: %llu (%s) for the "
        "states, partitions and queued gathers it keeps there and %llu (%s) for the module in use (its "
        "parameters, gradients and reduction buffers), more than the device budget of %llu bytes (%s); "
        "raise zoe.device_budget, offload more (zero_optimization.offload_optimizer / offload_param) or "
        "use a higher zero_optimization.stage",
        static_cast<unsigned long long>(pl->peak.device), format_bytes(pl->peak.device).c_str(), pl->rank,
        static_cast<unsigned long long>(fixed), format_bytes(fixed).c_str(),
        static_cast<unsigned long long>(moving), format_bytes(moving).c_str(),
        static_cast<unsigned long long>(db), format_bytes(db).c_str());
  }
  const int64_t host_budget = cfg.zoe.host_budget_bytes;
  if (host_budget > 0 && pl->peak.host > static_cast<uint64_t>(host_budget)) {
    return out_of_budget(
        "zoe.host_budget: this placement needs up to %llu bytes (%s) of host memory on rank %d (optimizer "
        "states, parameter partitions and staging buffers), more than the budget of %lld bytes (%s); raise "
        "zoe.host_budget or offload to nvme",
        static_cast<unsigned long long>(pl->peak.host), format_bytes(pl->peak.host).c_str(), pl->rank,
        static_cast<long long>(host_budget), format_bytes(static_cast<uint64_t>(host_budget)).c_str());
  }
  return Status::ok();
}

}  // namespace

uint64_t Placement::opt_nvme_bytes(uint64_t n, uint64_t chunk) const {
  if (optim::state_block_elems(state_format) == 1 || chunk == 0) return opt_bytes(n);
  const uint64_t mb =
      master_in_compute ? 0 : static_cast<uint64_t>(optim::master_bytes_per_element(master_format));
  auto piece = [&](uint64_t k) {
    const uint64_t s = optim::state_bytes(state_format, static_cast<size_t>(k));
    return k * mb + static_cast<uint64_t>(opt_states()) * ((s + 4095) / 4096 * 4096);
  };
  return n / chunk * piece(chunk) + (n % chunk ? piece(n % chunk) : 0);
}

size_t swap_chunk_elems(int64_t sub_group_size, bool given) {
  const int64_t sub = std::clamp<int64_t>(sub_group_size, 1, static_cast<int64_t>(kMaxSwapChunkElems));
  const size_t chunk =
      (static_cast<size_t>(sub) + optim::kChunkElems - 1) / optim::kChunkElems * optim::kChunkElems;
  if (!given) return chunk;  // DeepSpeed's default (1e9), not the user's value
  return static_cast<size_t>(config::value_used(
      "zero_optimization.sub_group_size", sub_group_size, static_cast<int64_t>(chunk),
      "elements per optimizer swap chunk: a multiple of the norm's 16384-element chunk, at most 1048576 "
      "(4 MiB fp32 buffers)"));
}

size_t swap_buffer_count(int64_t buffer_count, bool given) {
  // Whole slots of one buffer per state; a buffer beyond the last whole slot would never be used.
  const int64_t slots = std::max<int64_t>(buffer_count, 0) / static_cast<int64_t>(kSwapStates);
  const int64_t count = std::max<int64_t>(slots, kMinSwapSlots) * static_cast<int64_t>(kSwapStates);
  if (!given) return static_cast<size_t>(count);  // DeepSpeed's default (4), not the user's value
  return static_cast<size_t>(config::value_used(
      "zero_optimization.offload_optimizer.buffer_count", buffer_count, count,
      "the optimizer swapper uses whole pipeline slots of 4 buffers, one per state (master, m, v, "
      "gradient), and at least 3 of them to overlap reads, updates and writes"));
}

namespace {

// One plan with stage-3 modules of at least `persist` elements partitioned.
Result<Placement> plan_with_persistence(const config::Config& cfg, const std::vector<ModuleShape>& shapes,
                                        int world, int rank, const PlanTarget& target, int64_t persist) {
  Placement pl;
  pl.stage = cfg.zero.stage;
  pl.world = world;
  pl.rank = rank;
  pl.compute_bytes = cfg.bf16 || cfg.fp16.enabled ? 2 : 4;
  ZOE_ASSIGN_OR_RETURN(pl.optimizer, optim::parse_optimizer_kind(cfg.optimizer.type));
  ZOE_ASSIGN_OR_RETURN(pl.state_format, optim::parse_state_format(cfg.zoe.optimizer_states));
  ZOE_ASSIGN_OR_RETURN(pl.master_format, optim::parse_master_format(cfg.zoe.master_weights));
  ZOE_RETURN_IF_ERROR(optim::check_state_tiling(pl.state_format, kPartAlign, "a rank's partition alignment"));
  pl.master_in_compute = pl.master_format == optim::MasterFormat::kBF16 && cfg.bf16 && !cfg.fp16.enabled &&
                         !cfg.zoe.speculative_step && target.host_addressable;
  pl.device_budget = target.device_budget              ? target.device_budget
                     : cfg.zoe.device_budget_bytes > 0 ? static_cast<uint64_t>(cfg.zoe.device_budget_bytes)
                                                       : 64ull << 30;
  pl.reduce_bucket = static_cast<size_t>(std::max<int64_t>(world, cfg.zero.reduce_bucket_size));
  pl.prefetch_bucket = cfg.zero.stage3_prefetch_bucket_size;
  ZOE_RETURN_IF_ERROR(lay_out_modules(cfg, shapes, persist, &pl));
  pl.max_live_parameters = std::max<size_t>(
      pl.max_live_parameters, static_cast<size_t>(std::max<int64_t>(0, cfg.zero.stage3_max_live_parameters)));
  split_optimizer_homes(cfg, &pl);
  ZOE_ASSIGN_OR_RETURN(Extent x, count_resident_states(cfg, &pl));
  pl.host_share = cfg.zoe.host_budget_bytes > 0 ? static_cast<uint64_t>(cfg.zoe.host_budget_bytes)
                                                : target.host_memory / kAutoHostShareDiv;
  if (x.any_partitioned) plan_tier_manager(cfg, target, &x, &pl);
  if (x.any_opt_nvme) plan_swapper(cfg, &pl);
  fit_own_buffers(cfg, &pl);
  size_own_buffers(cfg, &pl);
  ZOE_RETURN_IF_ERROR(check_peaks(cfg, x, &pl));
  return pl;
}

// The hints a plan lowered below the values given, warned about once each. A key the config does
// not give (DeepSpeed's default, e.g. a 5e7-element prefetch bucket against a 576 KiB budget) is
// the plan's to size: lowering it is not the user's value changed, and is not warned about.
void warn_hints_used(const config::Config& cfg, const Placement& pl, int64_t persist) {
  auto used = [&](const char* key, int64_t given, int64_t value, const char* why) {
    if (cfg.given(key)) config::value_used(key, given, value, why);
  };
  used("zero_optimization.stage3_param_persistence_threshold", cfg.zero.stage3_param_persistence_threshold,
       persist,
       "elements: the modules under the threshold, kept whole on the device, did not fit "
       "zoe.device_budget beside the rest, so the larger ones are partitioned like any other");
  const int64_t bucket = cfg.zero.reduce_bucket_size;
  used("zero_optimization.reduce_bucket_size", bucket, static_cast<int64_t>(pl.reduce_bucket),
       bucket < pl.world ? "a reduction bucket holds at least one element per rank"
                         : "elements: the reduction's bucket buffers did not fit zoe.device_budget "
                           "beside the module in use");
  used("zero_optimization.stage3_prefetch_bucket_size", cfg.zero.stage3_prefetch_bucket_size,
       pl.prefetch_bucket,
       pl.world > 1
           ? "elements of gathered modules queued ahead of use: what zoe.device_budget leaves beside "
             "the states and the module in use"
           : "elements of partitions moved to the device ahead of use: what zoe.device_budget leaves "
             "beside the states and the module in use");
  used("zero_optimization.stage3_max_live_parameters", cfg.zero.stage3_max_live_parameters,
       static_cast<int64_t>(pl.max_live_parameters),
       "elements: the largest gathered module must be live at once, so it is the least "
       "zoe can use");
}

// Plans with the persistence threshold `persist`, lowering reduce_bucket_size (halving it) while the
// plan is out of budget and the reduction's bucket buffers take device memory.
Result<Placement> plan_with_buckets(const config::Config& cfg, const std::vector<ModuleShape>& shapes,
                                    int world, int rank, const PlanTarget& target, int64_t persist) {
  config::Config c = cfg;
  Result<Placement> r = plan_with_persistence(c, shapes, world, rank, target, persist);
  while (!r.is_ok() && r.status().code() == StatusCode::kOutOfBudget && c.zero.stage >= 2 &&
         c.zero.reduce_bucket_size > world) {
    c.zero.reduce_bucket_size = std::max<int64_t>(world, c.zero.reduce_bucket_size / 2);
    Result<Placement> smaller = plan_with_persistence(c, shapes, world, rank, target, persist);
    if (smaller.is_ok() || smaller.status().code() != StatusCode::kOutOfBudget) return smaller;
  }
  return r;
}

}  // namespace

// stage3_param_persistence_threshold is a performance hint (DeepSpeed's default keeps every module
// under 1e5 elements on the device): when the modules it keeps there do not fit the device budget
// beside the rest, the threshold is lowered, largest persistent module first, until the plan fits
// (warned once with the value used). Only a plan that fails with no module kept whole is refused.
Result<Placement> plan_placement(const config::Config& cfg, const std::vector<ModuleShape>& shapes, int world,
                                 int rank, const PlanTarget& target) {
  if (world < 1 || rank < 0 || rank >= world) {
    return invalid_argument("placement: rank %d of world size %d", rank, world);
  }
  if (shapes.empty()) return invalid_argument("placement: no modules");
  const int64_t asked = cfg.zero.stage3_param_persistence_threshold;
  int64_t persist = asked;
  Result<Placement> r = plan_with_buckets(cfg, shapes, world, rank, target, persist);
  while (!r.is_ok() && r.status().code() == StatusCode::kOutOfBudget && cfg.zero.stage == 3) {
    // Partition the largest module still kept whole (and every one as large).
    int64_t top = 0;
    for (const ModuleShape& s : shapes) {
      int64_t n = 0;
      for (size_t e : s.param_numel) n += static_cast<int64_t>(e);
      if (n < persist) top = std::max(top, n);
    }
    if (top == 0) break;
    persist = top;
    r = plan_with_buckets(cfg, shapes, world, rank, target, persist);
  }
  if (r.is_ok()) warn_hints_used(cfg, r.value(), persist);
  return r;
}

}  // namespace zoe::zero
