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

}  // namespace zoe::config
