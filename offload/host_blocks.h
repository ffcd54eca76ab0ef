// HostBlocks: pinned host blocks under a hard byte budget, kept for reuse (the same sizes come back
// every micro-batch, so after the first one nothing is allocated or pinned again).
//
// The budget counts every block allocated, in use or kept free, so it bounds the memory the
// pool holds (its share of the process's RSS). Not thread-safe: one owner.
#pragma once

#include <cstdint>
#include <map>

#include "io/buffer.h"
#include "zoe/status.h"

namespace zoe::offload {

class HostBlocks {
 public:
  HostBlocks(uint64_t budget, io::PinMode pin) : budget_(budget), pin_(pin) {}

  // A block of at least `bytes` (rounded up to 4096): a free one of a close size, else a new one
  // within the budget (dropping free blocks to make room). kOutOfBudget naming the host tier's
  // budget when even that fails.
  Result<char*> take(uint64_t bytes);
  // Whether take(bytes) would succeed now.
  bool can_take(uint64_t bytes) const;
  void give(char* p);
  // Drops every free block.
  void trim();

  uint64_t budget() const { return budget_; }
  uint64_t allocated() const { return allocated_; }
  uint64_t high_water() const { return high_water_; }
  uint64_t in_use() const { return in_use_; }

 private:
  struct Block {
    io::AlignedBuffer buf;
    bool used = false;
  };
  char* reuse(uint64_t bytes);
  uint64_t free_bytes() const;

  uint64_t budget_;
  io::PinMode pin_;
  std::map<char*, Block> blocks_;
  uint64_t allocated_ = 0;
  uint64_t in_use_ = 0;
  uint64_t high_water_ = 0;
};

inline uint64_t round_up_4k(uint64_t n) { return (n + 4095) & ~uint64_t{4095}; }

}  // namespace zoe::offload
