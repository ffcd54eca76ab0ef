// OptimizerSwapper: the optimizer step as a pipeline over chunks of sub-groups whose states live
// on NVMe: read chunk i+1 while chunk i is updated while chunk i-1 is written back. Host memory
// is bounded by buffer_count buffers, whatever the model size; a sub-group larger than a buffer
// is streamed through in chunks. With no SwapStore, states live in host memory and the same
// step() runs with no I/O.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/trace.h"
#include "io/buffer.h"
#include "offload/swap_store.h"
#include "offload/swapper_limits.h"
#include "offload/tier.h"

namespace zoe::offload {

struct SwappedState {
  StateKind kind = StateKind::kOther;
  uint32_t elem_bytes = 4;  // 4 for fp32, 2 for bf16/fp16; a blocked state: the bytes of one block
  bool write_back = true;   // false: read-only (gradients)
  // Elements per block (a divisor of 4096): a packed low-bit state is stored as whole blocks of
  // codes and scale (optim/lowbit.h), elem_bytes each; n elements take ceil(n / block_elems)
  // blocks. Callers' buffers hold a range's blocks back to back; on NVMe each chunk's blocks
  // start on a 4096-byte boundary.
  uint32_t block_elems = 1;
};

struct SwapperOptions {
  std::vector<SwappedState> states;  // e.g. master params, m, v (written back) and gradients (read)
  size_t buffer_count = 12;          // buffers in all; a pipeline slot takes one per state
  size_t buffer_bytes = 16u << 20;   // each; a multiple of 4096
  // Buffers of write_state_async() beyond buffer_count, in [1, kMaxAsyncWriteBuffers]: that many
  // chunks written behind the caller before it waits.
  size_t async_buffers = kAsyncWriteBuffers;
  io::PinMode pin = io::PinMode::kLock;
  TraceRecorder* trace = nullptr;
};

// One chunk handed to the update: elements [begin, begin + n) of group `group`; data[k] points
// at the chunk of state k (n elements of states[k].elem_bytes each).
struct ChunkView {
  GroupId group;
  size_t begin = 0;
  size_t n = 0;
  void* const* data = nullptr;
};
using ChunkUpdate = std::function<Status(const ChunkView&)>;

struct SwapperStats {
  uint64_t chunks = 0;
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t step_ns = 0;
  uint64_t compute_ns = 0;  // inside the update callback
  uint64_t io_wait_ns = 0;  // blocked on a read or on a free slot
};

class OptimizerSwapper {
 public:
  // store == nullptr: states live in host memory. Errors: no states, buffer_count smaller than
  // the number of states, buffer_bytes not a multiple of 4096, buffers that cannot be pinned.
  static Result<std::unique_ptr<OptimizerSwapper>> create(SwapStore* store, const SwapperOptions& opts);
  ~OptimizerSwapper();

  // Registers sub-group `id` of `elems` elements: swap space (or host memory) for each state.
  Status add_group(GroupId gid, size_t elems);
  // State transfers for setup, checks and checkpoints (caller memory needs no alignment):
  // elements [begin, begin + n) of the state; n = SIZE_MAX means to the end. begin must be a
  // multiple of chunk_elems(), and so must n unless the range reaches the end. Host memory
  // used: one buffer, whatever the size.
  Status write_state(GroupId gid, size_t state, const void* src, size_t begin = 0, size_t n = SIZE_MAX);
  Status read_state(GroupId gid, size_t state, void* dst, size_t begin = 0, size_t n = SIZE_MAX);
  // Starts writing one chunk of a state, elements [begin, begin + n) (begin on a chunk boundary,
  // n = chunk_elems() unless the range reaches the group's end), and returns once src is copied
  // into one of its async_buffers buffers: the write completes in the background, that many at
  // once.
  // read_state and write_state first wait for every write started so and fail with the first
  // one's error (which stays); wait_async_writes() and step() wait, report it and clear it; the
  // destructor waits too.
  Status write_state_async(GroupId gid, size_t state, const void* src, size_t begin, size_t n);
  // The same, written from src itself where it can be (src 4096-byte aligned and the chunk whole
  // 4096-byte blocks; else copied as write_state_async does): no copy, so the caller must leave
  // src unchanged until wait_async_writes() returns. Such writes take no buffer: at most
  // kMaxBorrowedWrites of them are in flight at once, beside the async_buffers copied ones.
  Status write_state_borrowed(GroupId gid, size_t state, const void* src, size_t begin, size_t n);
  Status wait_async_writes();

  // The next step's first chunks, early (during the backward that produces their gradients):
  // starts reading the written-back states (not the read-only ones: the gradient) of up to
  // `max_slots` chunks in step order into slots (waiting for those the asynchronous writes hold;
  // keep one for the transfers that follow: max_slots < slots()). step() consumes
  // them first. A write of any state through write_state, or of a written-back state through
  // write_state_async, drops them (they would be stale); so does drop_preloaded().
  void preload(size_t max_slots);
  // The caller's intent, with the slot policy left to the swapper: the next step's gradients are
  // final from here on, so read its first chunks now, as many as the slots allow while one stays
  // for the transfers that follow. Once per step: again only after step() or drop_preloaded().
  void read_ahead_next_step();
  // Hands a preloaded chunk's read-only state over from memory: n elements of `state` of chunk
  // (id, begin) into its slot, so step() does not read it from NVMe. False (nothing done) when
  // that chunk is not preloaded.
  bool fill_preloaded(GroupId gid, size_t begin, size_t state, const void* src, size_t n);
  // Waits for the preloaded chunks' reads, writes home the states fill_preloaded() handed over
  // (they exist nowhere else), and gives their slots back; the first error.
  Status drop_preloaded();
  size_t preloaded() const { return preloaded_.size(); }

  // One pass over every group in registration order. The first error (I/O or from `update`)
  // stops the pass; it returns once nothing is in flight, with every buffer back in the pool.
  // write_all: also write back the read-only states (to initialise them chunk by chunk).
  Status step(const ChunkUpdate& update, bool write_all = false);

  const SwapperStats& last_stats() const { return stats_; }
  size_t slots() const { return slots_; }
  size_t free_slots();
  size_t chunk_elems() const { return chunk_elems_; }
  uint64_t buffer_bytes_total() const { return pool_ ? pool_->total_bytes() : 0; }

 private:
  // A timeline is being recorded: event names are built only then (they cost a string each).
  bool tracing() const { return opts_.trace && opts_.trace->enabled(); }
  struct Group {
    uint64_t id;
    size_t elems;
    std::vector<io::AlignedBuffer> host;  // host mode: one per state
  };
  OptimizerSwapper(SwapStore* store, const SwapperOptions& opts) : store_(store), opts_(opts) {}
  Group* find(uint64_t id);
  Status sync_read(const Group& g, size_t state, char* data, size_t first, size_t last);
  char* slot_buffer(size_t slot, size_t state) const;
  size_t state_bytes(size_t state, size_t n) const;        // n elements (from a chunk boundary) of a state
  size_t span_bytes(size_t n, size_t state) const;         // state_bytes rounded up to 4096
  uint64_t home_offset(size_t state, size_t begin) const;  // element `begin` (a chunk boundary) in its home
  uint64_t home_bytes(size_t state, size_t elems) const;   // a group's home of `elems` elements
  // write_state_async (borrow false) and write_state_borrowed (borrow true).
  Status write_async(GroupId gid, size_t state, const void* src, size_t begin, size_t n, bool borrow);
  Status sync_transfer(uint64_t id, size_t state, char* data, bool write, size_t begin, size_t n);
  Status step_host(const ChunkUpdate& update);
  // step()'s chunks in order, and the reads of those on their way (rest: a preloaded chunk's
  // states it did not have).
  struct StepChunk {
    const Group* g;
    size_t begin, n;
  };
  struct StepRead {
    size_t slot;
    io::IoHandle h;
    uint64_t t0;
    io::IoHandle rest = nullptr;
  };
  size_t resume_preloaded(const std::vector<StepChunk>& chunks, std::deque<StepRead>* reads, Status* err);
  void write_back_chunk(const StepChunk& c, size_t slot, bool write_all);
  void release_slot(size_t slot, Status error);

  SwapStore* store_;
  SwapperOptions opts_;
  std::unique_ptr<io::BufferPool> pool_;  // slots_ x states buffers
  size_t slots_ = 0;
  size_t chunk_elems_ = 0;
  std::vector<Group> groups_;
  SwapperStats stats_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<size_t> free_;  // free slots, guarded by mu_
  Status write_err_;          // first write-back error of the current step, guarded by mu_
  // Chunks read ahead of step() by preload(), in step order from the first (touched by the
  // caller's thread between steps and by step(), never at once).
  struct Preloaded {
    uint64_t group;
    size_t begin, n, slot;
    io::IoHandle h;
    uint64_t t0;
    std::vector<bool> have;  // per state: in the slot (read, or filled)
  };
  std::vector<Preloaded> preloaded_;
  Status release_preloaded(Preloaded& p);
  Status discard_preloaded();                    // drop_preloaded() without ending the step's read-ahead
  bool read_ahead_ = false;                      // read_ahead_next_step() ran since the last step()
  size_t async_writes_ = 0;                      // write_state_async() writes in flight, guarded by mu_
  size_t borrowed_writes_ = 0;                   // of which borrowed (no buffer taken), guarded by mu_
  static constexpr size_t kBorrowed = SIZE_MAX;  // the buffer index of a borrowed write
  std::vector<size_t> async_free_;  // its free buffers (pool indices after the slots'), guarded by mu_
  Status async_err_;                // the first of their errors since the last wait, guarded by mu_
};

}  // namespace zoe::offload
