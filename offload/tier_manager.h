// TierManager: where every item (a partition's state) lives — device, pinned host, NVMe — under
// hard per-tier byte budgets, with asynchronous moves, pins, eviction (LRU or trace/Belady) and
// statistics. It moves bytes and knows nothing of models or ZeRO stages.
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
//    post the work to the manager's poster thread (post_mu_ is a leaf lock), which finishes moves.
//    So a completion can never wait for a thread that waits for that completion.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/trace.h"
#include "device/device.h"
#include "io/buffer.h"
#include "offload/swap_store.h"

namespace zoe::offload {

enum class Tier : uint8_t { kDevice = 0, kHost = 1, kNvme = 2 };
const char* tier_name(Tier t);
enum class Residency : uint8_t { kAbsent, kLoading, kResident, kDirty, kWriting };
const char* residency_name(Residency r);
enum class EvictionPolicy : uint8_t { kLru, kTrace };

using ItemId = uint64_t;

struct TierManagerOptions {
  device::Device* device = nullptr;  // the device tier; nullptr: none
  uint64_t device_budget = 0;        // 0: the device's own budget
  uint64_t host_budget = 0;          // host bytes zoe may hold: home items, cached copies, staging
  SwapStore* nvme = nullptr;         // the NVMe tier; nullptr: none
  size_t staging_bytes = 4u << 20;   // staging buffers for NVMe <-> device pieces
  size_t staging_count = 4;
  io::PinMode pin = io::PinMode::kNone;  // pinning of host copies and staging buffers
  EvictionPolicy policy = EvictionPolicy::kLru;
  uint32_t wait_for_unpin_ms = 0;    // how long a full tier waits for pins to drop before failing
  TraceRecorder* trace = nullptr;    // records every transfer when set
};

// The completion of a fetch or an eviction. Thread-safe, copyable.
class MoveHandle {
 public:
  MoveHandle() = default;
  // The copy's address (device or host) once the move is done, or the error.
  Result<void*> wait() const;
  bool ready() const;

 private:
  friend class TierManager;
  struct State;
  std::shared_ptr<State> s_;
};

struct LinkStats {
  uint64_t bytes = 0;
  uint64_t transfers = 0;
  uint64_t busy_ns = 0;  // sum of transfer durations
  double gbps() const { return busy_ns ? static_cast<double>(bytes) / static_cast<double>(busy_ns) : 0.0; }
};

struct TierStats {
  uint64_t budget[3] = {0, 0, 0};
  uint64_t used[3] = {0, 0, 0};
  uint64_t high_water[3] = {0, 0, 0};
  // Indexed by link(): nvme->host, host->nvme, host->device, device->host, nvme->device, device->nvme.
  LinkStats links[6];
  uint64_t wait_ns = 0;        // time callers spent blocked (full tiers, fetch waits)
  uint64_t evictions = 0;
  uint64_t writebacks = 0;
  uint64_t prefetches = 0, prefetch_skipped = 0;
  static const char* link_name(int i);
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
  struct Copy;
  struct Item;
  explicit TierManager(const TierManagerOptions& opts);
  Status init();

  // All *_locked run with mu_ held.
  Item* find_locked(ItemId id);
  const Item* find_locked(ItemId id) const;
  Status reserve_locked(std::unique_lock<std::mutex>& lock, Tier tier, uint64_t bytes, bool may_wait);
  void release_locked(Tier tier, uint64_t bytes);
  enum class MoveKind : uint8_t { kLoad, kWriteDrop, kWriteKeep };
  static MoveHandle ready_handle(Status s, void* p);
  bool evict_one_locked(Tier tier, uint64_t* freed_now, bool allow_dirty);
  void start_writeback_locked(Item* it, Tier tier, bool drop);
  void drop_copy_locked(Item* it, Tier tier);
  void invalidate_others_locked(Item* it, Tier keep);
  uint64_t next_use_locked(ItemId id) const;
  // Starts loading the copy of `it` in `tier` (state kLoading, reserved, allocated by the caller).
  // Returns false when a source is busy and may_wait is false.
  bool start_load_locked(std::unique_lock<std::mutex>& lock, Item* it, Tier tier, bool may_wait);
  MoveHandle load_locked(std::unique_lock<std::mutex>& lock, Item* it, Tier tier, bool pin, bool may_wait);
  void finish_move(Item* it, Tier tier, Status st, MoveKind kind, int src_tier, int link, uint64_t begin_ns);
  void fail_async(Item* it, Tier tier, Status s, MoveKind kind, int src_tier, int link, uint64_t begin_ns);
  void wait_locked(std::unique_lock<std::mutex>& lock);
  // Synchronous copy between caller memory and the item's nvme home through the sync staging
  // buffer. Called with mu_ held; lets go of it while the I/O runs (the item is marked busy).
  Status nvme_sync(std::unique_lock<std::mutex>& lock, Item* it, char* data, bool write, uint64_t offset,
                   uint64_t len);
  Status nvme_sync_unlocked(Item* it, char* data, bool write, uint64_t offset, uint64_t len);

  // Runs fn on the poster thread once the stream reaches this point.
  Status after(device::Stream& s, std::function<void()> fn);
  void post(std::function<void()> fn);
  void run_posted();

  // Staging buffers: jobs wait in a queue for a free buffer.
  void with_staging(std::function<void(char*)> job);
  void release_staging(char* buf);

  TierManagerOptions opts_;
  std::unique_ptr<device::Stream> h2d_, d2h_;
  std::unique_ptr<io::BufferPool> staging_;
  std::mutex staging_mu_;
  std::vector<char*> staging_free_;
  std::deque<std::function<void(char*)>> staging_wait_;
  std::mutex sync_mu_;            // guards sync_staging_; never taken with mu_ held
  char* sync_staging_ = nullptr;  // read()/write() to NVMe

  std::thread poster_;
  std::mutex post_mu_;
  std::condition_variable post_cv_;
  std::deque<std::function<void()>> posted_;
  bool post_stop_ = false;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<ItemId, std::unique_ptr<Item>> items_;
  uint64_t budget_[3] = {0, 0, 0};
  uint64_t used_[3] = {0, 0, 0};
  uint64_t high_water_[3] = {0, 0, 0};
  uint64_t pending_free_[3] = {0, 0, 0};  // bytes being written back, to be freed
  uint64_t in_flight_ = 0;
  uint64_t clock_ = 0;  // LRU clock
  Status first_error_;
  TierStats stats_;

  bool tracing_ = false;
  std::vector<ItemId> trace_;
  std::unordered_map<ItemId, std::vector<uint64_t>> trace_pos_;
  uint64_t cursor_ = 0;
};

}  // namespace zoe::offload
