// The zoe engine: a data-parallel ZeRO (stages 0-3) trainer that decides where every byte of
// model state lives (device, pinned host RAM, NVMe). The training loop stays the caller's:
//
//   auto rt = zoe::Runtime::init();                  // ranks from MPI when under mpirun
//   auto cfg = zoe::config::Config::load("ds_config.json", rt->world_size());
//   auto eng = zoe::Engine::create(*rt, cfg.value());
//   eng->add_module("block.0", {{"w", {d, d}}, {"b", {d}}});   ...
//   eng->initialize(init_fn);
//   for each step: for each micro-batch:
//       forward:  for m in order:    p = eng->fetch(m);  compute;  eng->release(m);
//       backward: for m in reverse:  p = eng->fetch(m);  g = eng->grads(m); write g;
//                                    eng->reduce_grads(m);  eng->release(m);
//     stats = eng->step();
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zoe/status.h"

namespace zoe {

namespace config {
struct Config;
}
namespace comm {
class Communicator;
}
namespace device {
class Device;
}

// Process-wide setup: the communicator (MPI under a launcher, else one local rank).
class Runtime {
 public:
  // Under mpirun/srun: MpiComm; otherwise LocalComm. force_local ignores the launcher.
  static Result<std::unique_ptr<Runtime>> init(bool force_local = false);
  ~Runtime();
  int rank() const;
  int world_size() const;
  comm::Communicator& comm() const { return *comm_; }

 private:
  Runtime() = default;
  std::unique_ptr<comm::Communicator> comm_;
};

enum class ComputeDType : uint8_t { kF32, kBF16, kF16 };

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// A module's parameters as the compute sees them: full (gathered) tensors on the device, in
// the compute dtype (fp32, or bf16/fp16 with mixed precision).
struct ModuleParams {
  ComputeDType dtype = ComputeDType::kF32;
  std::vector<void*> data;      // one per ParamSpec, in registration order
  std::vector<size_t> numel;
};

struct StepStats {
  int64_t step = 0;             // optimizer steps taken so far
  bool skipped = false;         // fp16 overflow: no update, loss scale lowered
  double grad_norm = 0.0;       // of the averaged, unscaled gradients (before clipping)
  double loss_scale = 1.0;      // the scale for the next step
  double lr = 0.0;              // used by this step
  // Seconds since the previous step() (or initialize()): time in each part of the engine.
  double t_compute = 0.0;       // outside engine calls (the caller's forward/backward)
  double t_comm = 0.0;          // waiting for collectives
  double t_io_stall = 0.0;      // waiting for parameters to arrive from host/NVMe
  double t_optimizer = 0.0;     // the caller waiting for the optimizer: the step itself (norm, and the
                                // update unless it is overlapped) and fetches waiting for an update
  double t_update_overlapped = 0.0;  // the previous step's update on its own thread, behind this
                                     // step's forward (zoe.overlap_step); 0 when serial
  // High-water marks, bytes: device, host, nvme.
  uint64_t high_water[3] = {0, 0, 0};
  // Bytes moved since initialize(): NVMe reads and writes (every tier's), host -> device and
  // device -> host (parameter partitions, including those streamed from/to NVMe).
  uint64_t bytes_nvme_read = 0, bytes_nvme_write = 0, bytes_host_to_device = 0, bytes_device_to_host = 0;
  // Stage 3, since the previous step(): fetches whose all-gather prefetch had already queued
  // (following the recorded fetch order), and fetches that had to gather on the spot.
  uint64_t gathers_prefetched = 0, gathers_on_demand = 0;
};

// Bytes in use now, per tier (not high-water marks).
struct MemoryUse {
  uint64_t device = 0;             // all device memory the engine holds
  uint64_t device_partitions = 0;  // of which the tier manager's stage-3 partitions (homes and cached copies)
  uint64_t host = 0;               // offloaded states, swapper and staging buffers, partitions in host RAM
  uint64_t nvme = 0;               // swap space allocated
  uint64_t partition_pins = 0;     // stage-3 partitions pinned: 0 between the caller's calls
};

class Engine {
 public:
  // Builds the device (CPU backend, or CUDA when asked and present), tiers and I/O from cfg.
  static Result<std::unique_ptr<Engine>> create(Runtime& rt, const config::Config& cfg);
  ~Engine();

  // Modules in forward order; each becomes one flat group, partitioned over the ranks.
  Status add_module(const std::string& name, const std::vector<ParamSpec>& params);
  // Fills every parameter (fp32; the same on every rank), places all states in their tiers.
  // init(module_index, param_index, data, numel).
  Status initialize(const std::function<void(size_t, size_t, float*, size_t)>& init);

  size_t num_modules() const;
  const std::string& module_name(size_t m) const;
  ComputeDType compute_dtype() const;
  // The current loss scale (fp16; 1 otherwise): multiply the loss gradient by it.
  double loss_scale() const;

  // Gathers module m's parameters on the device (stage 3: from wherever they live; prefetching
  // the next modules of the recorded order). Valid until release(m).
  Result<ModuleParams> fetch(size_t m);
  Status release(size_t m);
  // A zeroed device buffer per parameter, in the compute dtype, for module m's gradients of
  // this micro-batch (loss scale included). Valid until reduce_grads(m).
  Result<ModuleParams> grads(size_t m);
  // Reduces module m's gradients over the ranks into this rank's partition (reduce-scatter at
  // stage 2/3, all-reduce at 0/1), accumulating over micro-batches, and frees the buffer.
  Status reduce_grads(size_t m);
  // Norm, loss scaling, clipping and AdamW over this rank's partitions wherever they live,
  // then the new parameters back to their home (and gathered at stage 1/2).
  Result<StepStats> step();

  // The full fp32 master values of parameter p of module m (gathered from every rank).
  Status read_master(size_t m, size_t p, float* out);

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
  Result<std::string> load(const std::string& dir);
  int64_t steps_taken() const;

  // Bytes of model state per rank: compute parameters, gradients and optimizer states.
  uint64_t model_state_bytes() const;
  uint64_t device_budget_bytes() const;
  MemoryUse memory_in_use() const;
  uint64_t num_params() const;
  // Writes the Chrome-trace timeline of transfers and optimizer chunks recorded so far.
  Status write_trace(const std::string& path) const;
  void enable_trace(bool on);
  // Adds a compute span (the caller's kernels) to the same timeline.
  void record_compute(const std::string& name, uint64_t begin_ns, uint64_t end_ns);

  struct Impl;  // internal (src/zero/engine_impl.h)

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe
