// Parameter gathering: see param_gather.h.
#include "zero/param_gather.h"

#include <algorithm>

namespace zoe::zero {

// Queues the gather of module m's parameters ahead of its fetch: device buffers for the
// gathered module and a copy of this rank's partition; on the communicator's stream, a host
// task reads the partition's latest bytes into that copy (from whichever tier holds them),
// then the all-gather runs. Every rank queues the same gathers in the same order (the decisions
// depend only on the recorded fetch order and the config), so the collectives line up.
Status ParamGather::start(ModuleId m) {
  const ModuleLayout& mod = modules_[m];
  Slot& slot = slots_[m.index];
  const size_t es = shape_.esize();
  ZOE_ASSIGN_OR_RETURN(device::DeviceBuffer full, r_.mem->zeroed(mod.padded * es));
  ZOE_ASSIGN_OR_RETURN(device::DeviceBuffer send, r_.mem->zeroed(mod.part * es));
  slot.full = std::move(full);
  slot.send = std::move(send);
  slot.error = Status::ok();
  // (Only on host-memory devices with a host communicator: the gather window is 0 otherwise.)
  r_.dcomm->enqueue_host_task([this, m]() -> Status {
    Slot& sl = slots_[m.index];
    // The partition must be updated first (an overlapped step may still be writing it). This
    // waits on the communicator's thread, not the caller's, so the decision to queue the gather
    // stays the same on every rank whatever each rank's update speed; the update's thread never
    // needs the communicator, so the wait always ends.
    Status s = gate_.wait(m);
    // A read, not a pinning fetch: a pin held here could wait for room in the device tier
    // while the caller holds that room for a gather queued behind this task.
    if (s.is_ok()) s = homes_.read_partition(m, sl.send.get());
    // The gather after this task runs anyway, so this rank stays in step with the others;
    // fetch() reports the error.
    if (!s.is_ok()) sl.error = s.with_context("reading the partition of module " + modules_[m].name);
    return Status::ok();
  });
  slot.begin_ns = now_ns();
  slot.handle = r_.dcomm->all_gather(slot.send.get(), slot.full.get(), mod.part, comm::to_comm(shape_.cdt));
  slot.pending = true;
  live_elems_ += mod.padded;
  return Status::ok();
}

// Waits for module m's queued gather; its parameters are then in its slot.
Status ParamGather::finish(ModuleId m) {
  const ModuleLayout& mod = modules_[m];
  Slot& slot = slots_[m.index];
  Status s;
  {
    Timer t(&clock_.t_comm);
    s = slot.handle.wait();
  }
  if (r_.trace->enabled()) {
    r_.trace->record("gather " + mod.name + " (queued)", "gather", slot.begin_ns, now_ns(),
                     mod.padded * shape_.esize(), kLaneGather);
  }
  slot.send.reset();
  slot.pending = false;
  slot.handle = comm::CommHandle();
  if (s.is_ok()) s = slot.error;
  return s.is_ok() ? s : s.with_context("gathering the parameters of module " + mod.name);
}

Status ParamGather::discard() {
  Status first;
  for (ModuleId m : modules_.ids()) {
    Slot& slot = slots_[m.index];
    if (!slot.pending) continue;
    Status s = finish(m);
    if (first.is_ok()) first = s;
    slot.full.reset();
    live_elems_ -= modules_[m].padded;
  }
  return first;
}

// At fetch(m) after the first iteration: the recorded order predicts m. When it does not (an
// evaluation pass, a changed loop), move the cursor to m's next occurrence and drop the
// gathers queued for the old prediction.
Status ParamGather::follow_order(ModuleId m) {
  if (recording_ || order_.empty() || order_[cursor_] == m) return Status::ok();
  for (size_t k = 1; k < order_.size(); ++k) {
    size_t at = (cursor_ + k) % order_.size();
    if (order_[at] == m) {
      cursor_ = at;
      break;
    }
  }
  return discard();
}

// Gathers of the next partitioned modules in the recorded order, within the gather window and
// stage3_max_live_parameters; never past the end of the order (the step changes the parameters).
Status ParamGather::queue_gathers(const MakeRoom& make_room) {
  size_t queued = 0;
  for (ModuleId q : modules_.ids()) queued += slots_[q.index].pending ? modules_[q].padded : 0;
  const int64_t cap = static_cast<int64_t>(r_.max_live);
  for (size_t k = cursor_ + 1; k < order_.size(); ++k) {
    const ModuleId next = order_[k];
    const ModuleLayout& nm = modules_[next];
    // Persistent, fetched, queued, or served in place (prefetch_moves() moves those).
    if (!nm.partitioned_params || slots_[next.index].full || in_place(next)) continue;
    if (queued + nm.padded > r_.window || static_cast<int64_t>(live_elems_ + nm.padded) > cap) break;
    Status s = start(next);
    if (!s.is_ok()) {
      // The window was sized to fit the budget; reductions still holding buffers are the only
      // other users: free them and retry, else fail.
      ZOE_RETURN_IF_ERROR(make_room());
      s = start(next);
      if (!s.is_ok()) {
        return s.with_context(
            "prefetching the parameters of module " + nm.name +
            " (lower zero_optimization.stage3_prefetch_bucket_size or raise zoe.device_budget)");
      }
    }
    queued += nm.padded;
  }
  return Status::ok();
}

// Partitions further ahead move towards the device, up to the prefetch bucket size; not past
// the order's end either (the step rewrites every partition).
void ParamGather::prefetch_moves(ModuleId m) {
  int64_t budget = r_.prefetch_bucket;
  for (size_t k = cursor_ + 1; k < order_.size() && budget > 0; ++k) {
    const ModuleId next = order_[k];
    if (next == m) continue;
    const ModuleLayout& nm = modules_[next];
    if (!nm.partitioned_params || slots_[next.index].full || slots_[next.index].pinned) continue;
    if (!gate_.done(next)) continue;  // a local decision: partition moves are not collective
    homes_.prefetch_partition(next);
    slots_[next.index].hinted = true;
    budget -= static_cast<int64_t>(nm.part);
  }
}

Status ParamGather::prefetch_after(ModuleId m, const MakeRoom& make_room) {
  if (recording_ || order_.empty() || !homes_.has_partitions()) return Status::ok();
  ZOE_RETURN_IF_ERROR(queue_gathers(make_room));
  prefetch_moves(m);
  return Status::ok();
}

// A partitioned module nobody queued a gather for: gathered now, from its pinned partition.
// stage3_max_live_parameters bounds what prefetch queues: above it, the queued gathers are dropped,
// but a fetch the caller asks for is never refused for it (as in DeepSpeed; the modules the caller
// holds are its own, and the device budget is the limit).
Status ParamGather::gather_now(ModuleId m) {
  const ModuleLayout& mod = modules_[m];
  Slot& slot = slots_[m.index];
  const int64_t cap = static_cast<int64_t>(r_.max_live);
  if (static_cast<int64_t>(live_elems_ + mod.padded) > cap) ZOE_RETURN_IF_ERROR(discard());
  ZOE_ASSIGN_OR_RETURN(void* part, homes_.pin_partition(m, &clock_.t_io));
  // From here the partition is pinned: every path below unpins it.
  auto full = r_.mem->zeroed(mod.padded * shape_.esize());
  if (!full.is_ok()) {
    homes_.unpin_partition(m);
    return full.status().with_context("gathering the parameters of module " + mod.name);
  }
  {
    Timer t(&clock_.t_comm);
    const uint64_t g0 = now_ns();
    Status s = r_.dcomm->all_gather(part, full.value().get(), mod.part, comm::to_comm(shape_.cdt)).wait();
    if (r_.trace->enabled()) {
      r_.trace->record("gather " + mod.name, "gather", g0, now_ns(), mod.padded * shape_.esize(),
                       kLaneGather);
    }
    homes_.unpin_partition(m);
    if (!s.is_ok()) return s.with_context("gathering the parameters of module " + mod.name);
  }
  slot.full = std::move(full).value();
  live_elems_ += mod.padded;
  clock_.gathers_on_demand++;
  return Status::ok();
}

// Served in place beyond what the tier's share holds pinned (several modules fetched together):
// the partition's latest bytes read into a copy, as a gather would, pinning nothing.
Status ParamGather::copy_now(ModuleId m) {
  const ModuleLayout& mod = modules_[m];
  Slot& slot = slots_[m.index];
  ZOE_ASSIGN_OR_RETURN(device::DeviceBuffer full, r_.mem->zeroed(mod.padded * shape_.esize()));
  {
    Timer t(&clock_.t_io);
    Status s = homes_.read_partition(m, full.get());
    if (!s.is_ok()) return s.with_context("reading the partition of module " + mod.name);
  }
  slot.full = std::move(full);
  live_elems_ += mod.padded;
  clock_.gathers_on_demand++;
  return Status::ok();
}

// A partitioned module whose gathered bytes are its partition's own: the partition itself, pinned
// on the device (waiting for a move prefetch started, or moving it now) until release(). Counted
// as prefetched where prefetch had started its move.
Status ParamGather::serve_in_place(ModuleId m) {
  const ModuleLayout& mod = modules_[m];
  Slot& slot = slots_[m.index];
  const int64_t cap = static_cast<int64_t>(r_.max_live);
  if (static_cast<int64_t>(live_elems_ + mod.padded) > cap) ZOE_RETURN_IF_ERROR(discard());
  const uint64_t bytes = mod.part * shape_.esize();
  if (pinned_bytes_ + bytes > r_.in_place_pins) return copy_now(m);
  const uint64_t t0 = now_ns();
  auto part = homes_.pin_partition(m, &clock_.t_io);
  if (!part.is_ok()) return part.status().with_context("fetching the parameters of module " + mod.name);
  if (r_.trace->enabled()) r_.trace->record("pin " + mod.name, "gather", t0, now_ns(), bytes, kLaneGather);
  slot.pinned = part.value();
  pinned_bytes_ += bytes;
  live_elems_ += mod.padded;
  (slot.hinted ? clock_.gathers_prefetched : clock_.gathers_on_demand)++;
  slot.hinted = false;
  return Status::ok();
}

Result<ModuleParams> ParamGather::fetch(ModuleId m, const MakeRoom& make_room) {
  const ModuleLayout& mod = modules_[m];
  Slot& slot = slots_[m.index];
  // Behind an overlapped step: this module's update first (only this one's).
  {
    Timer t(&clock_.t_opt);
    ZOE_RETURN_IF_ERROR(gate_.wait(m));
  }
  ZOE_RETURN_IF_ERROR(homes_.settle(m));
  if (recording_) order_.push_back(m);
  ZOE_RETURN_IF_ERROR(follow_order(m));
  if (mod.partitioned_params && !slot.fetched && slot.pending) {
    // Prefetched: the gather was queued when an earlier module was fetched.
    Status s = finish(m);
    if (!s.is_ok()) {
      slot.full.reset();
      live_elems_ -= mod.padded;
      return s;
    }
    clock_.gathers_prefetched++;
    ZOE_RETURN_IF_ERROR(prefetch_after(m, make_room));
  } else if (mod.partitioned_params && !slot.fetched) {
    ZOE_RETURN_IF_ERROR(in_place(m) ? serve_in_place(m) : gather_now(m));
    ZOE_RETURN_IF_ERROR(prefetch_after(m, make_room));
  }
  if (!recording_ && !order_.empty()) cursor_ = (cursor_ + 1) % order_.size();
  slot.fetched = true;
  void* flat = !mod.partitioned_params ? homes_.persistent_params(m)
               : slot.pinned           ? slot.pinned
                                       : slot.full.get();
  return r_.mem->views(mod, flat);
}

Status ParamGather::release(ModuleId m) {
  const ModuleLayout& mod = modules_[m];
  if (m.index >= slots_.size() || !slots_[m.index].fetched)
    return invalid_argument("release(%s) of a module that is not fetched", mod.name.c_str());
  Slot& slot = slots_[m.index];
  slot.fetched = false;
  if (mod.partitioned_params) {
    slot.full.reset();
    if (slot.pinned) {
      homes_.unpin_partition(m);
      pinned_bytes_ -= mod.part * shape_.esize();
    }
    slot.pinned = nullptr;
    live_elems_ -= mod.padded;
  }
  return Status::ok();
}

void ParamGather::end_recording() {
  if (!recording_) return;
  recording_ = false;
  cursor_ = 0;
  homes_.end_trace();
}

void ParamGather::shutdown() {
  for (ModuleId m : modules_.ids()) {
    Slot& s = slots_[m.index];
    if (s.pending) (void)s.handle.wait();
    s.full.reset();
    s.send.reset();
    if (s.pinned) homes_.unpin_partition(m);
    s.pinned = nullptr;
  }
  pinned_bytes_ = 0;
}

}  // namespace zoe::zero
