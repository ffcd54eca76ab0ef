// Engine::step: the order of the step's phases over the parts.
//  1. Sync point: the asynchronous checkpoint, the reductions in flight (GradReducer), queued
//     gathers (ParamGather), the previous overlapped update and its owed gathers (Updater),
//     the tier manager's moves.
//  2. The global gradient norm: GradReducer's per-chunk sums of this rank, all-reduced.
//  3. Loss scaling and clipping folded into one scale; the speculative updates kept or undone.
//  4. The update (Updater::apply: serial, or overlapped behind the next forward), or the skip
//     of an fp16 overflow; the loss scaler.
//  5. Statistics (StepClock).
//
// Contract: step() needs every gradient buffer reduced and, at stage 3, every module released.
// After an error the engine is destructible; its states may be half-updated.
#include <cmath>

#include "core/log.h"
#include "zero/engine_impl.h"

namespace zoe {

using zero::Timer;

namespace {

// Phase 1: nothing in flight may still read or write what the step changes.
Status sync_before_step(Engine& eng, Engine::Impl& I) {
  // An asynchronous checkpoint still reading the states must finish before they change.
  ZOE_RETURN_IF_ERROR_CTX(eng.finish_save(), "finishing the asynchronous checkpoint");
  ZOE_RETURN_IF_ERROR(I.grads->complete(true));
  ZOE_RETURN_IF_ERROR(I.gather->discard());  // none in a regular loop: prefetch stops at the order's end
  // The previous step's update (if it still runs behind) and the gathers it left owed.
  {
    Timer t(&I.clock.t_opt);
    ZOE_RETURN_IF_ERROR_CTX(I.update->finish(), "the previous optimizer step");
  }
  // Moves still in flight (prefetches) finish before the update rewrites the partitions they read.
  ZOE_RETURN_IF_ERROR_CTX(I.homes->drain(), "finishing the parameter moves before the step");
  for (zero::ModuleId m : I.modules.ids()) {
    const std::string& name = I.modules[m].name;
    if (I.grads->unreduced(m))
      return invalid_argument("step(): module %s has gradients that were not reduced", name.c_str());
    if (I.gather->in_use(m)) return invalid_argument("step(): module %s is still fetched", name.c_str());
  }
  I.gather->end_recording();
  return Status::ok();
}

// Phase 2: the global gradient norm over this rank's owned ranges, summed over ranks (stage 0
// owns all).
Result<optim::NormResult> global_norm(Engine::Impl& I) {
  ZOE_ASSIGN_OR_RETURN(optim::NormResult local, I.grads->local_norm());
  double sums[1] = {local.finite ? local.sum_sq : INFINITY};
  if (I.ctx.shape.stage >= 1 && I.ctx.shape.world > 1) {
    Timer t(&I.clock.t_comm);
    double out[1];
    ZOE_RETURN_IF_ERROR_CTX(
        I.ctx.comm->all_reduce(sums, out, 1, comm::CommType::kF64, comm::ReduceOp::kSum).wait(),
        "all-reducing the gradient norm");
    sums[0] = out[0];
  }
  optim::NormResult global;
  global.sum_sq = sums[0];
  global.finite = std::isfinite(sums[0]);
  return global;
}

// Per module, the parameters no rank gave a gradient this step (empty where every one got one):
// this rank's flags, summed over the ranks.
Result<std::vector<std::vector<uint8_t>>> untouched_params(Engine::Impl& I) {
  std::vector<std::vector<uint8_t>> u;
  std::vector<double> got;
  for (zero::ModuleId m : I.modules.ids()) {
    u.push_back(I.grads->untouched(m));
    for (uint8_t f : u.back()) got.push_back(f ? 0.0 : 1.0);
  }
  if (I.ctx.shape.world > 1) {
    // The ranks must have reduced the same modules in the same order: else a reduction of one
    // rank's module met another rank's (same-sized) one, and the sums mix gradients.
    Timer t(&I.clock.t_comm);
    const double h = static_cast<double>(I.grads->sequence_hash());
    double mine[2] = {h, -h}, most[2];
    ZOE_RETURN_IF_ERROR_CTX(
        I.ctx.comm->all_reduce(mine, most, 2, comm::CommType::kF64, comm::ReduceOp::kMax).wait(),
        "comparing the modules each rank reduced");
    if (most[0] != -most[1]) {
      return invalid_argument(
          "step(): the ranks reduced different modules in this step (rank %d's sequence differs from "
          "another's): every rank must reduce the same modules in the same order, because the reductions "
          "are collectives matched by order; in the PyTorch front-end every rank must run the same units "
          "in each micro-batch (put modules a rank may skip, such as experts, in one unit: zoe_units=...)",
          I.ctx.shape.rank);
    }
  }
  if (I.ctx.shape.world > 1 && !got.empty()) {
    Timer t(&I.clock.t_comm);
    std::vector<double> sum(got.size());
    ZOE_RETURN_IF_ERROR_CTX(
        I.ctx.comm->all_reduce(got.data(), sum.data(), got.size(), comm::CommType::kF64, comm::ReduceOp::kSum)
            .wait(),
        "all-reducing which parameters got gradients");
    size_t i = 0;
    for (auto& mod : u) {
      for (uint8_t& f : mod) f = sum[i++] > 0.0 ? 0 : 1;
    }
  }
  return u;
}

}  // namespace

// The resources' counters the step's statistics are made of.
static zero::ResourceReadings resource_readings(const Engine::Impl& I, ActivationStats* acts) {
  const zero::EngineContext& c = I.ctx;
  zero::ResourceReadings r;
  r.device_high_water = c.dev->high_water_bytes();
  r.host_high_water = I.update->host_bytes();
  if (c.tm) r.host_high_water += c.tm->stats().high_water[1];
  r.nvme_high_water = c.store ? c.store->high_water_bytes() : 0;
  if (c.io) {
    const io::IoStatsSnapshot ios = c.io->stats();
    r.nvme_read = ios.read_bytes;
    r.nvme_write = ios.write_bytes;
  }
  if (c.tm) {
    const offload::TierStats ts = c.tm->stats();
    r.host_to_device = ts.host_to_device.bytes + ts.nvme_to_device.bytes;
    r.device_to_host = ts.device_to_host.bytes + ts.device_to_nvme.bytes;
  }
  if (c.acts) {
    *acts = c.acts->stats();
    r.acts = acts;
  }
  return r;
}

// No activation state crosses a step boundary: what a micro-batch left in the store is dropped
// (warned once: the caller should call end_micro_batch() after each micro-batch).
static Status end_activations(Engine::Impl& I) {
  if (!I.ctx.acts) return Status::ok();
  const size_t held = offload::activation_tensors_held(*I.ctx.acts);
  if (held == 0) return Status::ok();
  static bool warned = false;
  if (!warned) {
    warned = true;
    ZOE_LOG_WARN(
        "step(): the activation store still held %zu saved tensors; dropped (call "
        "activations().end_micro_batch() after each micro-batch)",
        held);
  }
  return I.ctx.acts->end_micro_batch();
}

Result<StepStats> Engine::step() {
  Impl& I = *impl_;
  const uint64_t t_enter = now_ns();
  if (!I.initialized) return invalid_argument("step() before initialize()");
  ZOE_RETURN_IF_ERROR(I.awake("step()"));
  ZOE_RETURN_IF_ERROR(sync_before_step(*this, I));
  ZOE_RETURN_IF_ERROR(end_activations(I));
  const uint64_t t_opt0 = now_ns();
  ZOE_ASSIGN_OR_RETURN(optim::NormResult global, global_norm(I));
  // Phase 3: gradients were summed over ranks and micro-batches with the loss scale: average,
  // unscale and clip in one scale.
  const optim::StepScale sc = optim::compute_step_scale(global, static_cast<float>(I.update->grad_divisor()),
                                                        static_cast<float>(I.ctx.cfg->gradient_clipping));
  StepStats st;
  st.grad_norm = sc.grad_norm;
  st.lr = I.ctx.cfg->lr_at(I.update->steps() + 1);
  // Muon: the matrices' rate (optimizer.params.muon_lr's; the rest's is adam_lr's).
  if (I.update->optimizer() == optim::OptimizerKind::kMuon)
    st.lr = I.ctx.cfg->group_lr_at(I.update->steps() + 1, I.ctx.cfg->optimizer.muon_lr);
  ZOE_ASSIGN_OR_RETURN(auto untouched, untouched_params(I));
  I.update->set_untouched(std::move(untouched));
  I.update->settle_speculation(sc.overflow, sc.grad_scale, &st);
  // An overlapped update's bytes count at the next step: the link counters are read before
  // its thread starts, so no byte it moves lands in this step by the thread's timing.
  ActivationStats acts;
  const bool overlapped = !sc.overflow && I.update->overlaps();
  zero::ResourceReadings before;
  if (overlapped) before = resource_readings(I, &acts);
  // Phase 4: the update, or the skip.
  if (sc.overflow) {
    st.skipped = true;
    ZOE_RETURN_IF_ERROR(I.update->skip());
  } else {
    ZOE_RETURN_IF_ERROR(I.update->apply(sc.grad_scale, st.lr));
  }
  if (I.ctx.shape.cdt == DType::kF16) I.update->scaler().update(sc.overflow);
  I.grads->end_step();
  I.clock.t_opt += static_cast<double>(now_ns() - t_opt0) * 1e-9;
  // Phase 5: statistics (an overlapped update's bytes and time count at the next step).
  st.step = I.update->steps();
  st.loss_scale = loss_scale();
  zero::ResourceReadings r = resource_readings(I, &acts);
  if (overlapped) r.take_link_bytes(before);
  I.clock.collect(r, t_enter, num_params(), &st);
  return st;
}

}  // namespace zoe
