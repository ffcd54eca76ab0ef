// Streaming xxh64 (seed 0) for checkpoint files: libxxhash when found at configure time, else a
// portable implementation of the same function (same digests), so the build needs no xxhash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "zoe/features.h"

#if ZOE_HAVE_XXHASH
#include <xxhash.h>
#endif

namespace zoe::ckpt::detail {

class PortableXxh64 {
 public:
  void reset() { *this = PortableXxh64(); }
  void update(const void* data, size_t n) {
    auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    if (fill_ + n < 32) {
      std::memcpy(mem_ + fill_, p, n);
      fill_ += n;
      return;
    }
    if (fill_) {
      size_t k = 32 - fill_;
      std::memcpy(mem_ + fill_, p, k);
      stripe(mem_);
      p += k;
      n -= k;
      fill_ = 0;
    }
    for (; n >= 32; p += 32, n -= 32) stripe(p);
    std::memcpy(mem_, p, n);
    fill_ = n;
  }
  uint64_t digest() const {
    uint64_t h;
    if (total_ >= 32) {
      h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
      for (uint64_t v : v_) h = (h ^ round(0, v)) * kP1 + kP4;
    } else {
      h = kP5;
    }
    h += total_;
    const unsigned char* p = mem_;
    size_t n = fill_;
    for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round(0, load64(p)), 27) * kP1 + kP4;
    if (n >= 4) {
      uint32_t w;
      std::memcpy(&w, p, 4);
      h = rotl(h ^ (static_cast<uint64_t>(w) * kP1), 23) * kP2 + kP3;
      p += 4;
      n -= 4;
    }
    for (; n > 0; ++p, --n) h = rotl(h ^ (*p * kP5), 11) * kP1;
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
  }

 private:
  static constexpr uint64_t kP1 = 11400714785074694791ull, kP2 = 14029467366897019727ull,
                            kP3 = 1609587929392839161ull, kP4 = 9650029242287828579ull,
                            kP5 = 2870177450012600261ull;
  static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t round(uint64_t acc, uint64_t in) { return rotl(acc + in * kP2, 31) * kP1; }
  static uint64_t load64(const unsigned char* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // little-endian hosts only, like the rest of zoe's file formats
    return v;
  }
  void stripe(const unsigned char* p) {
    for (int i = 0; i < 4; ++i) v_[i] = round(v_[i], load64(p + 8 * i));
  }

  uint64_t v_[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  unsigned char mem_[32] = {};
  size_t fill_ = 0;
  uint64_t total_ = 0;
};

#if ZOE_HAVE_XXHASH
class LibXxh64 {
 public:
  LibXxh64() : st_(XXH64_createState()) { XXH64_reset(st_, 0); }
  ~LibXxh64() { XXH64_freeState(st_); }
  LibXxh64(const LibXxh64&) = delete;
  LibXxh64& operator=(const LibXxh64&) = delete;
  void reset() { XXH64_reset(st_, 0); }
  void update(const void* data, size_t n) { XXH64_update(st_, data, n); }
  uint64_t digest() const { return XXH64_digest(st_); }

 private:
  XXH64_state_t* st_;
};

using Xxh64 = LibXxh64;
#else
using Xxh64 = PortableXxh64;
#endif

}  // namespace zoe::ckpt::detail
