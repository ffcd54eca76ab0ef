// The zoe engine: a data-parallel ZeRO (stages 0-3) trainer that decides where every byte of
// model state lives (device, pinned host RAM, NVMe). The training loop stays the caller's:
//
//   auto rt = zoe::Runtime::init().value();          // ranks from MPI when under mpirun
//   auto cfg = zoe::Config::load("ds_config.json", rt->world_size()).value();
//   auto eng = zoe::Engine::create(*rt, cfg).value();
//   eng->add_module("block.0", {{"w", {d, d}}, {"b", {d}}});   ...
//   eng->initialize(init_fn);
//   for each step: for each micro-batch:
//       forward:  for m in order:    auto p = eng->gather(m);  compute with p->params();
//       backward: for m in reverse:  auto p = eng->gather(m);  auto g = eng->grads(m);  write g;
//                                    eng->reduce_grads(m);     (p releases at scope exit)
//     stats = eng->step();
//
// The layer-major schedule (zoe.schedule "layer-major", gradient_accumulation_steps G > 1): the
// caller runs a step's G micro-batches module by module instead of micro-batch by micro-batch:
//       forward:  for m in order:    auto p = eng->gather(m);  for g in 0..G-1: compute with p->params();
//       backward: for m in reverse:  auto p = eng->gather(m);
//                                    for g in 0..G-1: auto gr = eng->grads(m); write gr;
//                                    eng->reduce_grads(m);
//     stats = eng->step();
// so each module's parameters cross from their tier once per step in each direction, and the
// gradient sums of a module whose optimizer states are on NVMe stay in host memory over its G
// reductions and are written once (the placement counts that buffer: the largest NVMe-resident
// module's owned range in fp32). A module's G reductions must follow each other (another module's
// reduction in between writes the held sums to NVMe and reads them back: correct, but without the
// saving). The gradients are summed in micro-batch order, as the micro-batch schedule sums them:
// the two schedules give the same bits. The caller keeps the G micro-batches' activations (the
// activation store holds G micro-batches' saves as one: plan() them together).
//
// Contracts
//   Thread-safety: an Engine is not thread-safe. One thread (the one that drives the training
//     loop) makes every call on it; distinct Engines may be driven by distinct threads. The
//     engine's own threads (I/O, prefetch, an asynchronous save) never call back into user code.
//     The dtype helpers (zoe/dtype.h) are safe from any thread.
//   After an error: a call that returns kInvalidArgument for a precondition (a module index out of
//     range, release() of a module not fetched, add_module() after initialize(), a second
//     initialize()) changed nothing: the engine stays usable. After any other error (I/O, out of
//     budget, a collective, a corrupt checkpoint on load) the engine is only destructible:
//     destroy it (it frees its device memory, pins and swap files) and restart from a checkpoint.
//   Buffer validity: the views fetch()/gather() return stay valid until release(m) (for gather():
//     until the Gathered is destroyed or released); those of grads(m) until reduce_grads(m). Any
//     pointer is invalid after step(), load() and the engine's destruction. On a device that is
//     not host-addressable (CUDA) the caller's kernels must have finished with a buffer (stream
//     synchronized) before it hands the buffer back (release, reduce_grads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zoe/activations.h"
#include "zoe/config.h"
#include "zoe/dtype.h"
#include "zoe/runtime.h"
#include "zoe/status.h"
#include "zoe/step_stats.h"
#include "zoe/tensor.h"

namespace zoe {

// ParamSpec, TensorView and ModuleParams: zoe/tensor.h.

// StepStats: declared once, in zoe/step_stats.h (its fields reach this struct, the Python stats
// dict and `--json` output from there).

// Bytes in use now, per tier (not high-water marks). memory_in_use() first waits for an update
// still running behind the last step() (zoe.overlap_step), so its figures are those between steps.
struct MemoryUse {
  uint64_t device = 0;             // all device memory the engine holds
  uint64_t device_partitions = 0;  // of which the tier manager's stage-3 partitions (homes and cached copies)
  uint64_t host = 0;               // offloaded states, swapper and staging buffers, partitions in host RAM
  uint64_t nvme = 0;               // swap space allocated
  uint64_t partition_pins = 0;     // stage-3 partitions pinned: 0 between the caller's calls
};

// The host buffers initialize() sized: the optimizer swapper's (NVMe-resident optimizer states),
// the tier manager's staging buffers and its cache of NVMe-homed stage-3 partitions. `chosen` names
// the config keys whose values zoe picked itself because the config does not give them (a value the
// config gives is used as given), within `host_share`.
struct BufferSizes {
  // zoe.host_budget, or this host's memory / 16 shared by the job's ranks; 0: unknown (DeepSpeed's
  // defaults are then used for the keys the config does not give).
  uint64_t host_share = 0;
  size_t swap_buffer_count = 0;   // offload_optimizer.buffer_count as used (0: no swapper)
  size_t swap_buffer_bytes = 0;   // each
  size_t swap_async_buffers = 0;  // its write buffers for the gradient sums, beside them
  size_t staging_count = 0;       // offload_param.buffer_count as used (0: no NVMe tier)
  size_t staging_bytes = 0;       // each (offload_param.buffer_size in bytes)
  uint64_t host_cache_bytes = 0;  // NVMe-homed partitions kept in host memory (offload_param.max_in_cpu)
  std::vector<std::string> chosen;
};

// How add_module() registers a module.
struct ModuleOptions {
  // A frozen module's parameters are never trained (a frozen base under LoRA adapters, a frozen
  // embedding): the engine holds only its compute parameters, in their home (the device, or at
  // stage 3 this rank's partition in the tier offload_param names), and no fp32 master, no Adam
  // m/v, no gradient buffer or accumulator, no swap space for states; model_state_bytes(), the
  // placement's budgets and memory_in_use() count only those parameter bytes. fetch(), release(),
  // gather() and prefetch work as for any module; grads() and reduce_grads() refuse it
  // (kInvalidArgument naming it; the engine stays usable); step() leaves it as it is and the
  // gradient norm does not include it.
  // Precision: its values are its compute copy. At fp32 compute they are the init values, bit
  // for bit; with bf16/fp16 compute they are the init values rounded once to the compute dtype
  // (as DeepSpeed keeps frozen weights in the model's dtype only), and read_master(), save() and
  // consolidate give those rounded values as fp32 (exactly; a checkpoint round trip is
  // bit-identical). A checkpoint holds a frozen module's parameters and their fp32 values as its
  // master, and no m/v; it loads into a frozen or a trainable module (m/v start at zero then).
  bool frozen = false;
  // A held module stays fetched while the modules after it run (a PyTorch root module's own
  // parameters: fetched at the start of the forward, used at its end, and through the backward;
  // an embedding tied to the head), and its gradients arrive over the whole backward: the
  // placement keeps room for its gathered parameters and its gradient buffer beside every other
  // module in use, so a budget initialize() accepts never runs out in the middle of a step for it.
  bool held = false;
};

class Engine;

// A scoped fetch (like DeepSpeed's GatheredParameters): module m's parameters, released when it
// is destroyed (scope exit, an exception, an early return) or by release(). Move-only; it must
// not outlive its Engine.
class Gathered {
 public:
  Gathered(Gathered&& o) noexcept { *this = std::move(o); }
  Gathered& operator=(Gathered&& o) noexcept;
  Gathered(const Gathered&) = delete;
  Gathered& operator=(const Gathered&) = delete;
  // Releases (an error is logged: use release() to see it).
  ~Gathered();

  size_t module() const { return m_; }
  const ModuleParams& params() const { return params_; }
  const ModuleParams* operator->() const { return &params_; }
  const TensorView& operator[](size_t i) const { return params_.tensors[i]; }
  size_t size() const { return params_.tensors.size(); }
  // Releases now; the views are invalid afterwards. A second call does nothing.
  Status release();

 private:
  friend class Engine;
  Gathered(Engine* e, size_t m, ModuleParams p) : engine_(e), m_(m), params_(std::move(p)) {}
  Engine* engine_ = nullptr;
  size_t m_ = 0;
  ModuleParams params_;
};

class Engine {
 public:
  // Builds the device (CPU backend, or CUDA when zoe.device is "cuda"), tiers and I/O from cfg.
  // rt must outlive the engine.
  static Result<std::unique_ptr<Engine>> create(Runtime& rt, const Config& cfg);
  ~Engine();

  // Modules in forward order; each becomes one flat group, partitioned over the ranks.
  Status add_module(const std::string& name, const std::vector<ParamSpec>& params);
  Status add_module(const std::string& name, const std::vector<ParamSpec>& params, const ModuleOptions& opts);
  // Whether module m was registered frozen (ModuleOptions::frozen).
  bool module_frozen(size_t m) const;
  // Fills every parameter (fp32; the same on every rank), places all states in their tiers.
  // init(module_index, param_index, data, numel) writes all numel values (data holds whatever an
  // earlier call left there: one buffer serves every module).
  Status initialize(const std::function<void(size_t, size_t, float*, size_t)>& init);

  size_t num_modules() const;
  const std::string& module_name(size_t m) const;
  ComputeDType compute_dtype() const;
  // The current loss scale (fp16; 1 otherwise): multiply the loss gradient by it.
  double loss_scale() const;

  // Gathers module m's parameters on the device (stage 3: from wherever they live; prefetching
  // the next modules of the recorded order). Valid until release(m), and read-only: at world size
  // 1 a stage-3 module's views are its partition itself, pinned on the device (no gathered copy),
  // so the device holds a module in use and its gradients, not a copy beside them.
  Result<ModuleParams> fetch(size_t m);
  Status release(size_t m);
  // fetch(m) as a scoped object: released when the Gathered goes away.
  Result<Gathered> gather(size_t m);
  // A zeroed device buffer per parameter, in the compute dtype, for module m's gradients of
  // this micro-batch (loss scale included). Valid until reduce_grads(m).
  Result<ModuleParams> grads(size_t m);
  // Reduces module m's gradients over the ranks into this rank's partition (reduce-scatter at
  // stage 2/3, all-reduce at 0/1), accumulating over micro-batches, and frees the buffer.
  Status reduce_grads(size_t m);
  // reduce_grads(m) where only the parameters p with has_grad[p] got a gradient in this
  // micro-batch (one flag per parameter; the others' buffers are left zero). A parameter that
  // no micro-batch of a step gave a gradient on any rank (a frozen one, an expert no token
  // reached, a branch not taken), like every parameter of a module whose gradients were never
  // reduced in the step, is left as it is by that step: no moment update, no weight decay, no
  // step, as torch.optim.AdamW leaves a parameter whose .grad is None. (DeepSpeed zero-fills such
  // a gradient instead, which decays the parameter and moves it by its momentum.)
  Status reduce_grads(size_t m, const std::vector<bool>& has_grad);
  // Norm, loss scaling, clipping and AdamW over this rank's partitions wherever they live,
  // then the new parameters back to their home (and gathered at stage 1/2).
  Result<StepStats> step();

  // fp32 copies of a view (parameters or gradients), wherever it lives (host-addressable or device
  // memory): dst gets view.numel floats. write_f32 stores src x scale in the view's dtype (the
  // loss scale for gradients), rounding as zoe/dtype.h says.
  Status read_f32(const TensorView& view, float* dst);
  Status write_f32(const TensorView& view, const float* src, float scale = 1.0f);

  // The full fp32 master values of parameter p of module m (gathered from every rank).
  Status read_master(size_t m, size_t p, float* out);
  // Every parameter of module m at once, back to back in add_module()'s order (out holds the sum
  // of their element counts): one read of the module where read_master() reads it per parameter.
  Status read_module_master(size_t m, float* out);

  // Checkpoints (call between steps, on every rank). save() streams every state from the tier
  // it lives on into save_dir/<tag> (atomic, checksummed; save_dir/latest names it) with the
  // caller's `trainer_state`. load() verifies the checksums and restores every state into this
  // engine's placement and world size (resharding as needed); it returns the trainer state.
  // dir: a save directory (its latest checkpoint) or one checkpoint directory.
  //
  // async: the states are written by a background thread while the caller runs the next
  // forward/backward (which only reads them); the next step(), save(), load() or
  // finish_save() waits for it first, and returns its error if it failed. Collectives of the
  // save run on the caller's thread only (at the call and when it finishes).
  Status save(const std::string& save_dir, const std::string& tag, const std::string& trainer_state_json,
              bool async = false);
  // Waits for an asynchronous save, commits it; its Status (OK when none was running).
  Status finish_save();
  // Claims save_dir for this job now (on every rank; a collective), as the first save() would: a
  // second job whose save() or claim_save_dir() names the same directory is refused with a message
  // naming the holder, at its start rather than at its first save. Creates the directory.
  Status claim_save_dir(const std::string& save_dir);
  Result<std::string> load(const std::string& dir);
  int64_t steps_taken() const;

  // Sleep and wake, for reinforcement learning on the same device (an inference engine takes the
  // device memory between training phases). sleep(), called between steps (after step(), every
  // module released, no gradient taken since), waits for everything in flight (an asynchronous
  // checkpoint, an update behind the last step, queued gathers), copies every byte the engine
  // holds in device memory (parameters, the partition cache, gradient buffers, optimizer states
  // on the device, the activation store's device share) to host memory, or to zoe's swap on NVMe
  // where zoe.host_budget has no room left, and gives the device memory back:
  // memory_in_use().device is 0 while asleep (its host and nvme figures count the copies).
  // wake() brings every byte back to the address it had, so training after a sleep()/wake() pair
  // gives the bits of training without it. While asleep, fetch, gather, release, grads,
  // reduce_grads, step, read_master, save and load are refused (kInvalidArgument naming the call
  // and saying to wake() first); so are sleep() while asleep, wake() while awake and sleep() in
  // the middle of a step. A refused or failed call changes nothing (a wake() whose copy back
  // failed leaves the engine asleep with its copies: call it again). Destroying a sleeping engine
  // is fine. zoe's CPU device only for now: on CUDA sleep() fails with kUnsupported.
  Status sleep();
  Status wake();
  bool is_asleep() const;

  // The activation store of this engine (zoe/activations.h), made at initialize() and present
  // from then on: with zoe.activation_offload none it keeps every saved tensor on the device. Its
  // budgets are planned beside the placement: the device share is zoe.activation_device_budget,
  // or what the device budget leaves beside the placement's device peak, so the engine stays
  // within its device budget. Where activations are in use (zoe.activation_offload cpu or nvme,
  // or DeepSpeed's activation_checkpointing section) and no share is given, the placement is
  // planned within three quarters of the device budget, so that a stage-3 device cache leaves at
  // least a quarter to activations (where the placement needs more, it gets the whole budget and
  // a warning names zoe.activation_device_budget). step() drops what a micro-batch left in it (no activation
  // state crosses a step boundary). Before initialize() every call of the store fails, saying so.
  ActivationStore& activations();

  // Bytes of model state per rank: compute parameters, gradients and optimizer states (a frozen
  // module counts its compute parameters only).
  uint64_t model_state_bytes() const;
  // Bytes of the master and the optimizer's states (AdamW's m and v with their block scales, Lion's
  // m, Adagrad's sum, Muon's momentum and its AdamW part's v) per trained parameter, as stored
  // (zoe.master_weights, zoe.optimizer_states): AdamW and Muon 12 for fp32, 4.03125 for AdamW's
  // int8 with a bf16 master; Lion and Adagrad 8 for fp32.
  double optimizer_state_bytes_per_param() const;
  // optimizer.type's update: "AdamW" (also for "Adam"), "Lion", "Adagrad" or "Muon" (src/optim/muon.h:
  // the parameters with 2+ dimensions whose "<module>.<param>" name has neither "embed" nor
  // "lm_head" get Muon, the rest AdamW; a ParamSpec's first dimension is a matrix's rows).
  std::string optimizer() const;
  // zoe.optimizer_states and zoe.master_weights in use ("fp32", "bf16", "int8", "int4").
  std::string optimizer_states() const;
  std::string master_weights() const;
  // zoe.schedule in use: "micro-batch" or "layer-major".
  std::string schedule() const;
  uint64_t device_budget_bytes() const;
  MemoryUse memory_in_use() const;
  // The host buffers the placement sized (after initialize(); all zero before).
  BufferSizes buffer_sizes() const;
  uint64_t num_params() const;
  // Writes the Chrome-trace timeline of transfers and optimizer chunks recorded so far.
  Status write_trace(const std::string& path) const;
  void enable_trace(bool on);
  // Adds a compute span (the caller's kernels) to the same timeline.
  void record_compute(const std::string& name, uint64_t begin_ns, uint64_t end_ns);

  struct Impl;  // internal (src/zero/engine_impl.h)

 private:
  friend struct EngineAccess;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe
