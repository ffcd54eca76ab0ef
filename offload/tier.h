// The memory tiers, the links bytes move on between them, and the per-link transfer statistics.
#pragma once

#include <cstdint>
#include <functional>

namespace zoe::offload {

enum class Tier : uint8_t { kDevice = 0, kHost = 1, kNvme = 2 };
const char* tier_name(Tier t);
constexpr int tier_index(Tier t) { return static_cast<int>(t); }

// The tier manager's name for an item, and the optimizer swapper's for a group of states: two
// types of their own, so that one cannot be passed where the other (or a caller's index of its
// own) is expected. Built from a plain number only by name (ItemId{n}, GroupId{n}: the offload
// layer's callers number their items); never converted to or from one implicitly.
template <class Tag>
struct TypedId {
  uint64_t value = 0;
  constexpr TypedId() = default;
  constexpr explicit TypedId(uint64_t v) : value(v) {}
  friend constexpr bool operator==(TypedId a, TypedId b) { return a.value == b.value; }
  friend constexpr bool operator!=(TypedId a, TypedId b) { return a.value != b.value; }
};
using ItemId = TypedId<struct ItemTag>;
using GroupId = TypedId<struct GroupTag>;

// A direction of transfer. The values are stable: traces put link l on thread 100 + l.
enum class Link : uint8_t {
  kNvmeToHost = 0,
  kHostToNvme = 1,
  kHostToDevice = 2,
  kDeviceToHost = 3,
  kNvmeToDevice = 4,
  kDeviceToNvme = 5,
};
constexpr int kLinkCount = 6;
const char* link_name(Link l);  // "nvme->host", "host->nvme", ...

struct LinkStats {
  uint64_t bytes = 0;
  uint64_t transfers = 0;
  uint64_t busy_ns = 0;  // sum of transfer durations
  double gbps() const { return busy_ns ? static_cast<double>(bytes) / static_cast<double>(busy_ns) : 0.0; }
};

struct TierStats {
  uint64_t budget[3] = {0, 0, 0};  // indexed by tier_index()
  uint64_t used[3] = {0, 0, 0};
  uint64_t high_water[3] = {0, 0, 0};
  LinkStats nvme_to_host, host_to_nvme, host_to_device, device_to_host, nvme_to_device, device_to_nvme;
  uint64_t wait_ns = 0;  // time callers spent blocked (full tiers, fetch waits)
  uint32_t waiting = 0;  // callers blocked now on a full tier (waiting for pins or write-backs)
  uint64_t evictions = 0;
  uint64_t writebacks = 0;
  uint64_t prefetches = 0, prefetch_skipped = 0;

  LinkStats& link(Link l);
  const LinkStats& link(Link l) const;
  // Calls fn(link_name(l), link(l)) for every link, in Link order (for JSON and tables).
  template <class Fn>
  void for_each_link(Fn&& fn) const {
    for (int i = 0; i < kLinkCount; ++i) fn(link_name(static_cast<Link>(i)), link(static_cast<Link>(i)));
  }
};

}  // namespace zoe::offload

template <class Tag>
struct std::hash<zoe::offload::TypedId<Tag>> {
  size_t operator()(zoe::offload::TypedId<Tag> id) const noexcept { return std::hash<uint64_t>()(id.value); }
};
