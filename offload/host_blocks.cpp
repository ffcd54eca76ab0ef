// HostBlocks: best-fit reuse of kept blocks, then allocation within the budget.
#include "offload/host_blocks.h"

#include <vector>

#include "core/units.h"

namespace zoe::offload {

char* HostBlocks::reuse(uint64_t bytes) {
  Block* best = nullptr;
  for (auto& [p, b] : blocks_) {
    if (b.used || b.buf.size() < bytes) continue;
    if (!best || b.buf.size() < best->buf.size()) best = &b;
  }
  // A block more than twice the size would waste its rest: prefer a new one when there is room.
  if (best && best->buf.size() > 2 * bytes && allocated_ + bytes <= budget_) best = nullptr;
  if (!best) return nullptr;
  best->used = true;
  in_use_ += best->buf.size();
  return best->buf.bytes();
}

uint64_t HostBlocks::free_bytes() const {
  uint64_t n = 0;
  for (const auto& [p, b] : blocks_)
    if (!b.used) n += b.buf.size();
  return n;
}

bool HostBlocks::can_take(uint64_t bytes) const {
  bytes = round_up_4k(bytes);
  for (const auto& [p, b] : blocks_)
    if (!b.used && b.buf.size() >= bytes) return true;
  return allocated_ - free_bytes() + bytes <= budget_;
}

Result<char*> HostBlocks::take(uint64_t bytes) {
  bytes = round_up_4k(bytes);
  if (char* p = reuse(bytes)) return p;
  if (allocated_ + bytes > budget_) trim();
  if (allocated_ + bytes > budget_) {
    return out_of_budget(
        "activation host tier: %llu bytes requested, %llu in use, budget %llu bytes (%s) "
        "(zoe.activation_host_budget)",
        static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(allocated_),
        static_cast<unsigned long long>(budget_), format_bytes(budget_).c_str());
  }
  ZOE_ASSIGN_OR_RETURN(io::AlignedBuffer buf, io::AlignedBuffer::allocate(bytes, pin_));
  char* p = buf.bytes();
  allocated_ += buf.size();
  in_use_ += buf.size();
  if (allocated_ > high_water_) high_water_ = allocated_;
  blocks_[p] = Block{std::move(buf), true};
  return p;
}

void HostBlocks::give(char* p) {
  auto it = blocks_.find(p);
  if (it == blocks_.end() || !it->second.used) return;
  it->second.used = false;
  in_use_ -= it->second.buf.size();
}

void HostBlocks::trim() {
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    if (it->second.used) {
      ++it;
      continue;
    }
    allocated_ -= it->second.buf.size();
    it = blocks_.erase(it);
  }
}

}  // namespace zoe::offload
