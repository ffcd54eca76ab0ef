// The optimizer swapper's limits that its planner needs without the swapper: the buffers of
// write_state_async() beside the pipeline's slots (so reading ahead never starves them), the
// default and the most a swapper takes (SwapperOptions::async_buffers).
#pragma once

#include <cstddef>

namespace zoe::offload {

inline constexpr size_t kAsyncWriteBuffers = 2;
inline constexpr size_t kMaxAsyncWriteBuffers = 8;

}  // namespace zoe::offload
