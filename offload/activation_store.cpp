// The activation store: placement (plan, device, host, eviction), load, and the micro-batch's end.
// The NVMe path is in activation_store_nvme.cpp.
#include <algorithm>
#include <cstring>

#include "core/clock.h"
#include "offload/activation_store_impl.h"

namespace zoe::offload {

namespace {
enum CopyKind { kD2D = 0, kD2H = 1, kH2D = 2, kH2H = 3 };
}  // namespace

TieredActivationStore::TieredActivationStore(const ActivationStoreOptions& o)
    : o_(o), host_(o.offload == ActivationOffload::kNone ? 0 : o.host_budget, o.pin) {}

TieredActivationStore::~TieredActivationStore() {
  Status s = end_micro_batch();
  (void)s;  // a write error nobody loaded: the bytes are dropped with the micro-batch
  wbuf_.clear();
}

Status TieredActivationStore::init() {
  if (!o_.device) return invalid_argument("activation store: no device");
  if (o_.run_bytes == 0 || o_.run_bytes % 4096 != 0)
    return invalid_argument("activation store: run_bytes %llu is not a positive multiple of 4096",
                            static_cast<unsigned long long>(o_.run_bytes));
  ZOE_ASSIGN_OR_RETURN(stream_, o_.device->create_stream());
  if (o_.offload == ActivationOffload::kNvme) return init_nvme();
  return Status::ok();
}

Result<std::unique_ptr<ActivationStore>> create_activation_store(const ActivationStoreOptions& opts) {
  auto s = std::make_unique<TieredActivationStore>(opts);
  ZOE_RETURN_IF_ERROR(s->init());
  return std::unique_ptr<ActivationStore>(std::move(s));
}

uint64_t TieredActivationStore::host_reserve(uint64_t largest) const {
  if (o_.offload != ActivationOffload::kNvme) return 0;
  return uint64_t{o_.write_buffers} * o_.run_bytes + uint64_t{o_.prefetch + 1} * round_up_4k(largest);
}

Status TieredActivationStore::plan(const uint64_t* sizes, size_t n) {
  if (!t_.empty())
    return invalid_argument(
        "activation store: plan() called after %zu saves of this micro-batch "
        "(call it before the first save)",
        t_.size());
  uint64_t largest = 0;
  for (size_t i = 0; i < n; ++i) largest = std::max(largest, sizes[i]);
  ActivationBudgets b;
  b.offload = o_.offload;
  b.device_budget = o_.device_budget;
  uint64_t reserve = host_reserve(largest);
  b.host_capacity = o_.host_budget > reserve ? o_.host_budget - reserve : 0;
  b.min_offload_bytes = o_.min_offload_bytes;
  auto p = plan_activations({sizes, n}, b);
  plan_.clear();
  plan_sizes_.assign(sizes, sizes + n);
  planned_next_ = true;
  if (!p.is_ok()) return p.status();
  plan_ = std::move(p).value();
  return Status::ok();
}

Tier TieredActivationStore::target_tier(uint64_t bytes) const {
  size_t i = t_.size() - 1;
  if (i < plan_.size() && plan_sizes_[i] == bytes) return plan_[i];
  return Tier::kDevice;
}

void TieredActivationStore::note_tier(Tier t, int64_t delta) {
  int k = static_cast<int>(t);
  tier_now_[k] = static_cast<uint64_t>(static_cast<int64_t>(tier_now_[k]) + delta);
  stats_.tier_bytes[k] =
      static_cast<uint64_t>(static_cast<int64_t>(stats_.tier_bytes[k]) + (delta > 0 ? delta : 0));
  stats_.high_water_device = std::max(stats_.high_water_device, tier_now_[0]);
  stats_.high_water_host = std::max(stats_.high_water_host, host_.high_water());
  stats_.high_water_nvme = std::max(stats_.high_water_nvme, nvme_used_);
}

Status TieredActivationStore::copy(void* dst, const void* src, uint64_t bytes, int kind) {
  if (bytes == 0) return Status::ok();
  if (o_.device->kind() == device::DeviceKind::kCpu) {
    // The CPU device's memory is host memory: the caller's tensors may be any host memory (a model's
    // own buffers, not only the device's allocations), so the copy is a plain one, counted per link.
    std::memcpy(dst, src, bytes);
    if (kind == kD2H) stats_.bytes_device_to_host += bytes;
    if (kind == kH2D) stats_.bytes_host_to_device += bytes;
    return Status::ok();
  }
  switch (kind) {
    case kD2D:
      ZOE_RETURN_IF_ERROR(stream_->copy_d2d(dst, src, bytes));
      break;
    case kD2H:
      ZOE_RETURN_IF_ERROR(stream_->copy_d2h(dst, src, bytes));
      stats_.bytes_device_to_host += bytes;
      break;
    case kH2D:
      ZOE_RETURN_IF_ERROR(stream_->copy_h2d(dst, src, bytes));
      stats_.bytes_host_to_device += bytes;
      break;
    default:
      std::memcpy(dst, src, bytes);
      return Status::ok();
  }
  return stream_->synchronize();
}

Result<ActivationId> TieredActivationStore::save(const void* src, uint64_t bytes) {
  if (!src && bytes > 0)
    return invalid_argument("activation store: save() of %llu bytes from a null pointer",
                            static_cast<unsigned long long>(bytes));
  ZOE_RETURN_IF_ERROR(poll_writes(true));
  if (t_.empty()) {
    stats_.checkpoint_bytes = 0;
    std::fill(std::begin(stats_.tier_bytes), std::end(stats_.tier_bytes), 0);
  }
  size_t i = t_.size();
  t_.push_back(Tensor{});
  t_[i].bytes = bytes;
  ZOE_RETURN_IF_ERROR(place(i, src, target_tier(bytes)));
  stats_.checkpoint_bytes += bytes;
  return ActivationId{i};
}

Status TieredActivationStore::place(size_t i, const void* src, Tier tier) {
  if (tier == Tier::kHost) {
    Status s = place_host(i, src, true);
    if (s.is_ok() || s.code() != StatusCode::kOutOfBudget || o_.offload != ActivationOffload::kNvme) return s;
    tier = Tier::kNvme;  // the host is fuller than planned (reuse of blocks): the next tier
  }
  if (tier == Tier::kNvme) return place_nvme(i, src, true);
  return place_device(i, src);
}

Status TieredActivationStore::place_device(size_t i, const void* src) {
  Tensor& t = t_[i];
  ZOE_RETURN_IF_ERROR(make_device_room(t.bytes));
  if (t.bytes > 0) {
    ZOE_ASSIGN_OR_RETURN(void* p, o_.device->allocate(t.bytes));
    Status s = copy(p, src, t.bytes, kD2D);
    if (!s.is_ok()) {
      o_.device->free(p);
      return s;
    }
    t_[i].dev = p;
  }
  device_used_ += t.bytes;
  t_[i].tier = Tier::kDevice;
  t_[i].live = true;
  note_tier(Tier::kDevice, static_cast<int64_t>(t.bytes));
  return Status::ok();
}

Status TieredActivationStore::place_host(size_t i, const void* src, bool from_device) {
  Tensor& t = t_[i];
  uint64_t reserve = host_reserve(t.bytes);
  uint64_t cap = o_.host_budget > reserve ? o_.host_budget - reserve : 0;
  if (o_.offload == ActivationOffload::kNone || tier_now_[1] + t.bytes > cap || !host_.can_take(t.bytes))
    return out_of_budget(
        "activation host tier: no room for %llu bytes (%llu held, capacity %llu of "
        "zoe.activation_host_budget %llu)",
        static_cast<unsigned long long>(t.bytes), static_cast<unsigned long long>(tier_now_[1]),
        static_cast<unsigned long long>(cap), static_cast<unsigned long long>(o_.host_budget));
  ZOE_ASSIGN_OR_RETURN(char* p, host_.take(t.bytes));
  Status s = copy(p, src, t.bytes, from_device ? kD2H : kH2H);
  if (!s.is_ok()) {
    host_.give(p);
    return s;
  }
  t.host = p;
  t.tier = Tier::kHost;
  t.live = true;
  note_tier(Tier::kHost, static_cast<int64_t>(t.bytes));
  return Status::ok();
}

// Evicts the earliest saved device tensors that may leave until `bytes` more fit the share.
Status TieredActivationStore::make_device_room(uint64_t bytes) {
  size_t j = 0;
  while (device_used_ + bytes > o_.device_budget) {
    while (j < t_.size() && !(t_[j].live && t_[j].tier == Tier::kDevice &&
                              t_[j].bytes >= o_.min_offload_bytes && t_[j].bytes > 0))
      ++j;
    if (o_.offload == ActivationOffload::kNone || j >= t_.size() || j + 1 == t_.size())
      return out_of_budget(
          "activations: %llu bytes more do not fit the device's activation share of %llu bytes "
          "(zoe.activation_device_budget; %llu held, offload %s)",
          static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(o_.device_budget),
          static_cast<unsigned long long>(device_used_), activation_offload_name(o_.offload));
    ZOE_RETURN_IF_ERROR(evict(j));
  }
  return Status::ok();
}

Status TieredActivationStore::evict(size_t j) {
  Tensor& t = t_[j];
  void* dev = t.dev;
  Status s = place_host(j, dev, true);
  if (!s.is_ok() && s.code() == StatusCode::kOutOfBudget && o_.offload == ActivationOffload::kNvme)
    s = place_nvme(j, dev, true);
  ZOE_RETURN_IF_ERROR(s);
  o_.device->free(dev);
  t_[j].dev = nullptr;
  device_used_ -= t_[j].bytes;
  note_tier(Tier::kDevice, -static_cast<int64_t>(t_[j].bytes));
  stats_.tier_bytes[0] -= t_[j].bytes;
  return Status::ok();
}

Status TieredActivationStore::load_resident(Tensor& t, void* dst) {
  if (t.tier == Tier::kDevice) return copy(dst, t.dev, t.bytes, kD2D);
  return copy(dst, t.host, t.bytes, kH2D);
}

Status TieredActivationStore::load(ActivationId id, void* dst) {
  if (!id.valid() || id.value >= t_.size() || !t_[id.value].live)
    return invalid_argument(
        "activation store: tensor %llu is not held (never saved in this micro-batch, "
        "already loaded, or its save failed)",
        static_cast<unsigned long long>(id.value));
  size_t i = id.value;
  if (!dst && t_[i].bytes > 0) return invalid_argument("activation store: load() of tensor %zu into null", i);
  Status reported = poll_writes(true);
  prefetch_from(i);
  ZOE_RETURN_IF_ERROR(reported);
  Status s = t_[i].tier == Tier::kNvme ? load_nvme(i, dst) : load_resident(t_[i], dst);
  ZOE_RETURN_IF_ERROR_CTX(s, "activation store: loading tensor " + std::to_string(i));
  release(i);
  return Status::ok();
}

void TieredActivationStore::release(size_t i) {
  Tensor& t = t_[i];
  if (!t.live) return;
  if (t.dev) o_.device->free(t.dev);
  if (t.tier == Tier::kDevice) device_used_ -= t.bytes;
  if (t.read) {
    Status s = t.read->wait();  // the block may not be given back under a read in flight
    (void)s;
  }
  if (t.host) host_.give(t.host);
  t.dev = nullptr;
  t.host = nullptr;
  t.read = nullptr;
  t.live = false;
  note_tier(t.tier, -static_cast<int64_t>(t.bytes));
  if (t.tier == Tier::kNvme && --runs_[t.run].live == 0 && !runs_[t.run].open) free_run(t.run);
}

void TieredActivationStore::drop_all() {
  for (size_t i = 0; i < t_.size(); ++i) release(i);
  for (size_t r = 0; r < runs_.size(); ++r) free_run(r);
  for (WriteBuf& w : wbuf_) w.filling = false;
  t_.clear();
  runs_.clear();
  open_run_ = -1;
}

Status TieredActivationStore::end_micro_batch() {
  for (WriteBuf& w : wbuf_) {
    if (w.pending) (void)w.pending->wait();  // no lock is held: completions run freely
  }
  Status s = poll_writes(true);
  for (Tensor& t : t_) {
    if (t.read) (void)t.read->wait();
  }
  std::vector<uint64_t> sizes;
  for (const Tensor& t : t_) sizes.push_back(t.bytes);
  drop_all();
  if (!planned_next_ && !sizes.empty()) {
    Status p = plan(sizes.data(), sizes.size());
    if (!p.is_ok()) plan_.clear();  // the next micro-batch places as it goes (and reports what fails)
  }
  planned_next_ = false;
  return s;
}

}  // namespace zoe::offload
