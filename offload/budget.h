// Budget: the hard byte budgets of the three tiers (bytes in use, high-water marks, bytes being
// written back that will be freed) and reserve(), the one routine that makes room in a full tier:
// evict unpinned copies through the owner's callback, then wait for write-backs or unpins.
//
// Not thread-safe by itself: every call is made with the owner's mutex held. reserve() lets go
// of that mutex only inside its condition waits, never while evicting, so it never waits for I/O
// holding it; the owner's completions notify `changed` (release() does) to wake it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

#include "offload/tier.h"
#include "zoe/status.h"

namespace zoe::offload {

class Budget {
 public:
  // Starts evicting one copy of the tier that eviction may take (dirty ones only when
  // allow_dirty): a clean copy is release()d at once, a dirty one is add_pending()ed while it is
  // written back. Returns false when there is none.
  using EvictOne = std::function<bool(Tier tier, bool allow_dirty)>;
  // Bytes pinned in the tier, for the message of a refusal.
  using PinnedBytes = std::function<uint64_t(Tier tier)>;

  // changed: the owner's condition variable, notified by release() and by the owner whenever a
  // pin drops or a write-back ends. wait_for_unpin_ms: how long reserve() waits for pins to drop.
  Budget(std::condition_variable& changed, uint32_t wait_for_unpin_ms, EvictOne evict_one,
         PinnedBytes pinned_bytes);

  void set_limit(Tier t, uint64_t bytes) { limit_[tier_index(t)] = bytes; }  // 0: unlimited
  uint64_t limit(Tier t) const { return limit_[tier_index(t)]; }
  uint64_t used(Tier t) const { return used_[tier_index(t)]; }
  uint64_t high_water(Tier t) const { return high_water_[tier_index(t)]; }
  uint64_t wait_ns() const { return wait_ns_; }  // time reserve() spent waiting
  uint32_t waiting() const { return waiting_; }  // reserve() calls waiting now for room

  // Takes `bytes` in the tier, making room first: evicts while the bytes being written back do
  // not cover the shortfall; then, if may_wait, waits for write-backs to free their bytes, or
  // for up to wait_for_unpin_ms for pins to drop. Dirty copies are evicted only if may_wait.
  // kOutOfBudget names the tier, the bytes requested, in use, the budget, why, and bytes pinned.
  Status reserve(std::unique_lock<std::mutex>& lock, Tier t, uint64_t bytes, bool may_wait);
  // Counts bytes in use without making room (the staging buffers).
  void take(Tier t, uint64_t bytes);
  void release(Tier t, uint64_t bytes);
  // Bytes of a write-back that frees its copy: counted from its start to its end.
  void add_pending(Tier t, uint64_t bytes) { pending_free_[tier_index(t)] += bytes; }
  void end_pending(Tier t, uint64_t bytes) { pending_free_[tier_index(t)] -= bytes; }

 private:
  Status refuse(Tier t, uint64_t bytes, const char* why) const;

  std::condition_variable& changed_;
  const uint32_t wait_for_unpin_ms_;
  EvictOne evict_one_;
  PinnedBytes pinned_bytes_;
  uint64_t limit_[3] = {0, 0, 0};
  uint64_t used_[3] = {0, 0, 0};
  uint64_t high_water_[3] = {0, 0, 0};
  uint64_t pending_free_[3] = {0, 0, 0};
  uint64_t wait_ns_ = 0;
  uint32_t waiting_ = 0;
};

}  // namespace zoe::offload
