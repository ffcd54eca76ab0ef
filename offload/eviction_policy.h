// EvictionPolicy: which copy a full tier gives up, chosen among the copies eviction may take.
// Two policies: LRU (the least recently used copy) and Belady over a recorded trace (the copy
// whose next use in the recorded order of fetches is furthest away).
//
// Not thread-safe: the tier manager calls a policy with its mutex held. A policy only ranks;
// it never evicts, waits or does I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "offload/tier.h"

namespace zoe::offload {

// Selects the policy in TierManagerOptions.
enum class EvictionPolicyKind : uint8_t { kLru, kTrace };

// A copy eviction may take (unpinned, present, not its item's home).
struct EvictionCandidate {
  ItemId id;
  uint64_t last_use = 0;  // the LRU clock at its latest use; smaller is older
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  // The index in `candidates` (which is not empty) of the copy to evict. Among equals, the
  // first one wins, so the order of the candidates decides ties.
  virtual size_t choose(const std::vector<EvictionCandidate>& candidates) const = 0;

  // Optional: the order of accesses. A fetch of `id` starts (fetch_begins), and later returns
  // its handle (fetch_returned). Default: ignored.
  virtual void fetch_begins(ItemId id) { (void)id; }
  virtual void fetch_returned() {}
  // Optional: fetches between begin_trace() and end_trace() are the order to plan by. Default:
  // ignored.
  virtual void begin_trace() {}
  virtual void end_trace() {}
};

// The oldest last_use.
class LruPolicy final : public EvictionPolicy {
 public:
  size_t choose(const std::vector<EvictionCandidate>& candidates) const override;
};

// Belady: records the order of fetches between begin_trace() and end_trace() and afterwards
// assumes it repeats, cyclically; a replay cursor follows the fetches. The victim is the copy
// whose next use is furthest from the cursor (never used again: furthest of all), the oldest on
// ties. While recording, or before any trace, it is LRU.
class BeladyPolicy final : public EvictionPolicy {
 public:
  size_t choose(const std::vector<EvictionCandidate>& candidates) const override;
  void fetch_begins(ItemId id) override;
  void fetch_returned() override;
  void begin_trace() override;
  void end_trace() override;

 private:
  // Fetches from the cursor to the next use of id (UINT64_MAX: none in the trace).
  uint64_t next_use(ItemId id) const;

  bool tracing_ = false;
  std::vector<ItemId> trace_;
  std::unordered_map<ItemId, std::vector<uint64_t>> trace_pos_;  // id -> its positions in trace_
  uint64_t cursor_ = 0;
};

std::unique_ptr<EvictionPolicy> make_eviction_policy(EvictionPolicyKind kind);

}  // namespace zoe::offload
