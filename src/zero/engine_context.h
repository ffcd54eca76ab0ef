// What every part of the engine reads: the run's shape (rank, world, stage, dtype, config), the
// resources create_engine() and initialize() set up (device, communicators, I/O, the tier
// manager, the optimizer swapper, the CPU pool, the timeline) and the placement. The parts own
// the state that changes as training runs; this holds none of it. Set up by the caller's thread;
// afterwards the parts only read these handles (the objects behind them are thread-safe where
// the overlapped update uses them: the tier manager, the swapper, the update's own ops and pool).
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/trace.h"
#include "device/device.h"
#include "device/device_buffer.h"
#include "io/buffer.h"
#include "io/io_engine.h"
#include "io/swap_file.h"
#include "offload/activation_store.h"
#include "offload/optimizer_swapper.h"
#include "offload/swap_store.h"
#include "offload/tier_manager.h"
#include "optim/adam.h"
#include "zero/device_ops.h"
#include "zero/module_table.h"
#include "zero/placement.h"
#include "zoe/runtime.h"
#include "zoe/tensor.h"

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

struct EngineContext {
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
  std::unique_ptr<DeviceOps> ops;  // the caller's copies and kernels on device memory
  std::unique_ptr<io::IoEngine> io;
  std::unique_ptr<io::SwapFile> swap;
  std::unique_ptr<offload::SwapStore> store;
  std::unique_ptr<offload::TierManager> tm;
  std::unique_ptr<offload::OptimizerSwapper> swapper;
  std::unique_ptr<optim::CpuPool> pool;
  // The activation store (Engine::activations()), made at initialize(); before the device goes.
  std::unique_ptr<ActivationStore> acts;
  offload::ActivationStoreOptions acts_options;  // as initialize() sized it
  TraceRecorder trace;
  // Host memory of cpu-offloaded optimizer states, accumulators and speculative buffers.
  std::vector<io::AlignedBuffer> host_bufs;
  uint64_t host_bytes = 0;
  Placement placement;  // what initialize() executed

  size_t esize() const { return dtype_size(cdt); }
  // The tier a stage-3 partition's owned range is updated in: the device, or the host tier when
  // partitions are offloaded.
  offload::Tier update_tier() const {
    return param_off == config::OffloadDevice::kNone ? offload::Tier::kDevice : offload::Tier::kHost;
  }
  // Zeroed device memory.
  Result<device::DeviceBuffer> dalloc(size_t bytes);
  // Zeroed host memory, kept in host_bufs until the engine goes.
  Result<void*> halloc(size_t bytes);
  // Per-parameter views of a module's flat buffer.
  ModuleParams views(const ModuleLayout& mod, void* flat) const;
};

}  // namespace zoe::zero
