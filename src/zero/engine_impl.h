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

// acc[i] += float(g[i]) for a gradient in the compute dtype.
inline void accumulate(float* acc, const void* g, DType dt, size_t n) {
  switch (dt) {
    case DType::kF32: {
      const auto* s = static_cast<const float*>(g);
      for (size_t i = 0; i < n; ++i) acc[i] += s[i];
      break;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(g);
      for (size_t i = 0; i < n; ++i) acc[i] += bf16_to_f32(s[i]);
      break;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(g);
      for (size_t i = 0; i < n; ++i) acc[i] += f16_to_f32(s[i]);
      break;
    }
  }
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
    void* grad_buf = nullptr;         // device, padded elements, compute dtype
    size_t opt_begin = 0, opt_n = 0;  // the flat range this rank's optimizer owns
    void* master = nullptr;           // fp32; device or host (none / cpu offload)
    void* exp_avg = nullptr;
    void* exp_avg_sq = nullptr;
    float* grad_acc = nullptr;        // fp32, opt_n elements, device or host
  };
  struct Pending {
    size_t m;
    comm::CommHandle h;
    void* send;  // the module's gradient buffer, freed once the collective is done
    void* recv;  // the reduced gradients (device), freed after accumulation
    size_t recv_offset;  // first element of this rank's range inside recv
  };

  Runtime* rt = nullptr;
  comm::Communicator* comm = nullptr;
  int rank = 0, world = 1;
  std::unique_ptr<config::Config> cfg;
  DType cdt = DType::kF32;
  int stage = 0;
  OffloadDevice opt_off = OffloadDevice::kNone, param_off = OffloadDevice::kNone;

  std::unique_ptr<device::Device> dev;
  std::unique_ptr<io::IoEngine> io;
  std::unique_ptr<io::SwapFile> swap;
  std::unique_ptr<offload::SwapStore> store;
  std::unique_ptr<offload::TierManager> tm;
  std::unique_ptr<offload::OptimizerSwapper> swapper;
  std::unique_ptr<optim::CpuPool> pool;
  TraceRecorder trace;
  std::vector<io::AlignedBuffer> host_bufs;  // cpu-offloaded optimizer states and gradients
  uint64_t host_bytes = 0;

  std::vector<Module> modules;
  bool initialized = false;
  std::deque<Pending> pending;
  zero::LossScaler scaler;
  int64_t steps = 0;
  std::vector<size_t> order;  // fetch order recorded in the first iteration
  bool recording = true;
  size_t cursor = 0;
  size_t live_elems = 0;

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
    memset(r.value(), 0, bytes);  // CpuDevice memory is host memory
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
      for (void** p : {&mod.full, &mod.grad_buf}) {
        if (*p) dev->free(*p);
        *p = nullptr;
      }
      if (opt_off == OffloadDevice::kNone) {
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
      accumulate(mod.grad_acc, static_cast<char*>(p.recv) + p.recv_offset * esize(), cdt, mod.opt_n);
      dev->free(p.send);
      dev->free(p.recv);
      pending.pop_front();
    }
    return Status::ok();
  }

  void prefetch_after(size_t m) {
    if (recording || order.empty() || !tm) return;
    // Follow the recorded order from the current position, up to the prefetch bucket size.
    int64_t budget = cfg->zero.stage3_prefetch_bucket_size;
    for (size_t k = 1; k < order.size() && budget > 0; ++k) {
      size_t next = order[(cursor + k) % order.size()];
      if (next == m) continue;
      const Module& nm = modules[next];
      if (!nm.partitioned_params) continue;
      tm->prefetch(next, Tier::kDevice);
      budget -= static_cast<int64_t>(nm.part);
    }
  }
};

}  // namespace zoe
