// reduce_rows: the ordered, fp32-accumulating host reduction (see reduce.h for the contract).
#include "comm/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "core/log.h"

namespace zoe::comm {
namespace {

constexpr size_t kBlock = 1024;  // elements accumulated per pass, small enough for L1

template <typename T>
inline T max_nan(T acc, T x) {
  // NaN sticks: x <= acc is false when either is NaN, so a NaN x replaces acc; a NaN acc stays.
  return (std::isnan(acc) || x <= acc) ? acc : x;
}

// Types whose arithmetic is their own (fp32, fp64, i64 and u8 via unsigned wrap-around).
template <typename T, typename Acc>
void reduce_native(const void* const* rows, int nrows, size_t count, void* out, ReduceOp op) {
  T* dst = static_cast<T*>(out);
  Acc acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    size_t n = count - base < kBlock ? count - base : kBlock;
    const T* r0 = static_cast<const T*>(rows[0]) + base;
    for (size_t i = 0; i < n; ++i) acc[i] = static_cast<Acc>(r0[i]);
    for (int r = 1; r < nrows; ++r) {
      const T* src = static_cast<const T*>(rows[r]) + base;
      if (op == ReduceOp::kSum) {
        for (size_t i = 0; i < n; ++i) acc[i] = static_cast<Acc>(acc[i] + static_cast<Acc>(src[i]));
      } else if constexpr (std::is_floating_point_v<T>) {
        for (size_t i = 0; i < n; ++i) acc[i] = max_nan(acc[i], src[i]);
      } else {
        for (size_t i = 0; i < n; ++i)
          acc[i] = src[i] > static_cast<T>(acc[i]) ? static_cast<Acc>(src[i]) : acc[i];
      }
    }
    for (size_t i = 0; i < n; ++i) dst[base + i] = static_cast<T>(acc[i]);
  }
}

// bf16/fp16: widen to fp32, reduce in fp32 in row order, round once.
template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void reduce_half(const void* const* rows, int nrows, size_t count, void* out, ReduceOp op) {
  uint16_t* dst = static_cast<uint16_t*>(out);
  float acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    size_t n = count - base < kBlock ? count - base : kBlock;
    const uint16_t* r0 = static_cast<const uint16_t*>(rows[0]) + base;
    for (size_t i = 0; i < n; ++i) acc[i] = Widen(r0[i]);
    for (int r = 1; r < nrows; ++r) {
      const uint16_t* src = static_cast<const uint16_t*>(rows[r]) + base;
      if (op == ReduceOp::kSum) {
        for (size_t i = 0; i < n; ++i) acc[i] += Widen(src[i]);
      } else {
        for (size_t i = 0; i < n; ++i) acc[i] = max_nan(acc[i], Widen(src[i]));
      }
    }
    for (size_t i = 0; i < n; ++i) dst[base + i] = Narrow(acc[i]);
  }
}

}  // namespace

void reduce_rows(const void* const* rows, int nrows, size_t count, void* out, CommType type, ReduceOp op) {
  ZOE_CHECK(nrows >= 1);
  if (count == 0) return;
  switch (type) {
    case CommType::kF32:
      return reduce_native<float, float>(rows, nrows, count, out, op);
    case CommType::kF64:
      return reduce_native<double, double>(rows, nrows, count, out, op);
    case CommType::kI64:
      if (op == ReduceOp::kSum) return reduce_native<uint64_t, uint64_t>(rows, nrows, count, out, op);
      return reduce_native<int64_t, int64_t>(rows, nrows, count, out, op);
    case CommType::kU8:
      return reduce_native<uint8_t, uint8_t>(rows, nrows, count, out, op);
    case CommType::kBF16:
      return reduce_half<bf16_to_f32, f32_to_bf16>(rows, nrows, count, out, op);
    case CommType::kF16:
      return reduce_half<f16_to_f32, f32_to_f16>(rows, nrows, count, out, op);
  }
  ZOE_CHECK_MSG(false, "reduce_rows: unknown CommType %d", static_cast<int>(type));
}

}  // namespace zoe::comm
