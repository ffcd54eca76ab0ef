// The optimizer swapper's limits that its planner needs without the swapper: the buffers of
// write_state_async() beside the pipeline's slots (so reading ahead never starves them), the
// default and the most a swapper takes (SwapperOptions::async_buffers), and the borrowed writes
// in flight.
#pragma once

#include <cstddef>

namespace zoe::offload {

inline constexpr size_t kAsyncWriteBuffers = 2;
inline constexpr size_t kMaxAsyncWriteBuffers = 8;
// write_state_borrowed() writes in flight at once (they take no buffer: the caller's memory is
// written from).
inline constexpr size_t kMaxBorrowedWrites = 16;

}  // namespace zoe::offload
