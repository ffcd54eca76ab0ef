// Engine::sleep() and Engine::wake(): every byte the engine holds in device memory goes to host
// memory (or to zoe's swap on NVMe where zoe.host_budget has no room), and the device memory goes
// back to the system; wake() brings the bytes back to the same addresses.
//
// The device keeps each allocation's address across suspend()/resume() (device.h), so the
// pointers the parts hold (parameter homes, the partition cache, gradient buffers, optimizer
// states on the device, the activation store's device share) stay valid and no part needs to
// know that the engine slept: training after a sleep()/wake() pair runs the same operations on
// the same bytes as training without it, hence the same bits. The price is that the copy is of
// whole allocations, cached stage-3 partitions included (they are read again anyway at the next
// step); a part-by-part spill could skip those, at the cost of every part learning to rebuild.
#include <algorithm>
#include <cstring>

#include "core/units.h"
#include "zero/engine_impl.h"

namespace zoe {

namespace {

// The NVMe copies' items, far above any partition's.
constexpr uint64_t kSleepItemBase = uint64_t{1} << 62;
// The bounce buffer between device memory and the swap file.
constexpr size_t kBounceBytes = size_t{16} << 20;

size_t round_4k(uint64_t n) { return static_cast<size_t>((n + 4095) / 4096 * 4096); }

}  // namespace

Status Engine::Impl::awake(const char* what) const {
  if (!asleep) return Status::ok();
  return invalid_argument("%s while the engine is asleep: call wake() first", what);
}

void Engine::Impl::drop_sleep_copies() {
  for (SleepCopy& c : sleep_copies)
    if (c.host.size() == 0 && ctx.store && ctx.store->contains(c.key)) ctx.store->free(c.key);
  sleep_copies.clear();
  sleep_host_bytes = 0;
}

// Each allocation to host memory while host_room lasts, the rest to the swap (when there is one).
Status Engine::Impl::copy_out(uint64_t host_room) {
  io::AlignedBuffer bounce;
  device::Device& dev = *ctx.dev;
  for (const auto& [p, n] : dev.live_allocations()) {
    SleepCopy c;
    c.dev = p;
    c.bytes = n;
    if (n <= host_room) {
      ZOE_ASSIGN_OR_RETURN(c.host, io::AlignedBuffer::allocate(static_cast<size_t>(n)));
      ZOE_RETURN_IF_ERROR(dev.copy_to_host(c.host.data(), p, static_cast<size_t>(n)));
      host_room -= n;
      sleep_host_bytes += n;
      sleep_copies.push_back(std::move(c));
      continue;
    }
    if (!ctx.store) {
      return out_of_budget(
          "sleep(): the device holds %s more than zoe.host_budget leaves room for, and there is no "
          "NVMe tier to take them: raise zoe.host_budget, or offload to \"nvme\" (offload_optimizer or "
          "offload_param with an nvme_path)",
          format_bytes(n).c_str());
    }
    c.key = offload::StateKey{kSleepItemBase + sleep_copies.size(), offload::StateKind::kOther};
    ZOE_RETURN_IF_ERROR(ctx.store->allocate(c.key, n).status());
    sleep_copies.push_back(std::move(c));
    if (bounce.size() == 0) {
      ZOE_ASSIGN_OR_RETURN(bounce, io::AlignedBuffer::allocate(kBounceBytes));
    }
    for (uint64_t off = 0; off < n; off += kBounceBytes) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kBounceBytes, n - off));
      ZOE_RETURN_IF_ERROR(dev.copy_to_host(bounce.data(), static_cast<const char*>(p) + off, len));
      std::memset(bounce.bytes() + len, 0, round_4k(len) - len);
      ZOE_RETURN_IF_ERROR(
          ctx.store->write(sleep_copies.back().key, off, bounce.data(), round_4k(len))->wait());
    }
  }
  return Status::ok();
}

Status Engine::Impl::copy_back() {
  io::AlignedBuffer bounce;
  device::Device& dev = *ctx.dev;
  for (SleepCopy& c : sleep_copies) {
    if (c.host.size() != 0) {
      ZOE_RETURN_IF_ERROR(dev.copy_to_device(c.dev, c.host.data(), static_cast<size_t>(c.bytes)));
      continue;
    }
    if (bounce.size() == 0) {
      ZOE_ASSIGN_OR_RETURN(bounce, io::AlignedBuffer::allocate(kBounceBytes));
    }
    for (uint64_t off = 0; off < c.bytes; off += kBounceBytes) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kBounceBytes, c.bytes - off));
      ZOE_RETURN_IF_ERROR(ctx.store->read(c.key, off, bounce.data(), round_4k(len))->wait());
      ZOE_RETURN_IF_ERROR(dev.copy_to_device(static_cast<char*>(c.dev) + off, bounce.data(), len));
    }
  }
  return Status::ok();
}

Status Engine::sleep() {
  Impl& I = *impl_;
  if (!I.initialized) return invalid_argument("sleep() before initialize()");
  if (I.asleep) return invalid_argument("sleep() while the engine is asleep: call wake() first");
  if (I.gather->any_fetched() || I.grads->in_step())
    return invalid_argument(
        "sleep() in the middle of a step (a module is fetched, or gradients were taken or reduced since "
        "the last step()): call it after step(), with every module released");
  if (I.ctx.dev->kind() != device::DeviceKind::kCpu)
    return unsupported("sleep() is built for zoe's CPU device only; on a %s device it is not supported yet",
                       I.ctx.dev->name().c_str());
  // Everything in flight ends first: an asynchronous checkpoint, an update running behind the
  // last step, queued gathers and parameter moves, the caller-side device work.
  ZOE_RETURN_IF_ERROR_CTX(finish_save(), "finishing the asynchronous checkpoint before sleep()");
  ZOE_RETURN_IF_ERROR_CTX(I.update->finish(), "the last optimizer step, before sleep()");
  ZOE_RETURN_IF_ERROR(I.gather->discard());
  ZOE_RETURN_IF_ERROR_CTX(I.homes->drain(), "finishing the parameter moves before sleep()");
  ZOE_RETURN_IF_ERROR(I.ctx.ops->synchronize());
  if (I.ctx.comm_stream) ZOE_RETURN_IF_ERROR(I.ctx.comm_stream->synchronize());
  if (I.ctx.acts) offload::drain_activation_writes(*I.ctx.acts);
  // Host room: what zoe.host_budget leaves beside the host memory in use (no limit when unset).
  uint64_t room = UINT64_MAX;
  const auto budget = static_cast<uint64_t>(std::max<int64_t>(0, I.ctx.cfg->zoe.host_budget_bytes));
  if (budget > 0) {
    const uint64_t used = memory_in_use().host;
    room = budget > used ? budget - used : 0;
  }
  Status s = I.copy_out(room);
  if (s.is_ok()) s = I.ctx.dev->suspend();
  if (!s.is_ok()) {
    I.drop_sleep_copies();  // the device still holds every byte: nothing changed
    return s.with_context("sleep()");
  }
  I.asleep = true;
  return Status::ok();
}

Status Engine::wake() {
  Impl& I = *impl_;
  if (!I.asleep) return invalid_argument("wake() while the engine is awake: call sleep() first");
  ZOE_RETURN_IF_ERROR_CTX(I.ctx.dev->resume(), "wake()");
  // A failed copy leaves the device's bytes wrong: the engine stays asleep, holding its copies,
  // and the next wake() tries again.
  Status s = I.copy_back();
  if (!s.is_ok()) {
    (void)I.ctx.dev->suspend();
    return s.with_context("wake()");
  }
  I.drop_sleep_copies();
  I.asleep = false;
  return Status::ok();
}

bool Engine::is_asleep() const { return impl_->asleep; }

}  // namespace zoe
