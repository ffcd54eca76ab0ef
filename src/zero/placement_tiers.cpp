// The placement planner, stage 3: the tier manager's device share, staging buffers and host cache,
// and the gather window (see placement.cpp for the rest of the rules).
#include <algorithm>

#include "config/value_used.h"
#include "core/units.h"
#include "zero/placement_internal.h"

namespace zoe::zero::detail {

// Bytes rounded up to whole 4 KiB pages.
static uint64_t page_round(uint64_t b) { return (b + 4095) / 4096 * 4096; }

// Host bytes of every NVMe-homed partition's host copy.
uint64_t nvme_part_bytes(const Placement& pl) {
  uint64_t parts = 0;
  for (const auto& m : pl.modules) {
    if (m.partitioned_params && m.param_home == offload::Tier::kNvme)
      parts += page_round(u64(m.part) * pl.compute_bytes);
  }
  return parts;
}

namespace {

// Partition bytes pinned in the tier manager's device share at once: the largest, which a gather
// reads; served in place, the module in use and the held ones (the update writes offloaded
// partitions in host memory, not here).
uint64_t pinned_at_once(const Placement& pl) {
  const uint64_t es = pl.compute_bytes;
  uint64_t biggest = 0, held = 0;
  for (const auto& m : pl.modules) {
    if (!m.partitioned_params) continue;
    biggest = std::max(biggest, u64(m.part) * es);
    held += m.held && served_in_place(m) ? u64(m.part) * es : 0;
  }
  return biggest + held;
}

// 4a. The tier manager's device share and the gather window before the states' share: gathered
//     modules queued ahead of use take up to stage3_prefetch_bucket_size elements, in at most
//     half of what the reserve leaves, and within stage3_max_live_parameters beside the module in
//     use (at most the largest gathered one). What they leave goes to the partitions' device cache.
void plan_gather_window(const config::Config& cfg, Extent* x, Placement* pl) {
  const uint64_t es = pl->compute_bytes, db = pl->device_budget, world = static_cast<uint64_t>(pl->world);
  const uint64_t bucket = static_cast<uint64_t>(std::max<int64_t>(0, cfg.zero.stage3_prefetch_bucket_size));
  const uint64_t avail = db > x->reserve * 2 ? db - x->reserve : db / 2;
  size_t biggest_gathered = 0;
  for (const auto& m : pl->modules)
    biggest_gathered = std::max(biggest_gathered, m.partitioned_params ? m.padded : 0);
  const uint64_t live = pl->max_live_parameters;
  const uint64_t live_room = live > biggest_gathered ? live - biggest_gathered : 0;
  // Served in place (world size 1): no gathers are queued; prefetch moves partitions instead.
  const bool queues = pl->world > 1;
  const uint64_t gather_bytes =
      queues ? std::min<uint64_t>({bucket * x->per_elem, avail / 2, live_room * x->per_elem}) : 0;
  pl->gather_window = static_cast<size_t>(gather_bytes / x->per_elem);
  // The bucket or stage3_max_live_parameters bound the window as given; the budget may cut it.
  if (queues && gather_bytes < std::min(bucket, live_room) * x->per_elem)
    pl->prefetch_bucket = static_cast<int64_t>(pl->gather_window);
  // The rest holds partitions moving towards the device (their window and the one in use; a
  // gather's pin is short, so two; served in place, the one in use stays pinned beside the window).
  const uint64_t window =
      queues ? bucket * es / world + 2ull * (x->biggest / world) * es : bucket * es + pinned_at_once(*pl);
  pl->tm_device_budget = std::min<uint64_t>(window, avail - gather_bytes);
  // A gather pins the partition it reads in the device tier, and a module served in place stays
  // pinned there while in use: the tier holds what is pinned at once (check_peaks() refuses a
  // budget without room for it, naming zoe.device_budget, rather than the first fetch failing).
  // Device-homed partitions served in place pin their homes, which take no room beyond them.
  const bool homes_pinned = !queues && cfg.zero.offload_param.device == Offload::kNone;
  const uint64_t biggest_part = homes_pinned ? 0 : pinned_at_once(*pl);
  if (!queues) pl->in_place_pins = homes_pinned ? UINT64_MAX : pinned_at_once(*pl);
  if (pl->tm_device_budget > 0)
    pl->tm_device_budget = std::max(pl->tm_device_budget, biggest_part);  // 0: all of it
  if (cfg.zero.offload_param.device == Offload::kNone) {
    // The partitions live on the device: all of them count in the tier's budget.
    for (const auto& m : pl->modules) pl->tm_device_budget += m.partitioned_params ? u64(m.part) * es : 0;
  }
  x->tm_budget =
      pl->tm_device_budget ? std::min(pl->tm_device_budget, db) : db;  // as the tier manager caps it
}

// 4b. Staging for NVMe <-> device pieces: offload_param.buffer_count buffers (one of them the
//     synchronous one, so at least 2) of offload_param.buffer_size elements, 4 KiB multiples, at
//     least 64 KiB and at most the largest NVMe-homed partition (a larger piece is never filled,
//     so that cap is the size asked for in effect and is not warned about).
void plan_staging(const config::Config& cfg, const Extent& x, Placement* pl) {
  const uint64_t es = pl->compute_bytes;
  const uint64_t top = std::max<uint64_t>(u64(x.biggest_part_nvme) * es, 64u << 10);
  const int64_t size = cfg.zero.offload_param.buffer_size;
  // Not given: zoe's piece size (kAutoStagingBytes) rather than DeepSpeed's 1e8 elements, which
  // would make each staging buffer as large as the largest partition.
  const bool own = pl->host_share && !cfg.given("zero_optimization.offload_param.buffer_size");
  const uint64_t asked = own ? kAutoStagingBytes : u64(std::max<int64_t>(1, size)) * es;
  const uint64_t bytes = (std::clamp<uint64_t>(asked, 64u << 10, top) + 4095) / 4096 * 4096;
  if (own) pl->chosen.push_back("zero_optimization.offload_param.buffer_size");
  if (bytes > asked && !own) {
    config::value_used("zero_optimization.offload_param.buffer_size", size, static_cast<int64_t>(bytes / es),
                       "elements: the tier manager's staging buffers are 4 KiB multiples of at least 64 KiB");
  }
  pl->tm_staging_bytes = static_cast<size_t>(bytes);
  pl->tm_staging_count = static_cast<size_t>(
      config::value_clamped("zero_optimization.offload_param.buffer_count",
                            cfg.zero.offload_param.buffer_count, 2, 1 << 10,
                            "the tier manager needs a synchronous staging buffer and one for moves") -
      1);
  pl->resident.host += u64(pl->tm_staging_bytes) * (pl->tm_staging_count + 1);  // + the sync one
}

// 4c. Host copies of NVMe-homed partitions: the step updates one while the previous one is
//     written back, and keeps up to offload_param.max_in_cpu elements of them (clean, as a cache
//     the next fetches into the device copy from) within the tier's host budget.
void plan_host_cache(const config::Config& cfg, const Extent& x, Placement* pl) {
  const uint64_t es = pl->compute_bytes;
  auto alloc = page_round;
  const uint64_t parts = nvme_part_bytes(*pl);
  const uint64_t work = 2 * alloc(u64(x.biggest_part_nvme) * es);
  // Not given: the step's two to start with; size_own_buffers() gives the cache what the host
  // share leaves.
  const bool own = pl->host_share && !cfg.given("zero_optimization.offload_param.max_in_cpu");
  const uint64_t keep = own ? 0 : u64(std::max<int64_t>(0, cfg.zero.offload_param.max_in_cpu)) * es;
  pl->tm_host_cache = std::max(std::min(keep, parts), std::min(work, parts));
  pl->tm_host_budget = u64(pl->tm_staging_bytes) * (pl->tm_staging_count + 1) + pl->tm_host_cache;
}

}  // namespace

// 4. Stage-3 partitions: the tier manager's budgets and buffers, and the gather window.
void plan_tier_manager(const config::Config& cfg, const PlanTarget& target, Extent* x, Placement* pl) {
  pl->tier_manager = true;
  plan_gather_window(cfg, x, pl);
  if (x->nvme_tier) plan_staging(cfg, *x, pl);
  if (cfg.zero.offload_param.device == Offload::kNvme) plan_host_cache(cfg, *x, pl);
  // The tier's share beyond the device-homed partitions (counted as resident) leaves room for the
  // module in use beside the states: when the window's share went to it (stage3_max_live_parameters
  // leaves no room for queued gathers), it is cut to what fits, but not below two partitions in
  // flight (a plan that needs more is refused by check_peaks()).
  const uint64_t db = pl->device_budget;
  uint64_t homes = 0;
  for (const auto& m : pl->modules) {
    if (m.partitioned_params && m.param_home == offload::Tier::kDevice)
      homes += u64(m.part) * pl->compute_bytes;
  }
  const uint64_t keep = pl->resident.device + moving_device_bytes(*pl);
  const uint64_t in_flight = pl->world > 1
                                 ? 2ull * (x->biggest / static_cast<uint64_t>(pl->world)) * pl->compute_bytes
                                 : pinned_at_once(*pl);
  if (pl->tm_device_budget > homes && db > keep &&
      pl->tm_device_budget - homes > std::max(in_flight, db - keep)) {
    pl->tm_device_budget = homes + std::max(in_flight, db - keep);
    x->tm_budget = std::min(pl->tm_device_budget, db);
  }
  // Device memory the states take (persistent modules, device-resident optimizer states,
  // device-homed partitions) comes out of the gather window too: keep the tier's budget and
  // the reserve free.
  const uint64_t used = pl->resident.device + x->tm_budget;
  const uint64_t room = db > used + x->reserve ? (db - used - x->reserve) / x->per_elem : 0;
  const size_t fits = std::min<size_t>(pl->gather_window, static_cast<size_t>(room));
  if (fits < pl->gather_window) pl->prefetch_bucket = static_cast<int64_t>(fits);  // cut by the budget
  pl->gather_window = fits;
  if (!target.queued_gathers) {  // no window at all: not the budget's doing
    pl->gather_window = 0;
    pl->prefetch_bucket = cfg.zero.stage3_prefetch_bucket_size;
  }
  // Served in place (world size 1): the bucket is what the tier's share moves ahead beside the
  // partitions pinned in use; the budget may cut it (device-homed partitions never move).
  if (pl->world == 1 && cfg.zero.offload_param.device != Offload::kNone) {
    const uint64_t share = x->tm_budget > homes ? x->tm_budget - homes : 0, pinned = pinned_at_once(*pl);
    const int64_t ahead = static_cast<int64_t>((share > pinned ? share - pinned : 0) / pl->compute_bytes);
    if (ahead < pl->prefetch_bucket) pl->prefetch_bucket = ahead;
  }
}

}  // namespace zoe::zero::detail
