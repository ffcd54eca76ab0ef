// TierManager: registering and removing items, and the synchronous read()/write() of their bytes.
// Part of the facade (tier_manager.h); the moves are in tier_manager.cpp.
#include <algorithm>
#include <cstring>

#include "offload/tier_manager.h"

namespace zoe::offload {

Status TierManager::add_item(ItemId id, uint64_t bytes, Tier home) {
  const auto n = static_cast<unsigned long long>(id.value);
  if (bytes == 0) return invalid_argument("item %llu: size 0", n);
  if (home == Tier::kDevice && !opts_.device)
    return unsupported("item %llu: no device tier is configured", n);
  if (home == Tier::kNvme && !opts_.nvme) return unsupported("item %llu: no nvme tier is configured", n);
  std::unique_lock<std::mutex> lock(mu_);
  if (find_locked(id)) return invalid_argument("item %llu is already registered", n);
  auto item = std::make_unique<Item>();
  item->id = id;
  item->bytes = bytes;
  item->alloc = (bytes + 4095) & ~uint64_t{4095};
  item->home = home;
  Copy& c = item->at(home);
  if (home == Tier::kNvme) {
    // An item starts as zeros in every tier (the host tier clears its buffer below).
    ZOE_ASSIGN_OR_RETURN(io::Extent e, opts_.nvme->allocate(item->key(), item->alloc, io::Unwritten::kZeros));
    (void)e;
  } else {
    ZOE_RETURN_IF_ERROR(budget_.reserve(lock, home, item->alloc, true));
    if (find_locked(id)) {  // registered by another thread while this one waited for room
      budget_.release(home, item->alloc);
      return invalid_argument("item %llu is already registered", n);
    }
    if (home == Tier::kHost) {
      auto b = io::AlignedBuffer::allocate(item->alloc, opts_.pin);
      if (!b.is_ok()) {
        budget_.release(home, item->alloc);
        return b.status();
      }
      c.host = std::move(b).value();
      c.ptr = c.host.data();
      memset(c.ptr, 0, item->alloc);
    } else {
      auto p = opts_.device->allocate(item->alloc);
      if (!p.is_ok()) {
        budget_.release(home, item->alloc);
        return p.status();
      }
      c.ptr = p.value();
    }
  }
  c.state = Residency::kResident;
  table_.insert(std::move(item));
  return Status::ok();
}

Status TierManager::remove_item(ItemId id) {
  std::unique_lock<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  if (!it) return not_found("tier manager: no item %llu", static_cast<unsigned long long>(id.value));
  while (!it->idle()) wait_locked(lock);
  if (it->pinned()) {
    return invalid_argument("item %llu is pinned; unpin it before removing",
                            static_cast<unsigned long long>(id.value));
  }
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    if (t != it->home && it->at(t).state != Residency::kAbsent) drop_copy_locked(it, t);
  }
  if (it->home == Tier::kNvme) {
    opts_.nvme->free(it->key());
  } else {
    drop_copy_locked(it, it->home);
  }
  table_.erase(id);
  return Status::ok();
}

Status TierManager::nvme_sync(std::unique_lock<std::mutex>& lock, Item* it, char* data, bool write,
                              uint64_t first, uint64_t len) {
  // The I/O runs without mu_: completions are finished by the poster, which takes mu_, and a
  // thread that waits for I/O under mu_ would wait for them (see the header). The item is marked
  // busy instead, so no move of it starts meanwhile and remove_item() waits.
  it->sync_ops++;
  lock.unlock();
  Status s = transfers_->copy_sync(it->key(), it->alloc, data, write, first, len);
  lock.lock();
  it->sync_ops--;
  cv_.notify_all();
  return s;
}

// The byte range [*offset, *offset + *len) of an item, checked and clamped (len UINT64_MAX: to the end).
static Status check_range(ItemId id, uint64_t bytes, uint64_t* offset, uint64_t* len) {
  if (*offset > bytes) {
    return invalid_argument("item %llu: offset %llu is beyond its %llu bytes",
                            static_cast<unsigned long long>(id.value),
                            static_cast<unsigned long long>(*offset), static_cast<unsigned long long>(bytes));
  }
  *len = std::min<uint64_t>(*len, bytes - *offset);
  uint64_t end = *offset + *len;
  if (*offset % 4096 != 0 || (end != bytes && end % 4096 != 0)) {
    return invalid_argument("item %llu: range [%llu, %llu) is not on 4096-byte boundaries",
                            static_cast<unsigned long long>(id.value),
                            static_cast<unsigned long long>(*offset), static_cast<unsigned long long>(end));
  }
  return Status::ok();
}

Status TierManager::write(ItemId id, const void* src, uint64_t offset, uint64_t len) {
  std::unique_lock<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  if (!it) return not_found("tier manager: no item %llu", static_cast<unsigned long long>(id.value));
  ZOE_RETURN_IF_ERROR(check_range(id, it->bytes, &offset, &len));
  while (!it->idle()) wait_locked(lock);
  if (it->pinned()) {
    return invalid_argument("item %llu is pinned; unpin it before writing",
                            static_cast<unsigned long long>(id.value));
  }
  // A part of the item is replaced: the rest must be current at home first.
  const bool whole = offset == 0 && len == it->bytes;
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    Copy& c = it->at(t);
    if (t == it->home || c.state == Residency::kAbsent) continue;
    if (c.state == Residency::kDirty && !whole) {
      start_writeback_locked(it, t, /*drop=*/true);
      while (!it->idle()) wait_locked(lock);
      if (it->at(t).state == Residency::kDirty) {  // the write-back failed; nothing was lost
        Status e = first_error_;
        first_error_ = Status::ok();
        return e;
      }
    } else {
      drop_copy_locked(it, t);
    }
  }
  Copy& h = it->at(it->home);
  switch (it->home) {
    case Tier::kHost:
      memcpy(static_cast<char*>(h.ptr) + offset, src, len);
      return Status::ok();
    case Tier::kDevice:
      return opts_.device->copy_to_device(static_cast<char*>(h.ptr) + offset, src, len);
    case Tier::kNvme:
      return nvme_sync(lock, it, static_cast<char*>(const_cast<void*>(src)), true, offset, len)
          .with_context("writing item " + std::to_string(id.value) + " to its nvme home");
  }
  return internal_error("bad tier");
}

Status TierManager::read(ItemId id, void* dst, uint64_t offset, uint64_t len) {
  std::unique_lock<std::mutex> lock(mu_);
  Item* it = find_locked(id);
  if (!it) return not_found("tier manager: no item %llu", static_cast<unsigned long long>(id.value));
  ZOE_RETURN_IF_ERROR(check_range(id, it->bytes, &offset, &len));
  while (!it->idle()) wait_locked(lock);
  // Any present copy holds the newest bytes: stale copies are dropped when another is dirtied.
  const Copy& h = it->at(Tier::kHost);
  if (h.present()) {
    memcpy(dst, static_cast<const char*>(h.ptr) + offset, len);
    return Status::ok();
  }
  const Copy& d = it->at(Tier::kDevice);
  if (d.present()) return opts_.device->copy_to_host(dst, static_cast<const char*>(d.ptr) + offset, len);
  return nvme_sync(lock, it, static_cast<char*>(dst), false, offset, len)
      .with_context("reading item " + std::to_string(id.value) + " from nvme");
}

}  // namespace zoe::offload
