// The internal side of zoe::Runtime (include/zoe/runtime.h): the host communicator it holds, for
// zoe's own layers, tools and tests (RuntimeAccess). User code never includes this.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "zoe/runtime.h"

namespace zoe {

struct Runtime::Impl {
  std::unique_ptr<comm::Communicator> comm;
};

struct RuntimeAccess {
  static comm::Communicator& comm(const Runtime& rt) { return *rt.impl_->comm; }
};

}  // namespace zoe
