// SwapStore: extent bookkeeping and budget accounting for the NVMe tier.
#include "offload/swap_store.h"

#include "core/log.h"
#include "core/units.h"

namespace zoe::offload {

const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::kParam:
      return "param";
    case StateKind::kGrad:
      return "grad";
    case StateKind::kMaster:
      return "master";
    case StateKind::kAdamM:
      return "adam_m";
    case StateKind::kAdamV:
      return "adam_v";
    case StateKind::kOther:
      return "other";
  }
  return "?";
}

std::string describe(const StateKey& key) {
  return "nvme tier item " + std::to_string(key.item) + " state " + state_kind_name(key.kind);
}

SwapStore::SwapStore(io::SwapFile* file, io::IoEngine* engine, uint64_t budget_bytes)
    : file_(file), engine_(engine), budget_(budget_bytes) {}

SwapStore::~SwapStore() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [k, e] : extents_) file_->free(e);
}

Result<io::Extent> SwapStore::allocate(const StateKey& key, uint64_t bytes, io::Unwritten unwritten) {
  uint64_t need = (bytes + 4095) & ~uint64_t{4095};
  std::lock_guard<std::mutex> lock(mu_);
  if (extents_.count(key)) {
    return invalid_argument("nvme tier: item %llu state %s already has swap space",
                            static_cast<unsigned long long>(key.item), state_kind_name(key.kind));
  }
  if (budget_ && used_ + need > budget_) {
    return out_of_budget("nvme tier: %llu bytes requested (%s), %llu bytes in use, budget %llu bytes (%s)",
                         static_cast<unsigned long long>(need), format_bytes(need).c_str(),
                         static_cast<unsigned long long>(used_), static_cast<unsigned long long>(budget_),
                         format_bytes(budget_).c_str());
  }
  ZOE_ASSIGN_OR_RETURN(io::Extent e, file_->allocate(need, unwritten));
  extents_[key] = e;
  used_ += need;
  high_water_ = std::max(high_water_, used_);
  return e;
}

void SwapStore::free(const StateKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = extents_.find(key);
  if (it == extents_.end()) return;
  file_->free(it->second);
  used_ -= it->second.bytes;
  extents_.erase(it);
}

Result<io::Extent> SwapStore::extent(const StateKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = extents_.find(key);
  if (it == extents_.end()) {
    return not_found("nvme tier: item %llu state %s has no swap space",
                     static_cast<unsigned long long>(key.item), state_kind_name(key.kind));
  }
  return it->second;
}

bool SwapStore::contains(const StateKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return extents_.count(key) != 0;
}

io::IoHandle SwapStore::read(const StateKey& key, uint64_t offset, void* buf, size_t len, io::IoCallback cb) {
  StoreIo io{io::IoOp::kRead, key, offset, buf, len};
  return transfer({&io, 1}, std::move(cb));
}

io::IoHandle SwapStore::write(const StateKey& key, uint64_t offset, const void* buf, size_t len,
                              io::IoCallback cb) {
  StoreIo io{io::IoOp::kWrite, key, offset, const_cast<void*>(buf), len};
  return transfer({&io, 1}, std::move(cb));
}

io::IoHandle SwapStore::transfer(std::span<const StoreIo> ios, io::IoCallback cb) {
  std::vector<io::SwapIo> sios;
  std::vector<StateKey> keys;
  sios.reserve(ios.size());
  keys.reserve(ios.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const StoreIo& io : ios) {
      auto it = extents_.find(io.key);
      ZOE_CHECK_MSG(it != extents_.end(), "nvme tier: item %llu state %s has no swap space",
                    static_cast<unsigned long long>(io.key.item), state_kind_name(io.key.kind));
      sios.push_back(io::SwapIo{io.op, it->second, io.offset, io.buf, io.len});
      keys.push_back(io.key);
    }
  }
  return file_->transfer(*engine_, sios, std::move(cb),
                         [keys = std::move(keys)](size_t i) { return describe(keys[i]); });
}

uint64_t SwapStore::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t SwapStore::high_water_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return high_water_;
}

}  // namespace zoe::offload
