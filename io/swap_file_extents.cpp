// SwapFile, extents: first-fit allocation of 4096-aligned extents from the free list (offsets
// coalesced on free), growing the swap space when nothing fits, and the capacity and use counts.
#include "io/swap_file.h"

#include <iterator>

#include "core/log.h"

namespace zoe::io {

void SwapFile::add_free_locked(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return;
  auto next = free_.lower_bound(offset);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    ZOE_CHECK_MSG(prev->first + prev->second <= offset, "double free of swap extent at %llu",
                  static_cast<unsigned long long>(offset));
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end()) {
    ZOE_CHECK_MSG(offset + bytes <= next->first, "double free of swap extent at %llu",
                  static_cast<unsigned long long>(offset));
    if (offset + bytes == next->first) {
      bytes += next->second;
      free_.erase(next);
    }
  }
  free_[offset] = bytes;
}

Result<Extent> SwapFile::allocate(uint64_t bytes, Unwritten unwritten) {
  if (bytes == 0) return Extent{0, 0};
  uint64_t need = (bytes + 4095) & ~uint64_t{4095};
  std::lock_guard<std::mutex> lock(mu_);
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < need) continue;
      Extent e{it->first, need};
      uint64_t rest = it->second - need;
      free_.erase(it);
      if (rest) free_[e.offset + need] = rest;
      used_ += need;
      if (unwritten == Unwritten::kZeros) {
        std::lock_guard<std::mutex> sums(sum_mu_);
        zero_fill_.emplace(e.offset, e.offset + need);
      }
      return e;
    }
    // Nothing fits: grow so that the free tail (if any) plus new space holds `need`.
    uint64_t tail_free = 0;
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == capacity_) tail_free = last->second;
    }
    ZOE_RETURN_IF_ERROR(grow_locked(capacity_ + need - tail_free, /*allow_step=*/true));
  }
  return internal_error("swap file: allocation of %llu bytes failed after growing",
                        static_cast<unsigned long long>(need));
}

void SwapFile::free(const Extent& e) {
  if (e.bytes == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ZOE_CHECK_MSG(e.offset + e.bytes <= capacity_, "swap extent out of range");
    used_ -= e.bytes;
    add_free_locked(e.offset, e.bytes);
  }
  std::lock_guard<std::mutex> lock(sum_mu_);
  forget_sums_locked(e.offset, e.offset + e.bytes);
  forget_written_locked(e.offset, e.offset + e.bytes);
  zero_fill_.erase(e.offset);
}

uint64_t SwapFile::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_;
}

uint64_t SwapFile::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

}  // namespace zoe::io
