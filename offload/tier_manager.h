// TierManager: where every item (a partition's state) lives — device, pinned host, NVMe — under
// hard per-tier byte budgets, with asynchronous moves, pins, eviction (LRU or trace/Belady) and
// statistics. It moves bytes and knows nothing of models or ZeRO stages. The facade over:
//  - ResidencyTable (residency.h): per item and tier, the copy's state, pins, the LRU clock;
//  - Budget (budget.h) and EvictionPolicy (eviction_policy.h): room in a full tier, and victims;
//  - Transfers (transfer.h) with StagingPool (staging.h): moving bytes on every link;
//  - Poster (poster.h): the one thread that finishes moves.
//
// Residency of each (item, tier) copy: absent -> loading -> resident -> (dirty) -> writing -> absent.
// Rules the manager keeps:
//  - a pinned copy is never evicted; a dirty copy is never dropped before it is written back;
//  - budgets are hard: an allocation that does not fit evicts unpinned copies and waits for their
//    write-backs, or fails with kOutOfBudget naming the tier, the bytes requested, in use, budget;
//  - at most one non-home copy is dirty; unpin(dirty) at one tier drops the other non-home copies
//    (which must then be unpinned), and a fetch copies from the dirty copy when there is one;
//  - NVMe <-> device moves are streamed through fixed staging buffers in pieces, so an item larger
//    than every buffer works.
// Locking, by construction free of waits on completions:
//  - mu_ guards the items, budgets and statistics. No thread waits for I/O or for a device stream
//    while holding it (condition waits release it); synchronous read()/write() mark the item busy
//    and let go of mu_ for their transfers.
//  - Completion paths (the I/O engine's reaper, device stream callbacks) never take mu_: they only
//    post the work to the manager's poster thread (the poster's lock is a leaf), which finishes
//    moves. So a completion can never wait for a thread that waits for that completion.
//  - A move ends only in finish_move(), on the poster thread: Transfers reports every completion
//    and every failure there, also one that happens while the move is being started under mu_.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/trace.h"
#include "device/device.h"
#include "io/buffer.h"
#include "offload/budget.h"
#include "offload/eviction_policy.h"
#include "offload/move_handle.h"
#include "offload/poster.h"
#include "offload/residency.h"
#include "offload/swap_store.h"
#include "offload/tier.h"
#include "offload/transfer.h"

namespace zoe::offload {

struct TierManagerOptions {
  device::Device* device = nullptr;  // the device tier; nullptr: none
  uint64_t device_budget = 0;        // 0: the device's own budget
  uint64_t host_budget = 0;          // host bytes zoe may hold: home items, cached copies, staging
  SwapStore* nvme = nullptr;         // the NVMe tier; nullptr: none
  size_t staging_bytes = 4u << 20;   // staging buffers for NVMe <-> device pieces
  size_t staging_count = 4;
  io::PinMode pin = io::PinMode::kNone;  // pinning of host copies and staging buffers
  EvictionPolicyKind policy = EvictionPolicyKind::kLru;
  uint32_t wait_for_unpin_ms = 0;  // how long a full tier waits for pins to drop before failing
  TraceRecorder* trace = nullptr;  // records every transfer when set
};

class TierManager {
 public:
  static Result<std::unique_ptr<TierManager>> create(const TierManagerOptions& opts);
  // Waits for moves in flight. Dirty copies are not written back: call flush() first.
  ~TierManager();

  // Registers an item of `bytes` whose authoritative copy lives in `home` (its memory or swap
  // space is reserved now, under that tier's budget).
  Status add_item(ItemId id, uint64_t bytes, Tier home);
  // Drops every copy; the item must be unpinned and idle.
  Status remove_item(ItemId id);

  // Sets bytes [offset, offset + len) of the item (len UINT64_MAX: to the end) in its home;
  // other copies are written back first if dirty, then dropped. The item must be unpinned.
  // offset must be a multiple of 4096, and so must offset + len unless it is the item's end.
  Status write(ItemId id, const void* src, uint64_t offset = 0, uint64_t len = UINT64_MAX);
  // Copies bytes [offset, offset + len) of the item's latest content (a present copy, else
  // home) to dst; the same alignment rule. Host memory used: one staging buffer.
  Status read(ItemId id, void* dst, uint64_t offset = 0, uint64_t len = UINT64_MAX);

  // Makes the item resident in `tier` (kDevice or kHost) and pins it there. The handle gives
  // the address. Blocks only while the tier is full and evictions are being written back.
  MoveHandle fetch(ItemId id, Tier tier);
  // Drops one pin; dirty: the caller changed the bytes.
  void unpin(ItemId id, Tier tier, bool dirty = false);
  // Starts loading into `tier` without pinning, if it fits without waiting; skipped otherwise.
  void prefetch(ItemId id, Tier tier);
  // Removes the copy in `tier` (writing it back first if dirty). Pinned copies are refused.
  MoveHandle evict(ItemId id, Tier tier);
  // Writes a dirty copy in `tier` back to the home and keeps it, clean (a cache: later fetches
  // into the device copy from it; the tier's budget drops it when room is needed). Clean or
  // absent: done at once. Pinned copies are refused.
  MoveHandle clean(ItemId id, Tier tier);
  // Writes back every dirty copy and waits; returns the first error.
  Status flush();
  // Waits until no move is in flight; returns the first error since the last drain.
  Status drain();

  // Trace policy: record the order of fetches between begin/end; afterwards evict the copy whose
  // next use in that order is furthest away (Belady).
  void begin_trace();
  void end_trace();

  TierStats stats() const;
  Residency residency(ItemId id, Tier tier) const;
  uint32_t pins(ItemId id, Tier tier) const;
  size_t item_count() const;

 private:
  enum class MoveKind : uint8_t { kLoad, kWriteDrop, kWriteKeep };
  // One move of item `it`'s copy in `tier` on `link`.
  struct Move {
    Item* it = nullptr;
    Tier tier = Tier::kHost;
    MoveKind kind = MoveKind::kLoad;
    Link link = Link::kNvmeToHost;
    uint64_t begin_ns = 0;
    // A load from a cached copy: that copy's tier, pinned for the move's duration.
    std::optional<Tier> src = std::nullopt;
  };

  explicit TierManager(const TierManagerOptions& opts);
  Status init();

  // All *_locked run with mu_ held.
  Item* find_locked(ItemId id) { return table_.find(id); }
  const Item* find_locked(ItemId id) const { return table_.find(id); }
  bool evict_one_locked(Tier tier, bool allow_dirty);
  void start_writeback_locked(Item* it, Tier tier, bool drop);
  // Frees the copy's memory, clears it and gives its bytes back to the budget.
  void drop_copy_locked(Item* it, Tier tier);
  // Pins the move's source copy, if any, and starts its transfer, which never waits; finish_move()
  // ends it on the poster. The caller has counted it in in_flight_.
  void start_move_locked(Move m, const Places& at);
  // Starts loading the copy of `it` in `tier` (state kLoading, reserved, allocated by the caller).
  // Returns false when a source is busy and may_wait is false.
  bool start_load_locked(std::unique_lock<std::mutex>& lock, Item* it, Tier tier, bool may_wait);
  MoveHandle load_locked(std::unique_lock<std::mutex>& lock, Item* it, Tier tier, bool pin, bool may_wait);
  MoveHandle write_home(ItemId id, Tier tier, bool drop);  // evict() and clean()
  // On the poster thread: takes mu_, records the move's end in the table, budget and statistics.
  void finish_move(const Move& m, Status st);
  void wait_locked(std::unique_lock<std::mutex>& lock);
  // Synchronous copy between caller memory and the item's nvme home through the sync staging
  // buffer. Called with mu_ held; lets go of it while the I/O runs (the item is marked busy).
  Status nvme_sync(std::unique_lock<std::mutex>& lock, Item* it, char* data, bool write, uint64_t offset,
                   uint64_t len);

  TierManagerOptions opts_;
  Poster poster_;
  std::unique_ptr<Transfers> transfers_;  // after poster_: destroyed before it

  mutable std::mutex mu_;
  std::condition_variable cv_;  // something changed: a move ended, a pin dropped, bytes freed
  ResidencyTable table_;
  Budget budget_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<EvictionCandidate> candidates_;  // evict_one_locked's scratch
  uint64_t in_flight_ = 0;
  Status first_error_;
  TierStats stats_;
};

}  // namespace zoe::offload
