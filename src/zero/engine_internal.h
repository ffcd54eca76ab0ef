// The internal side of the public types: what zoe's own layers, tools and tests reach behind
// include/zoe/ (the communicator of a Runtime, the config::Config of a Config, an engine created
// from a config::Config). User code never includes this.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "config/config.h"
#include "zoe/config.h"
#include "zoe/engine.h"
#include "zoe/runtime.h"

namespace zoe {

struct Runtime::Impl {
  std::unique_ptr<comm::Communicator> comm;
};

struct RuntimeAccess {
  static comm::Communicator& comm(const Runtime& rt) { return *rt.impl_->comm; }
};

struct Config::Impl {
  config::Config cfg;
  int world_size = 1;
};

struct ConfigAccess {
  static const config::Config& get(const Config& c) { return c.impl_->cfg; }
  // A public Config holding `cfg` (already validated by config::Config::parse or load).
  static Config wrap(config::Config cfg, int world_size);
};

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
