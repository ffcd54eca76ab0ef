// zoe/random.h: the normal kernel of init_normal.h and a counter-based uniform, split into
// fixed chunks over the cores this process may use (the chunking never changes a value).
#include "zoe/random.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "core/cpu.h"
#include "core/init_normal.h"

namespace zoe {
namespace {

constexpr size_t kChunk = size_t{1} << 20;  // elements per task
// Apart from the normal stream's keys (init_normal.h hashes key + j * golden), so that a seed
// drawn for a uniform fill never shares a hash input with the same seed's normals.
constexpr uint64_t kUniformSalt = 0x5bd1e9955bd1e995ULL;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Runs body(first, count) over [0, n) in kChunk pieces on up to usable_cores() threads.
template <typename Body>
void parallel_chunks(size_t n, const Body& body) {
  const size_t chunks = (n + kChunk - 1) / kChunk;
  const size_t threads = std::min(chunks, static_cast<size_t>(std::max(1, usable_cores())));
  auto run = [&](size_t t) {
    for (size_t c = t; c < chunks; c += threads) {
      const size_t first = c * kChunk;
      body(first, std::min(kChunk, n - first));
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(run, t);
  run(0);
  for (auto& th : pool) th.join();
}

}  // namespace

void fill_normal(float* out, size_t n, float mean, float std_dev, uint64_t seed) {
  if (n == 0) return;
  static const initk::NormalFn fn = initk::normal_for(environment_simd_level());
  parallel_chunks(n, [&](size_t first, size_t count) {
    fn(seed, first, count, std_dev, out + first);
    if (mean != 0.0f)
      for (size_t i = 0; i < count; ++i) out[first + i] += mean;
  });
}

void fill_uniform(float* out, size_t n, float low, float high, uint64_t seed) {
  if (n == 0) return;
  const float width = high - low;
  // The largest float below high: a product that rounds up to high is kept inside [low, high).
  const float top = low < high ? std::nextafter(high, low) : low;
  const uint64_t key = splitmix64(seed ^ kUniformSalt);
  parallel_chunks(n, [&](size_t first, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      const uint64_t h = splitmix64(key + (first + i) * 0x9e3779b97f4a7c15ULL);
      const float u = static_cast<float>(h >> 40) * 0x1.0p-24f;
      out[first + i] = std::min(low + width * u, top);
    }
  });
}

}  // namespace zoe
