// Helpers of the communicator suites: typed element access, known inputs, wrong-element counts.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "tests/util/status_test_util.h"

namespace zoe::comm::test {

inline constexpr CommType kAllTypes[] = {CommType::kF32, CommType::kBF16, CommType::kF16,
                                         CommType::kF64, CommType::kU8,   CommType::kI64};
inline constexpr size_t kSizes[] = {0, 1, 7, 1000, 100003};

// Element i of a typed buffer as a double, and back (values the type holds exactly).
inline double get(CommType t, const void* buf, size_t i) {
  switch (t) {
    case CommType::kF32:
      return static_cast<const float*>(buf)[i];
    case CommType::kF64:
      return static_cast<const double*>(buf)[i];
    case CommType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(buf)[i]);
    case CommType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(buf)[i]);
    case CommType::kU8:
      return static_cast<const uint8_t*>(buf)[i];
    case CommType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
  }
  return NAN;
}
inline void put(CommType t, void* buf, size_t i, double v) {
  switch (t) {
    case CommType::kF32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case CommType::kF64:
      static_cast<double*>(buf)[i] = v;
      break;
    case CommType::kBF16:
      static_cast<uint16_t*>(buf)[i] = f32_to_bf16(static_cast<float>(v));
      break;
    case CommType::kF16:
      static_cast<uint16_t*>(buf)[i] = f32_to_f16(static_cast<float>(v));
      break;
    case CommType::kU8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v);
      break;
    case CommType::kI64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
  }
}

// Inputs whose sums over up to 8 ranks are exact in every type (bf16 holds integers up to 256).
inline double reduce_input(int rank, size_t i) { return static_cast<double>((rank * 7 + i * 3) % 32); }
// all_gather/broadcast inputs: rank*1000+i where the type holds it, small integers elsewhere.
inline double gather_input(CommType t, int rank, size_t i) {
  if (t == CommType::kF32 || t == CommType::kF64 || t == CommType::kI64)
    return static_cast<double>(rank * 1000 + static_cast<int64_t>(i % 100000));
  return static_cast<double>((rank * 37 + i) % 64);
}

struct Buf {
  Buf(CommType t, size_t n) : type(t), count(n), bytes(n * comm_type_size(t) + 1) {}  // never empty
  void* data() { return bytes.data(); }
  CommType type;
  size_t count;
  std::vector<unsigned char> bytes;
};

// Random finite values of moderate range (not exactly summable): for determinism and reference tests.
inline void fill_random(CommType t, void* buf, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(-4.0, 4.0);
  for (size_t i = 0; i < n; ++i) {
    double v = d(rng);
    if (t == CommType::kU8) v = static_cast<double>(rng() % 256);
    if (t == CommType::kI64) v = static_cast<double>(static_cast<int64_t>(rng() >> 8) - (int64_t{1} << 54));
    put(t, buf, i, v);
  }
}

}  // namespace zoe::comm::test
