// EvictionPolicy: LRU and Belady (trace) victim selection.
#include "offload/eviction_policy.h"

#include <algorithm>

#include "core/log.h"

namespace zoe::offload {

size_t LruPolicy::choose(const std::vector<EvictionCandidate>& candidates) const {
  ZOE_CHECK(!candidates.empty());
  size_t best = 0;
  for (size_t i = 1; i < candidates.size(); ++i) {
    if (candidates[i].last_use < candidates[best].last_use) best = i;
  }
  return best;
}

void BeladyPolicy::fetch_begins(ItemId id) {
  if (!tracing_) return;
  trace_pos_[id].push_back(trace_.size());
  trace_.push_back(id);
}

void BeladyPolicy::fetch_returned() {
  if (!tracing_ && !trace_.empty()) cursor_ = (cursor_ + 1) % trace_.size();
}

void BeladyPolicy::begin_trace() {
  tracing_ = true;
  trace_.clear();
  trace_pos_.clear();
  cursor_ = 0;
}

void BeladyPolicy::end_trace() {
  tracing_ = false;
  cursor_ = 0;
}

uint64_t BeladyPolicy::next_use(ItemId id) const {
  if (trace_.empty()) return UINT64_MAX;
  auto p = trace_pos_.find(id);
  if (p == trace_pos_.end()) return UINT64_MAX;
  const auto& v = p->second;
  auto i = std::lower_bound(v.begin(), v.end(), cursor_);
  if (i != v.end()) return *i - cursor_;
  return v.front() + trace_.size() - cursor_;  // wraps around to the next pass
}

size_t BeladyPolicy::choose(const std::vector<EvictionCandidate>& candidates) const {
  if (tracing_ || trace_.empty()) return LruPolicy().choose(candidates);
  ZOE_CHECK(!candidates.empty());
  size_t best = 0;
  uint64_t best_next = next_use(candidates[0].id);
  for (size_t i = 1; i < candidates.size(); ++i) {
    const uint64_t next = next_use(candidates[i].id);
    if (next > best_next || (next == best_next && candidates[i].last_use < candidates[best].last_use)) {
      best = i;
      best_next = next;
    }
  }
  return best;
}

std::unique_ptr<EvictionPolicy> make_eviction_policy(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kLru:
      return std::make_unique<LruPolicy>();
    case EvictionPolicyKind::kTrace:
      return std::make_unique<BeladyPolicy>();
  }
  return std::make_unique<LruPolicy>();
}

}  // namespace zoe::offload
