// Engine, parameters: fetch/release of a module's compute parameters, and at stage 3 the
// gathers of partitions from their tier, queued ahead of use in the recorded fetch order.
//
// Contract: fetch(m) returns module m's full parameters on the device, valid until release(m).
// Stage 3: the first iteration records the fetch order; afterwards each fetch queues the
// gathers of the next modules (within the gather window and stage3_max_live_parameters) and
// moves partitions further ahead towards the device (stage3_prefetch_bucket_size). Every rank
// queues the same gathers in the same order, so the collectives line up. Device memory of a
// fetch is owned by DeviceBuffers: an error at any point gives it back.
#include <algorithm>

#include "zero/engine_impl.h"

namespace zoe {

using config::OffloadDevice;
using offload::Tier;
using zero::Timer;
using zero::to_comm;

void Engine::Impl::owned_range(const Module& mod, size_t* begin, size_t* n) const {
  if (stage == 0) {
    *begin = 0;
    *n = mod.padded;
  } else {
    *begin = static_cast<size_t>(rank) * mod.part;
    *n = mod.part;
  }
}

Result<void*> Engine::Impl::owned_compute(size_t m, double* t_io_acc) {
  Module& mod = modules[m];
  if (!mod.partitioned_params) return mod.full.bytes_ptr() + mod.opt_begin * esize();
  Tier t = param_off == OffloadDevice::kNone ? Tier::kDevice : Tier::kHost;
  uint64_t t0 = now_ns();
  auto p = tm->fetch(m, t).wait();
  *t_io_acc += static_cast<double>(now_ns() - t0) * 1e-9;
  return p;
}

bool Engine::Impl::owned_on_device(size_t m) const {
  return !modules[m].partitioned_params || param_off == OffloadDevice::kNone;
}

Status Engine::Impl::unpin_owned(size_t m, double* t_io_acc) {
  Module& mod = modules[m];
  if (!mod.partitioned_params) return Status::ok();
  Tier t = param_off == OffloadDevice::kNone ? Tier::kDevice : Tier::kHost;
  tm->unpin(m, t, /*dirty=*/true);
  if (param_off != OffloadDevice::kNvme) return Status::ok();
  // Write back the host copy and keep it, clean: the next fetch into the device copies from it
  // instead of reading NVMe, as long as the tier's host budget (offload_param.max_in_cpu) keeps
  // it; that budget also bounds what the write-backs in flight hold. (A failed write-back keeps
  // its dirty copy; the tier manager's drain() at the end of the step reports it.)
  if (writebacks.size() >= kMaxWritebacks) {
    uint64_t t0 = now_ns();
    (void)writebacks.front().wait();
    writebacks.pop_front();
    *t_io_acc += static_cast<double>(now_ns() - t0) * 1e-9;
  }
  writebacks.push_back(tm->clean(m, Tier::kHost));
  return Status::ok();
}

Status Engine::Impl::gather_updated(size_t m) {
  Module& mod = modules[m];
  Timer t(&t_comm);
  ZOE_ASSIGN_OR_RETURN(device::DeviceBuffer tmp, dalloc(mod.part * esize()));
  Status gs = ops->copy(tmp.get(), mod.full.bytes_ptr() + mod.opt_begin * esize(), mod.part * esize());
  if (gs.is_ok()) gs = ops->synchronize();  // the gather reads tmp on the communicator's stream
  if (gs.is_ok()) gs = dcomm->all_gather(tmp.get(), mod.full.get(), mod.part, to_comm(cdt)).wait();
  return gs.is_ok() ? gs : gs.with_context("gathering the updated parameters of module " + mod.name);
}

// Queues the gather of module m's parameters ahead of its fetch: device buffers for the
// gathered module and a copy of this rank's partition; on the communicator's stream, a host
// task reads the partition's latest bytes into that copy (from whichever tier holds them),
// then the all-gather runs. Every rank queues the same gathers in the same order (the decisions
// depend only on the recorded fetch order and the config), so the collectives line up.
Status Engine::Impl::start_gather(size_t m) {
  Module& mod = modules[m];
  const size_t es = esize();
  ZOE_ASSIGN_OR_RETURN(device::DeviceBuffer full, dalloc(mod.padded * es));
  ZOE_ASSIGN_OR_RETURN(device::DeviceBuffer send, dalloc(mod.part * es));
  mod.full = std::move(full);
  mod.gather_send = std::move(send);
  mod.gather_error = Status::ok();
  // (Only on host-memory devices with a host communicator: gather_window is 0 otherwise.)
  dcomm->enqueue_host_task([this, m]() -> Status {
    Module& md = modules[m];
    // The partition must be updated first (an overlapped step may still be writing it). This
    // waits on the communicator's thread, not the caller's, so the decision to queue the gather
    // stays the same on every rank whatever each rank's update speed; the update's thread never
    // needs the communicator, so the wait always ends.
    Status s = wait_module_updated(m);
    // A read, not a pinning fetch: a pin held here could wait for room in the device tier
    // while the caller holds that room for a gather queued behind this task.
    if (s.is_ok()) s = tm->read(m, md.gather_send.get());
    // The gather after this task runs anyway, so this rank stays in step with the others;
    // fetch() reports the error.
    if (!s.is_ok()) md.gather_error = s.with_context("reading the partition of module " + md.name);
    return Status::ok();
  });
  mod.gather_begin_ns = now_ns();
  mod.gather = dcomm->all_gather(mod.gather_send.get(), mod.full.get(), mod.part, to_comm(cdt));
  mod.gather_pending = true;
  live_elems += mod.padded;
  return Status::ok();
}

// Waits for module m's queued gather; its parameters are then in mod.full.
Status Engine::Impl::finish_gather(size_t m) {
  Module& mod = modules[m];
  Status s;
  {
    Timer t(&t_comm);
    s = mod.gather.wait();
  }
  if (trace.enabled()) {
    trace.record("gather " + mod.name + " (queued)", "gather", mod.gather_begin_ns, now_ns(),
                 mod.padded * esize(), kLaneGather);
  }
  mod.gather_send.reset();
  mod.gather_pending = false;
  mod.gather = comm::CommHandle();
  if (s.is_ok()) s = mod.gather_error;
  return s.is_ok() ? s : s.with_context("gathering the parameters of module " + mod.name);
}

// Drops every queued gather (the fetch order changed, or the parameters are about to).
Status Engine::Impl::discard_gathers() {
  Status first;
  for (size_t m = 0; m < modules.size(); ++m) {
    Module& mod = modules[m];
    if (!mod.gather_pending) continue;
    Status s = finish_gather(m);
    if (first.is_ok()) first = s;
    mod.full.reset();
    live_elems -= mod.padded;
  }
  return first;
}

// At fetch(m) after the first iteration: the recorded order predicts m. When it does not (an
// evaluation pass, a changed loop), move the cursor to m's next occurrence and drop the
// gathers queued for the old prediction.
Status Engine::Impl::follow_order(size_t m) {
  if (recording || order.empty() || order[cursor] == m) return Status::ok();
  for (size_t k = 1; k < order.size(); ++k) {
    size_t at = (cursor + k) % order.size();
    if (order[at] == m) {
      cursor = at;
      break;
    }
  }
  return discard_gathers();
}

Status Engine::Impl::prefetch_after(size_t m) {
  if (recording || order.empty() || !tm) return Status::ok();
  // 1. Gathers of the next partitioned modules in the recorded order, within the gather window
  //    and stage3_max_live_parameters; never past the end of the order (the step changes the
  //    parameters).
  size_t queued = 0;
  for (const auto& md : modules) queued += md.gather_pending ? md.padded : 0;
  const int64_t cap = cfg->zero.stage3_max_live_parameters;
  for (size_t k = cursor + 1; k < order.size(); ++k) {
    const size_t next = order[k];
    const Module& nm = modules[next];
    if (!nm.partitioned_params || nm.full) continue;  // persistent, fetched, or queued
    if (queued + nm.padded > gather_window || static_cast<int64_t>(live_elems + nm.padded) > cap) break;
    Status s = start_gather(next);
    if (!s.is_ok()) {
      // The window was sized to fit the budget; reductions still holding buffers are the only
      // other users. A rank that skipped a gather the others run would fall out of step, so
      // there is no skipping: wait for them, retry, else fail.
      ZOE_RETURN_IF_ERROR(complete_pending(true));
      s = start_gather(next);
      if (!s.is_ok()) {
        return s.with_context(
            "prefetching the parameters of module " + nm.name +
            " (lower zero_optimization.stage3_prefetch_bucket_size or raise zoe.device_budget)");
      }
    }
    queued += nm.padded;
  }
  // 2. Partitions further ahead move towards the device, up to the prefetch bucket size; not
  //    past the order's end either (the step rewrites every partition).
  int64_t budget = cfg->zero.stage3_prefetch_bucket_size;
  for (size_t k = cursor + 1; k < order.size() && budget > 0; ++k) {
    size_t next = order[k];
    if (next == m) continue;
    const Module& nm = modules[next];
    if (!nm.partitioned_params || nm.full) continue;
    if (!update_done(next)) continue;  // a local decision: partition moves are not collective
    tm->prefetch(next, Tier::kDevice);
    budget -= static_cast<int64_t>(nm.part);
  }
  return Status::ok();
}

Result<ModuleParams> Engine::fetch(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.t_engine);
  if (!I.initialized) return invalid_argument("fetch() before initialize()");
  if (m >= I.modules.size())
    return invalid_argument("fetch(%zu): there are %zu modules", m, I.modules.size());
  Impl::Module& mod = I.modules[m];
  // Behind an overlapped step: this module's update first (only this one's).
  {
    Timer t(&I.t_opt);
    ZOE_RETURN_IF_ERROR(I.wait_module_updated(m));
  }
  if (!I.gather_owed.empty() && I.gather_owed[m]) {
    I.gather_owed[m] = 0;
    ZOE_RETURN_IF_ERROR(I.gather_updated(m));
  }
  if (I.recording) I.order.push_back(m);
  ZOE_RETURN_IF_ERROR(I.follow_order(m));
  if (mod.partitioned_params && !mod.fetched && mod.gather_pending) {
    // Prefetched: the gather was queued when an earlier module was fetched.
    Status s = I.finish_gather(m);
    if (!s.is_ok()) {
      mod.full.reset();
      I.live_elems -= mod.padded;
      return s;
    }
    I.gathers_prefetched++;
    ZOE_RETURN_IF_ERROR(I.prefetch_after(m));
  } else if (mod.partitioned_params && !mod.fetched) {
    int64_t cap = I.cfg->zero.stage3_max_live_parameters;
    if (static_cast<int64_t>(I.live_elems + mod.padded) > cap) ZOE_RETURN_IF_ERROR(I.discard_gathers());
    if (static_cast<int64_t>(I.live_elems + mod.padded) > cap) {
      return invalid_argument(
          "fetching module %s would gather %zu parameters, above stage3_max_live_parameters %lld: "
          "release modules before fetching more",
          mod.name.c_str(), I.live_elems + mod.padded, static_cast<long long>(cap));
    }
    void* part;
    {
      Timer t(&I.t_io);
      ZOE_ASSIGN_OR_RETURN(part, I.tm->fetch(m, Tier::kDevice).wait());
    }
    // From here the partition is pinned: every path below unpins it.
    auto full = I.dalloc(mod.padded * I.esize());
    if (!full.is_ok()) {
      I.tm->unpin(m, Tier::kDevice);
      return full.status().with_context("gathering the parameters of module " + mod.name);
    }
    {
      Timer t(&I.t_comm);
      const uint64_t g0 = now_ns();
      Status s = I.dcomm->all_gather(part, full.value().get(), mod.part, to_comm(I.cdt)).wait();
      if (I.trace.enabled()) {
        I.trace.record("gather " + mod.name, "gather", g0, now_ns(), mod.padded * I.esize(), kLaneGather);
      }
      I.tm->unpin(m, Tier::kDevice);
      if (!s.is_ok()) return s.with_context("gathering the parameters of module " + mod.name);
    }
    mod.full = std::move(full).value();
    I.live_elems += mod.padded;
    I.gathers_on_demand++;
    ZOE_RETURN_IF_ERROR(I.prefetch_after(m));
  }
  if (!I.recording && !I.order.empty()) I.cursor = (I.cursor + 1) % I.order.size();
  mod.fetched = true;
  return I.views(mod, mod.full.get());
}

Status Engine::release(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.t_engine);
  if (m >= I.modules.size())
    return invalid_argument("release(%zu): there are %zu modules", m, I.modules.size());
  Impl::Module& mod = I.modules[m];
  if (!mod.fetched) return invalid_argument("release(%s) of a module that is not fetched", mod.name.c_str());
  mod.fetched = false;
  if (mod.partitioned_params) {
    mod.full.reset();
    I.live_elems -= mod.padded;
  }
  return Status::ok();
}

}  // namespace zoe
