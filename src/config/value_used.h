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

}  // namespace zoe::config
