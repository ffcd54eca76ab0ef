// MemoryLedger: the hard byte budget and live-allocation table every device backend keeps.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zoe/status.h"

namespace zoe::device {

// Accounting is done under one mutex, so concurrent reservations can never together pass the
// budget. Thread-safe.
class MemoryLedger {
 public:
  // `tier` names the budget in messages, e.g. "device cpu".
  MemoryLedger(std::string tier, uint64_t budget) : tier_(std::move(tier)), budget_(budget) {}

  // Reserves bytes against the budget, or fails with kOutOfBudget naming the tier, the bytes
  // requested, the bytes in use and the budget.
  Status reserve(uint64_t bytes);
  // Returns bytes reserved earlier.
  void release(uint64_t bytes);

  // Records the live allocation [p, p + bytes), whose bytes were reserved.
  void insert(void* p, uint64_t bytes);
  // Removes the allocation that starts at p, returning its size; nullopt when there is none.
  // The bytes stay reserved until release().
  std::optional<uint64_t> erase(void* p);
  // True when [p, p + bytes) lies inside one live allocation.
  bool contains(const void* p, uint64_t bytes) const;
  // The live allocations, by address.
  std::vector<std::pair<void*, uint64_t>> live() const;
  // Removes every live allocation (releasing their bytes) and returns them, for teardown.
  std::vector<std::pair<void*, uint64_t>> take_all();

  const std::string& tier() const { return tier_; }
  uint64_t budget() const { return budget_; }
  uint64_t used() const;
  uint64_t high_water() const;

 private:
  const std::string tier_;
  const uint64_t budget_;
  mutable std::mutex mu_;
  uint64_t used_ = 0;
  uint64_t high_water_ = 0;
  std::map<uintptr_t, uint64_t> live_;  // start address -> bytes
};

}  // namespace zoe::device
