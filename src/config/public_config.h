// The internal side of zoe::Config (include/zoe/config.h): the validated config::Config it holds,
// for zoe's own layers, tools and tests (ConfigAccess). User code never includes this.
#pragma once

#include "config/config.h"
#include "zoe/config.h"

namespace zoe {

struct Config::Impl {
  config::Config cfg;
  int world_size = 1;
};

struct ConfigAccess {
  static const config::Config& get(const Config& c) { return c.impl_->cfg; }
  // A public Config holding `cfg` (already validated by config::Config::parse or load).
  static Config wrap(config::Config cfg, int world_size);
};

}  // namespace zoe
