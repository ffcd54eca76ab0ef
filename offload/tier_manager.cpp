// TierManager: the facade. Fetch, unpin, prefetch, evict and flush drive the residency table, the
// budget and the eviction policy under mu_, start moves on Transfers, and finish them on the
// poster thread (finish_move). Registration and synchronous access are in tier_manager_items.cpp.
#include "offload/tier_manager.h"

#include <algorithm>

#include "core/clock.h"
#include "core/log.h"
#include "core/units.h"

namespace zoe::offload {

// ---------------------------------------------------------------------------------------------
// Construction

TierManager::TierManager(const TierManagerOptions& opts)
    : opts_(opts),
      budget_(
          cv_, opts.wait_for_unpin_ms,
          [this](Tier t, bool allow_dirty) { return evict_one_locked(t, allow_dirty); },
          [this](Tier t) { return table_.pinned_bytes(t); }),
      policy_(make_eviction_policy(opts.policy)) {}

Result<std::unique_ptr<TierManager>> TierManager::create(const TierManagerOptions& opts) {
  std::unique_ptr<TierManager> m(new TierManager(opts));
  ZOE_RETURN_IF_ERROR(m->init());
  return m;
}

Status TierManager::init() {
  if (opts_.staging_bytes == 0 || opts_.staging_bytes % 4096) {
    return invalid_argument("tier manager: staging buffer size %zu is not a positive multiple of 4096",
                            opts_.staging_bytes);
  }
  if (opts_.staging_count == 0) return invalid_argument("tier manager: need at least one staging buffer");
  budget_.set_limit(Tier::kHost, opts_.host_budget);
  if (opts_.device) {
    uint64_t db = opts_.device->budget_bytes();
    budget_.set_limit(Tier::kDevice, opts_.device_budget
                                         ? std::min(opts_.device_budget, db ? db : opts_.device_budget)
                                         : db);
  }
  uint64_t staging = 0;
  if (opts_.nvme) {
    budget_.set_limit(Tier::kNvme, opts_.nvme->budget_bytes());
    // One more buffer than the moves share: the synchronous transfers' own (see staging.h).
    staging = static_cast<uint64_t>(opts_.staging_bytes) * (opts_.staging_count + 1);
    const uint64_t host = budget_.limit(Tier::kHost);
    if (host && staging > host) {
      return out_of_budget("host tier: the %zu staging buffers of %s need %s, more than the host budget %s",
                           opts_.staging_count + 1, format_bytes(opts_.staging_bytes).c_str(),
                           format_bytes(staging).c_str(), format_bytes(host).c_str());
    }
  }
  ZOE_ASSIGN_OR_RETURN(transfers_, Transfers::create(poster_, opts_.device, opts_.nvme, opts_.staging_bytes,
                                                     opts_.staging_count, opts_.pin));
  budget_.take(Tier::kHost, staging);
  return Status::ok();
}

TierManager::~TierManager() {
  (void)drain();
  poster_.stop();
  if (transfers_) transfers_->synchronize();
  std::lock_guard<std::mutex> lock(mu_);
  table_.for_each([&](Item& it) {
    Copy& d = it.at(Tier::kDevice);
    if (d.ptr) opts_.device->free(d.ptr);
    if (it.at(Tier::kNvme).state != Residency::kAbsent) opts_.nvme->free(it.key());
  });
  table_.clear();
}

// ---------------------------------------------------------------------------------------------
// Copies and eviction

void TierManager::drop_copy_locked(Item* it, Tier tier) {
  Copy& c = it->at(tier);
  if (tier == Tier::kDevice && c.ptr) opts_.device->free(c.ptr);
  ResidencyTable::clear(c);
  budget_.release(tier, it->alloc);
}

bool TierManager::evict_one_locked(Tier tier, bool allow_dirty) {
  table_.evictable(tier, allow_dirty, &candidates_);
  if (candidates_.empty()) return false;
  Item* victim = find_locked(candidates_[policy_->choose(candidates_)].id);
  stats_.evictions++;
  if (victim->at(tier).state == Residency::kDirty) {
    start_writeback_locked(victim, tier, /*drop=*/true);
  } else {
    drop_copy_locked(victim, tier);
  }
  return true;
}

void TierManager::wait_locked(std::unique_lock<std::mutex>& lock) {
  uint64_t t0 = now_ns();
  cv_.wait(lock);
  stats_.wait_ns += now_ns() - t0;
}

// ---------------------------------------------------------------------------------------------
// Moves

void TierManager::start_move_locked(Move m, const Places& at) {
  if (m.src) m.it->at(*m.src).pins++;
  m.begin_ns = now_ns();
  transfers_->start(m.link, at, m.it->alloc, [this, m](Status s) { finish_move(m, std::move(s)); });
}

void TierManager::finish_move(const Move& m, Status st) {
  Item* it = m.it;
  const uint64_t end = now_ns();
  if (opts_.trace && opts_.trace->enabled() && st.is_ok()) {  // names cost a string each
    opts_.trace->record("item " + std::to_string(it->id.value), link_name(m.link), m.begin_ns, end, it->alloc,
                        kLaneTransfer + static_cast<uint32_t>(m.link));
  }
  std::shared_ptr<MoveHandle::State> move;
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Copy& c = it->at(m.tier);
    in_flight_--;
    if (m.src) it->at(*m.src).pins--;
    if (st.is_ok()) {
      LinkStats& l = stats_.link(m.link);
      l.bytes += it->alloc;
      l.transfers++;
      l.busy_ns += end - m.begin_ns;
    }
    move = std::move(c.move);
    if (m.kind == MoveKind::kLoad) {
      if (!st.is_ok()) {
        st = std::move(st).with_context("loading item " + std::to_string(it->id.value) + " into the " +
                                        tier_name(m.tier) + " tier");
        if (first_error_.is_ok()) first_error_ = st;
        drop_copy_locked(it, m.tier);
      } else {
        ptr = c.ptr;
        if (!ResidencyTable::finish_load(*it, m.tier, m.src ? &it->at(*m.src) : nullptr)) {
          drop_copy_locked(it, m.tier);
          st = Status(StatusCode::kCancelled, "prefetched copy went stale");
        }
      }
    } else {  // write-back
      if (m.kind == MoveKind::kWriteDrop) budget_.end_pending(m.tier, it->alloc);
      if (!st.is_ok()) {
        st = std::move(st).with_context("writing back item " + std::to_string(it->id.value) + " from the " +
                                        tier_name(m.tier) + " tier");
        if (first_error_.is_ok()) first_error_ = st;
        ResidencyTable::finish_writeback(c, /*written=*/false);  // the bytes are still here
      } else {
        stats_.writebacks++;
        if (m.kind == MoveKind::kWriteDrop) {
          drop_copy_locked(it, m.tier);
        } else {
          ResidencyTable::finish_writeback(c, /*written=*/true);
          ptr = c.ptr;
        }
      }
    }
    cv_.notify_all();
  }
  if (move) move->complete(std::move(st), ptr);
}

void TierManager::start_writeback_locked(Item* it, Tier tier, bool drop) {
  ResidencyTable::begin_writeback(*it, tier);
  it->at(tier).dropping = drop;
  if (drop) budget_.add_pending(tier, it->alloc);
  in_flight_++;
  Move m{it, tier, drop ? MoveKind::kWriteDrop : MoveKind::kWriteKeep};
  Places at{it->key()};
  char* ptr = static_cast<char*>(it->at(tier).ptr);
  if (tier == Tier::kHost) {  // home is nvme
    m.link = Link::kHostToNvme;
    at.host = ptr;
  } else if (it->home == Tier::kHost) {  // a device copy goes straight home
    m.link = Link::kDeviceToHost;
    at.host = static_cast<char*>(it->at(Tier::kHost).ptr);
    at.device = ptr;
  } else {  // to an nvme home through staging buffers, in pieces
    m.link = Link::kDeviceToNvme;
    at.device = ptr;
  }
  start_move_locked(m, at);
}

bool TierManager::start_load_locked(std::unique_lock<std::mutex>& lock, Item* it, Tier tier, bool may_wait) {
  Move m{it, tier, MoveKind::kLoad};
  Places at{it->key()};
  char* ptr = static_cast<char*>(it->at(tier).ptr);
  for (;;) {
    if (tier == Tier::kHost) {  // home is nvme
      Copy& d = it->at(Tier::kDevice);
      if (d.moving()) {
        if (!may_wait) return false;
        wait_locked(lock);
        continue;
      }
      at.host = ptr;
      if (d.state == Residency::kDirty) {  // the newest bytes are on the device
        m.link = Link::kDeviceToHost;
        m.src = Tier::kDevice;
        at.device = static_cast<char*>(d.ptr);
      } else {
        m.link = Link::kNvmeToHost;
      }
      start_move_locked(m, at);
      return true;
    }
    // Into the device: from a host copy when there is one, else from NVMe through staging. A
    // host copy being written home and kept (clean()) is a source too: both only read it, and
    // the load's pin keeps it until the load ends.
    Copy& h = it->at(Tier::kHost);
    const bool written_and_kept = h.state == Residency::kWriting && !h.dropping;
    if (it->home == Tier::kNvme && h.moving() && !written_and_kept) {
      if (!may_wait) return false;
      wait_locked(lock);
      continue;
    }
    at.device = ptr;
    if (h.present() || written_and_kept) {
      m.link = Link::kHostToDevice;
      m.src = Tier::kHost;
      at.host = static_cast<char*>(h.ptr);
    } else {
      m.link = Link::kNvmeToDevice;
    }
    start_move_locked(m, at);
    return true;
  }
}

MoveHandle TierManager::load_locked(std::unique_lock<std::mutex>& lock, Item* it, Tier tier, bool pin,
                                    bool may_wait) {
  Copy& c = it->at(tier);
  MoveHandle h(table_.begin_load(*it, tier, pin));
  in_flight_++;
  auto fail = [&](Status s, bool reserved) {
    if (c.ptr && tier == Tier::kDevice) opts_.device->free(c.ptr);
    auto move = std::move(c.move);
    ResidencyTable::clear(c);
    in_flight_--;
    if (reserved) budget_.release(tier, it->alloc);
    cv_.notify_all();
    move->complete(std::move(s), nullptr);
    return h;
  };
  Status s = budget_.reserve(lock, tier, it->alloc, may_wait);
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

// ---------------------------------------------------------------------------------------------
// Fetch, unpin, prefetch, evict, flush

static Status check_fetch_tier(const TierManagerOptions& o, ItemId id, Tier home, Tier tier) {
  const auto n = static_cast<unsigned long long>(id.value);
  if (tier == Tier::kNvme)
    return invalid_argument("item %llu: nvme is a home tier; fetch into device or host", n);
  if (tier == Tier::kDevice && !o.device) return unsupported("item %llu: no device tier is configured", n);
  if (tier == Tier::kHost && home == Tier::kDevice) {
    return invalid_argument("item %llu lives on the device; it has no host copy", n);
  }
  return Status::ok();
}

MoveHandle TierManager::fetch(ItemId id, Tier tier) {
  std::unique_lock<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  if (!it) {
    return MoveHandle::completed(
        not_found("tier manager: no item %llu", static_cast<unsigned long long>(id.value)), nullptr);
  }
  Status v = check_fetch_tier(opts_, id, it->home, tier);
  if (!v.is_ok()) return MoveHandle::completed(v, nullptr);
  policy_->fetch_begins(id);
  for (;;) {
    Copy& c = it->at(tier);
    switch (c.state) {
      case Residency::kResident:
      case Residency::kDirty:
        table_.pin(c);
        policy_->fetch_returned();
        return MoveHandle::completed(Status::ok(), c.ptr);
      case Residency::kLoading:
        if (c.stale) {
          wait_locked(lock);
          continue;
        }
        table_.pin(c);
        policy_->fetch_returned();
        return MoveHandle(c.move);
      case Residency::kWriting:
        wait_locked(lock);
        continue;
      case Residency::kAbsent: {
        if (it->sync_ops) {  // a synchronous write of the home is running: load what it leaves
          wait_locked(lock);
          continue;
        }
        MoveHandle h = load_locked(lock, it, tier, /*pin=*/true, /*may_wait=*/true);
        policy_->fetch_returned();
        return h;
      }
    }
  }
}

void TierManager::unpin(ItemId id, Tier tier, bool dirty) {
  std::lock_guard<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  ZOE_CHECK_MSG(it != nullptr, "unpin of unknown item %llu", static_cast<unsigned long long>(id.value));
  for (Tier stale : table_.unpin(*it, tier, dirty)) drop_copy_locked(it, stale);
  cv_.notify_all();
}

void TierManager::prefetch(ItemId id, Tier tier) {
  std::unique_lock<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  if (!it || !check_fetch_tier(opts_, id, it->home, tier).is_ok()) return;
  if (it->at(tier).state != Residency::kAbsent || it->sync_ops) return;
  stats_.prefetches++;
  MoveHandle h = load_locked(lock, it, tier, /*pin=*/false, /*may_wait=*/false);
  if (h.ready() && !h.wait().is_ok()) stats_.prefetch_skipped++;
}

MoveHandle TierManager::evict(ItemId id, Tier tier) { return write_home(id, tier, /*drop=*/true); }

MoveHandle TierManager::clean(ItemId id, Tier tier) { return write_home(id, tier, /*drop=*/false); }

// evict() (drop: the copy goes, written home first if dirty) and clean() (the copy stays; a dirty
// one is written home and becomes clean).
MoveHandle TierManager::write_home(ItemId id, Tier tier, bool drop) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto n = static_cast<unsigned long long>(id.value);
  Item* it = find_locked(id);
  if (!it) return MoveHandle::completed(not_found("tier manager: no item %llu", n), nullptr);
  if (tier == it->home || tier == Tier::kNvme) {
    if (!drop) return MoveHandle::completed(Status::ok(), nullptr);  // the home is always clean
    return MoveHandle::completed(
        invalid_argument("item %llu: the %s tier holds its home copy, which is never evicted", n,
                         tier_name(tier)),
        nullptr);
  }
  for (;;) {
    Copy& c = it->at(tier);
    switch (c.state) {
      case Residency::kAbsent:
        return MoveHandle::completed(Status::ok(), nullptr);
      case Residency::kLoading:
        wait_locked(lock);
        continue;
      case Residency::kWriting:
        return MoveHandle(c.move);
      case Residency::kResident:
      case Residency::kDirty:
        if (!drop && c.state == Residency::kResident) return MoveHandle::completed(Status::ok(), nullptr);
        if (c.pins) {
          return MoveHandle::completed(
              invalid_argument("item %llu is pinned %u time(s) in the %s tier; unpin it before %s", n, c.pins,
                               tier_name(tier), drop ? "evicting" : "cleaning"),
              nullptr);
        }
        if (drop) stats_.evictions++;
        if (c.state == Residency::kResident) {
          drop_copy_locked(it, tier);
          return MoveHandle::completed(Status::ok(), nullptr);
        }
        start_writeback_locked(it, tier, drop);
        return MoveHandle(c.move);
    }
  }
}

Status TierManager::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  table_.for_each([&](Item& it) {
    for (Tier t : {Tier::kDevice, Tier::kHost}) {
      const Copy& c = it.at(t);
      if (c.state == Residency::kDirty && c.pins == 0) start_writeback_locked(&it, t, /*drop=*/false);
    }
  });
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
// Trace policy, statistics, queries

void TierManager::begin_trace() {
  std::lock_guard<std::mutex> lock(mu_);
  policy_->begin_trace();
}

void TierManager::end_trace() {
  std::lock_guard<std::mutex> lock(mu_);
  policy_->end_trace();
}

TierStats TierManager::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStats s = stats_;
  s.wait_ns += budget_.wait_ns();
  s.waiting = budget_.waiting();
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    s.budget[tier_index(t)] = budget_.limit(t);
    s.used[tier_index(t)] = budget_.used(t);
    s.high_water[tier_index(t)] = budget_.high_water(t);
  }
  if (opts_.nvme) {
    s.budget[tier_index(Tier::kNvme)] = opts_.nvme->budget_bytes();
    s.used[tier_index(Tier::kNvme)] = opts_.nvme->used_bytes();
    s.high_water[tier_index(Tier::kNvme)] = opts_.nvme->high_water_bytes();
  }
  return s;
}

Residency TierManager::residency(ItemId id, Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Item* it = find_locked(id);
  return it ? it->at(tier).state : Residency::kAbsent;
}

uint32_t TierManager::pins(ItemId id, Tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Item* it = find_locked(id);
  return it ? it->at(tier).pins : 0;
}

size_t TierManager::item_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.size();
}

}  // namespace zoe::offload
