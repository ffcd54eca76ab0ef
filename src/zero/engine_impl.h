// The engine's internal state, shared by engine.cpp (training) and engine_checkpoint.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/trace.h"
#include "core/units.h"
#include "device/device.h"
#include "io/io_engine.h"
#include "io/swap_file.h"
#include "offload/optimizer_swapper.h"
#include "offload/swap_store.h"
#include "offload/tier_manager.h"
#include "optim/adam.h"
#include "zero/device_ops.h"
#include "zero/loss_scaler.h"
#include "zoe/engine.h"

namespace zoe {

using config::OffloadDevice;
using offload::Tier;

namespace zero_detail {

// Partitions hold a whole number of 4 KiB blocks in every dtype (O_DIRECT swapping).
inline constexpr size_t kPartAlign = 2048;

inline comm::CommType to_comm(DType d) {
  return d == DType::kF32 ? comm::CommType::kF32 : d == DType::kBF16 ? comm::CommType::kBF16 : comm::CommType::kF16;
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

struct Timer {
  explicit Timer(double* acc) : acc_(acc), t0_(now_ns()) {}
  ~Timer() { *acc_ += static_cast<double>(now_ns() - t0_) * 1e-9; }
  double* acc_;
  uint64_t t0_;
};

}  // namespace zero_detail

using namespace zero_detail;  // NOLINT(google-build-using-namespace): internal to src/zero

struct Engine::Impl {
  struct Module {
    std::string name;
    std::vector<ParamSpec> specs;
    std::vector<size_t> numel, offset;
    size_t total = 0, padded = 0, part = 0;
    bool partitioned_params = false;  // stage 3 and not persistent
    size_t stage_opt_n(int st) const { return st == 0 ? padded : part; }
    void* full = nullptr;             // device: full compute params (stage 0-2, persistent) or the gather
    bool fetched = false;
    // Stage 3: a gather queued ahead of fetch() (prefetch), into `full` from `gather_send`.
    bool gather_pending = false;
    comm::CommHandle gather;
    void* gather_send = nullptr;      // device: this rank's partition, copied for the gather
    Status gather_error;              // set on the communicator's thread if the partition could not be read
    void* grad_buf = nullptr;         // device, padded elements, compute dtype
    size_t opt_begin = 0, opt_n = 0;  // the flat range this rank's optimizer owns
    // Where this module's optimizer states and accumulated gradients live: the device (kNone),
    // host RAM (kCpu) or NVMe (kNvme, as swapper group `module index`). With a partial
    // offload ratio some modules stay on the device while others are offloaded.
    OffloadDevice opt_home = OffloadDevice::kNone;
    void* master = nullptr;           // fp32; device or host (none / cpu offload)
    void* exp_avg = nullptr;
    void* exp_avg_sq = nullptr;
    float* grad_acc = nullptr;        // fp32, opt_n elements, device or host; NVMe: swapper state kGradState
    int acc_count = 0;                // micro-batch reductions accumulated since the last step
    // Sum of squares of the accumulated gradients per optim::kChunkElems chunk of the owned
    // range, computed by the pass that accumulates them (the step makes no norm pass).
    std::vector<double> norm_parts;
  };
  // Swapper state indices of an NVMe-offloaded module.
  static constexpr size_t kMasterState = 0, kAvgState = 1, kAvgSqState = 2, kGradState = 3;
  struct Pending {
    size_t m;
    comm::CommHandle h;
    void* send;  // the module's gradient buffer, freed once the collective is done
    void* recv;  // the reduced gradients (device), freed after accumulation
    size_t recv_offset;  // first element of this rank's range inside recv
  };

  Runtime* rt = nullptr;
  comm::Communicator* comm = nullptr;   // host buffers (the runtime's: MPI or local)
  comm::Communicator* dcomm = nullptr;  // device buffers: `comm` on the CPU device, NCCL on CUDA
  std::unique_ptr<comm::Communicator> own_dcomm;
  int rank = 0, world = 1;
  std::unique_ptr<config::Config> cfg;
  DType cdt = DType::kF32;
  int stage = 0;
  OffloadDevice opt_off = OffloadDevice::kNone, param_off = OffloadDevice::kNone;

  std::unique_ptr<device::Device> dev;
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

  std::vector<Module> modules;
  bool initialized = false;
  std::deque<Pending> pending;
  zero::LossScaler scaler;
  int64_t steps = 0;
  std::vector<size_t> order;  // fetch order recorded in the first iteration
  bool recording = true;
  size_t cursor = 0;
  size_t live_elems = 0;
  size_t gather_window = 0;   // elements of gathered modules prefetch may queue ahead of use

  // An asynchronous checkpoint: written by save_thread, committed by finish_save().
  struct AsyncSave {
    std::thread thread;
    std::string save_dir, tag, tmp, trainer;
    int64_t steps = 0;
    Status status;  // of the background write
    std::vector<char> records_json;
  };
  std::unique_ptr<AsyncSave> async_save;

  // Per-step timing.
  double t_comm = 0, t_io = 0, t_opt = 0, t_engine = 0;
  uint64_t gathers_prefetched = 0, gathers_on_demand = 0;
  uint64_t last_step_ns = 0;

  size_t esize() const { return dtype_size(cdt); }

  // Per-parameter views of a module-sized flat buffer (parameters or gradients).
  ModuleParams views(const Module& mod, void* flat) const {
    ModuleParams out;
    out.dtype = cdt == DType::kF32 ? ComputeDType::kF32 : cdt == DType::kBF16 ? ComputeDType::kBF16 : ComputeDType::kF16;
    for (size_t p = 0; p < mod.specs.size(); ++p) {
      out.data.push_back(static_cast<char*>(flat) + mod.offset[p] * esize());
      out.numel.push_back(mod.numel[p]);
    }
    return out;
  }

  Result<void*> dalloc(size_t bytes) {
    auto r = dev->allocate(bytes);
    if (!r.is_ok()) return r.status().with_context("allocating device memory");
    Status z = ops->zero(r.value(), bytes);
    if (!z.is_ok()) {
      dev->free(r.value());
      return z;
    }
    return r.value();
  }

  // Frees every device allocation the engine still holds (before the device goes away).
  void free_device_memory() {
    for (auto& p : pending) {
      dev->free(p.send);
      dev->free(p.recv);
    }
    pending.clear();
    for (auto& mod : modules) {
      for (void** p : {&mod.full, &mod.grad_buf, &mod.gather_send}) {
        if (*p) dev->free(*p);
        *p = nullptr;
      }
      if (mod.opt_home == OffloadDevice::kNone) {
        for (void* p : {mod.master, mod.exp_avg, mod.exp_avg_sq, static_cast<void*>(mod.grad_acc)}) {
          if (p) dev->free(p);
        }
        mod.master = mod.exp_avg = mod.exp_avg_sq = nullptr;
        mod.grad_acc = nullptr;
      }
    }
  }

  Result<void*> halloc(size_t bytes) {
    auto pin = cfg->zero.offload_optimizer.pin_memory ? io::PinMode::kDevice : io::PinMode::kNone;
    ZOE_ASSIGN_OR_RETURN(io::AlignedBuffer b, io::AlignedBuffer::allocate(bytes, pin));
    memset(b.data(), 0, bytes);
    host_bytes += bytes;
    void* p = b.data();
    host_bufs.push_back(std::move(b));
    return p;
  }

  Status setup_io() {
    std::vector<std::string> dirs;
    auto add_dirs = [&](const config::OffloadConfig& o) {
      if (o.device != OffloadDevice::kNvme) return;
      for (const auto& d : o.nvme_path) {
        if (std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
      }
    };
    add_dirs(cfg->zero.offload_optimizer);
    add_dirs(cfg->zero.offload_param);
    if (dirs.empty()) return Status::ok();
    io::IoEngineOptions eo;
    eo.queue_depth = static_cast<uint32_t>(std::max<int64_t>(1, cfg->aio.queue_depth));
    eo.block_size = static_cast<size_t>(std::max<int64_t>(4096, cfg->aio.block_size / 4096 * 4096));
    ZOE_ASSIGN_OR_RETURN(io, io::IoEngine::create(eo));
    io::SwapFileOptions so;
    so.dirs = dirs;
    so.name = "zoe-swap-r" + std::to_string(rank) + "-" + std::to_string(getpid());
    ZOE_ASSIGN_OR_RETURN(swap, io::SwapFile::create(so));
    (void)swap->register_files(*io);
    store = std::make_unique<offload::SwapStore>(swap.get(), io.get(), 0);
    return Status::ok();
  }

  // The flat range [begin, begin+n) of module m this rank's optimizer owns.
  void owned_range(const Module& mod, size_t* begin, size_t* n) const {
    if (stage == 0) {
      *begin = 0;
      *n = mod.padded;
    } else {
      *begin = static_cast<size_t>(rank) * mod.part;
      *n = mod.part;
    }
  }

  // Where the compute params of module m's owned range are written after the update.
  // Stage 3 partitions: pinned in the tier manager until unpin_owned().
  Result<void*> owned_compute(size_t m) {
    Module& mod = modules[m];
    if (!mod.partitioned_params) return static_cast<char*>(mod.full) + mod.opt_begin * esize();
    Tier t = param_off == OffloadDevice::kNone ? Tier::kDevice : Tier::kHost;
    uint64_t t0 = now_ns();
    auto p = tm->fetch(m, t).wait();
    t_io += static_cast<double>(now_ns() - t0) * 1e-9;
    return p;
  }
  // Whether owned_compute(m) is device memory (else pinned host memory of the host tier).
  bool owned_on_device(size_t m) const { return !modules[m].partitioned_params || param_off == OffloadDevice::kNone; }
  // Host-readable view of `bytes` of device memory: the memory itself on the CPU device, else
  // a copy in host_stage (valid until the next call).
  Result<const void*> host_view(const void* dsrc, size_t bytes) {
    if (ops->host_addressable()) return dsrc;
    host_stage.resize(bytes);
    ZOE_RETURN_IF_ERROR(ops->to_host(host_stage.data(), dsrc, bytes));
    return static_cast<const void*>(host_stage.data());
  }
  void unpin_owned(size_t m) {
    Module& mod = modules[m];
    if (!mod.partitioned_params) return;
    Tier t = param_off == OffloadDevice::kNone ? Tier::kDevice : Tier::kHost;
    tm->unpin(m, t, /*dirty=*/true);
    if (param_off == OffloadDevice::kNvme) (void)tm->evict(m, Tier::kHost);  // write back, free RAM
  }

  Status complete_pending(bool all) {
    while (!pending.empty()) {
      Pending& p = pending.front();
      if (!all && !p.h.ready()) break;
      {
        Timer t(&t_comm);
        ZOE_RETURN_IF_ERROR_CTX(p.h.wait(), "reducing the gradients of module " + modules[p.m].name);
      }
      Module& mod = modules[p.m];
      Status s = accumulate_grads(p.m, static_cast<char*>(p.recv) + p.recv_offset * esize());
      if (!s.is_ok()) return s.with_context("accumulating the gradients of module " + mod.name);
      dev->free(p.send);
      dev->free(p.recv);
      pending.pop_front();
    }
    return Status::ok();
  }

  // Adds this micro-batch's reduced gradients of the owned range (compute dtype) to module m's
  // accumulator wherever it lives, computing the norm of the sum in the same pass. NVMe: one
  // swapper chunk at a time (read the sum so far unless this is the first micro-batch, add,
  // write back), so host memory stays one chunk whatever the model size.
  Status accumulate_grads(size_t m, const void* src) {
    Module& mod = modules[m];
    optim::Exec exec;
    exec.pool = pool.get();
    const bool first = mod.acc_count == 0;
    mod.norm_parts.resize(optim::norm_chunks(mod.opt_n));
    if (mod.opt_home == OffloadDevice::kNone) {
      // The accumulator lives on the device too: the device's kernel.
      ZOE_RETURN_IF_ERROR(ops->accumulate_with_norm(mod.grad_acc, src, cdt, mod.opt_n, first, mod.norm_parts.data()));
    } else if (mod.opt_home == OffloadDevice::kCpu) {
      ZOE_ASSIGN_OR_RETURN(const void* h, host_view(src, mod.opt_n * esize()));
      ZOE_RETURN_IF_ERROR(
          optim::accumulate_with_norm(mod.grad_acc, h, cdt, mod.opt_n, first, mod.norm_parts.data(), exec));
    } else {
      Timer t(&t_io);
      const size_t chunk = swapper->chunk_elems();
      ZOE_CHECK(chunk % optim::kChunkElems == 0);
      grad_stage.resize(chunk);
      for (size_t b = 0; b < mod.opt_n; b += chunk) {
        const size_t n = std::min(chunk, mod.opt_n - b);
        if (!first) ZOE_RETURN_IF_ERROR(swapper->read_state(m, kGradState, grad_stage.data(), b, n));
        ZOE_ASSIGN_OR_RETURN(const void* h, host_view(static_cast<const char*>(src) + b * esize(), n * esize()));
        ZOE_RETURN_IF_ERROR(optim::accumulate_with_norm(grad_stage.data(), h, cdt, n, first,
                                                        mod.norm_parts.data() + b / optim::kChunkElems, exec));
        ZOE_RETURN_IF_ERROR(swapper->write_state(m, kGradState, grad_stage.data(), b, n));
      }
    }
    mod.acc_count++;
    return Status::ok();
  }

  // A module no micro-batch reduced gradients for this step: zero gradients, zero norm.
  Status zero_grads(size_t m) {
    Module& mod = modules[m];
    mod.norm_parts.assign(optim::norm_chunks(mod.opt_n), 0.0);
    if (mod.opt_home == OffloadDevice::kNone) return ops->zero(mod.grad_acc, mod.opt_n * 4);
    if (mod.opt_home == OffloadDevice::kCpu) {
      memset(mod.grad_acc, 0, mod.opt_n * 4);
      return Status::ok();
    }
    const size_t chunk = swapper->chunk_elems();
    grad_stage.assign(chunk, 0.0f);
    for (size_t b = 0; b < mod.opt_n; b += chunk) {
      ZOE_RETURN_IF_ERROR(swapper->write_state(m, kGradState, grad_stage.data(), b, std::min(chunk, mod.opt_n - b)));
    }
    return Status::ok();
  }

  // Queues the gather of module m's parameters ahead of its fetch: device buffers for the
  // gathered module and a copy of this rank's partition; on the communicator's stream, a host
  // task reads the partition's latest bytes into that copy (from whichever tier holds them),
  // then the all-gather runs. Every rank queues the same gathers in the same order (the decisions depend
  // only on the recorded fetch order and the config), so the collectives line up.
  Status start_gather(size_t m) {
    Module& mod = modules[m];
    const size_t es = esize();
    ZOE_ASSIGN_OR_RETURN(mod.full, dalloc(mod.padded * es));
    auto send = dalloc(mod.part * es);
    if (!send.is_ok()) {
      dev->free(mod.full);
      mod.full = nullptr;
      return send.status();
    }
    mod.gather_send = send.value();
    mod.gather_error = Status::ok();
    // (Only on host-memory devices with a host communicator: gather_window is 0 otherwise.)
    dcomm->enqueue_host_task([this, m]() -> Status {
      Module& md = modules[m];
      // A read, not a pinning fetch: a pin held here could wait for room in the device tier
      // while the caller holds that room for a gather queued behind this task.
      Status s = tm->read(m, md.gather_send);
      // The gather after this task runs anyway, so this rank stays in step with the others;
      // fetch() reports the error.
      if (!s.is_ok()) md.gather_error = s.with_context("reading the partition of module " + md.name);
      return Status::ok();
    });
    mod.gather = dcomm->all_gather(mod.gather_send, mod.full, mod.part, to_comm(cdt));
    mod.gather_pending = true;
    live_elems += mod.padded;
    return Status::ok();
  }

  // Waits for module m's queued gather; its parameters are then in mod.full.
  Status finish_gather(size_t m) {
    Module& mod = modules[m];
    Status s;
    {
      Timer t(&t_comm);
      s = mod.gather.wait();
    }
    dev->free(mod.gather_send);
    mod.gather_send = nullptr;
    mod.gather_pending = false;
    mod.gather = comm::CommHandle();
    if (s.is_ok()) s = mod.gather_error;
    return s.is_ok() ? s : s.with_context("gathering the parameters of module " + mod.name);
  }

  // Drops every queued gather (the fetch order changed, or the parameters are about to).
  Status discard_gathers() {
    Status first;
    for (size_t m = 0; m < modules.size(); ++m) {
      Module& mod = modules[m];
      if (!mod.gather_pending) continue;
      Status s = finish_gather(m);
      if (first.is_ok()) first = s;
      dev->free(mod.full);
      mod.full = nullptr;
      live_elems -= mod.padded;
    }
    return first;
  }

  // At fetch(m) after the first iteration: the recorded order predicts m. When it does not (an
  // evaluation pass, a changed loop), move the cursor to m's next occurrence and drop the
  // gathers queued for the old prediction.
  Status follow_order(size_t m) {
    if (recording || order.empty() || order[cursor] == m) return Status::ok();
    for (size_t k = 1; k < order.size(); ++k) {
      size_t at = (cursor + k) % order.size();
      if (order[at] == m) {
        cursor = at;
        break;
      }
    }
    return discard_gathers();
  }

  Status prefetch_after(size_t m) {
    if (recording || order.empty() || !tm) return Status::ok();
    // 1. Gathers of the next partitioned modules in the recorded order, within the gather window
    //    and stage3_max_live_parameters; never past the end of the order (the step changes the
    //    parameters).
    size_t queued = 0;
    for (const auto& md : modules) queued += md.gather_pending ? md.padded : 0;
    const int64_t cap = cfg->zero.stage3_max_live_parameters;
    for (size_t k = cursor + 1; k < order.size(); ++k) {
      const size_t next = order[k];
      const Module& nm = modules[next];
      if (!nm.partitioned_params || nm.full != nullptr) continue;  // persistent, fetched, or queued
      if (queued + nm.padded > gather_window || static_cast<int64_t>(live_elems + nm.padded) > cap) break;
      Status s = start_gather(next);
      if (!s.is_ok()) {
        // The window was sized to fit the budget; reductions still holding buffers are the only
        // other users. A rank that skipped a gather the others run would fall out of step, so
        // there is no skipping: wait for them, retry, else fail.
        ZOE_RETURN_IF_ERROR(complete_pending(true));
        s = start_gather(next);
        if (!s.is_ok()) {
          return s.with_context("prefetching the parameters of module " + nm.name +
                                " (lower zero_optimization.stage3_prefetch_bucket_size or raise zoe.device_budget)");
        }
      }
      queued += nm.padded;
    }
    // 2. Partitions further ahead move towards the device, up to the prefetch bucket size; not
    //    past the order's end either (the step rewrites every partition).
    int64_t budget = cfg->zero.stage3_prefetch_bucket_size;
    for (size_t k = cursor + 1; k < order.size() && budget > 0; ++k) {
      size_t next = order[k];
      if (next == m) continue;
      const Module& nm = modules[next];
      if (!nm.partitioned_params || nm.full != nullptr) continue;
      tm->prefetch(next, Tier::kDevice);
      budget -= static_cast<int64_t>(nm.part);
    }
    return Status::ok();
  }
};

}  // namespace zoe
