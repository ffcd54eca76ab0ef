// TierManager: residency state machine, budgets with eviction, async moves, staging pipeline.
#include "offload/tier_manager.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/clock.h"
#include "core/log.h"
#include "core/units.h"

namespace zoe::offload {
namespace {

enum Link { kNvmeHost = 0, kHostNvme = 1, kHostDevice = 2, kDeviceHost = 3, kNvmeDevice = 4, kDeviceNvme = 5 };

constexpr int T(Tier t) { return static_cast<int>(t); }

}  // namespace

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
  }
  return "?";
}

const char* residency_name(Residency r) {
  switch (r) {
    case Residency::kAbsent: return "absent";
    case Residency::kLoading: return "loading";
    case Residency::kResident: return "resident";
    case Residency::kDirty: return "dirty";
    case Residency::kWriting: return "writing";
  }
  return "?";
}

const char* TierStats::link_name(int i) {
  static const char* kNames[] = {"nvme->host", "host->nvme", "host->device", "device->host", "nvme->device", "device->nvme"};
  return i >= 0 && i < 6 ? kNames[i] : "?";
}

// ---------------------------------------------------------------------------------------------
// MoveHandle

struct MoveHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  void* ptr = nullptr;

  void complete(Status s, void* p) {
    {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(s);
      ptr = p;
      done = true;
    }
    cv.notify_all();
  }
};

Result<void*> MoveHandle::wait() const {
  if (!s_) return internal_error("wait on an empty MoveHandle");
  std::unique_lock<std::mutex> lock(s_->mu);
  s_->cv.wait(lock, [&] { return s_->done; });
  if (!s_->status.is_ok()) return s_->status;
  return s_->ptr;
}

bool MoveHandle::ready() const {
  if (!s_) return true;
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->done;
}

// ---------------------------------------------------------------------------------------------
// Items

struct TierManager::Copy {
  Residency state = Residency::kAbsent;
  void* ptr = nullptr;
  io::AlignedBuffer host;  // memory of host copies
  uint32_t pins = 0;
  uint64_t last_use = 0;
  bool stale = false;  // a newer write happened elsewhere while this copy was loading
  std::shared_ptr<MoveHandle::State> move;
};

struct TierManager::Item {
  ItemId id = 0;
  uint64_t bytes = 0;
  uint64_t alloc = 0;  // bytes rounded up to 4096: what copies hold and transfers move
  Tier home = Tier::kHost;
  Copy c[3];
  // Synchronous read()/write() transfers of the NVMe home in progress. They run without mu_, so
  // while one is running nothing else may start a move of this item.
  uint32_t sync_ops = 0;
  StateKey key() const { return StateKey{id, StateKind::kOther}; }
  bool idle() const {
    if (sync_ops) return false;
    for (const auto& x : c) {
      if (x.state == Residency::kLoading || x.state == Residency::kWriting) return false;
    }
    return true;
  }
};

MoveHandle TierManager::ready_handle(Status s, void* p) {
  MoveHandle h;
  h.s_ = std::make_shared<MoveHandle::State>();
  h.s_->complete(std::move(s), p);
  return h;
}

// ---------------------------------------------------------------------------------------------
// Construction

TierManager::TierManager(const TierManagerOptions& opts) : opts_(opts) {}

Result<std::unique_ptr<TierManager>> TierManager::create(const TierManagerOptions& opts) {
  std::unique_ptr<TierManager> m(new TierManager(opts));
  ZOE_RETURN_IF_ERROR(m->init());
  return m;
}

// Stream host functions may not call the device API (CUDA forbids it), yet finishing a move
// frees device memory and starts the next copy. They hand the work to this thread instead.
Status TierManager::after(device::Stream& s, std::function<void()> fn) {
  return s.enqueue_host([this, fn = std::move(fn)]() mutable { post(std::move(fn)); });
}

void TierManager::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    posted_.push_back(std::move(fn));
  }
  post_cv_.notify_one();
}

void TierManager::run_posted() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(post_mu_);
      post_cv_.wait(lock, [&] { return post_stop_ || !posted_.empty(); });
      if (posted_.empty()) return;
      fn = std::move(posted_.front());
      posted_.pop_front();
    }
    fn();
  }
}

Status TierManager::init() {
  poster_ = std::thread([this] { run_posted(); });
  if (opts_.staging_bytes == 0 || opts_.staging_bytes % 4096) {
    return invalid_argument("tier manager: staging buffer size %zu is not a positive multiple of 4096", opts_.staging_bytes);
  }
  if (opts_.staging_count == 0) return invalid_argument("tier manager: need at least one staging buffer");
  budget_[T(Tier::kHost)] = opts_.host_budget;
  if (opts_.device) {
    uint64_t db = opts_.device->budget_bytes();
    budget_[T(Tier::kDevice)] = opts_.device_budget ? std::min(opts_.device_budget, db ? db : opts_.device_budget) : db;
    ZOE_ASSIGN_OR_RETURN(h2d_, opts_.device->create_stream());
    ZOE_ASSIGN_OR_RETURN(d2h_, opts_.device->create_stream());
  }
  if (opts_.nvme) budget_[T(Tier::kNvme)] = opts_.nvme->budget_bytes();
  if (opts_.nvme) {
    // One more buffer than the moves share: the synchronous transfers' own (read()/write() hold
    // the lock; waiting for a shared buffer there would wait for moves whose completion takes it).
    uint64_t staging = static_cast<uint64_t>(opts_.staging_bytes) * (opts_.staging_count + 1);
    if (budget_[T(Tier::kHost)] && staging > budget_[T(Tier::kHost)]) {
      return out_of_budget("host tier: the %zu staging buffers of %s need %s, more than the host budget %s",
                           opts_.staging_count + 1, format_bytes(opts_.staging_bytes).c_str(), format_bytes(staging).c_str(),
                           format_bytes(budget_[T(Tier::kHost)]).c_str());
    }
    ZOE_ASSIGN_OR_RETURN(staging_, io::BufferPool::create(opts_.staging_bytes, opts_.staging_count + 1, opts_.pin));
    for (size_t i = 0; i < opts_.staging_count; ++i) staging_free_.push_back(staging_->buffer(i));
    sync_staging_ = staging_->buffer(opts_.staging_count);
    iovec v{staging_->base(), staging_->total_bytes()};
    (void)opts_.nvme->engine().register_buffers({&v, 1});  // optional speed-up
    used_[T(Tier::kHost)] += staging;
    high_water_[T(Tier::kHost)] = used_[T(Tier::kHost)];
  }
  return Status::ok();
}

TierManager::~TierManager() {
  (void)drain();
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    post_stop_ = true;
  }
  post_cv_.notify_all();
  if (poster_.joinable()) poster_.join();
  if (h2d_) (void)h2d_->synchronize();
  if (d2h_) (void)d2h_->synchronize();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, it] : items_) {
    for (int t = 0; t < 3; ++t) {
      Copy& c = it->c[t];
      if (t == T(Tier::kDevice) && c.ptr) opts_.device->free(c.ptr);
      if (t == T(Tier::kNvme) && c.state != Residency::kAbsent) opts_.nvme->free(it->key());
    }
  }
  items_.clear();
}

TierManager::Item* TierManager::find_locked(ItemId id) {
  auto i = items_.find(id);
  return i == items_.end() ? nullptr : i->second.get();
}

const TierManager::Item* TierManager::find_locked(ItemId id) const {
  auto i = items_.find(id);
  return i == items_.end() ? nullptr : i->second.get();
}

// ---------------------------------------------------------------------------------------------
// Budgets and eviction

Status TierManager::reserve_locked(std::unique_lock<std::mutex>& lock, Tier tier, uint64_t bytes, bool may_wait) {
  const int t = T(tier);
  const uint64_t budget = budget_[t];
  auto refuse = [&](const char* why) {
    uint64_t pinned = 0;
    for (const auto& [id, it] : items_) {
      if (it->c[t].pins) pinned += it->alloc;
    }
    return out_of_budget("%s tier: %llu bytes requested (%s), %llu bytes in use (%s), budget %llu bytes (%s); %s "
                         "(%llu bytes pinned)",
                         tier_name(tier), static_cast<unsigned long long>(bytes), format_bytes(bytes).c_str(),
                         static_cast<unsigned long long>(used_[t]), format_bytes(used_[t]).c_str(),
                         static_cast<unsigned long long>(budget), format_bytes(budget).c_str(), why,
                         static_cast<unsigned long long>(pinned));
  };
  if (budget && bytes > budget) return refuse("the request alone exceeds the budget");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.wait_for_unpin_ms);
  uint64_t wait_begin = 0;
  for (;;) {
    if (!budget || used_[t] + bytes <= budget) {
      used_[t] += bytes;
      high_water_[t] = std::max(high_water_[t], used_[t]);
      if (wait_begin) stats_.wait_ns += now_ns() - wait_begin;
      return Status::ok();
    }
    // Evict until the bytes being written back cover the shortfall (clean copies free at once).
    while (used_[t] + bytes > budget && used_[t] + bytes - budget > pending_free_[t]) {
      uint64_t freed = 0;
      if (!evict_one_locked(tier, &freed, may_wait)) break;
    }
    if (used_[t] + bytes <= budget) continue;
    if (!may_wait) return refuse("prefetch does not wait");
    if (!wait_begin) wait_begin = now_ns();
    if (pending_free_[t] > 0) {
      cv_.wait(lock);
      continue;
    }
    if (std::chrono::steady_clock::now() < deadline) {
      cv_.wait_until(lock, deadline);
      continue;
    }
    stats_.wait_ns += now_ns() - wait_begin;
    return refuse("nothing else can be evicted");
  }
}

void TierManager::release_locked(Tier tier, uint64_t bytes) {
  used_[T(tier)] -= bytes;
  cv_.notify_all();
}

uint64_t TierManager::next_use_locked(ItemId id) const {
  if (trace_.empty()) return UINT64_MAX;
  auto p = trace_pos_.find(id);
  if (p == trace_pos_.end()) return UINT64_MAX;
  const auto& v = p->second;
  auto i = std::lower_bound(v.begin(), v.end(), cursor_);
  if (i != v.end()) return *i - cursor_;
  return v.front() + trace_.size() - cursor_;
}

bool TierManager::evict_one_locked(Tier tier, uint64_t* freed_now, bool allow_dirty) {
  const int t = T(tier);
  Item* best = nullptr;
  uint64_t best_next = 0, best_last = 0;
  const bool belady = opts_.policy == EvictionPolicy::kTrace && !tracing_ && !trace_.empty();
  for (auto& [id, it] : items_) {
    Copy& c = it->c[t];
    if (it->home == tier || c.pins || (c.state != Residency::kResident && c.state != Residency::kDirty)) continue;
    if (c.state == Residency::kDirty && !allow_dirty) continue;
    uint64_t next = belady ? next_use_locked(id) : 0;
    bool better = !best || (belady ? (next > best_next || (next == best_next && c.last_use < best_last))
                                   : c.last_use < best_last);
    if (better) {
      best = it.get();
      best_next = next;
      best_last = c.last_use;
    }
  }
  if (!best) return false;
  stats_.evictions++;
  if (best->c[t].state == Residency::kDirty) {
    start_writeback_locked(best, tier, /*drop=*/true);
  } else {
    drop_copy_locked(best, tier);
    *freed_now += best->alloc;
  }
  return true;
}

void TierManager::drop_copy_locked(Item* it, Tier tier) {
  Copy& c = it->c[T(tier)];
  if (tier == Tier::kDevice && c.ptr) opts_.device->free(c.ptr);
  c.host = io::AlignedBuffer();
  c.ptr = nullptr;
  c.state = Residency::kAbsent;
  c.pins = 0;
  c.stale = false;
  c.move.reset();
  release_locked(tier, it->alloc);
}

void TierManager::invalidate_others_locked(Item* it, Tier keep) {
  for (Tier u : {Tier::kDevice, Tier::kHost}) {
    if (u == keep || u == it->home) continue;
    Copy& c = it->c[T(u)];
    switch (c.state) {
      case Residency::kAbsent:
      case Residency::kWriting:  // writes older bytes home; the newer copy is dirty and follows
        break;
      case Residency::kLoading:
        ZOE_CHECK_MSG(c.pins == 0, "item %llu changed in the %s tier while pinned loading in the %s tier",
                      static_cast<unsigned long long>(it->id), tier_name(keep), tier_name(u));
        c.stale = true;
        break;
      case Residency::kResident:
      case Residency::kDirty:
        ZOE_CHECK_MSG(c.pins == 0, "item %llu changed in the %s tier while pinned in the %s tier",
                      static_cast<unsigned long long>(it->id), tier_name(keep), tier_name(u));
        drop_copy_locked(it, u);
        break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Staging buffers

void TierManager::with_staging(std::function<void(char*)> job) {
  char* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(staging_mu_);
    if (staging_free_.empty()) {
      staging_wait_.push_back(std::move(job));
      return;
    }
    b = staging_free_.back();
    staging_free_.pop_back();
  }
  job(b);
}

void TierManager::release_staging(char* buf) {
  std::function<void(char*)> next;
  {
    std::lock_guard<std::mutex> lock(staging_mu_);
    if (staging_wait_.empty()) {
      staging_free_.push_back(buf);
      return;
    }
    next = std::move(staging_wait_.front());
    staging_wait_.pop_front();
  }
  next(buf);
}

// ---------------------------------------------------------------------------------------------
// Moves

namespace {
// Counts the pieces of a streamed move; the last one to finish runs `done` with the first error.
struct Pieces {
  std::atomic<size_t> left;
  std::mutex mu;
  Status first;
  std::function<void(Status)> done;
  Pieces(size_t n, std::function<void(Status)> d) : left(n), done(std::move(d)) {}
  void finish(const Status& s) {
    if (!s.is_ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first.is_ok()) first = s;
    }
    if (left.fetch_sub(1) == 1) done(first);
  }
};
}  // namespace

void TierManager::finish_move(Item* it, Tier tier, Status st, MoveKind kind, int src_tier, int link, uint64_t begin_ns) {
  uint64_t end = now_ns();
  if (opts_.trace && st.is_ok()) {
    opts_.trace->record("item " + std::to_string(it->id), TierStats::link_name(link), begin_ns, end, it->alloc, 100 + link);
  }
  std::shared_ptr<MoveHandle::State> move;
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Copy& c = it->c[T(tier)];
    in_flight_--;
    if (src_tier >= 0) it->c[src_tier].pins--;
    if (st.is_ok()) {
      LinkStats& l = stats_.links[link];
      l.bytes += it->alloc;
      l.transfers++;
      l.busy_ns += end - begin_ns;
    }
    move = std::move(c.move);
    if (kind == MoveKind::kLoad) {
      if (!st.is_ok()) {
        st = std::move(st).with_context("loading item " + std::to_string(it->id) + " into the " + tier_name(tier) + " tier");
        if (first_error_.is_ok()) first_error_ = st;
        drop_copy_locked(it, tier);
      } else {
        c.state = Residency::kResident;
        ptr = c.ptr;
        if (src_tier >= 0 && it->c[src_tier].state == Residency::kDirty && tier == Tier::kHost) {
          // A dirty device copy was copied down: the host copy now carries the dirtiness.
          it->c[src_tier].state = Residency::kResident;
          c.state = Residency::kDirty;
        }
        if (c.stale) {
          ZOE_CHECK(c.pins == 0);
          drop_copy_locked(it, tier);
          st = Status(StatusCode::kCancelled, "prefetched copy went stale");
        }
      }
    } else {  // write-back
      if (kind == MoveKind::kWriteDrop) pending_free_[T(tier)] -= it->alloc;
      if (!st.is_ok()) {
        st = std::move(st).with_context("writing back item " + std::to_string(it->id) + " from the " + tier_name(tier) +
                                        " tier");
        if (first_error_.is_ok()) first_error_ = st;
        c.state = Residency::kDirty;  // the bytes are still here; nothing is lost
      } else {
        stats_.writebacks++;
        if (kind == MoveKind::kWriteDrop) {
          drop_copy_locked(it, tier);
        } else {
          c.state = Residency::kResident;
          ptr = c.ptr;
        }
      }
    }
    cv_.notify_all();
  }
  if (move) move->complete(std::move(st), ptr);
}

void TierManager::fail_async(Item* it, Tier tier, Status s, MoveKind kind, int src_tier, int link, uint64_t t0) {
  // Called with mu_ held: the poster finishes it once this thread lets go of the lock.
  post([this, it, tier, s, kind, src_tier, link, t0] { finish_move(it, tier, s, kind, src_tier, link, t0); });
}

void TierManager::start_writeback_locked(Item* it, Tier tier, bool drop) {
  Copy& c = it->c[T(tier)];
  ZOE_CHECK(c.state == Residency::kDirty);
  c.state = Residency::kWriting;
  c.move = std::make_shared<MoveHandle::State>();
  if (drop) pending_free_[T(tier)] += it->alloc;
  in_flight_++;
  const MoveKind kind = drop ? MoveKind::kWriteDrop : MoveKind::kWriteKeep;
  const uint64_t t0 = now_ns();
  if (tier == Tier::kHost) {  // home is nvme
    opts_.nvme->write(it->key(), 0, c.ptr, it->alloc, [this, it, kind, t0](io::IoCompletion& done) {
      Status s = done.status();
      post([this, it, kind, t0, s] { finish_move(it, Tier::kHost, s, kind, -1, kHostNvme, t0); });
    });
    return;
  }
  // Device copy: home host gets it directly; home nvme through staging buffers, in pieces.
  if (it->home == Tier::kHost) {
    Status s = d2h_->copy_d2h(it->c[T(Tier::kHost)].ptr, c.ptr, it->alloc);
    if (s.is_ok()) {
      s = after(*d2h_, [this, it, kind, t0] { finish_move(it, Tier::kDevice, Status::ok(), kind, -1, kDeviceHost, t0); });
    }
    if (!s.is_ok()) fail_async(it, Tier::kDevice, s, kind, -1, kDeviceHost, t0);
    return;
  }
  const size_t piece = opts_.staging_bytes;
  const size_t n = (it->alloc + piece - 1) / piece;
  auto pieces = std::make_shared<Pieces>(n, [this, it, kind, t0](Status s) {
    finish_move(it, Tier::kDevice, std::move(s), kind, -1, kDeviceNvme, t0);
  });
  char* dev = static_cast<char*>(c.ptr);
  for (size_t k = 0; k < n; ++k) {
    uint64_t off = k * piece;
    size_t len = static_cast<size_t>(std::min<uint64_t>(piece, it->alloc - off));
    with_staging([this, it, dev, off, len, pieces](char* buf) {
      Status s = d2h_->copy_d2h(buf, dev + off, len);
      if (s.is_ok()) {
        s = after(*d2h_, [this, it, off, len, buf, pieces] {
          opts_.nvme->write(it->key(), off, buf, len, [this, buf, pieces](io::IoCompletion& done) {
            post([this, buf, pieces, st = done.status()] {
              release_staging(buf);
              pieces->finish(st);
            });
          });
        });
      }
      if (!s.is_ok()) {
        release_staging(buf);
        pieces->finish(s);
      }
    });
  }
}

void TierManager::wait_locked(std::unique_lock<std::mutex>& lock) {
  uint64_t t0 = now_ns();
  cv_.wait(lock);
  stats_.wait_ns += now_ns() - t0;
}

bool TierManager::start_load_locked(std::unique_lock<std::mutex>& lock, Item* it, Tier tier, bool may_wait) {
  Copy& c = it->c[T(tier)];
  for (;;) {
    const uint64_t t0 = now_ns();
    if (tier == Tier::kHost) {  // home is nvme
      Copy& d = it->c[T(Tier::kDevice)];
      if (d.state == Residency::kWriting || d.state == Residency::kLoading) {
        if (!may_wait) return false;
        wait_locked(lock);
        continue;
      }
      if (d.state == Residency::kDirty) {  // the newest bytes are on the device
        d.pins++;
        Status s = d2h_->copy_d2h(c.ptr, d.ptr, it->alloc);
        if (s.is_ok()) {
          s = after(*d2h_, [this, it, t0] {
            finish_move(it, Tier::kHost, Status::ok(), MoveKind::kLoad, T(Tier::kDevice), kDeviceHost, t0);
          });
        }
        if (!s.is_ok()) fail_async(it, Tier::kHost, s, MoveKind::kLoad, T(Tier::kDevice), kDeviceHost, t0);
        return true;
      }
      opts_.nvme->read(it->key(), 0, c.ptr, it->alloc, [this, it, t0](io::IoCompletion& done) {
        Status s = done.status();
        post([this, it, t0, s] { finish_move(it, Tier::kHost, s, MoveKind::kLoad, -1, kNvmeHost, t0); });
      });
      return true;
    }
    // Into the device: from a host copy when there is one, else from NVMe through staging.
    Copy& h = it->c[T(Tier::kHost)];
    if (it->home == Tier::kNvme && (h.state == Residency::kLoading || h.state == Residency::kWriting)) {
      if (!may_wait) return false;
      wait_locked(lock);
      continue;
    }
    if (h.state == Residency::kResident || h.state == Residency::kDirty) {
      h.pins++;
      Status s = h2d_->copy_h2d(c.ptr, h.ptr, it->alloc);
      if (s.is_ok()) {
        s = after(*h2d_, [this, it, t0] {
          finish_move(it, Tier::kDevice, Status::ok(), MoveKind::kLoad, T(Tier::kHost), kHostDevice, t0);
        });
      }
      if (!s.is_ok()) fail_async(it, Tier::kDevice, s, MoveKind::kLoad, T(Tier::kHost), kHostDevice, t0);
      return true;
    }
    const size_t piece = opts_.staging_bytes;
    const size_t n = (it->alloc + piece - 1) / piece;
    auto pieces = std::make_shared<Pieces>(n, [this, it, t0](Status s) {
      finish_move(it, Tier::kDevice, std::move(s), MoveKind::kLoad, -1, kNvmeDevice, t0);
    });
    char* dev = static_cast<char*>(c.ptr);
    for (size_t k = 0; k < n; ++k) {
      uint64_t off = k * piece;
      size_t len = static_cast<size_t>(std::min<uint64_t>(piece, it->alloc - off));
      with_staging([this, it, dev, off, len, pieces](char* buf) {
        opts_.nvme->read(it->key(), off, buf, len, [this, dev, off, len, buf, pieces](io::IoCompletion& done) {
          post([this, dev, off, len, buf, pieces, s = done.status()]() mutable {
            if (s.is_ok()) s = h2d_->copy_h2d(dev + off, buf, len);
            if (s.is_ok()) {
              s = after(*h2d_, [this, buf, pieces] {
                release_staging(buf);
                pieces->finish(Status::ok());
              });
            }
            if (!s.is_ok()) {
              release_staging(buf);
              pieces->finish(s);
            }
          });
        });
      });
    }
    return true;
  }
}

MoveHandle TierManager::load_locked(std::unique_lock<std::mutex>& lock, Item* it, Tier tier, bool pin, bool may_wait) {
  Copy& c = it->c[T(tier)];
  ZOE_CHECK(c.state == Residency::kAbsent);
  c.state = Residency::kLoading;
  c.move = std::make_shared<MoveHandle::State>();
  c.pins = pin ? 1 : 0;
  c.last_use = ++clock_;
  c.stale = false;
  in_flight_++;
  MoveHandle h;
  h.s_ = c.move;
  auto fail = [&](Status s, bool reserved) {
    if (c.ptr && tier == Tier::kDevice) opts_.device->free(c.ptr);
    c.host = io::AlignedBuffer();
    c.ptr = nullptr;
    c.state = Residency::kAbsent;
    c.pins = 0;
    in_flight_--;
    if (reserved) release_locked(tier, it->alloc);
    auto m = std::move(c.move);
    cv_.notify_all();
    m->complete(std::move(s), nullptr);
    return h;
  };
  Status s = reserve_locked(lock, tier, it->alloc, may_wait);
  if (!s.is_ok()) return fail(std::move(s), false);
  if (tier == Tier::kHost) {
    auto b = io::AlignedBuffer::allocate(it->alloc, opts_.pin);
    if (!b.is_ok()) return fail(b.status(), true);
    c.host = std::move(b).value();
    c.ptr = c.host.data();
  } else {
    auto p = opts_.device->allocate(it->alloc);
    if (!p.is_ok()) return fail(p.status(), true);
    c.ptr = p.value();
  }
  if (!start_load_locked(lock, it, tier, may_wait)) {
    return fail(Status(StatusCode::kCancelled, "prefetch skipped: its source is busy"), true);
  }
  return h;
}

static Status check_fetch_tier(const TierManagerOptions& o, ItemId id, Tier home, Tier tier) {
  if (tier == Tier::kNvme) return invalid_argument("item %llu: nvme is a home tier; fetch into device or host", static_cast<unsigned long long>(id));
  if (tier == Tier::kDevice && !o.device) return unsupported("item %llu: no device tier is configured", static_cast<unsigned long long>(id));
  if (tier == Tier::kHost && home == Tier::kDevice) {
    return invalid_argument("item %llu lives on the device; it has no host copy", static_cast<unsigned long long>(id));
  }
  return Status::ok();
}

MoveHandle TierManager::fetch(ItemId id, Tier tier) {
  std::unique_lock<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  if (!it) return ready_handle(not_found("tier manager: no item %llu", static_cast<unsigned long long>(id)), nullptr);
  Status v = check_fetch_tier(opts_, id, it->home, tier);
  if (!v.is_ok()) return ready_handle(v, nullptr);
  if (tracing_) {
    trace_pos_[id].push_back(trace_.size());
    trace_.push_back(id);
  }
  auto advance = [&] {
    if (!tracing_ && !trace_.empty()) cursor_ = (cursor_ + 1) % trace_.size();
  };
  for (;;) {
    Copy& c = it->c[T(tier)];
    switch (c.state) {
      case Residency::kResident:
      case Residency::kDirty:
        c.pins++;
        c.last_use = ++clock_;
        advance();
        return ready_handle(Status::ok(), c.ptr);
      case Residency::kLoading:
        if (c.stale) {
          wait_locked(lock);
          continue;
        }
        {
          c.pins++;
          c.last_use = ++clock_;
          MoveHandle h;
          h.s_ = c.move;
          advance();
          return h;
        }
      case Residency::kWriting:
        wait_locked(lock);
        continue;
      case Residency::kAbsent: {
        if (it->sync_ops) {  // a synchronous write of the home is running: load what it leaves
          wait_locked(lock);
          continue;
        }
        MoveHandle h = load_locked(lock, it, tier, /*pin=*/true, /*may_wait=*/true);
        advance();
        return h;
      }
    }
  }
}

void TierManager::unpin(ItemId id, Tier tier, bool dirty) {
  std::lock_guard<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  ZOE_CHECK_MSG(it != nullptr, "unpin of unknown item %llu", static_cast<unsigned long long>(id));
  Copy& c = it->c[T(tier)];
  ZOE_CHECK_MSG(c.pins > 0 && (c.state == Residency::kResident || c.state == Residency::kDirty),
                "unpin of item %llu in the %s tier, which is not pinned there (%s)", static_cast<unsigned long long>(id),
                tier_name(tier), residency_name(c.state));
  c.pins--;
  c.last_use = ++clock_;
  if (dirty) {
    invalidate_others_locked(it, tier);
    if (tier != it->home) c.state = Residency::kDirty;
  }
  cv_.notify_all();
}

void TierManager::prefetch(ItemId id, Tier tier) {
  std::unique_lock<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  if (!it || !check_fetch_tier(opts_, id, it->home, tier).is_ok()) return;
  if (it->c[T(tier)].state != Residency::kAbsent || it->sync_ops) return;
  stats_.prefetches++;
  MoveHandle h = load_locked(lock, it, tier, /*pin=*/false, /*may_wait=*/false);
  if (h.ready() && !h.wait().is_ok()) stats_.prefetch_skipped++;
}

MoveHandle TierManager::evict(ItemId id, Tier tier) {
  std::unique_lock<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  if (!it) return ready_handle(not_found("tier manager: no item %llu", static_cast<unsigned long long>(id)), nullptr);
  if (tier == it->home || tier == Tier::kNvme) {
    return ready_handle(invalid_argument("item %llu: the %s tier holds its home copy, which is never evicted",
                                         static_cast<unsigned long long>(id), tier_name(tier)),
                        nullptr);
  }
  for (;;) {
    Copy& c = it->c[T(tier)];
    switch (c.state) {
      case Residency::kAbsent: return ready_handle(Status::ok(), nullptr);
      case Residency::kLoading: wait_locked(lock); continue;
      case Residency::kWriting: {
        MoveHandle h;
        h.s_ = c.move;
        return h;
      }
      case Residency::kResident:
      case Residency::kDirty:
        if (c.pins) {
          return ready_handle(invalid_argument("item %llu is pinned %u time(s) in the %s tier; unpin it before evicting",
                                               static_cast<unsigned long long>(id), c.pins, tier_name(tier)),
                              nullptr);
        }
        stats_.evictions++;
        if (c.state == Residency::kResident) {
          drop_copy_locked(it, tier);
          return ready_handle(Status::ok(), nullptr);
        }
        start_writeback_locked(it, tier, /*drop=*/true);
        MoveHandle h;
        h.s_ = c.move;
        return h;
    }
  }
}

Status TierManager::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  for (auto& [id, it] : items_) {
    for (Tier t : {Tier::kDevice, Tier::kHost}) {
      Copy& c = it->c[T(t)];
      if (c.state == Residency::kDirty && c.pins == 0) start_writeback_locked(it.get(), t, /*drop=*/false);
    }
  }
  while (in_flight_ > 0) wait_locked(lock);
  Status s = std::move(first_error_);
  first_error_ = Status::ok();
  return s;
}

Status TierManager::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  while (in_flight_ > 0) wait_locked(lock);
  Status s = std::move(first_error_);
  first_error_ = Status::ok();
  return s;
}

// ---------------------------------------------------------------------------------------------
// Items: registration and synchronous content access

Status TierManager::add_item(ItemId id, uint64_t bytes, Tier home) {
  if (bytes == 0) return invalid_argument("item %llu: size 0", static_cast<unsigned long long>(id));
  if (home == Tier::kDevice && !opts_.device) return unsupported("item %llu: no device tier is configured", static_cast<unsigned long long>(id));
  if (home == Tier::kNvme && !opts_.nvme) return unsupported("item %llu: no nvme tier is configured", static_cast<unsigned long long>(id));
  std::unique_lock<std::mutex> lock(mu_);
  if (find_locked(id)) return invalid_argument("item %llu is already registered", static_cast<unsigned long long>(id));
  auto item = std::make_unique<Item>();
  item->id = id;
  item->bytes = bytes;
  item->alloc = (bytes + 4095) & ~uint64_t{4095};
  item->home = home;
  Copy& c = item->c[T(home)];
  if (home == Tier::kNvme) {
    ZOE_ASSIGN_OR_RETURN(io::Extent e, opts_.nvme->allocate(item->key(), item->alloc));
    (void)e;
  } else {
    ZOE_RETURN_IF_ERROR(reserve_locked(lock, home, item->alloc, true));
    if (find_locked(id)) {
      release_locked(home, item->alloc);
      return invalid_argument("item %llu is already registered", static_cast<unsigned long long>(id));
    }
    if (home == Tier::kHost) {
      auto b = io::AlignedBuffer::allocate(item->alloc, opts_.pin);
      if (!b.is_ok()) {
        release_locked(home, item->alloc);
        return b.status();
      }
      c.host = std::move(b).value();
      c.ptr = c.host.data();
      memset(c.ptr, 0, item->alloc);
    } else {
      auto p = opts_.device->allocate(item->alloc);
      if (!p.is_ok()) {
        release_locked(home, item->alloc);
        return p.status();
      }
      c.ptr = p.value();
    }
  }
  c.state = Residency::kResident;
  items_[id] = std::move(item);
  return Status::ok();
}

Status TierManager::remove_item(ItemId id) {
  std::unique_lock<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  if (!it) return not_found("tier manager: no item %llu", static_cast<unsigned long long>(id));
  while (!it->idle()) wait_locked(lock);
  for (const auto& c : it->c) {
    if (c.pins) return invalid_argument("item %llu is pinned; unpin it before removing", static_cast<unsigned long long>(id));
  }
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    if (t != it->home && it->c[T(t)].state != Residency::kAbsent) drop_copy_locked(it, t);
  }
  if (it->home == Tier::kNvme) {
    opts_.nvme->free(it->key());
  } else {
    drop_copy_locked(it, it->home);
  }
  items_.erase(id);
  return Status::ok();
}

Status TierManager::nvme_sync(std::unique_lock<std::mutex>& lock, Item* it, char* data, bool write,
                              uint64_t first, uint64_t len) {
  // The I/O runs without mu_: completions are finished by the poster, which takes mu_, and a
  // thread that waits for I/O under mu_ would wait for them (see the header). The item is marked
  // busy instead, so no move of it starts meanwhile and remove_item() waits.
  it->sync_ops++;
  lock.unlock();
  Status s = nvme_sync_unlocked(it, data, write, first, len);
  lock.lock();
  it->sync_ops--;
  cv_.notify_all();
  return s;
}

Status TierManager::nvme_sync_unlocked(Item* it, char* data, bool write, uint64_t first, uint64_t len) {
  // Through the synchronous transfers' own staging buffer, one user at a time (sync_mu_, never
  // taken with mu_ held): the caller's memory need not be aligned.
  std::lock_guard<std::mutex> sync_lock(sync_mu_);
  char* got = sync_staging_;
  Status s;
  const size_t piece = opts_.staging_bytes;
  const uint64_t last = first + len;  // bytes [first, last) of the item; the disk sees whole blocks
  const uint64_t span_end = std::min<uint64_t>(it->alloc, (last + 4095) & ~uint64_t{4095});
  for (uint64_t off = first; off < span_end && s.is_ok(); off += piece) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(piece, span_end - off));
    size_t data_len = off < last ? static_cast<size_t>(std::min<uint64_t>(n, last - off)) : 0;
    if (write) {
      memcpy(got, data + (off - first), data_len);
      memset(got + data_len, 0, n - data_len);
      s = opts_.nvme->write(it->key(), off, got, n)->wait();
    } else {
      s = opts_.nvme->read(it->key(), off, got, n)->wait();
      if (s.is_ok()) memcpy(data + (off - first), got, data_len);
    }
  }
  return s;
}

// The byte range [*offset, *offset + *len) of an item, checked and clamped (len UINT64_MAX: to the end).
static Status check_range(ItemId id, uint64_t bytes, uint64_t* offset, uint64_t* len) {
  if (*offset > bytes) {
    return invalid_argument("item %llu: offset %llu is beyond its %llu bytes", static_cast<unsigned long long>(id),
                            static_cast<unsigned long long>(*offset), static_cast<unsigned long long>(bytes));
  }
  *len = std::min<uint64_t>(*len, bytes - *offset);
  uint64_t end = *offset + *len;
  if (*offset % 4096 != 0 || (end != bytes && end % 4096 != 0)) {
    return invalid_argument("item %llu: range [%llu, %llu) is not on 4096-byte boundaries", static_cast<unsigned long long>(id),
                            static_cast<unsigned long long>(*offset), static_cast<unsigned long long>(end));
  }
  return Status::ok();
}

Status TierManager::write(ItemId id, const void* src, uint64_t offset, uint64_t len) {
  std::unique_lock<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  if (!it) return not_found("tier manager: no item %llu", static_cast<unsigned long long>(id));
  ZOE_RETURN_IF_ERROR(check_range(id, it->bytes, &offset, &len));
  while (!it->idle()) wait_locked(lock);
  for (const auto& c : it->c) {
    if (c.pins) return invalid_argument("item %llu is pinned; unpin it before writing", static_cast<unsigned long long>(id));
  }
  // A part of the item is replaced: the rest must be current at home first.
  const bool whole = offset == 0 && len == it->bytes;
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    Copy& c = it->c[T(t)];
    if (t == it->home || c.state == Residency::kAbsent) continue;
    if (c.state == Residency::kDirty && !whole) {
      start_writeback_locked(it, t, /*drop=*/true);
      while (!it->idle()) wait_locked(lock);
      if (it->c[T(t)].state == Residency::kDirty) {  // the write-back failed; nothing was lost
        Status e = first_error_;
        first_error_ = Status::ok();
        return e;
      }
    } else {
      drop_copy_locked(it, t);
    }
  }
  Copy& h = it->c[T(it->home)];
  switch (it->home) {
    case Tier::kHost:
      memcpy(static_cast<char*>(h.ptr) + offset, src, len);
      return Status::ok();
    case Tier::kDevice:
      return opts_.device->copy_to_device(static_cast<char*>(h.ptr) + offset, src, len);
    case Tier::kNvme:
      return nvme_sync(lock, it, static_cast<char*>(const_cast<void*>(src)), true, offset, len)
          .with_context("writing item " + std::to_string(id) + " to its nvme home");
  }
  return internal_error("bad tier");
}

Status TierManager::read(ItemId id, void* dst, uint64_t offset, uint64_t len) {
  std::unique_lock<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  if (!it) return not_found("tier manager: no item %llu", static_cast<unsigned long long>(id));
  ZOE_RETURN_IF_ERROR(check_range(id, it->bytes, &offset, &len));
  while (!it->idle()) wait_locked(lock);
  // Any present copy holds the newest bytes: stale copies are dropped when another is dirtied.
  const Copy& h = it->c[T(Tier::kHost)];
  if (h.state == Residency::kResident || h.state == Residency::kDirty) {
    memcpy(dst, static_cast<const char*>(h.ptr) + offset, len);
    return Status::ok();
  }
  const Copy& d = it->c[T(Tier::kDevice)];
  if (d.state == Residency::kResident || d.state == Residency::kDirty) {
    return opts_.device->copy_to_host(dst, static_cast<const char*>(d.ptr) + offset, len);
  }
  return nvme_sync(lock, it, static_cast<char*>(dst), false, offset, len)
      .with_context("reading item " + std::to_string(id) + " from nvme");
}

// ---------------------------------------------------------------------------------------------
// Trace policy, statistics

void TierManager::begin_trace() {
  std::lock_guard<std::mutex> lock(mu_);
  tracing_ = true;
  trace_.clear();
  trace_pos_.clear();
  cursor_ = 0;
}

void TierManager::end_trace() {
  std::lock_guard<std::mutex> lock(mu_);
  tracing_ = false;
  cursor_ = 0;
}

TierStats TierManager::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStats s = stats_;
  for (int t = 0; t < 2; ++t) {
    s.budget[t] = budget_[t];
    s.used[t] = used_[t];
    s.high_water[t] = high_water_[t];
  }
  if (opts_.nvme) {
    s.budget[2] = opts_.nvme->budget_bytes();
    s.used[2] = opts_.nvme->used_bytes();
    s.high_water[2] = opts_.nvme->high_water_bytes();
  }
  return s;
}

Residency TierManager::residency(ItemId id, Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Item* it = find_locked(id);
  return it ? it->c[T(tier)].state : Residency::kAbsent;
}

uint32_t TierManager::pins(ItemId id, Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Item* it = find_locked(id);
  return it ? it->c[T(tier)].pins : 0;
}

size_t TierManager::item_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return items_.size();
}

}  // namespace zoe::offload
