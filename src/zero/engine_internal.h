// The internal side of the public types: what zoe's own layers, tools and tests reach behind
// include/zoe/ (the communicator of a Runtime: comm/runtime_impl.h; the config::Config of a
// Config: config/public_config.h; an engine created from a config::Config). User code never
// includes this.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/runtime_impl.h"
#include "config/config.h"
#include "config/public_config.h"
#include "zoe/config.h"
#include "zoe/engine.h"
#include "zoe/runtime.h"

namespace zoe {

struct EngineAccess {
  static std::unique_ptr<Engine> make(std::unique_ptr<Engine::Impl> impl);  // engine.cpp
};

namespace zero {

// The runtime's host communicator (MPI or local).
inline comm::Communicator& runtime_comm(const Runtime& rt) { return RuntimeAccess::comm(rt); }
// Engine::create from the internal config (zoe's own tests and tools).
Result<std::unique_ptr<Engine>> create_engine(Runtime& rt, const config::Config& cfg);
// The host memory the engine plans each rank's buffers with (PlanTarget::host_memory): this
// host's memory over the job's ranks.
uint64_t engine_host_memory(int world);

}  // namespace zero
}  // namespace zoe
