// swap_checksum: xxh3_64 from libxxhash, or a portable fallback.
#include "io/checksum.h"

#include <cstring>

#include "zoe/features.h"

#if ZOE_HAVE_XXHASH
#include <xxhash.h>
#endif

namespace zoe::io {

#if ZOE_HAVE_XXHASH
uint64_t swap_checksum(const void* data, size_t n) { return XXH3_64bits(data, n); }
const char* swap_checksum_name() { return "xxh3_64"; }
#else
namespace {
inline uint64_t mix(uint64_t a, uint64_t b) {
  __uint128_t m = static_cast<__uint128_t>(a) * b;
  return static_cast<uint64_t>(m) ^ static_cast<uint64_t>(m >> 64);
}
}  // namespace

uint64_t swap_checksum(const void* data, size_t n) {
  constexpr uint64_t kK[4] = {0x9E3779B185EBCA87ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                              0x85EBCA77C2B2AE63ull};
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t acc[4] = {kK[0], kK[1], kK[2], kK[3]};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      acc[l] = mix(acc[l] ^ w, kK[l]) + w;
    }
  }
  uint64_t h = n * kK[0] ^ mix(acc[0], acc[1]) ^ mix(acc[2], acc[3]);
  for (; i < n; ++i) h = mix(h ^ p[i], kK[i % 4]);
  return mix(h, kK[2]) ^ (h >> 29);
}
const char* swap_checksum_name() { return "portable"; }
#endif

}  // namespace zoe::io
