// Factories of the IoEngine backends (private to io/).
#pragma once

#include <memory>

#include "io/io_engine.h"

namespace zoe::io {

Result<std::unique_ptr<IoEngine>> make_uring_engine(const IoEngineOptions& opts);
Result<std::unique_ptr<IoEngine>> make_thread_engine(const IoEngineOptions& opts);

}  // namespace zoe::io
