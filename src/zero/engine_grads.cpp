// Engine, gradients: the per-micro-batch gradient buffer of a module, its reduction over the
// ranks (reduce-scatter at stage 2/3, all-reduce at 0/1, in reduce_bucket_size buckets), and the
// accumulation of this rank's range into the fp32 accumulator wherever it lives, computing the
// norm of the sum in the same pass.
//
// Contract: grads(m) gives a zeroed device buffer valid until reduce_grads(m); reduce_grads(m)
// takes it over and returns at once (the reduction runs on the communicator's stream); the
// reduction's buffers are DeviceBuffers owned by its Pending entry until it has been
// accumulated (at the latest in step()), so no error path leaks them.
#include <algorithm>

#include "zero/engine_impl.h"

namespace zoe {

using config::OffloadDevice;
using zero::Timer;
using zero::to_comm;

// Host-readable view of `bytes` of device memory: the memory itself on the CPU device, else a
// copy in host_stage (valid until the next call).
Result<const void*> Engine::Impl::host_view(const void* dsrc, size_t bytes) {
  if (ops->host_addressable()) return dsrc;
  host_stage.resize(bytes);
  ZOE_RETURN_IF_ERROR(ops->to_host(host_stage.data(), dsrc, bytes));
  ZOE_RETURN_IF_ERROR(ops->synchronize());
  return static_cast<const void*>(host_stage.data());
}

Status Engine::Impl::complete_pending(bool all, size_t keep) {
  while (pending.size() > keep) {
    Pending& p = pending.front();
    if (!all && !p.h.ready()) break;
    Status s;
    {
      Timer t(&t_comm);
      s = p.h.wait();
    }
    const size_t m = p.m;
    if (s.is_ok()) s = accumulate_grads(m, p.recv.bytes_ptr() + p.recv_offset * esize());
    pending.pop_front();  // its buffers go back to the device either way
    if (!s.is_ok())
      return s.with_context("reducing and accumulating the gradients of module " + modules[m].name);
  }
  return Status::ok();
}

// Adds this micro-batch's reduced gradients of the owned range (compute dtype) to module m's
// accumulator wherever it lives, computing the norm of the sum in the same pass. NVMe: one
// swapper chunk at a time (read the sum so far unless this is the first micro-batch, add,
// write back asynchronously through the swapper's slots), so host memory stays bounded whatever
// the model size.
Status Engine::Impl::accumulate_grads(size_t m, const void* src) {
  // The overlapped update reads the accumulators (and owns the swapper) until it ends. Joining
  // it runs no collective: this point's timing differs across ranks.
  ZOE_RETURN_IF_ERROR(join_update());
  Module& mod = modules[m];
  optim::Exec exec;
  exec.pool = pool.get();
  const bool first = mod.acc_count == 0;
  mod.norm_parts.resize(optim::norm_chunks(mod.opt_n));
  if (mod.opt_home == OffloadDevice::kNone) {
    // The accumulator lives on the device too: the device's kernel.
    // Synchronized here: src (the reduction's buffer) is freed once this returns, and the
    // overlapped update reads the accumulator on its own thread's ops.
    ZOE_RETURN_IF_ERROR(
        ops->accumulate_with_norm(mod.grad_acc, src, cdt, mod.opt_n, first, mod.norm_parts.data()));
    ZOE_RETURN_IF_ERROR(ops->synchronize());
  } else if (mod.opt_home == OffloadDevice::kCpu) {
    unspeculate(m);  // one more micro-batch than the step has: the speculation assumed the sums final
    ZOE_ASSIGN_OR_RETURN(const void* h, host_view(src, mod.opt_n * esize()));
    ZOE_RETURN_IF_ERROR(
        optim::accumulate_with_norm(mod.grad_acc, h, cdt, mod.opt_n, first, mod.norm_parts.data(), exec));
    // zoe.speculative_step: the step's last micro-batch, so these sums are final.
    if (mod.spec_save && mod.acc_count + 1 >= std::max<int64_t>(1, cfg->gradient_accumulation_steps))
      ZOE_RETURN_IF_ERROR(speculate(m));
  } else {
    Timer t(&t_io);
    const size_t chunk = swapper->chunk_elems();
    ZOE_CHECK(chunk % optim::kChunkElems == 0);
    grad_stage.resize(chunk);
    // The step's last micro-batch: the sums are final. The swapper starts reading the next
    // update's first chunks now (their master and moments do not depend on this backward),
    // keeping one slot for the transfers below, and those chunks' sums go straight into its
    // slots instead of a round trip through NVMe.
    const bool last = mod.acc_count + 1 >= std::max<int64_t>(1, cfg->gradient_accumulation_steps);
    if (last && !preload_started) {
      preload_started = true;
      swapper->preload(swapper->slots() - 1);
    }
    for (size_t b = 0; b < mod.opt_n; b += chunk) {
      const size_t n = std::min(chunk, mod.opt_n - b);
      if (!first) ZOE_RETURN_IF_ERROR(swapper->read_state(m, kGradState, grad_stage.data(), b, n));
      ZOE_ASSIGN_OR_RETURN(const void* h,
                           host_view(static_cast<const char*>(src) + b * esize(), n * esize()));
      ZOE_RETURN_IF_ERROR(optim::accumulate_with_norm(grad_stage.data(), h, cdt, n, first,
                                                      mod.norm_parts.data() + b / optim::kChunkElems, exec));
      if (last && swapper->fill_preloaded(m, b, kGradState, grad_stage.data(), n)) continue;
      // Written behind the backward (the swapper copies the chunk; at most its two write buffers in flight):
      // the next read of a sum and the step wait for these writes and report their errors.
      ZOE_RETURN_IF_ERROR(swapper->write_state_async(m, kGradState, grad_stage.data(), b, n));
    }
  }
  mod.acc_count++;
  return Status::ok();
}

// A module no micro-batch reduced gradients for this step: zero gradients, zero norm.
Status Engine::Impl::zero_grads(size_t m) {
  Module& mod = modules[m];
  mod.norm_parts.assign(optim::norm_chunks(mod.opt_n), 0.0);
  if (mod.opt_home == OffloadDevice::kNone) {
    ZOE_RETURN_IF_ERROR(ops->zero(mod.grad_acc, mod.opt_n * 4));
    return ops->synchronize();  // the update may run on another thread's ops
  }
  if (mod.opt_home == OffloadDevice::kCpu) {
    memset(mod.grad_acc, 0, mod.opt_n * 4);
    return Status::ok();
  }
  const size_t chunk = swapper->chunk_elems();
  grad_stage.assign(chunk, 0.0f);
  for (size_t b = 0; b < mod.opt_n; b += chunk) {
    ZOE_RETURN_IF_ERROR(
        swapper->write_state(m, kGradState, grad_stage.data(), b, std::min(chunk, mod.opt_n - b)));
  }
  return Status::ok();
}

Result<ModuleParams> Engine::grads(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.t_engine);
  if (!I.initialized) return invalid_argument("grads() before initialize()");
  if (m >= I.modules.size())
    return invalid_argument("grads(%zu): there are %zu modules", m, I.modules.size());
  Impl::Module& mod = I.modules[m];
  if (!mod.grad_buf) {
    ZOE_ASSIGN_OR_RETURN(mod.grad_buf, I.dalloc(mod.padded * I.esize()));
  }
  return I.views(mod, mod.grad_buf.get());
}

Status Engine::reduce_grads(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.t_engine);
  if (m >= I.modules.size())
    return invalid_argument("reduce_grads(%zu): there are %zu modules", m, I.modules.size());
  Impl::Module& mod = I.modules[m];
  if (!mod.grad_buf) return invalid_argument("reduce_grads(%s) without grads()", mod.name.c_str());
  // Reductions that finished are accumulated; at most kMaxPendingReductions stay in flight (the
  // oldest is waited for), so their buffers take a bounded share of the device.
  ZOE_RETURN_IF_ERROR(I.complete_pending(false));
  ZOE_RETURN_IF_ERROR(I.complete_pending(true, zero::kMaxPendingReductions - 1));
  Impl::Pending p;
  p.m = m;
  const comm::CommType ct = to_comm(I.cdt);
  const size_t es = I.esize();
  // Buckets of at most reduce_bucket_size elements; the communicator runs them in order, so the
  // last handle completes after all of them.
  const size_t bucket = static_cast<size_t>(std::max<int64_t>(I.world, I.cfg->zero.reduce_bucket_size));
  if (I.stage >= 2) {
    ZOE_ASSIGN_OR_RETURN(p.recv, I.dalloc(mod.part * es));
    p.recv_offset = 0;
    const size_t per_rank = std::max<size_t>(1, bucket / static_cast<size_t>(I.world));
    if (per_rank >= mod.part) {
      p.send = std::move(mod.grad_buf);
      p.h = I.dcomm->reduce_scatter(p.send.get(), p.recv.get(), mod.part, ct, comm::ReduceOp::kSum);
    } else {
      // A bucket holds the same slice of every rank's part: pack each bucket rank-major. The
      // packed copy replaces the gradient buffer only once it is complete.
      ZOE_ASSIGN_OR_RETURN(device::DeviceBuffer packed, I.dalloc(mod.padded * es));
      const char* src = mod.grad_buf.bytes_ptr();
      char* dst = packed.bytes_ptr();
      for (size_t b = 0; b < mod.part; b += per_rank) {
        const size_t n = std::min(per_rank, mod.part - b);
        char* pack = dst + b * es * static_cast<size_t>(I.world);
        for (int r = 0; r < I.world; ++r) {
          ZOE_RETURN_IF_ERROR(I.ops->copy(pack + static_cast<size_t>(r) * n * es,
                                          src + (static_cast<size_t>(r) * mod.part + b) * es, n * es));
        }
      }
      // The collectives read the packed copy on the communicator's stream; the gradient buffer
      // is freed next.
      ZOE_RETURN_IF_ERROR(I.ops->synchronize());
      mod.grad_buf.reset();
      p.send = std::move(packed);
      for (size_t b = 0; b < mod.part; b += per_rank) {
        const size_t n = std::min(per_rank, mod.part - b);
        p.h = I.dcomm->reduce_scatter(p.send.bytes_ptr() + b * es * static_cast<size_t>(I.world),
                                      p.recv.bytes_ptr() + b * es, n, ct, comm::ReduceOp::kSum);
      }
    }
  } else {
    ZOE_ASSIGN_OR_RETURN(p.recv, I.dalloc(mod.padded * es));
    p.recv_offset = mod.opt_begin;
    p.send = std::move(mod.grad_buf);
    for (size_t b = 0; b < mod.padded; b += bucket) {
      const size_t n = std::min(bucket, mod.padded - b);
      p.h = I.dcomm->all_reduce(p.send.bytes_ptr() + b * es, p.recv.bytes_ptr() + b * es, n, ct,
                                comm::ReduceOp::kSum);
    }
  }
  // The reduction runs on the communicator's stream while the caller computes the next module;
  // its buffers are given back when it is accumulated (at the latest in step()).
  I.pending.push_back(std::move(p));
  return Status::ok();
}

}  // namespace zoe
