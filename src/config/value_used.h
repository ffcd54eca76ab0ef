// Config values zoe uses other than as given: the one place that decides them and says so.
#pragma once

#include <cstdint>

namespace zoe::config {

// Returns `used`, the value zoe uses for the config key `key` (its dotted path) given as `given`.
// When the two differ it logs one warning naming the key, both values and `why` (what zoe needs
// instead), once per process for each key and pair of values, however often it is resolved.
// Thread-safe.
int64_t value_used(const char* key, int64_t given, int64_t used, const char* why);

// `given` brought into [lo, hi] (lo <= hi), warned about as value_used() does when that changes it.
int64_t value_clamped(const char* key, int64_t given, int64_t lo, int64_t hi, const char* why);

// The I/O engine's request size for aio.block_size: a multiple of 4 KiB (O_DIRECT), rounded down,
// at least 4 KiB; warned about as value_used() does when that changes it.
int64_t aio_block_size_used(int64_t block_size);

}  // namespace zoe::config
