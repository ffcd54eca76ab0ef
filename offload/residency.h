// ResidencyTable: the items and, per item and tier, the state of its copy, its pins and its LRU
// stamp. The state machine of one copy:
//
//   absent --begin_load--> loading --finish_load--> resident --unpin(dirty)--> dirty
//   dirty --begin_writeback--> writing --finish_writeback--> resident (kept) or dirty (failed)
//   resident / dirty / a written-back copy that is dropped --clear--> absent
//
// The table does no I/O, allocates no memory and takes no lock: the tier manager calls it with
// its mutex held, and frees the memory of a copy before it clears it.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "io/buffer.h"
#include "offload/eviction_policy.h"
#include "offload/move_handle.h"
#include "offload/swap_store.h"
#include "offload/tier.h"

namespace zoe::offload {

enum class Residency : uint8_t { kAbsent, kLoading, kResident, kDirty, kWriting };
const char* residency_name(Residency r);

// One item's copy in one tier.
struct Copy {
  Residency state = Residency::kAbsent;
  void* ptr = nullptr;     // device or host address of the bytes unless absent
  io::AlignedBuffer host;  // the memory of a host copy
  uint32_t pins = 0;
  uint64_t last_use = 0;                    // the table's LRU clock at the latest use
  bool stale = false;                       // a newer write happened elsewhere while this copy was loading
  bool dropping = false;                    // writing: the copy goes once written (else it stays, clean)
  std::shared_ptr<MoveHandle::State> move;  // while loading or writing
  bool present() const { return state == Residency::kResident || state == Residency::kDirty; }
  bool moving() const { return state == Residency::kLoading || state == Residency::kWriting; }
};

struct Item {
  ItemId id;
  uint64_t bytes = 0;
  uint64_t alloc = 0;  // bytes rounded up to 4096: what copies hold and transfers move
  Tier home = Tier::kHost;
  Copy c[3];  // indexed by tier_index()
  // Synchronous read()/write() transfers of the NVMe home in progress. They run without the
  // manager's lock, so while one is running nothing else may start a move of this item.
  uint32_t sync_ops = 0;

  Copy& at(Tier t) { return c[tier_index(t)]; }
  const Copy& at(Tier t) const { return c[tier_index(t)]; }
  StateKey key() const { return StateKey{id.value, StateKind::kOther}; }
  bool pinned() const;
  // No move of any copy in progress and no synchronous transfer running.
  bool idle() const;
};

class ResidencyTable {
 public:
  Item* find(ItemId id);
  const Item* find(ItemId id) const;
  // Takes an item whose id is not in the table.
  Item* insert(std::unique_ptr<Item> item);
  void erase(ItemId id);
  void clear() { items_.clear(); }
  size_t size() const { return items_.size(); }
  // Visits every item in the table's order (unchanged while no item is added or removed).
  template <class Fn>
  void for_each(Fn&& fn) {
    for (auto& [id, it] : items_) fn(*it);
  }

  // Bytes of the copies pinned in tier t.
  uint64_t pinned_bytes(Tier t) const;
  // The copies of tier t eviction may take: unpinned, resident (or dirty when allow_dirty), and
  // not the item's home. Replaces *out, in the table's order.
  void evictable(Tier t, bool allow_dirty, std::vector<EvictionCandidate>* out) const;

  // Stamps the copy with the next tick of the LRU clock.
  void touch(Copy& c) { c.last_use = ++clock_; }
  // A fetch takes the copy: one more pin, and a use.
  void pin(Copy& c) {
    c.pins++;
    touch(c);
  }
  // Drops one pin of the item's copy in tier t (which must be present and pinned). dirty: the
  // caller changed the bytes there, so the copy becomes dirty (unless it is home), loading copies
  // elsewhere go stale, and the tiers returned hold present copies the caller must drop now.
  std::vector<Tier> unpin(Item& it, Tier t, bool dirty);

  // absent -> loading, pinned once if pin. Returns the move its handles wait on.
  std::shared_ptr<MoveHandle::State> begin_load(Item& it, Tier t, bool pin);
  // loading -> resident. src: the copy it was loaded from, nullptr for the home; a host copy
  // made from a dirty device copy takes over the dirtiness. Returns false when the copy went
  // stale meanwhile: the caller drops it.
  static bool finish_load(Item& it, Tier t, Copy* src);
  // dirty -> writing, with a new move for its handles to wait on.
  static void begin_writeback(Item& it, Tier t);
  // writing -> resident once written, or back to dirty when the write failed (nothing is lost).
  static void finish_writeback(Copy& c, bool written);
  // Any state -> absent: forgets the copy's address, host memory, pins and move.
  static void clear(Copy& c);

 private:
  std::unordered_map<ItemId, std::unique_ptr<Item>> items_;
  uint64_t clock_ = 0;  // LRU clock
};

}  // namespace zoe::offload
