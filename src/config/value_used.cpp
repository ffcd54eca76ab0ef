// Warn-once resolution of config values zoe uses other than as given.
#include "config/value_used.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "core/log.h"

namespace zoe::config {

int64_t value_used(const char* key, int64_t given, int64_t used, const char* why) {
  if (used == given) return used;
  static std::mutex mu;
  static std::set<std::tuple<std::string, int64_t, int64_t>> warned;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.emplace(key, given, used).second) return used;
  }
  ZOE_LOG_WARN("config: %s is %lld; zoe uses %lld (%s)", key, static_cast<long long>(given),
               static_cast<long long>(used), why);
  return used;
}

int64_t value_clamped(const char* key, int64_t given, int64_t lo, int64_t hi, const char* why) {
  return value_used(key, given, std::clamp(given, lo, hi), why);
}

int64_t aio_block_size_used(int64_t block_size) {
  return value_used("aio.block_size", block_size, std::max<int64_t>(4096, block_size / 4096 * 4096),
                    "bytes: the I/O engine's requests are whole 4 KiB blocks (O_DIRECT)");
}

}  // namespace zoe::config
