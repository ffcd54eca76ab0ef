// The update: each module's optimizer states and fp32 gradient accumulator (on the device, in
// host RAM or on NVMe through the swapper), the optimizer (AdamW, Lion, Adagrad or Muon:
// optimizer.type)
// over this rank's owned ranges with the step's scale, the new compute parameters written to their homes
// (ParamHomes), the speculative step and the overlapped update thread. Also the loss scaler and the count of
// steps taken.
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
//  - Muon (updater_muon.cpp) orthogonalizes each WHOLE matrix, never a flat shard: apply() first
//    runs muon_prepass() on the caller's thread (every rank, the same order: it gathers): per
//    module, the momentum of the matrices' owned elements, the module's U = nesterov(g, buf)
//    gathered from the ranks (all_gather, 4 bytes an element), Newton-Schulz on each matrix that
//    overlaps this rank's range, and the owned part of the result written where the gradient sum
//    was. The chunked pass then applies it (and the auxiliary AdamW to the other parameters).
//    Costs beside AdamW's: the module's gradient sums and momentum read and written once more
//    (NVMe: 16 bytes an owned element), the gather, and NS's flops (optim/muon.h).
//  - Adam-mini (updater_adam_mini.cpp) keeps one second moment a block (optim/adam_mini.h): apply()
//    first runs adam_mini_prepass() on the caller's thread (every rank, the same order: one
//    all-reduce): each block's sum of g^2 over this rank's owned elements (NVMe: taken from the
//    final sums as the last micro-batch writes them, so nothing is read back), summed over the
//    ranks, then every block's mean moment
//    updated on every rank (the same values everywhere). The chunked pass then updates m and the
//    master with the block's mean.
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "core/trace.h"
#include "offload/optimizer_swapper.h"
#include "optim/adam.h"
#include "optim/adam_mini.h"
#include "optim/lion_adagrad.h"
#include "optim/lowbit.h"
#include "optim/muon.h"
#include "optim/optimizer_kind.h"
#include "zero/grad_sink.h"
#include "zero/home_views.h"
#include "zero/loss_scaler.h"
#include "zero/part_resources.h"
#include "zero/step_clock.h"
#include "zero/update_gate.h"
#include "zoe/step_stats.h"

namespace zoe::zero {

// The optimizer states a checkpoint holds, in its order: the master (zoe.master_weights), the
// optimizer's first state (AdamW's and Lion's m, Adagrad's sum) and AdamW's v (zoe.optimizer_states:
// fp32, bf16, or blockwise int8/int4 for AdamW, optim/lowbit.h). Lion and Adagrad have no kExpAvgSq.
enum class OptState : uint8_t { kMaster = 0, kExpAvg = 1, kExpAvgSq = 2 };

// One module's optimizer states: views of device memory (owned by dev) or of host memory (the
// Updater's HostArena); NVMe-resident states have none (they live in the swapper).
struct OptimStates {
  void* master = nullptr;      // fp32 or bf16 (zoe.master_weights)
  void* exp_avg = nullptr;     // AdamW's and Lion's m, Adagrad's sum
  void* exp_avg_sq = nullptr;  // AdamW's v; null for Lion and Adagrad
  float* grad_acc = nullptr;   // fp32, opt_n elements; NVMe: swapper state kGradState
  device::DeviceBuffer dev[4];
  // zoe.speculative_step: this step's update already ran during the backward. spec_save holds
  // the master and the states from before it; spec_out its new compute parameters (the owned range).
  bool speculated = false;
  void* spec_save = nullptr;
  void* spec_out = nullptr;
  std::vector<uint8_t> spec_untouched;  // the parameters the speculative update left as they were
};

// Adam-mini's blocks of one module (updater_adam_mini.cpp): per parameter its blocks and the index
// of its first block in v; v holds the mean second moment of every block of the module (each rank
// keeps them all, with the same values: from the sums over the ranks).
struct AdamMiniModule {
  std::vector<optim::AdamMiniParam> params;
  std::vector<size_t> first;
  std::vector<float> v;
};

// Adam-mini's update of the chunk [lo, lo + n) of a module's elements (lo from its first element):
// m and the fp32 master of each parameter's part, with its block's mean moment and its own step
// (step - skipped[p]); the padding after the last parameter is left as it is.
struct AdamMiniChunk {
  const ModuleLayout* mod = nullptr;
  const AdamMiniModule* mm = nullptr;
  size_t lo = 0, n = 0;
  float* master = nullptr;
  float* m = nullptr;
  const float* grad = nullptr;
  float grad_scale = 1.0f;
  int64_t step = 1;
  const std::vector<int64_t>* skipped = nullptr;  // per parameter; null: none sat out an update
  optim::AdamMiniParams p;
};
void adam_mini_chunk(const AdamMiniChunk& c);
// adam_mini_chunk over c in pieces spread over pool's threads (null: the caller's only; each element
// reads only its block's moment, so the bits do not depend on the pieces), each piece's new master
// also written to param_out in cdt (null: not).
Status adam_mini_update(const AdamMiniChunk& c, void* param_out, DType cdt, optim::CpuPool* pool);
// fn(i) for every i in [0, count), over pool's threads (null: the caller's); the first error.
Status for_each_piece(optim::CpuPool* pool, size_t count, const std::function<Status(size_t)>& fn);

class Updater final : public GradSink {
 public:
  struct Resources {
    DeviceMemory* mem = nullptr;
    DeviceOps* ops = nullptr;                      // the caller's
    optim::CpuPool* pool = nullptr;                // the caller's CPU threads
    comm::Communicator* comm = nullptr;            // host buffers (read_master's gather)
    offload::OptimizerSwapper* swapper = nullptr;  // null when no module's states are on NVMe
    TraceRecorder* trace = nullptr;
    const config::Config* cfg = nullptr;  // the optimizer, its schedule and the zoe.* update keys
    optim::OptimizerKind optimizer = optim::OptimizerKind::kAdamW;  // the placement's
    optim::StateFormat states = optim::StateFormat::kF32;           // its states (the placement's)
    optim::MasterFormat master = optim::MasterFormat::kF32;
    bool master_in_compute = false;  // the master is the compute copy's owned range (the placement's)
    // zoe.schedule "layer-major": an NVMe-resident module's gradient sums stay in host memory over
    // its consecutive micro-batches and go to NVMe once, after its last (Placement::grad_hold_bytes).
    bool hold_grad_sums = false;
  };
  Updater(const RunShape& shape, const ModuleTable& modules, UpdateTarget& homes, StepClock& clock,
          const Resources& r, const LossScaler& scaler);
  ~Updater();

  // initialize(): module m's states in their home, the master from `own` (its owned range). An
  // NVMe master is written from `own` itself: leave it unchanged until wait_placed().
  Status place(ModuleId m, const float* own);
  Status wait_placed();
  const UpdateGate& gate() const { return gate_; }

  // Checkpoints: elements [begin, begin + n) of module m's state k (its owned range), as stored
  // (state_size(k, n) bytes: packed blocks for int8/int4), to or from host memory. begin a
  // multiple of io_chunk_elems(), n too unless the range reaches the end. Between steps (after
  // finish()).
  Status read_state(ModuleId m, OptState k, size_t begin, size_t n, void* dst);
  Status write_state(ModuleId m, OptState k, size_t begin, size_t n, const void* src);
  // Bytes of n elements of state k as stored (n a multiple of the state's block, or a range's end).
  size_t state_size(OptState k, size_t n) const;
  optim::StateFormat state_format() const { return r_.states; }
  optim::OptimizerKind optimizer() const { return r_.optimizer; }
  // The states beside the master: kExpAvg, and kExpAvgSq when this is 2 (AdamW).
  int state_count() const { return optim::optimizer_state_count(r_.optimizer); }
  optim::MasterFormat master_format() const { return r_.master; }
  // Whether the update runs adam_step_lowbit (packed states or a bf16 master), not adam_step.
  bool lowbit() const;
  // The piece of a state transfer: the swapper's chunk (its I/O alignment), else 4 Mi elements.
  size_t io_chunk_elems() const;
  // Host memory of the states in host RAM (and their speculative copies), and of the swapper.
  uint64_t host_bytes() const;

  // The states an optimizer swapper must hold for the Updater, in the order it uses them (the
  // engine creates the swapper with these).
  static std::vector<offload::SwappedState> swapped_states(optim::OptimizerKind optimizer,
                                                           optim::StateFormat states,
                                                           optim::MasterFormat master,
                                                           bool master_in_compute);

  // GradSink: the sums of the gradients live with the states.
  Status add_grads(ModuleId m, const GradBatch& b) override;
  Status zero_grads(ModuleId m) override;

  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }
  // Per module, per parameter: the updates it sat out (no rank gave it a gradient: set_untouched).
  // Its AdamW bias correction counts its own updates, steps() minus these, as torch.optim.AdamW
  // counts each parameter's. Checkpoints keep them (Engine::save's engine.skipped_steps).
  const std::vector<std::vector<int64_t>>& skipped_steps() const { return skipped_; }
  // Errors: a count for a module or parameter that does not exist, or one above steps().
  Status set_skipped_steps(std::vector<std::vector<int64_t>> skipped);
  // apply(): the parameters this step leaves untouched sat out one more update.
  void count_skipped();
  // optimizer.type AdamMini: per module, its blocks' mean second moments (empty for a frozen
  // module). Checkpoints keep them (Engine::save's engine.adam_mini_v).
  std::vector<std::vector<float>> adam_mini_v() const;
  // Errors: a module count or a module's block count other than this model's.
  Status set_adam_mini_v(const std::vector<std::vector<float>>& v);
  // The low-bit update of a chunk whose parameters count different steps (said once).
  static void warn_mixed_steps();
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
  // Takes the step: steps() + 1, the optimizer with grad_scale and lr, serially or overlapped.
  Status apply(float grad_scale, double lr);
  // Whether apply() runs the update behind the caller (zoe.overlap_step on a host-memory device).
  bool overlaps() const;
  Status join();
  Status finish();

  // Module m's parameter p's fp32 master, gathered over the ranks (after finish()).
  Status read_master(ModuleId m, size_t p, float* out);
  // Module m's whole fp32 master in its padded layout (gathered from every rank): `full` holds
  // the module's padded element count.
  Status read_module_master(ModuleId m, float* full);
  // The first n (at most the padded count) of module m's fp32 master values into `out`, straight
  // from where they are stored (NVMe: whole chunks read into `out` itself, no copy where it is
  // 4096-byte aligned), where this rank owns the whole module (stage 0, or one rank) and stores
  // the master in fp32; false (nothing read) otherwise.
  Result<bool> read_master_direct(ModuleId m, size_t n, float* out);

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
  // The swapper's group holding module m's NVMe-resident states, and its states' indices
  // (swapped_states()): named here only.
  static offload::GroupId swap_group(ModuleId m) { return offload::GroupId(m.index); }
  static ModuleId module_of(offload::GroupId g) { return ModuleId(static_cast<size_t>(g.value)); }
  // Indices into swapped_states(); without a master (master_in_compute) m is the first; Lion and
  // Adagrad have no v (kNoState).
  static constexpr size_t kNoState = SIZE_MAX;
  size_t kMasterState = 0, kAvgState = 1, kAvgSqState = 2, kGradState = 3;
  size_t swap_index(OptState k) const {
    return k == OptState::kMaster ? kMasterState : k == OptState::kExpAvg ? kAvgState : kAvgSqState;
  }
  // updater_muon.cpp: Muon's whole-matrix phase (see the contract above), before the update.
  void init_muon();
  Status muon_prepass(float grad_scale);
  Status muon_module(ModuleId m, float grad_scale, const optim::MuonParams& mp);
  // Per module, per parameter: 1 where Muon updates it (a matrix: 2 or more dimensions, and its
  // name, "<module>.<param>", contains neither "embed" nor "lm_head", as DeepSpeed tags use_muon);
  // the rest get the auxiliary AdamW. Empty unless optimizer.type is Muon.
  std::vector<std::vector<uint8_t>> muon_;
  std::vector<float> muon_g_, muon_buf_, muon_u_, muon_full_, muon_o_;  // muon_prepass's
  std::vector<char> muon_packed_;  // muon_prepass's packed momentum (int8/int4 states)
  bool muon_flat_shard_ = false;   // the test hook ZOE_TEST_MUON_FLAT_SHARD (updater_muon.cpp)
  // updater_adam_mini.cpp: Adam-mini's blocks (place()) and their mean moments (before the update).
  Status init_adam_mini(ModuleId m);
  Status adam_mini_prepass(float grad_scale);
  Status adam_mini_sums(ModuleId m, double* sums);
  // add_grads_nvme's last micro-batch: its final sums' block sums, chunk by chunk (`at` from the
  // owned range's start), so the prepass need not read them back.
  void adam_mini_note_chunk(ModuleId m, size_t at, const float* acc, size_t n);
  std::vector<AdamMiniModule> mini_;  // per module; empty unless optimizer.type is AdamMini
  std::vector<double> mini_sums_, mini_all_;
  std::vector<std::vector<double>> mini_noted_;  // per module: adam_mini_note_chunk's sums
  std::vector<uint8_t> mini_noted_ok_;           // per module: noted for this step
  std::vector<float> mini_g_;
  // updater_states.cpp
  Result<const void*> host_view(const void* dsrc, size_t bytes);
  Status add_grads_nvme(ModuleId m, const GradBatch& b, const optim::Exec& exec);
  Status place_on_device(ModuleId m, const float* own);
  Status place_in_host(ModuleId m, const float* own);
  Status place_on_nvme(ModuleId m, const float* own);
  void* state_ptr(ModuleId m, OptState k) const;
  Status master_from_f32(const float* own, void* dst, size_t n) const;

  const RunShape& shape_;
  const ModuleTable& modules_;
  UpdateTarget& homes_;
  StepClock& clock_;
  Resources r_;
  HostArena host_;
  std::vector<OptimStates> states_;
  std::vector<char> host_stage_;   // device -> host staging (when device memory is not host memory)
  std::vector<float> grad_stage_;  // one swapper chunk: NVMe gradient sums go through it
  // Resources::hold_grad_sums: the running sums of module held_ (not yet on NVMe), or none.
  std::vector<float> held_sums_;
  ModuleId held_{SIZE_MAX};
  // Writes the held sums to NVMe (a module's micro-batches were not consecutive).
  Status flush_held();
  // A test hook for `zoe verify` and its tests: with ZOE_TEST_FLIP_GRAD_SUM="<module>@<step>" in
  // the environment (read once, warned), the first element of that module's gradient sum is
  // negated after the last micro-batch of that step (1-based), where the sums are offloaded (host
  // RAM or NVMe; not on the device, where `zoe verify`'s reference keeps them): a broken offload
  // path on purpose, which leaves the gradient norm as it was.
  void test_flip(ModuleId m, const GradBatch& b, float* sum) const;
  std::string flip_module_;
  int64_t flip_step_ = 0;
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
  std::vector<std::vector<int64_t>> skipped_;    // skipped_steps()

  // zoe.speculative_step.
  float spec_scale_ = 0.0f;
  uint64_t spec_kept_ = 0, spec_undone_ = 0;  // this step's modules (StepStats)
};

}  // namespace zoe::zero
