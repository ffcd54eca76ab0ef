// The engine's resources, owned by Engine::Impl alone: the run's shape and config, the device,
// the communicators, I/O, the tier manager, the optimizer swapper, the CPU pool, the activation
// store, the timeline and the placement. Set up by create_engine() and initialize() on the
// caller's thread. The parts never see this: each is built with the narrow handles it uses
// (part_resources.h and each part's Resources), so each can be built and tested alone.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "core/dtype.h"
#include "core/trace.h"
#include "device/device.h"
#include "io/io_engine.h"
#include "io/swap_file.h"
#include "offload/activation_store.h"
#include "offload/optimizer_swapper.h"
#include "offload/swap_store.h"
#include "offload/tier_manager.h"
#include "optim/adam.h"
#include "zero/device_ops.h"
#include "zero/part_resources.h"
#include "zero/placement.h"
#include "zoe/runtime.h"

namespace zoe::zero {

struct EngineContext {
  Runtime* rt = nullptr;
  comm::Communicator* comm = nullptr;   // host buffers (the runtime's: MPI or local)
  comm::Communicator* dcomm = nullptr;  // device buffers: `comm` on the CPU device, NCCL on CUDA
  RunShape shape;                       // rank, world, stage, compute dtype
  std::unique_ptr<config::Config> cfg;
  offload::Tier opt_off = offload::Tier::kDevice, param_off = offload::Tier::kDevice;

  std::unique_ptr<device::Device> dev;
  // Destroyed before the device (members go in reverse order): the collectives' stream, created
  // by the device, and the device-buffer communicator (NCCL) that runs on it.
  std::unique_ptr<device::Stream> comm_stream;
  std::unique_ptr<comm::Communicator> own_dcomm;
  std::unique_ptr<DeviceOps> ops;     // the caller's copies and kernels on device memory
  std::unique_ptr<DeviceMemory> mem;  // zeroed device memory through ops
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
  Placement placement;  // what initialize() executed
};

}  // namespace zoe::zero
