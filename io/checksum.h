// The fast 64-bit checksum of swap data: xxh3_64 (libxxhash) when found at configure time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zoe::io {

// A 64-bit hash of [data, data + n). xxh3_64 (seed 0) with libxxhash; without it, a portable
// multiply-mix hash of the same quality for error detection (digests differ between the two, so
// they are never stored: swap checksums live only in memory for the life of one process).
uint64_t swap_checksum(const void* data, size_t n);
// "xxh3_64" or "portable", for logs and benchmarks.
const char* swap_checksum_name();

}  // namespace zoe::io
