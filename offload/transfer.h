// Transfers: the one routine that moves an item's bytes on any link between NVMe, host and
// device, and the synchronous NVMe copy behind TierManager::read()/write().
//
// Every link is made of hops, each a single asynchronous copy: nvme->host and host->nvme are one
// I/O, host->device and device->host one stream copy. NVMe <-> device has no direct path: it goes
// in pieces through the staging pool, each piece two hops through one staging buffer
// (nvme->host->device, device->host->nvme), as many pieces in flight as there are buffers.
//
// Threads: start() never waits for a transfer (it may be called with the caller's lock held).
// Every completion, success or failure, is reported on the poster thread, never on the caller's
// or on a completion path's, so `done` may take the caller's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "device/device.h"
#include "offload/poster.h"
#include "offload/staging.h"
#include "offload/swap_store.h"
#include "offload/tier.h"

namespace zoe::offload {

// Where one item's bytes are, as far as a move needs: its NVMe extent, its host and device copies.
struct Places {
  StateKey key;
  char* host = nullptr;
  char* device = nullptr;
};

class Transfers {
 public:
  using Done = std::function<void(Status)>;

  // device: nullptr when there is no device tier (no streams); nvme: nullptr when there is no
  // NVMe tier (no staging). The poster, device and store must outlive this.
  static Result<std::unique_ptr<Transfers>> create(Poster& poster, device::Device* device, SwapStore* nvme,
                                                   size_t staging_bytes, size_t staging_count,
                                                   io::PinMode pin);

  // Moves bytes [0, bytes) of the item on `link`, from and to the places it names. done runs
  // once, on the poster thread, with the first error of any piece.
  void start(Link link, const Places& at, uint64_t bytes, Done done);

  // Copies bytes [first, first + len) between caller memory `data` (any alignment) and the NVMe
  // extent `key` of `alloc` bytes, through the synchronous staging buffer; the disk sees whole
  // 4096-byte blocks (a write pads the last one with zeros). A write from 4096-byte aligned
  // memory sends its whole blocks from `data` itself, kDirectWritesInFlight staging-sized pieces
  // at once (the initial placing of every partition). Blocks until the I/O is done: the caller
  // must not hold a lock that the poster's work takes.
  Status copy_sync(const StateKey& key, uint64_t alloc, char* data, bool write, uint64_t first, uint64_t len);
  static constexpr size_t kDirectWritesInFlight = 8;

  // Waits for the device streams to finish what was queued on them.
  void synchronize();

 private:
  Transfers(Poster& poster, SwapStore* nvme) : poster_(poster), nvme_(nvme) {}
  // Whole blocks [first, first + len) written from `data` (4096-byte aligned) in pieces.
  Status write_direct(const StateKey& key, const char* data, uint64_t first, uint64_t len);
  // One hop of len bytes: the NVMe side at `offset` of key, the host and device sides at the
  // addresses given. done runs on the poster thread.
  void hop(Link link, const StateKey& key, uint64_t offset, char* host, char* device, size_t len, Done done);
  // A link without a direct path: every piece takes hop `first` into a staging buffer, then
  // hop `second` out of it.
  void start_staged(Link first, Link second, const Places& at, uint64_t bytes, Done done);

  Poster& poster_;
  SwapStore* nvme_;
  std::unique_ptr<device::Stream> h2d_, d2h_;
  std::unique_ptr<StagingPool> staging_;
};

}  // namespace zoe::offload
