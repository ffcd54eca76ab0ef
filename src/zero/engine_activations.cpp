// The engine's activation store: its budgets planned beside the placement, and Engine::activations().
//
// Budgets:
//   device share: zoe.activation_device_budget, else the device budget minus the placement's device
//                 peak (an upper bound of the engine's own use), so the store never pushes the
//                 engine over zoe.device_budget; a share given above what is left is an error.
//                 The placement is planned without the share: the given one, or, where
//                 activations are in use (zoe.activation_offload cpu|nvme, or DeepSpeed's
//                 activation_checkpointing section) and none is given, a quarter of the device
//                 budget (kActivationDeviceShareDiv), so that a stage-3 device cache does not take
//                 the whole budget. Where the placement does not fit beside that default, it gets
//                 the whole budget and the store what is left (warned, naming the key).
//   host budget:  zoe.activation_host_budget, else a quarter of zoe.host_budget, within what the
//                 placement's host peak leaves of it; without zoe.host_budget, 1/16 of this host's
//                 memory per rank (kActivationHostShareDiv). A budget given above what
//                 zoe.host_budget leaves is an error naming both keys.
#include <algorithm>

#include "config/paths.h"
#include "config/value_used.h"
#include "core/log.h"
#include "core/units.h"
#include "zero/engine_impl.h"
#include "zero/engine_internal.h"
#include "zero/test_hooks.h"

namespace zoe {

namespace {

constexpr uint64_t kActivationDeviceShareDiv = 4;  // of the device budget, without the key
constexpr uint64_t kActivationHostShareDiv = 16;   // of this rank's host memory, without zoe.host_budget
constexpr uint64_t kActivationHostBudgetDiv = 4;   // of zoe.host_budget
constexpr uint64_t kMaxRunBytes = 8u << 20;
constexpr uint64_t kMinRunBytes = 64u << 10;

// Every call fails: the store before initialize().
class NoActivationStore final : public ActivationStore {
 public:
  Status plan(const uint64_t*, size_t) override { return fail(); }
  Result<ActivationId> save(const void*, uint64_t) override { return fail(); }
  Status load(ActivationId, void*) override { return fail(); }
  Status end_micro_batch() override { return fail(); }
  ActivationStats stats() const override { return {}; }
  ActivationOffload offload() const override { return ActivationOffload::kNone; }

 private:
  static Status fail() { return invalid_argument("Engine::activations(): call initialize() first"); }
};

Result<uint64_t> device_share(const zero::EngineContext& ctx) {
  const uint64_t budget = ctx.dev->budget_bytes(), peak = ctx.placement.peak.device;
  const uint64_t left = budget > peak ? budget - peak : 0;
  const int64_t given = ctx.cfg->zoe.activation_device_budget_bytes;
  if (given == 0) return left;
  if (static_cast<uint64_t>(given) > left)
    return invalid_argument(
        "zoe.activation_device_budget: %lld bytes, more than the %llu bytes (%s) the device "
        "budget of %llu bytes (zoe.device_budget) leaves beside the engine's planned peak of "
        "%llu bytes",
        static_cast<long long>(given), static_cast<unsigned long long>(left), format_bytes(left).c_str(),
        static_cast<unsigned long long>(budget), static_cast<unsigned long long>(peak));
  return static_cast<uint64_t>(given);
}

Result<uint64_t> host_budget(const zero::EngineContext& ctx) {
  const config::ZoeConfig& z = ctx.cfg->zoe;
  const uint64_t given = static_cast<uint64_t>(z.activation_host_budget_bytes);
  if (z.host_budget_bytes <= 0)
    return given ? given : zero::engine_host_memory(ctx.shape.world) / kActivationHostShareDiv;
  const uint64_t all = static_cast<uint64_t>(z.host_budget_bytes), peak = ctx.placement.peak.host;
  const uint64_t left = all > peak ? all - peak : 0;
  if (given == 0) return std::min(all / kActivationHostBudgetDiv, left);
  if (given > left)
    return invalid_argument(
        "zoe.activation_host_budget: %llu bytes, more than the %llu bytes zoe.host_budget "
        "(%llu) leaves beside the engine's planned host peak of %llu bytes",
        static_cast<unsigned long long>(given), static_cast<unsigned long long>(left),
        static_cast<unsigned long long>(all), static_cast<unsigned long long>(peak));
  return given;
}

// Whether the run saves activations through the store: offload asked for, or DeepSpeed's section.
bool activations_in_use(const config::Config& cfg) {
  return cfg.activation_checkpointing.given ||
         (!cfg.zoe.activation_offload.empty() &&
          cfg.zoe.activation_offload != activation_offload_name(ActivationOffload::kNone));
}

}  // namespace

Result<zero::Placement> Engine::Impl::plan_beside_activations(const std::vector<zero::ModuleShape>& shapes,
                                                              zero::PlanTarget target) const {
  const config::Config& cfg = *ctx.cfg;
  const uint64_t budget = target.device_budget;
  const uint64_t given = static_cast<uint64_t>(std::max<int64_t>(0, cfg.zoe.activation_device_budget_bytes));
  const uint64_t share = given ? given : activations_in_use(cfg) ? budget / kActivationDeviceShareDiv : 0;
  if (share == 0 || share >= budget)
    return zero::plan_placement(cfg, shapes, ctx.shape.world, ctx.shape.rank, target);
  target.device_budget = budget - share;
  auto placed = zero::plan_placement(cfg, shapes, ctx.shape.world, ctx.shape.rank, target);
  if (placed.is_ok() || given) return placed;
  target.device_budget = budget;
  auto whole = zero::plan_placement(cfg, shapes, ctx.shape.world, ctx.shape.rank, target);
  if (whole.is_ok()) {
    const uint64_t left = budget > whole.value().peak.device ? budget - whole.value().peak.device : 0;
    ZOE_LOG_WARN(
        "activations: the placement does not fit beside the default device share for activations (%s, a "
        "quarter of zoe.device_budget); the store gets what the placement leaves, %s: set "
        "zoe.activation_device_budget, or raise zoe.device_budget",
        format_bytes(share).c_str(), format_bytes(left).c_str());
  }
  return whole;
}

Result<offload::ActivationStoreOptions> Engine::Impl::activation_options() const {
  const config::Config& cfg = *ctx.cfg;
  offload::ActivationStoreOptions o;
  ZOE_ASSIGN_OR_RETURN(o.offload, parse_activation_offload(cfg.zoe.activation_offload));
  o.device = ctx.dev.get();
  ZOE_ASSIGN_OR_RETURN(o.device_budget, device_share(ctx));
  if (o.offload != ActivationOffload::kNone) {
    ZOE_ASSIGN_OR_RETURN(o.host_budget, host_budget(ctx));
  }
  o.min_offload_bytes = static_cast<uint64_t>(cfg.zoe.activation_min_bytes);
  o.prefetch = static_cast<uint32_t>(cfg.zoe.activation_prefetch);
  // Pinned for the device's asynchronous copies where the device pins (CUDA); pageable on the CPU
  // device, whose copies are memcpy (and mlock would count against RLIMIT_MEMLOCK).
  o.pin = ctx.dev->kind() == device::DeviceKind::kCuda ? io::PinMode::kDevice : io::PinMode::kNone;
  if (o.offload != ActivationOffload::kNvme) return o;
  o.nvme_dirs = config::activation_nvme_dirs(cfg);
  // Write buffers of at most 8 MiB, a quarter of the host budget for the two of them.
  o.run_bytes = std::clamp<uint64_t>(o.host_budget / 8 / 4096 * 4096, kMinRunBytes, kMaxRunBytes);
  o.io.queue_depth = static_cast<uint32_t>(std::clamp<int64_t>(cfg.aio.queue_depth, 1, 4096));
  o.io.block_size = static_cast<size_t>(config::aio_block_size_used(cfg.aio.block_size));
  o.io.faults = zero::engine_io_faults();
  // The backward waits on these reads, while the engine's parameter prefetch and optimizer swap
  // share the drive: they go first where the kernel's I/O scheduler queues requests.
  o.io.read_ioprio = io::io_read_priority(io::kIoPrioClassRealtime, 4);
  o.checksum = cfg.zoe.swap_checksum;
  o.hole_check = cfg.zoe.swap_hole_check;
  return o;
}

Status Engine::Impl::setup_activations() {
  ZOE_ASSIGN_OR_RETURN(ctx.acts_options, activation_options());
  const offload::ActivationStoreOptions& o = ctx.acts_options;
  auto store = offload::create_activation_store(o);
  if (!store.is_ok()) return store.status().with_context("the activation store");
  ctx.acts = std::move(store).value();
  if (o.offload != ActivationOffload::kNone) {
    ZOE_LOG_INFO("activations: offload %s, device share %s, host budget %s, prefetch %u, min %s",
                 activation_offload_name(o.offload), format_bytes(o.device_budget).c_str(),
                 format_bytes(o.host_budget).c_str(), o.prefetch, format_bytes(o.min_offload_bytes).c_str());
  }
  return Status::ok();
}

ActivationStore& Engine::activations() {
  static NoActivationStore none;  // before initialize(): stateless
  return impl_->ctx.acts ? *impl_->ctx.acts : none;
}

}  // namespace zoe
