// ResidencyTable: the per-copy state machine, pins and the LRU clock.
#include "offload/residency.h"

#include "core/log.h"

namespace zoe::offload {

const char* residency_name(Residency r) {
  switch (r) {
    case Residency::kAbsent:
      return "absent";
    case Residency::kLoading:
      return "loading";
    case Residency::kResident:
      return "resident";
    case Residency::kDirty:
      return "dirty";
    case Residency::kWriting:
      return "writing";
  }
  return "?";
}

bool Item::pinned() const {
  for (const auto& x : c) {
    if (x.pins) return true;
  }
  return false;
}

bool Item::idle() const {
  if (sync_ops) return false;
  for (const auto& x : c) {
    if (x.moving()) return false;
  }
  return true;
}

Item* ResidencyTable::find(ItemId id) {
  auto i = items_.find(id);
  return i == items_.end() ? nullptr : i->second.get();
}

const Item* ResidencyTable::find(ItemId id) const {
  auto i = items_.find(id);
  return i == items_.end() ? nullptr : i->second.get();
}

Item* ResidencyTable::insert(std::unique_ptr<Item> item) {
  ZOE_CHECK(item && !find(item->id));
  Item* p = item.get();
  items_[p->id] = std::move(item);
  return p;
}

void ResidencyTable::erase(ItemId id) { items_.erase(id); }

uint64_t ResidencyTable::pinned_bytes(Tier t) const {
  uint64_t pinned = 0;
  for (const auto& [id, it] : items_) {
    if (it->at(t).pins) pinned += it->alloc;
  }
  return pinned;
}

void ResidencyTable::evictable(Tier t, bool allow_dirty, std::vector<EvictionCandidate>* out) const {
  out->clear();
  for (const auto& [id, it] : items_) {
    const Copy& c = it->at(t);
    if (it->home == t || c.pins || !c.present()) continue;
    if (c.state == Residency::kDirty && !allow_dirty) continue;
    out->push_back(EvictionCandidate{id, c.last_use});
  }
}

std::vector<Tier> ResidencyTable::unpin(Item& it, Tier t, bool dirty) {
  Copy& c = it.at(t);
  ZOE_CHECK_MSG(c.pins > 0 && c.present(),
                "unpin of item %llu in the %s tier, which is not pinned there (%s)",
                static_cast<unsigned long long>(it.id.value), tier_name(t), residency_name(c.state));
  c.pins--;
  touch(c);
  std::vector<Tier> drop;
  if (!dirty) return drop;
  for (Tier u : {Tier::kDevice, Tier::kHost}) {
    if (u == t || u == it.home) continue;
    Copy& o = it.at(u);
    switch (o.state) {
      case Residency::kAbsent:
      case Residency::kWriting:  // writes older bytes home; the newer copy is dirty and follows
        break;
      case Residency::kLoading:
        ZOE_CHECK_MSG(o.pins == 0, "item %llu changed in the %s tier while pinned loading in the %s tier",
                      static_cast<unsigned long long>(it.id.value), tier_name(t), tier_name(u));
        o.stale = true;
        break;
      case Residency::kResident:
      case Residency::kDirty:
        ZOE_CHECK_MSG(o.pins == 0, "item %llu changed in the %s tier while pinned in the %s tier",
                      static_cast<unsigned long long>(it.id.value), tier_name(t), tier_name(u));
        drop.push_back(u);
        break;
    }
  }
  if (t != it.home) c.state = Residency::kDirty;
  return drop;
}

std::shared_ptr<MoveHandle::State> ResidencyTable::begin_load(Item& it, Tier t, bool pin) {
  Copy& c = it.at(t);
  ZOE_CHECK(c.state == Residency::kAbsent);
  c.state = Residency::kLoading;
  c.move = std::make_shared<MoveHandle::State>();
  c.pins = pin ? 1 : 0;
  touch(c);
  c.stale = false;
  return c.move;
}

bool ResidencyTable::finish_load(Item& it, Tier t, Copy* src) {
  Copy& c = it.at(t);
  ZOE_CHECK(c.state == Residency::kLoading);
  c.state = Residency::kResident;
  if (src && src->state == Residency::kDirty && t == Tier::kHost) {
    // A dirty device copy was copied down: the host copy now carries the dirtiness.
    src->state = Residency::kResident;
    c.state = Residency::kDirty;
  }
  if (c.stale) ZOE_CHECK(c.pins == 0);
  return !c.stale;
}

void ResidencyTable::begin_writeback(Item& it, Tier t) {
  Copy& c = it.at(t);
  ZOE_CHECK(c.state == Residency::kDirty);
  c.state = Residency::kWriting;
  c.move = std::make_shared<MoveHandle::State>();
}

void ResidencyTable::finish_writeback(Copy& c, bool written) {
  ZOE_CHECK(c.state == Residency::kWriting);
  c.state = written ? Residency::kResident : Residency::kDirty;
  c.dropping = false;
}

void ResidencyTable::clear(Copy& c) {
  c.host = io::AlignedBuffer();
  c.ptr = nullptr;
  c.state = Residency::kAbsent;
  c.pins = 0;
  c.stale = false;
  c.dropping = false;
  c.move.reset();
}

}  // namespace zoe::offload
