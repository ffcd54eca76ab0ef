// Budget: per-tier byte accounting and making room by eviction.
#include "offload/budget.h"

#include <algorithm>
#include <chrono>

#include "core/clock.h"
#include "core/units.h"

namespace zoe::offload {

Budget::Budget(std::condition_variable& changed, uint32_t wait_for_unpin_ms, EvictOne evict_one,
               PinnedBytes pinned_bytes)
    : changed_(changed),
      wait_for_unpin_ms_(wait_for_unpin_ms),
      evict_one_(std::move(evict_one)),
      pinned_bytes_(std::move(pinned_bytes)) {}

Status Budget::refuse(Tier tier, uint64_t bytes, const char* why) const {
  const int t = tier_index(tier);
  const uint64_t pinned = pinned_bytes_(tier);
  return out_of_budget(
      "%s tier: %llu bytes requested (%s), %llu bytes in use (%s), budget %llu bytes (%s); %s "
      "(%llu bytes pinned)",
      tier_name(tier), static_cast<unsigned long long>(bytes), format_bytes(bytes).c_str(),
      static_cast<unsigned long long>(used_[t]), format_bytes(used_[t]).c_str(),
      static_cast<unsigned long long>(limit_[t]), format_bytes(limit_[t]).c_str(), why,
      static_cast<unsigned long long>(pinned));
}

Status Budget::reserve(std::unique_lock<std::mutex>& lock, Tier tier, uint64_t bytes, bool may_wait) {
  const int t = tier_index(tier);
  const uint64_t budget = limit_[t];
  if (budget && bytes > budget) return refuse(tier, bytes, "the request alone exceeds the budget");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_for_unpin_ms_);
  uint64_t wait_begin = 0;
  struct Waiting {  // counted in waiting_ from the first wait until reserve() returns
    uint32_t* count = nullptr;
    ~Waiting() {
      if (count) --*count;
    }
  } waiting;
  for (;;) {
    if (!budget || used_[t] + bytes <= budget) {
      take(tier, bytes);
      if (wait_begin) wait_ns_ += now_ns() - wait_begin;
      return Status::ok();
    }
    // Evict until the bytes being written back cover the shortfall (clean copies free at once).
    while (used_[t] + bytes > budget && used_[t] + bytes - budget > pending_free_[t]) {
      if (!evict_one_(tier, /*allow_dirty=*/may_wait)) break;
    }
    if (used_[t] + bytes <= budget) continue;
    if (!may_wait) return refuse(tier, bytes, "prefetch does not wait");
    if (!wait_begin) {
      wait_begin = now_ns();
      waiting.count = &waiting_;
      ++waiting_;
    }
    if (pending_free_[t] > 0) {
      changed_.wait(lock);
      continue;
    }
    if (std::chrono::steady_clock::now() < deadline) {
      changed_.wait_until(lock, deadline);
      continue;
    }
    wait_ns_ += now_ns() - wait_begin;
    return refuse(tier, bytes, "nothing else can be evicted");
  }
}

void Budget::take(Tier tier, uint64_t bytes) {
  const int t = tier_index(tier);
  used_[t] += bytes;
  high_water_[t] = std::max(high_water_[t], used_[t]);
}

void Budget::release(Tier tier, uint64_t bytes) {
  used_[tier_index(tier)] -= bytes;
  changed_.notify_all();
}

}  // namespace zoe::offload
