// OptimizerSwapper: slot-based read-ahead / update / write-behind pipeline over SwapStore chunks.
#include "offload/optimizer_swapper.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "core/clock.h"
#include "core/log.h"
#include "core/units.h"

namespace zoe::offload {

Result<std::unique_ptr<OptimizerSwapper>> OptimizerSwapper::create(SwapStore* store,
                                                                   const SwapperOptions& opts) {
  if (opts.states.empty()) return invalid_argument("optimizer swapper: no states to swap");
  // The most elements a buffer holds of every state.
  size_t fit = SIZE_MAX;
  for (const auto& s : opts.states) {
    if (s.block_elems == 0 || 4096 % s.block_elems != 0)
      return invalid_argument("optimizer swapper: %u elements per block do not divide 4096", s.block_elems);
    if (s.elem_bytes == 0 || (s.block_elems == 1 && s.elem_bytes > 8) || s.elem_bytes > 4096)
      return invalid_argument("optimizer swapper: element size %u", s.elem_bytes);
    fit = std::min<size_t>(fit, opts.buffer_bytes / s.elem_bytes * s.block_elems);
  }
  std::unique_ptr<OptimizerSwapper> sw(new OptimizerSwapper(store, opts));
  if (opts.buffer_bytes < 4096 || opts.buffer_bytes % 4096) {
    return invalid_argument("optimizer swapper: buffer size %zu is not a positive multiple of 4096",
                            opts.buffer_bytes);
  }
  sw->slots_ = opts.buffer_count / opts.states.size();
  if (sw->slots_ == 0) {
    return invalid_argument(
        "optimizer swapper: buffer_count %zu is smaller than the %zu optimizer states it must hold "
        "at once (set buffer_count >= %zu; 3x that overlaps reads, updates and writes)",
        opts.buffer_count, opts.states.size(), opts.states.size());
  }
  // Chunks are a multiple of 4096 elements: whole 4096-byte blocks of every unblocked state, whole
  // blocks of every blocked one.
  sw->chunk_elems_ = fit / 4096 * 4096;
  if (sw->chunk_elems_ == 0) sw->chunk_elems_ = 4096;
  for (size_t k = 0; k < opts.states.size(); ++k) {
    if (sw->state_bytes(k, sw->chunk_elems_) > opts.buffer_bytes) {
      return invalid_argument(
          "optimizer swapper: buffers of %zu bytes are too small for one chunk of 4096 elements of state %zu",
          opts.buffer_bytes, k);
    }
  }
  if (opts.async_buffers < 1 || opts.async_buffers > kMaxAsyncWriteBuffers) {
    return invalid_argument("optimizer swapper: %zu asynchronous write buffers (1 to %zu)",
                            opts.async_buffers, kMaxAsyncWriteBuffers);
  }
  if (!store) return sw;  // host mode: same chunks, no buffers, no I/O
  ZOE_ASSIGN_OR_RETURN(
      sw->pool_, io::BufferPool::create(opts.buffer_bytes,
                                        sw->slots_ * opts.states.size() + opts.async_buffers, opts.pin));
  iovec v{sw->pool_->base(), sw->pool_->total_bytes()};
  (void)store->engine().register_buffers({&v, 1});  // optional: fixed buffers
  for (size_t s = 0; s < sw->slots_; ++s) sw->free_.push_back(s);
  for (size_t b = 0; b < opts.async_buffers; ++b)
    sw->async_free_.push_back(sw->slots_ * opts.states.size() + b);
  return sw;
}

OptimizerSwapper::~OptimizerSwapper() {
  if (!store_) return;
  (void)wait_async_writes();  // their callbacks touch this object
  (void)drop_preloaded();
  for (const auto& g : groups_) {
    for (const auto& s : opts_.states) store_->free(StateKey{g.id, s.kind});
  }
}

OptimizerSwapper::Group* OptimizerSwapper::find(uint64_t id) {
  for (auto& g : groups_) {
    if (g.id == id) return &g;
  }
  return nullptr;
}

char* OptimizerSwapper::slot_buffer(size_t slot, size_t state) const {
  return pool_->buffer(slot * opts_.states.size() + state);
}

size_t OptimizerSwapper::state_bytes(size_t state, size_t n) const {
  const SwappedState& s = opts_.states[state];
  return (n + s.block_elems - 1) / s.block_elems * s.elem_bytes;
}

size_t OptimizerSwapper::span_bytes(size_t n, size_t state) const {
  return (state_bytes(state, n) + 4095) & ~size_t{4095};
}

uint64_t OptimizerSwapper::home_offset(size_t state, size_t begin) const {
  const SwappedState& s = opts_.states[state];
  if (s.block_elems == 1) return static_cast<uint64_t>(begin) * s.elem_bytes;
  // A blocked state on NVMe: each chunk's blocks start on a 4096-byte boundary (direct I/O);
  // in host memory they follow each other.
  if (!store_) return state_bytes(state, begin);
  return static_cast<uint64_t>(begin / chunk_elems_) * span_bytes(chunk_elems_, state);
}

uint64_t OptimizerSwapper::home_bytes(size_t state, size_t elems) const {
  const size_t rest = elems % chunk_elems_;
  return home_offset(state, elems - rest) + (rest == 0           ? 0
                                             : store_ == nullptr ? state_bytes(state, rest)
                                                                 : span_bytes(rest, state));
}

void OptimizerSwapper::release_slot(size_t slot, Status error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error.is_ok() && write_err_.is_ok()) write_err_ = std::move(error);
  free_.push_back(slot);
  cv_.notify_all();  // under the lock: the waiter cannot return before this call is done
}

size_t OptimizerSwapper::free_slots() {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

Status OptimizerSwapper::add_group(GroupId gid, size_t elems) {
  const uint64_t id = gid.value;
  if (elems == 0)
    return invalid_argument("optimizer swapper: group %llu has no elements",
                            static_cast<unsigned long long>(id));
  if (find(id))
    return invalid_argument("optimizer swapper: group %llu is already registered",
                            static_cast<unsigned long long>(id));
  Group g{id, elems, {}};
  for (size_t k = 0; k < opts_.states.size(); ++k) {
    const uint64_t bytes = opts_.states[k].block_elems == 1
                               ? static_cast<uint64_t>(elems) * opts_.states[k].elem_bytes
                               : home_bytes(k, elems);
    if (store_) {
      // States start as zeros, on NVMe as in memory (the host path clears its buffers below).
      auto e = store_->allocate(StateKey{id, opts_.states[k].kind}, bytes, io::Unwritten::kZeros);
      if (!e.is_ok()) {
        for (size_t j = 0; j < k; ++j) store_->free(StateKey{id, opts_.states[j].kind});
        return e.status().with_context("registering optimizer sub-group " + std::to_string(id));
      }
    } else {
      ZOE_ASSIGN_OR_RETURN(io::AlignedBuffer b, io::AlignedBuffer::allocate(bytes, io::PinMode::kNone));
      memset(b.data(), 0, bytes);
      g.host.push_back(std::move(b));
    }
  }
  groups_.push_back(std::move(g));
  return Status::ok();
}

Status OptimizerSwapper::sync_transfer(uint64_t id, size_t state, char* data, bool write, size_t first,
                                       size_t count) {
  {
    // After the asynchronous writes; their error stays for wait_async_writes() and step() to
    // report (another thread's transfer, a checkpoint's, must not swallow it).
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return async_writes_ == 0; });
    if (!async_err_.is_ok()) return async_err_;
  }
  if (write) ZOE_RETURN_IF_ERROR(discard_preloaded());  // they would be stale
  Group* g = find(id);
  if (!g) return not_found("optimizer swapper: no group %llu", static_cast<unsigned long long>(id));
  if (state >= opts_.states.size()) return invalid_argument("optimizer swapper: no state %zu", state);
  if (first > g->elems)
    return invalid_argument("optimizer swapper: element %zu is beyond group %llu's %zu", first,
                            static_cast<unsigned long long>(id), g->elems);
  const size_t last = count == SIZE_MAX ? g->elems : std::min(g->elems, first + count);
  if (first % chunk_elems_ != 0 || (last != g->elems && last % chunk_elems_ != 0)) {
    return invalid_argument("optimizer swapper: range [%zu, %zu) is not on %zu-element chunk boundaries",
                            first, last, chunk_elems_);
  }
  if (!store_) {
    char* home = g->host[state].bytes() + home_offset(state, first);
    if (write)
      memcpy(home, data, state_bytes(state, last - first));
    else
      memcpy(data, home, state_bytes(state, last - first));
    return Status::ok();
  }
  if (!write) return sync_read(*g, state, data, first, last);
  size_t slot;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty(); });
    slot = free_.back();
    free_.pop_back();
  }
  char* buf = slot_buffer(slot, state);
  StateKey key{id, opts_.states[state].kind};
  Status s;
  for (size_t begin = first; begin < last && s.is_ok(); begin += chunk_elems_) {
    size_t n = std::min(chunk_elems_, last - begin);
    size_t bytes = state_bytes(state, n), span = span_bytes(n, state);
    uint64_t off = home_offset(state, begin);
    char* mine = data + state_bytes(state, begin - first);
    if (write) {
      memcpy(buf, mine, bytes);
      memset(buf + bytes, 0, span - bytes);
      s = store_->write(key, off, buf, span)->wait();
    } else {
      s = store_->read(key, off, buf, span)->wait();
      if (s.is_ok()) memcpy(mine, buf, bytes);
    }
  }
  release_slot(slot, Status::ok());
  return s;
}

// The chunks of [first, last) read with up to kSyncReadDepth in flight. A chunk of whole 4096-byte
// blocks whose place in `data` is 4096-byte aligned is read there itself; the others through a
// slot (one waited for, more taken only where they are free now: another thread's transfers keep
// theirs), copied out in order as their reads complete.
Status OptimizerSwapper::sync_read(const Group& g, size_t state, char* data, size_t first, size_t last) {
  constexpr size_t kSyncReadDepth = 8;
  auto dst = [&](size_t begin) { return data + state_bytes(state, begin - first); };
  auto direct = [&](size_t begin, size_t n) {
    return span_bytes(n, state) == state_bytes(state, n) &&
           reinterpret_cast<uintptr_t>(dst(begin)) % 4096 == 0;
  };
  bool staged = false;
  for (size_t b = first; b < last && !staged; b += chunk_elems_)
    staged = !direct(b, std::min(chunk_elems_, last - b));
  std::vector<size_t> slots;
  if (staged) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty(); });
    while (!free_.empty() && slots.size() < kSyncReadDepth) {
      slots.push_back(free_.back());
      free_.pop_back();
    }
  }
  constexpr size_t kNoSlot = SIZE_MAX;  // read into `data` itself
  struct InFlight {
    io::IoHandle h;
    size_t slot, begin, n;
  };
  std::deque<InFlight> flight;
  const StateKey key{g.id, opts_.states[state].kind};
  Status s;
  std::vector<size_t> idle = slots;
  size_t next = first;
  while (s.is_ok() && (next < last || !flight.empty())) {
    const size_t n = std::min(chunk_elems_, last - next);
    const bool here = next < last && direct(next, n);
    if (next < last && flight.size() < kSyncReadDepth && (here || !idle.empty())) {
      const size_t slot = here ? kNoSlot : idle.back();
      if (!here) idle.pop_back();
      char* to = here ? dst(next) : slot_buffer(slot, state);
      flight.push_back(
          {store_->read(key, home_offset(state, next), to, span_bytes(n, state)), slot, next, n});
      next += n;
      continue;
    }
    InFlight f = std::move(flight.front());
    flight.pop_front();
    s = f.h->wait();
    if (f.slot == kNoSlot) continue;
    if (s.is_ok()) memcpy(dst(f.begin), slot_buffer(f.slot, state), state_bytes(state, f.n));
    idle.push_back(f.slot);  // free again for the next chunk
  }
  for (InFlight& f : flight) (void)f.h->wait();  // after an error: nothing may still write the slots
  for (size_t slot : slots) release_slot(slot, Status::ok());
  return s;
}

Status OptimizerSwapper::wait_async_writes() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return async_writes_ == 0; });
  Status s = std::move(async_err_);
  async_err_ = Status::ok();
  return s;
}

Status OptimizerSwapper::write_state_async(GroupId gid, size_t state, const void* src, size_t begin,
                                           size_t n) {
  return write_async(gid, state, src, begin, n, false);
}

Status OptimizerSwapper::write_state_borrowed(GroupId gid, size_t state, const void* src, size_t begin,
                                              size_t n) {
  return write_async(gid, state, src, begin, n, true);
}

Status OptimizerSwapper::write_async(GroupId gid, size_t state, const void* src, size_t begin, size_t n,
                                     bool borrow) {
  const uint64_t id = gid.value;
  Group* g = find(id);
  if (!g) return not_found("optimizer swapper: no group %llu", static_cast<unsigned long long>(id));
  if (state >= opts_.states.size()) return invalid_argument("optimizer swapper: no state %zu", state);
  if (begin % chunk_elems_ != 0 || begin >= g->elems || n == 0 || n > chunk_elems_ ||
      (begin + n != g->elems && n != chunk_elems_) || begin + n > g->elems) {
    return invalid_argument(
        "optimizer swapper: an asynchronous write of [%zu, %zu) of group %llu (%zu elements) is not one "
        "%zu-element chunk",
        begin, begin + n, static_cast<unsigned long long>(id), g->elems, chunk_elems_);
  }
  if (!store_) {
    memcpy(g->host[state].bytes() + home_offset(state, begin), src, state_bytes(state, n));
    return Status::ok();
  }
  if (opts_.states[state].write_back)
    ZOE_RETURN_IF_ERROR(discard_preloaded());  // a preloaded copy would be stale
  const size_t bytes = state_bytes(state, n), span = span_bytes(n, state);
  // Borrowed: the disk reads src itself, so no buffer is taken; such writes count apart (at most
  // kMaxBorrowedWrites in flight), so a module's chunks are in flight together.
  borrow = borrow && span == bytes && reinterpret_cast<uintptr_t>(src) % 4096 == 0;
  size_t index = kBorrowed;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (borrow) {
      cv_.wait(lock, [&] { return borrowed_writes_ < kMaxBorrowedWrites; });
      borrowed_writes_++;
    } else {
      cv_.wait(lock, [&] { return !async_free_.empty(); });
      index = async_free_.back();
      async_free_.pop_back();
    }
    async_writes_++;
  }
  char* buf = borrow ? static_cast<char*>(const_cast<void*>(src)) : pool_->buffer(index);
  if (!borrow) {
    memcpy(buf, src, bytes);
    memset(buf + bytes, 0, span - bytes);
  }
  const StateKey key{id, opts_.states[state].kind};
  const uint64_t t0 = now_ns();
  // The callback touches only members (the destructor waits for it); it runs on the I/O
  // engine's completion path and takes mu_ only to give the slot back.
  store_->write(key, home_offset(state, begin), buf, span,
                [this, index, id, begin, t0](io::IoCompletion& done) {
                  const std::string what = std::to_string(id) + "@" + std::to_string(begin);
                  if (tracing())
                    opts_.trace->record("write " + what, "host->nvme", t0, now_ns(), 0, kLaneOptWrite);
                  std::lock_guard<std::mutex> lock(mu_);
                  if (!done.status().is_ok() && async_err_.is_ok())
                    async_err_ = done.status().with_context("writing optimizer state chunk " + what);
                  if (index == kBorrowed) {
                    borrowed_writes_--;
                  } else {
                    async_free_.push_back(index);
                  }
                  async_writes_--;
                  cv_.notify_all();
                });
  return Status::ok();
}

void OptimizerSwapper::preload(size_t max_slots) {
  if (!store_ || !preloaded_.empty()) return;
  max_slots =
      std::min(max_slots, slots_ - 1);  // one stays for transfers: waiting for it never ends otherwise
  const size_t K = opts_.states.size();
  for (const auto& g : groups_) {
    for (size_t b = 0; b < g.elems; b += chunk_elems_) {
      if (preloaded_.size() >= max_slots) return;
      size_t slot;
      {
        // Waits for a slot the asynchronous writes hold (they end on their own): how many chunks
        // are read ahead does not depend on timing.
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !free_.empty(); });
        slot = free_.back();
        free_.pop_back();
      }
      const size_t n = std::min(chunk_elems_, g.elems - b);
      std::vector<StoreIo> ios;
      std::vector<bool> have(K, false);
      for (size_t k = 0; k < K; ++k) {
        if (!opts_.states[k].write_back) continue;
        ios.push_back(StoreIo{io::IoOp::kRead, StateKey{g.id, opts_.states[k].kind}, home_offset(k, b),
                              slot_buffer(slot, k), span_bytes(n, k)});
        have[k] = true;
      }
      if (ios.empty()) {
        release_slot(slot, Status::ok());
        return;
      }
      preloaded_.push_back(Preloaded{g.id, b, n, slot, store_->transfer(ios), now_ns(), std::move(have)});
    }
  }
}

bool OptimizerSwapper::fill_preloaded(GroupId gid, size_t begin, size_t state, const void* src, size_t n) {
  const uint64_t id = gid.value;
  if (state >= opts_.states.size()) return false;
  for (Preloaded& p : preloaded_) {
    if (p.group != id || p.begin != begin) continue;
    if (p.n != n || p.have[state]) return false;
    const size_t bytes = state_bytes(state, n), span = span_bytes(n, state);
    char* buf = slot_buffer(p.slot, state);  // not one the preload is reading into
    memcpy(buf, src, bytes);
    memset(buf + bytes, 0, span - bytes);
    p.have[state] = true;
    return true;
  }
  return false;
}

Status OptimizerSwapper::release_preloaded(Preloaded& p) {
  Status s = p.h->wait();
  // A state handed over by fill_preloaded() exists nowhere else: written home first.
  for (size_t k = 0; k < opts_.states.size(); ++k) {
    if (!p.have[k] || opts_.states[k].write_back) continue;
    Status w = store_
                   ->write(StateKey{p.group, opts_.states[k].kind}, home_offset(k, p.begin),
                           slot_buffer(p.slot, k), span_bytes(p.n, k))
                   ->wait();
    if (!w.is_ok() && s.is_ok())
      s = w.with_context("writing optimizer state chunk " + std::to_string(p.group) + "@" +
                         std::to_string(p.begin));
  }
  release_slot(p.slot, Status::ok());
  return s;
}

void OptimizerSwapper::read_ahead_next_step() {
  if (read_ahead_) return;
  read_ahead_ = true;
  preload(slots_ - 1);
}

Status OptimizerSwapper::drop_preloaded() {
  read_ahead_ = false;
  return discard_preloaded();
}

Status OptimizerSwapper::discard_preloaded() {
  std::vector<Preloaded> pre = std::move(preloaded_);
  preloaded_.clear();
  Status s;
  for (Preloaded& p : pre) {
    Status r = release_preloaded(p);
    if (s.is_ok() && !r.is_ok()) s = std::move(r);
  }
  return s;
}

Status OptimizerSwapper::write_state(GroupId gid, size_t state, const void* src, size_t begin, size_t n) {
  const uint64_t id = gid.value;
  return sync_transfer(id, state, static_cast<char*>(const_cast<void*>(src)), true, begin, n);
}

Status OptimizerSwapper::read_state(GroupId gid, size_t state, void* dst, size_t begin, size_t n) {
  const uint64_t id = gid.value;
  return sync_transfer(id, state, static_cast<char*>(dst), false, begin, n);
}

Status OptimizerSwapper::step_host(const ChunkUpdate& update) {
  // The same chunking as the NVMe path, so an update sees identical ChunkViews either way.
  const size_t K = opts_.states.size();
  std::vector<void*> ptrs(K);
  const size_t chunk = chunk_elems_;
  for (auto& g : groups_) {
    for (size_t begin = 0; begin < g.elems; begin += chunk) {
      size_t n = std::min(chunk, g.elems - begin);
      for (size_t k = 0; k < K; ++k) ptrs[k] = g.host[k].bytes() + home_offset(k, begin);
      uint64_t t0 = now_ns();
      Status s = update(ChunkView{GroupId(g.id), begin, n, ptrs.data()});
      uint64_t t1 = now_ns();
      stats_.compute_ns += t1 - t0;
      stats_.chunks++;
      if (tracing())
        opts_.trace->record("update " + std::to_string(g.id) + "@" + std::to_string(begin), "optimizer", t0,
                            t1, 0, kLaneOptimizer);
      if (!s.is_ok()) {
        return std::move(s).with_context("updating optimizer sub-group " + std::to_string(g.id) +
                                         " at element " + std::to_string(begin));
      }
    }
  }
  return Status::ok();
}

// step(): the chunks preload() started are the first ones in order; each gets the states it lacks
// (the gradient, unless it was filled) read now. Returns how many chunks are on their way.
size_t OptimizerSwapper::resume_preloaded(const std::vector<StepChunk>& chunks, std::deque<StepRead>* reads,
                                          Status* err) {
  const size_t K = opts_.states.size();
  std::vector<Preloaded> pre = std::move(preloaded_);
  preloaded_.clear();
  size_t np = 0;
  while (np < pre.size() && np < chunks.size() && chunks[np].g->id == pre[np].group &&
         chunks[np].begin == pre[np].begin && chunks[np].n == pre[np].n)
    ++np;
  for (size_t i = np; i < pre.size(); ++i) {  // not in this step's order (not expected): dropped
    Status r = release_preloaded(pre[i]);
    if (err->is_ok() && !r.is_ok()) *err = std::move(r);
  }
  for (size_t i = 0; i < np; ++i) {
    const Preloaded& p = pre[i];
    std::vector<StoreIo> ios;
    for (size_t k = 0; k < K; ++k) {
      stats_.bytes_read += p.have[k] && !opts_.states[k].write_back ? 0 : span_bytes(p.n, k);
      if (p.have[k]) continue;
      ios.push_back(StoreIo{io::IoOp::kRead, StateKey{p.group, opts_.states[k].kind}, home_offset(k, p.begin),
                            slot_buffer(p.slot, k), span_bytes(p.n, k)});
    }
    reads->push_back(StepRead{p.slot, p.h, p.t0, ios.empty() ? nullptr : store_->transfer(ios)});
  }
  return np;
}

// step(): writes an updated chunk's written-back states home from its slot, which goes back to
// the pool when the writes complete (at once when there is nothing to write).
void OptimizerSwapper::write_back_chunk(const StepChunk& c, size_t slot, bool write_all) {
  const size_t K = opts_.states.size();
  std::vector<StoreIo> ios;
  for (size_t k = 0; k < K; ++k) {
    if (!opts_.states[k].write_back && !write_all) continue;
    uint64_t off = home_offset(k, c.begin);
    ios.push_back(StoreIo{io::IoOp::kWrite, StateKey{c.g->id, opts_.states[k].kind}, off,
                          slot_buffer(slot, k), span_bytes(c.n, k)});
    stats_.bytes_written += span_bytes(c.n, k);
  }
  if (ios.empty()) {
    release_slot(slot, Status::ok());
    return;
  }
  uint64_t tws = now_ns();
  std::string what = tracing() ? std::to_string(c.g->id) + "@" + std::to_string(c.begin) : std::string();
  // The callback touches only members: step() may return as soon as the slot is back.
  store_->transfer(ios, [this, slot, tws, what](io::IoCompletion& done) {
    if (tracing()) opts_.trace->record("write " + what, "host->nvme", tws, now_ns(), 0, kLaneOptWrite);
    release_slot(slot, done.status().is_ok()
                           ? Status::ok()
                           : done.status().with_context("writing back optimizer sub-group chunk " + what));
  });
}

Status OptimizerSwapper::step(const ChunkUpdate& update, bool write_all) {
  read_ahead_ = false;
  ZOE_RETURN_IF_ERROR(wait_async_writes());
  stats_ = SwapperStats{};
  const uint64_t t_begin = now_ns();
  if (!store_) {
    Status s = step_host(update);
    stats_.step_ns = now_ns() - t_begin;
    return s;
  }
  std::vector<StepChunk> chunks;
  for (const auto& g : groups_) {
    for (size_t b = 0; b < g.elems; b += chunk_elems_)
      chunks.push_back({&g, b, std::min(chunk_elems_, g.elems - b)});
  }
  const size_t K = opts_.states.size();
  std::deque<StepRead> reads;
  Status err;  // first error of this thread (reads, updates)
  {
    std::lock_guard<std::mutex> lock(mu_);
    write_err_ = Status::ok();
  }
  size_t next_read = resume_preloaded(chunks, &reads, &err);

  auto take_slot = [&](bool wait, size_t* slot) {
    std::unique_lock<std::mutex> lock(mu_);
    if (wait && free_.empty()) {
      uint64_t t0 = now_ns();
      cv_.wait(lock, [&] { return !free_.empty(); });
      stats_.io_wait_ns += now_ns() - t0;
    }
    if (free_.empty()) return false;
    *slot = free_.back();
    free_.pop_back();
    return true;
  };
  auto give_slot = [this](size_t slot) { release_slot(slot, Status::ok()); };
  auto issue_read = [&](size_t slot) {
    const StepChunk& c = chunks[next_read++];
    std::vector<StoreIo> ios;
    for (size_t k = 0; k < K; ++k) {
      uint64_t off = home_offset(k, c.begin);
      ios.push_back(StoreIo{io::IoOp::kRead, StateKey{c.g->id, opts_.states[k].kind}, off,
                            slot_buffer(slot, k), span_bytes(c.n, k)});
      stats_.bytes_read += span_bytes(c.n, k);
    }
    reads.push_back(StepRead{slot, store_->transfer(ios), now_ns()});
  };

  std::vector<void*> ptrs(K);
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    // Read ahead as far as free slots allow; chunk ci itself must be on its way.
    size_t slot;
    while (next_read < chunks.size() && take_slot(/*wait=*/reads.empty(), &slot)) issue_read(slot);
    StepRead r = reads.front();
    reads.pop_front();
    const StepChunk& c = chunks[ci];
    uint64_t tw = now_ns();
    Status s = r.h->wait();
    if (r.rest) {
      Status s2 = r.rest->wait();
      if (s.is_ok()) s = std::move(s2);
    }
    uint64_t tr = now_ns();
    stats_.io_wait_ns += tr - tw;
    if (tracing())
      opts_.trace->record("read " + std::to_string(c.g->id) + "@" + std::to_string(c.begin), "nvme->host",
                          r.t0, tr, 0, kLaneOptRead);
    if (!s.is_ok()) {
      err = std::move(s).with_context("reading optimizer sub-group " + std::to_string(c.g->id) +
                                      " at element " + std::to_string(c.begin));
      give_slot(r.slot);
      break;
    }
    for (size_t k = 0; k < K; ++k) ptrs[k] = slot_buffer(r.slot, k);
    uint64_t t0 = now_ns();
    s = update(ChunkView{GroupId{c.g->id}, c.begin, c.n, ptrs.data()});
    uint64_t t1 = now_ns();
    stats_.compute_ns += t1 - t0;
    stats_.chunks++;
    if (tracing())
      opts_.trace->record("update " + std::to_string(c.g->id) + "@" + std::to_string(c.begin), "optimizer",
                          t0, t1, 0, kLaneOptimizer);
    if (!s.is_ok()) {
      err = std::move(s).with_context("updating optimizer sub-group " + std::to_string(c.g->id) +
                                      " at element " + std::to_string(c.begin));
      give_slot(r.slot);
      break;
    }
    write_back_chunk(c, r.slot, write_all);
  }
  // Nothing stays in flight: wait for the reads issued ahead and for every write-back.
  for (auto& r : reads) {
    (void)r.h->wait();
    if (r.rest) (void)r.rest->wait();
    give_slot(r.slot);
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return free_.size() == slots_; });
    if (err.is_ok()) err = write_err_;
  }
  stats_.step_ns = now_ns() - t_begin;
  return err;
}

}  // namespace zoe::offload
