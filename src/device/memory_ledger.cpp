// MemoryLedger: budget checks with messages that say what was asked, what is used, what is allowed.
#include "device/memory_ledger.h"

#include "core/log.h"
#include "core/units.h"

namespace zoe::device {

Status MemoryLedger::reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > budget_ - used_) {  // used_ <= budget_ always, so this cannot wrap
    return out_of_budget(
        "%s: allocating %llu bytes (%s) would exceed the budget: %llu bytes (%s) in use of a "
        "%llu-byte budget (%s)",
        tier_.c_str(), static_cast<unsigned long long>(bytes), format_bytes(bytes).c_str(),
        static_cast<unsigned long long>(used_), format_bytes(used_).c_str(),
        static_cast<unsigned long long>(budget_), format_bytes(budget_).c_str());
  }
  used_ += bytes;
  if (used_ > high_water_) high_water_ = used_;
  return Status::ok();
}

void MemoryLedger::release(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ZOE_CHECK_MSG(bytes <= used_, "%s: releasing %llu bytes with only %llu in use", tier_.c_str(),
                static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(used_));
  used_ -= bytes;
}

void MemoryLedger::insert(void* p, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  bool inserted = live_.emplace(reinterpret_cast<uintptr_t>(p), bytes).second;
  ZOE_CHECK_MSG(inserted, "%s: allocation %p handed out twice", tier_.c_str(), p);
}

std::optional<uint64_t> MemoryLedger::erase(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(p));
  if (it == live_.end()) return std::nullopt;
  uint64_t bytes = it->second;
  live_.erase(it);
  return bytes;
}

bool MemoryLedger::contains(const void* p, uint64_t bytes) const {
  auto addr = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return false;
  --it;
  uint64_t offset = addr - it->first;
  return offset <= it->second && bytes <= it->second - offset;
}

std::vector<std::pair<void*, uint64_t>> MemoryLedger::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<void*, uint64_t>> all;
  all.reserve(live_.size());
  for (const auto& [addr, bytes] : live_)
    all.emplace_back(reinterpret_cast<void*>(addr), bytes);  // NOLINT(performance-no-int-to-ptr)
  return all;
}

std::vector<std::pair<void*, uint64_t>> MemoryLedger::take_all() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<void*, uint64_t>> all;
  for (auto& [addr, bytes] : live_) {
    all.emplace_back(reinterpret_cast<void*>(addr), bytes);  // NOLINT(performance-no-int-to-ptr)
    used_ -= bytes;
  }
  live_.clear();
  return all;
}

uint64_t MemoryLedger::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t MemoryLedger::high_water() const {
  std::lock_guard<std::mutex> lock(mu_);
  return high_water_;
}

}  // namespace zoe::device
