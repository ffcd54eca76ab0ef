// The update: each module's optimizer states and fp32 gradient accumulator (on the device, in
// host RAM or on NVMe through the swapper), AdamW over this rank's owned ranges with the step's
// scale, the new compute parameters written to their homes (ParamHomes), the speculative step
// and the overlapped update thread. Also the loss scaler and the count of steps taken.
//
// Contract:
//  - apply() runs the update in forward order, serially or (zoe.overlap_step on a host-memory
//    device) on a thread of its own behind the caller's next forward; gate() tells which modules
//    are done. The thread touches only this part's state and what it is handed: its own ops and
//    CPU pool, the swapper, the tier manager, ParamHomes' thread-safe calls, its clock.
//  - join() ends an overlapped update without any collective (for points whose timing differs
//    across ranks); finish() also runs the gathers it left owed (a sync point, same order on
//    every rank). A failed overlapped update's error is returned by the join that ends it.
//  - speculate(m) (zoe.speculative_step, states in host RAM, gradients final) updates module m
//    during the backward as if the step will neither clip nor overflow, saving its states
//    first; settle_speculation() keeps those updates when the step's scale is the assumed one,
//    else puts the states back. unspeculate_all() before anything reads the states.
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include "zero/engine_context.h"
#include "zero/loss_scaler.h"
#include "zero/param_homes.h"
#include "zero/step_clock.h"
#include "zero/update_gate.h"

namespace zoe::zero {

// One module's optimizer states: views of device memory (owned by dev) or of host memory
// (EngineContext::host_bufs); NVMe-resident states have none (swap_group(m) in the swapper).
struct OptimStates {
  void* master = nullptr;  // fp32
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  float* grad_acc = nullptr;  // fp32, opt_n elements; NVMe: swapper state kGradState
  device::DeviceBuffer dev[4];
  // zoe.speculative_step: this step's update already ran during the backward. spec_save holds
  // master, m and v from before it; spec_out its new compute parameters (the owned range).
  bool speculated = false;
  void* spec_save = nullptr;
  void* spec_out = nullptr;
  std::vector<uint8_t> spec_untouched;  // the parameters the speculative update left as they were
};

class Updater {
 public:
  Updater(EngineContext& ctx, const ModuleTable& modules, ParamHomes& homes, StepClock& clock)
      : ctx_(ctx), modules_(modules), homes_(homes), clock_(clock) {}
  ~Updater();

  // initialize(): module m's states in their home, the master from `own` (its owned range).
  Status place(ModuleId m, const float* own);
  OptimStates& states(ModuleId m) { return states_[m.index]; }
  const UpdateGate& gate() const { return gate_; }

  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }
  // What the step divides the summed gradients by: ranks x micro-batches (x the fp16 loss scale).
  double grad_divisor() const;

  // untouched: module m's parameters that got no gradient this step (on this rank), left as they are.
  Status speculate(ModuleId m, const std::vector<uint8_t>& untouched);
  void unspeculate(ModuleId m);
  void unspeculate_all();
  // In step(): keeps the speculative updates when the step updates with the scale they assumed
  // (no clip, no overflow), else undoes them; fills st's speculative counts.
  void settle_speculation(bool overflow, float grad_scale, StepStats* st);

  // Per module, the parameters no rank gave a gradient this step (empty: every one got one). The
  // next update leaves them as they are: no moment update, no decay, no step, like
  // torch.optim.AdamW for a parameter whose .grad is None. A speculative update that assumed
  // otherwise is undone.
  void set_untouched(std::vector<std::vector<uint8_t>> untouched);

  // The step is skipped (fp16 overflow): the chunks the swapper read ahead go.
  Status skip();
  // Takes the step: steps() + 1, AdamW with grad_scale and lr, serially or overlapped.
  Status apply(float grad_scale, double lr);
  Status join();
  Status finish();

  // Module m's parameter p's fp32 master, gathered over the ranks (after finish()).
  Status read_master(ModuleId m, size_t p, float* out);

  // Waits for everything in flight (no collectives) and frees device memory: before the device goes.
  void shutdown();

 private:
  struct ChunkUpdater;
  ChunkUpdater make_updater(DeviceOps* ops, optim::CpuPool* pool, double lr, int64_t step_no, float scale);
  Status run(ChunkUpdater& up, double* t_io);
  Status run_swapped(ChunkUpdater& up, double* t_io, std::vector<void*>* outs);
  Result<void*> open_out(ModuleId m, double* t_io, std::vector<void*>* outs);
  Status close_out(ModuleId m, double* t_io, std::vector<void*>* outs);
  void start_thread(ChunkUpdater up);

  EngineContext& ctx_;
  const ModuleTable& modules_;
  ParamHomes& homes_;
  StepClock& clock_;
  std::vector<OptimStates> states_;
  LossScaler scaler_;
  int64_t steps_ = 0;
  WritebackQueue writebacks_;

  // The overlapped update (zoe.overlap_step).
  UpdateGate gate_;
  std::thread thread_;
  bool running_ = false;     // a thread was started and not joined (caller's thread only)
  double thread_t_opt_ = 0;  // seconds on the update's thread (read after join)
  double thread_t_io_ = 0;
  Status update_error_;                          // a failed overlapped update: the joins after it return it
  std::unique_ptr<optim::CpuPool> update_pool_;  // the update's own threads
  std::unique_ptr<DeviceOps> update_ops_;        // kernels and copies of the update's thread

  std::vector<std::vector<uint8_t>> untouched_;  // set_untouched(), for the next apply()

  // zoe.speculative_step.
  float spec_scale_ = 0.0f;
  uint64_t spec_kept_ = 0, spec_undone_ = 0;  // this step's modules (StepStats)
};

}  // namespace zoe::zero
