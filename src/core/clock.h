// Monotonic time helpers.
#pragma once

#include <cstdint>
#include <ctime>

namespace zoe {

inline uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

inline double now_s() { return static_cast<double>(now_ns()) * 1e-9; }

}  // namespace zoe
