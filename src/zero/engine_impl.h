// The engine's internal state, shared by its parts (declarations only; the logic lives in them):
//   engine.cpp             creation, modules, initialize() (executes a Placement), teardown
//   placement.{h,cpp}      the pure placement planner
//   engine_fetch.cpp       parameter fetch/release, stage-3 gathers and their prefetch
//   engine_grads.cpp       gradient buffers, reduction, accumulation (with the norm)
//   engine_step.cpp        the optimizer step: norm, loss scale, clipping, AdamW, write-back
//   engine_checkpoint.cpp  save/load glue to src/checkpoint
#pragma once

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/trace.h"
#include "device/device.h"
#include "device/device_buffer.h"
#include "io/buffer.h"
#include "io/io_engine.h"
#include "io/swap_file.h"
#include "offload/optimizer_swapper.h"
#include "offload/swap_store.h"
#include "offload/tier_manager.h"
#include "optim/adam.h"
#include "zero/device_ops.h"
#include "zero/loss_scaler.h"
#include "zero/placement.h"
#include "zoe/engine.h"

namespace zoe::zero {

// The one place the public ComputeDType (zoe/dtype.h) and the internal DType (core/dtype.h) meet:
// the same numeric values, so the mapping is a cast.
static_assert(static_cast<int>(ComputeDType::kF32) == static_cast<int>(DType::kF32) &&
                  static_cast<int>(ComputeDType::kF16) == static_cast<int>(DType::kF16) &&
                  static_cast<int>(ComputeDType::kBF16) == static_cast<int>(DType::kBF16),
              "ComputeDType and DType must keep the same values");
constexpr ComputeDType public_dtype(DType d) { return static_cast<ComputeDType>(d); }
constexpr DType internal_dtype(ComputeDType d) { return static_cast<DType>(d); }

inline comm::CommType to_comm(DType d) {
  return d == DType::kF32    ? comm::CommType::kF32
         : d == DType::kBF16 ? comm::CommType::kBF16
                             : comm::CommType::kF16;
}

// dst (compute dtype) = src (fp32), round to nearest even.
inline void store_compute(void* dst, const float* src, DType dt, size_t n) {
  if (dt == DType::kF32) {
    memcpy(dst, src, n * 4);
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = dt == DType::kBF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
}

// Adds the seconds of its lifetime to *acc.
struct Timer {
  explicit Timer(double* acc) : acc_(acc), t0_(now_ns()) {}
  ~Timer() { *acc_ += static_cast<double>(now_ns() - t0_) * 1e-9; }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  double* acc_;
  uint64_t t0_;
};

}  // namespace zoe::zero

namespace zoe {

struct Engine::Impl {
  struct Module {
    std::string name;
    std::vector<ParamSpec> specs;
    std::vector<size_t> numel, offset;
    size_t total = 0, padded = 0, part = 0;  // from the placement
    bool partitioned_params = false;         // stage 3 and not persistent
    // Device: the full compute parameters (stage 0-2 and persistent modules), or the gather.
    device::DeviceBuffer full;
    bool fetched = false;
    // Stage 3: a gather queued ahead of fetch() (prefetch), into `full` from `gather_send`.
    bool gather_pending = false;
    comm::CommHandle gather;
    device::DeviceBuffer gather_send;  // this rank's partition, copied for the gather
    Status gather_error;               // set on the communicator's thread if the partition could not be read
    uint64_t gather_begin_ns = 0;      // when the queued gather was started (for the timeline)
    device::DeviceBuffer grad_buf;     // padded elements, compute dtype
    size_t opt_begin = 0, opt_n = 0;   // the flat range this rank's optimizer owns
    // Where this module's optimizer states and accumulated gradients live: the device (kNone),
    // host RAM (kCpu) or NVMe (kNvme, as swapper group `module index`).
    config::OffloadDevice opt_home = config::OffloadDevice::kNone;
    // Views of the states: device memory (owned by dev_states) or host memory (Impl::host_bufs).
    void* master = nullptr;  // fp32
    void* exp_avg = nullptr;
    void* exp_avg_sq = nullptr;
    float* grad_acc = nullptr;  // fp32, opt_n elements; NVMe: swapper state kGradState
    device::DeviceBuffer dev_states[4];
    int acc_count = 0;  // micro-batch reductions accumulated since the last step
    // Sum of squares of the accumulated gradients per optim::kChunkElems chunk of the owned
    // range, computed by the pass that accumulates them (the step makes no norm pass).
    std::vector<double> norm_parts;
    // zoe.speculative_step (states in host RAM): this step's update already ran during the
    // backward, as if the step neither clips nor overflows. spec_save holds master, m and v from
    // before it; spec_out its new compute parameters (the owned range), written home by the step
    // once the norm confirms the speculation.
    bool speculated = false;
    void* spec_save = nullptr;
    void* spec_out = nullptr;
  };
  // Swapper state indices of an NVMe-offloaded module.
  static constexpr size_t kMasterState = 0, kAvgState = 1, kAvgSqState = 2, kGradState = 3;
  // A reduction in flight: its buffers live until it has been accumulated.
  struct Pending {
    size_t m = 0;
    comm::CommHandle h;
    device::DeviceBuffer send;  // the module's gradient buffer (or its bucket-packed copy)
    device::DeviceBuffer recv;  // the reduced gradients
    size_t recv_offset = 0;     // first element of this rank's range inside recv
  };

  Runtime* rt = nullptr;
  comm::Communicator* comm = nullptr;   // host buffers (the runtime's: MPI or local)
  comm::Communicator* dcomm = nullptr;  // device buffers: `comm` on the CPU device, NCCL on CUDA
  int rank = 0, world = 1;
  std::unique_ptr<config::Config> cfg;
  DType cdt = DType::kF32;
  int stage = 0;
  config::OffloadDevice opt_off = config::OffloadDevice::kNone, param_off = config::OffloadDevice::kNone;

  std::unique_ptr<device::Device> dev;
  // Destroyed before the device (members go in reverse order): the collectives' stream, created
  // by the device, and the device-buffer communicator (NCCL) that runs on it.
  std::unique_ptr<device::Stream> comm_stream;
  std::unique_ptr<comm::Communicator> own_dcomm;
  std::unique_ptr<zero::DeviceOps> ops;  // copies and kernels on device memory
  std::vector<char> host_stage;          // device -> host staging (when device memory is not host memory)
  std::unique_ptr<io::IoEngine> io;
  std::unique_ptr<io::SwapFile> swap;
  std::unique_ptr<offload::SwapStore> store;
  std::unique_ptr<offload::TierManager> tm;
  std::unique_ptr<offload::OptimizerSwapper> swapper;
  std::unique_ptr<optim::CpuPool> pool;
  TraceRecorder trace;
  std::vector<io::AlignedBuffer> host_bufs;  // cpu-offloaded optimizer states and gradients
  uint64_t host_bytes = 0;
  std::vector<float> grad_stage;  // one swapper chunk: NVMe gradient accumulation goes through it
  // This step's last micro-batch has begun accumulating: the swapper is reading the next update's
  // first chunks (preload), and their gradients go straight into its slots.
  bool preload_started = false;

  zero::Placement placement;  // what initialize() executed
  std::vector<Module> modules;
  bool initialized = false;
  std::deque<Pending> pending;
  zero::LossScaler scaler;
  int64_t steps = 0;
  std::vector<size_t> order;  // fetch order recorded in the first iteration
  bool recording = true;
  size_t cursor = 0;
  size_t live_elems = 0;
  size_t gather_window = 0;  // elements of gathered modules prefetch may queue ahead of use
  // The step's NVMe partition write-backs in flight (at most kMaxWritebacks; the tier manager's
  // host budget bounds the memory they hold).
  static constexpr size_t kMaxWritebacks = 4;
  std::deque<offload::MoveHandle> writebacks;
  void wait_writebacks() {
    for (auto& h : writebacks) (void)h.wait();  // a failure keeps its dirty copy: drain() reports it
    writebacks.clear();
  }

  // An asynchronous checkpoint: written by save_thread, committed by finish_save().
  struct AsyncSave {
    std::thread thread;
    std::string save_dir, tag, tmp, trainer;
    int64_t steps = 0;
    Status status;  // of the background write
    std::vector<char> records_json;
  };
  std::unique_ptr<AsyncSave> async_save;

  // The optimizer update of the last step, running behind the caller's next forward (zoe.overlap_step).
  // Its thread updates the modules in forward order and marks each one done once its compute
  // parameters are home; fetch(m) waits for done[m] only. The thread touches no collective: the
  // all-gather of an updated persistent module's partition (stage 1/2) is run by the caller's
  // thread at the module's next fetch (or at the next sync point), in the same order on every rank.
  struct Update {
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<uint8_t> done;   // per module, guarded by mu
    bool running = false;        // a thread was started and not joined (caller's thread only)
    Status status;               // of the update (guarded by mu)
    double t_opt = 0, t_io = 0;  // seconds on the update's thread (read after join)
  };
  Update update;
  std::vector<uint8_t> gather_owed;  // persistent modules whose updated partitions are not gathered yet
  std::unique_ptr<optim::CpuPool> update_pool;  // the update's own threads (CpuPool is one call at a time)
  std::unique_ptr<zero::DeviceOps> update_ops;  // kernels and copies of the update's thread
  double t_opt_overlapped = 0;                  // the previous update's time on its thread

  // Per-step timing.
  double t_comm = 0, t_io = 0, t_opt = 0, t_engine = 0;
  uint64_t gathers_prefetched = 0, gathers_on_demand = 0;
  // The link counters at the previous step() (NVMe read, NVMe write, host->device, device->host).
  uint64_t last_link_bytes[4] = {0, 0, 0, 0};
  uint64_t last_step_ns = 0;

  size_t esize() const { return dtype_size(cdt); }

  // engine.cpp: memory and setup.
  ModuleParams views(const Module& mod, void* flat) const;  // per-parameter views of a flat buffer
  Result<device::DeviceBuffer> dalloc(size_t bytes);        // zeroed device memory
  Result<void*> halloc(size_t bytes);                       // zeroed host memory, kept in host_bufs
  void free_device_memory();                                // before the device goes away
  Status setup_io();
  Status setup_tiers();
  Status place_module(size_t m, const std::function<void(size_t, size_t, float*, size_t)>& init);

  // engine_fetch.cpp: parameters.
  void owned_range(const Module& mod, size_t* begin, size_t* n) const;
  // Where the compute params of module m's owned range are written after the update. Stage-3
  // partitions: pinned in the tier manager until unpin_owned(). t_io_acc: the caller's stall clock.
  Result<void*> owned_compute(size_t m, double* t_io_acc);
  // Whether owned_compute(m) is device memory (else pinned host memory of the host tier).
  bool owned_on_device(size_t m) const;
  Status unpin_owned(size_t m, double* t_io_acc);
  // Stage 1/2 (and persistent stage-3 modules): all-gathers the updated partition into mod.full.
  Status gather_updated(size_t m);

  // engine_step.cpp: the update.
  bool update_done(size_t m);            // module m's update (if one runs) is done; never blocks
  Status wait_module_updated(size_t m);  // blocks until it is; the update's error if it failed
  // Joins the update and runs the gathers it left owed (in module order): a sync point (step,
  // save, load, read_master, destruction). Returns the update's error.
  Status finish_update();
  // Joins the update without any collective (safe at points whose timing differs across ranks).
  Status join_update();
  Status update_error;  // a failed overlapped update: every later sync point returns it
  Status start_gather(size_t m);
  Status finish_gather(size_t m);
  Status discard_gathers();
  Status follow_order(size_t m);
  Status prefetch_after(size_t m);

  // engine_grads.cpp: gradients.
  Result<const void*> host_view(const void* dsrc, size_t bytes);
  // Accumulates finished reductions (all: waits for each) until at most `keep` are in flight.
  Status complete_pending(bool all, size_t keep = 0);
  Status accumulate_grads(size_t m, const void* src);
  Status zero_grads(size_t m);

  // engine_step.cpp: zoe.speculative_step. speculate(m) updates module m (states in host RAM, its
  // gradients final) with the step's scale if it will neither clip nor overflow (spec_scale) and
  // keeps its compute parameters in spec_out; unspeculate(m) puts its saved states back (also
  // before anything reads the states: read_master, a checkpoint, another accumulation).
  Status speculate(size_t m);
  void unspeculate(size_t m);
  void unspeculate_all();
  float spec_scale = 0.0f;
  uint64_t spec_kept = 0, spec_undone = 0;  // this step's modules (StepStats)
};

}  // namespace zoe
