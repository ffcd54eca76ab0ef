// SwapStore: (item, state kind) -> extents of a SwapFile, under the NVMe tier's byte budget.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>

#include "io/io_engine.h"
#include "io/swap_file.h"
#include "zoe/status.h"

namespace zoe::offload {

// What a stored tensor is; one item (a partition) may have one of each.
enum class StateKind : uint8_t { kParam = 0, kGrad = 1, kMaster = 2, kAdamM = 3, kAdamV = 4, kOther = 5 };
const char* state_kind_name(StateKind k);

struct StateKey {
  uint64_t item = 0;
  StateKind kind = StateKind::kOther;
  bool operator==(const StateKey& o) const { return item == o.item && kind == o.kind; }
};

// "item 3 state adam_m", for messages.
std::string describe(const StateKey& key);

// One transfer of SwapStore::transfer(): [offset, offset + len) of the key's extent.
struct StoreIo {
  io::IoOp op = io::IoOp::kRead;
  StateKey key;
  uint64_t offset = 0;
  void* buf = nullptr;
  size_t len = 0;
};

// Thread-safe. The engine and file are not owned and must outlive the store. Transfers carry the
// file's checksums (io::SwapFileOptions::checksum): a read whose data changed since it was
// written completes with kCorruption naming the item, the state, the file and the offset.
class SwapStore {
 public:
  // budget_bytes 0 = no limit beyond the disks.
  SwapStore(io::SwapFile* file, io::IoEngine* engine, uint64_t budget_bytes);
  ~SwapStore();

  // Reserves room for `bytes` (rounded up to 4096). Over the budget: kOutOfBudget naming the
  // tier, the bytes requested, the bytes in use and the budget. `unwritten`: what reads of bytes
  // not yet written get (io::Unwritten: an error, or zeros like a fresh host buffer).
  Result<io::Extent> allocate(const StateKey& key, uint64_t bytes,
                              io::Unwritten unwritten = io::Unwritten::kError);
  void free(const StateKey& key);
  Result<io::Extent> extent(const StateKey& key) const;
  bool contains(const StateKey& key) const;

  // Async transfer of [offset, offset+len) of the key's extent. O_DIRECT rules apply to buf.
  io::IoHandle read(const StateKey& key, uint64_t offset, void* buf, size_t len, io::IoCallback cb = {});
  io::IoHandle write(const StateKey& key, uint64_t offset, const void* buf, size_t len,
                     io::IoCallback cb = {});
  // Several transfers (any keys) as one submission and one completion.
  io::IoHandle transfer(std::span<const StoreIo> ios, io::IoCallback cb = {});

  uint64_t budget_bytes() const { return budget_; }
  uint64_t used_bytes() const;
  uint64_t high_water_bytes() const;
  io::IoEngine& engine() const { return *engine_; }
  io::SwapFile& file() const { return *file_; }

 private:
  struct KeyHash {
    size_t operator()(const StateKey& k) const {
      return std::hash<uint64_t>()(k.item * 8 + static_cast<uint64_t>(k.kind));
    }
  };
  io::SwapFile* file_;
  io::IoEngine* engine_;
  uint64_t budget_;
  mutable std::mutex mu_;
  std::unordered_map<StateKey, io::Extent, KeyHash> extents_;
  uint64_t used_ = 0;
  uint64_t high_water_ = 0;
};

}  // namespace zoe::offload
