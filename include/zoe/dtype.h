// ComputeDType, the element type of the parameters and gradients the engine hands out, and the
// conversions between it and fp32 that a caller's forward/backward needs (host memory here; device
// memory through Engine::read_f32 / Engine::write_f32).
//
// The conversions are zoe's own (the ones its optimizer and checkpoints use), bit for bit:
//   * fp32 -> bf16/fp16 rounds to nearest, ties to even; overflow gives +-inf; NaN stays a quiet NaN.
//   * bf16/fp16 -> fp32 is exact.
// Thread-safety: every function here is pure and may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zoe {

// The numeric values are those of zoe's internal storage type (checked where they are mapped).
enum class ComputeDType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Bytes per element: 4 or 2.
constexpr size_t dtype_size(ComputeDType d) { return d == ComputeDType::kF32 ? 4 : 2; }
// "fp32", "fp16" or "bf16".
const char* dtype_name(ComputeDType d);

// One element.
float to_f32(uint16_t half, ComputeDType d);  // d is kBF16 or kF16
uint16_t from_f32(float x, ComputeDType d);   // d is kBF16 or kF16 (round to nearest even)

// n elements of `src` (in dtype d) -> fp32 `dst`. Host memory; src and dst do not overlap.
void to_f32(const void* src, ComputeDType d, float* dst, size_t n);
// n fp32 elements of `src`, each multiplied by `scale` (in fp32), -> `dst` in dtype d. Host memory.
// A scale of 1 stores src itself; pass the loss scale when writing gradients.
void from_f32(const float* src, ComputeDType d, void* dst, size_t n, float scale = 1.0f);

}  // namespace zoe
