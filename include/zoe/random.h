// Random fills for initialising tensors, on every core this process may use.
//
// The values are a function of (seed, element index) only: the same bits on every CPU, SIMD level
// and thread count, so a model initialised on one machine is the one initialised on another.
// zoe's reference model draws its initial values from the same normal stream; the PyTorch
// front-end draws a meta-built model's torch.nn.init normal and uniform values with these.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zoe {

// out[i] = mean + std_dev * z(seed, i) for i in [0, n): standard normals by Box-Muller from a
// counter-based hash (24-bit radius and angle uniforms), so any range of a stream can be drawn
// on its own. n == 0 does nothing.
void fill_normal(float* out, size_t n, float mean, float std_dev, uint64_t seed);

// out[i] = low + (high - low) * u(seed, i), with u of 24 bits in [0, 1); every value lies in
// [low, high) when low < high (low itself when they are equal).
void fill_uniform(float* out, size_t n, float low, float high, uint64_t seed);

}  // namespace zoe
