// Gradient reduction: see grad_reducer.h.
#include "zero/grad_reducer.h"

#include "config/value_used.h"
#include "core/log.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zoe::zero {

using config::OffloadDevice;

void GradReducer::resize(size_t n) {
  // Buckets of reduce_bucket_size elements as the planner resolved it (at least one per rank,
  // within the device budget).
  bucket_ = std::max<size_t>(1, ctx_.placement.reduce_bucket);
  grad_buf_.resize(n);
  acc_count_.assign(n, 0);
  got_grad_.assign(n, {});
  norm_parts_.resize(n);
}

// Host-readable view of `bytes` of device memory: the memory itself on the CPU device, else a
// copy in host_stage_ (valid until the next call).
Result<const void*> GradReducer::host_view(const void* dsrc, size_t bytes) {
  if (ctx_.ops->host_addressable()) return dsrc;
  host_stage_.resize(bytes);
  ZOE_RETURN_IF_ERROR(ctx_.ops->to_host(host_stage_.data(), dsrc, bytes));
  ZOE_RETURN_IF_ERROR(ctx_.ops->synchronize());
  return static_cast<const void*>(host_stage_.data());
}

Status GradReducer::complete(bool all, size_t keep) {
  while (pending_.size() > keep) {
    Pending& p = pending_.front();
    if (!all && !p.h.ready()) break;
    Status s;
    {
      Timer t(&clock_.t_comm);
      s = p.h.wait();
    }
    const ModuleId m = p.m;
    if (s.is_ok()) s = accumulate(m, p.grads.bytes_ptr() + p.offset * ctx_.esize());
    pending_.pop_front();  // its buffers go back to the device either way
    if (!s.is_ok())
      return s.with_context("reducing and accumulating the gradients of module " + modules_[m].name);
  }
  return Status::ok();
}

bool GradReducer::last_micro_batch(ModuleId m) const {
  return acc_count_[m.index] + 1 >= std::max<int64_t>(1, ctx_.cfg->gradient_accumulation_steps);
}

// Adds this micro-batch's reduced gradients of the owned range (compute dtype) to module m's
// accumulator wherever it lives, computing the norm of the sum in the same pass.
Status GradReducer::accumulate(ModuleId m, const void* src) {
  // The overlapped update reads the accumulators (and owns the swapper) until it ends. Joining
  // it runs no collective: this point's timing differs across ranks.
  ZOE_RETURN_IF_ERROR(update_.join());
  const ModuleLayout& mod = modules_[m];
  OptimStates& st = update_.states(m);
  optim::Exec exec;
  exec.pool = ctx_.pool.get();
  const bool first = acc_count_[m.index] == 0;
  std::vector<double>& norm = norm_parts_[m.index];
  norm.resize(optim::norm_chunks(mod.opt_n));
  if (mod.opt_home == OffloadDevice::kNone) {
    // The accumulator lives on the device too: the device's kernel.
    // Synchronized here: src (the reduction's buffer) is freed once this returns, and the
    // overlapped update reads the accumulator on its own thread's ops.
    ZOE_RETURN_IF_ERROR(
        ctx_.ops->accumulate_with_norm(st.grad_acc, src, ctx_.cdt, mod.opt_n, first, norm.data()));
    ZOE_RETURN_IF_ERROR(ctx_.ops->synchronize());
  } else if (mod.opt_home == OffloadDevice::kCpu) {
    update_.unspeculate(m);  // one more micro-batch than the step has: the speculation assumed the sums final
    ZOE_ASSIGN_OR_RETURN(const void* h, host_view(src, mod.opt_n * ctx_.esize()));
    ZOE_RETURN_IF_ERROR(
        optim::accumulate_with_norm(st.grad_acc, h, ctx_.cdt, mod.opt_n, first, norm.data(), exec));
    // zoe.speculative_step: the step's last micro-batch, so these sums are final.
    if (st.spec_save && last_micro_batch(m)) ZOE_RETURN_IF_ERROR(update_.speculate(m, untouched(m)));
  } else {
    ZOE_RETURN_IF_ERROR(accumulate_nvme(m, src, first, exec));
  }
  acc_count_[m.index]++;
  return Status::ok();
}

// NVMe: one swapper chunk at a time (read the sum so far unless this is the first micro-batch,
// add, write back asynchronously through the swapper's slots), so host memory stays bounded
// whatever the model size.
Status GradReducer::accumulate_nvme(ModuleId m, const void* src, bool first, const optim::Exec& exec) {
  const ModuleLayout& mod = modules_[m];
  offload::OptimizerSwapper& sw = *ctx_.swapper;
  const size_t es = ctx_.esize();
  Timer t(&clock_.t_io);
  const size_t chunk = sw.chunk_elems();
  ZOE_CHECK(chunk % optim::kChunkElems == 0);
  grad_stage_.resize(chunk);
  // The step's last micro-batch: the sums are final. The swapper starts reading the next
  // update's first chunks now (their master and moments do not depend on this backward),
  // keeping one slot for the transfers below, and those chunks' sums go straight into its
  // slots instead of a round trip through NVMe.
  const bool last = last_micro_batch(m);
  if (last && !preload_started_) {
    preload_started_ = true;
    sw.preload(sw.slots() - 1);
  }
  double* norm = norm_parts_[m.index].data();
  for (size_t b = 0; b < mod.opt_n; b += chunk) {
    const size_t n = std::min(chunk, mod.opt_n - b);
    if (!first) ZOE_RETURN_IF_ERROR(sw.read_state(swap_group(m), kGradState, grad_stage_.data(), b, n));
    ZOE_ASSIGN_OR_RETURN(const void* h, host_view(static_cast<const char*>(src) + b * es, n * es));
    ZOE_RETURN_IF_ERROR(optim::accumulate_with_norm(grad_stage_.data(), h, ctx_.cdt, n, first,
                                                    norm + b / optim::kChunkElems, exec));
    if (last && sw.fill_preloaded(swap_group(m), b, kGradState, grad_stage_.data(), n)) continue;
    // Written behind the backward (the swapper copies the chunk; at most its write buffers in flight):
    // the next read of a sum and the step wait for these writes and report their errors.
    ZOE_RETURN_IF_ERROR(sw.write_state_async(swap_group(m), kGradState, grad_stage_.data(), b, n));
  }
  return Status::ok();
}

// A module no micro-batch reduced gradients for this step: zero gradients, zero norm.
Status GradReducer::zero_grads(ModuleId m) {
  const ModuleLayout& mod = modules_[m];
  norm_parts_[m.index].assign(optim::norm_chunks(mod.opt_n), 0.0);
  OptimStates& st = update_.states(m);
  if (mod.opt_home == OffloadDevice::kNone) {
    ZOE_RETURN_IF_ERROR(ctx_.ops->zero(st.grad_acc, mod.opt_n * 4));
    return ctx_.ops->synchronize();  // the update may run on another thread's ops
  }
  if (mod.opt_home == OffloadDevice::kCpu) {
    memset(st.grad_acc, 0, mod.opt_n * 4);
    return Status::ok();
  }
  const size_t chunk = ctx_.swapper->chunk_elems();
  grad_stage_.assign(chunk, 0.0f);
  for (size_t b = 0; b < mod.opt_n; b += chunk) {
    ZOE_RETURN_IF_ERROR(ctx_.swapper->write_state(swap_group(m), kGradState, grad_stage_.data(), b,
                                                  std::min(chunk, mod.opt_n - b)));
  }
  return Status::ok();
}

Result<optim::NormResult> GradReducer::local_norm() {
  optim::NormResult local;
  for (ModuleId m : modules_.ids()) {
    if (modules_[m].frozen) continue;  // no gradients: not part of the norm
    if (acc_count_[m.index] == 0)
      ZOE_RETURN_IF_ERROR_CTX(zero_grads(m), "zeroing the gradients of module " + modules_[m].name);
    double sum = 0.0;
    for (double p : norm_parts_[m.index]) sum += p;
    local.sum_sq += sum;
    local.finite = local.finite && std::isfinite(sum);
  }
  return local;
}

void GradReducer::end_step() {
  preload_started_ = false;
  std::fill(acc_count_.begin(), acc_count_.end(), 0);
  for (auto& g : got_grad_) g.clear();
  seq_hash_ = 0;
}

std::vector<uint8_t> GradReducer::untouched(ModuleId m) const {
  const std::vector<uint8_t>& got = got_grad_[m.index];
  std::vector<uint8_t> out(modules_[m].specs.size(), 1);
  for (size_t p = 0; p < got.size() && p < out.size(); ++p) out[p] = got[p] ? 0 : 1;
  return out;
}

Status GradReducer::refuse_frozen(const char* what, ModuleId m) const {
  return invalid_argument(
      "%s(%zu): module %s is frozen (registered with ModuleOptions::frozen): it has no gradients; only "
      "its parameters can be fetched",
      what, m.index, modules_[m].name.c_str());
}

Result<ModuleParams> GradReducer::grads(ModuleId m) {
  const ModuleLayout& mod = modules_[m];
  if (mod.frozen) return refuse_frozen("grads", m);
  if (!grad_buf_[m.index]) {
    // The reduction in flight is accumulated first and its buffers freed: one module's gradients
    // on the device at a time.
    ZOE_RETURN_IF_ERROR(complete(true));
    auto buf = ctx_.dalloc(mod.padded * ctx_.esize());
    if (!buf.is_ok()) return buf.status().with_context("the gradient buffer of module " + mod.name);
    grad_buf_[m.index] = std::move(buf).value();
  }
  return ctx_.views(mod, grad_buf_[m.index].get());
}

// Stage 2/3 with buckets smaller than a partition: a bucket holds the same slice of every rank's
// part, so each bucket is packed rank-major into one of the pack buffers (the other may still be
// read by the previous bucket's collective), and its sum lands in this rank's part of the gradient
// buffer, whose bytes there were packed already and which later buckets do not read.
Status GradReducer::reduce_scatter_buckets(ModuleId m, size_t per_rank, Pending* p) {
  const ModuleLayout& mod = modules_[m];
  const size_t es = ctx_.esize();
  const size_t world = static_cast<size_t>(ctx_.world);
  const size_t mine = static_cast<size_t>(ctx_.rank) * mod.part;
  char* src = p->grads.bytes_ptr();
  comm::CommHandle used[kReducePackBuffers];
  for (size_t b = 0, k = 0; b < mod.part; b += per_rank, ++k) {
    const size_t n = std::min(per_rank, mod.part - b);
    device::DeviceBuffer& pack = p->pack[k % kReducePackBuffers];
    if (!pack) {
      ZOE_ASSIGN_OR_RETURN(pack, ctx_.dalloc(per_rank * world * es));
    }
    ZOE_RETURN_IF_ERROR(used[k % kReducePackBuffers].wait());
    for (size_t r = 0; r < world; ++r) {
      ZOE_RETURN_IF_ERROR(
          ctx_.ops->copy(pack.bytes_ptr() + r * n * es, src + (r * mod.part + b) * es, n * es));
    }
    // The collective reads the packed copy on the communicator's stream.
    ZOE_RETURN_IF_ERROR(ctx_.ops->synchronize());
    p->h = ctx_.dcomm->reduce_scatter(pack.get(), src + (mine + b) * es, n, to_comm(ctx_.cdt),
                                      comm::ReduceOp::kSum);
    used[k % kReducePackBuffers] = p->h;
  }
  return Status::ok();
}

// Queues module m's reduction, in place in its gradient buffer (p->grads), in buckets of at most
// reduce_bucket_size elements; the communicator runs them in order, so the last handle completes
// after all of them.
Status GradReducer::start_reduction(ModuleId m, Pending* p) {
  const ModuleLayout& mod = modules_[m];
  const comm::CommType ct = to_comm(ctx_.cdt);
  const size_t es = ctx_.esize();
  const size_t bucket = bucket_;
  char* g = p->grads.bytes_ptr();
  if (ctx_.stage >= 2) {
    const size_t per_rank = std::max<size_t>(1, bucket / static_cast<size_t>(ctx_.world));
    if (per_rank < mod.part) return reduce_scatter_buckets(m, per_rank, p);
    p->h = ctx_.dcomm->reduce_scatter(g, g + p->offset * es, mod.part, ct, comm::ReduceOp::kSum);
    return Status::ok();
  }
  for (size_t b = 0; b < mod.padded; b += bucket) {
    const size_t n = std::min(bucket, mod.padded - b);
    p->h = ctx_.dcomm->all_reduce(g + b * es, g + b * es, n, ct, comm::ReduceOp::kSum);
  }
  return Status::ok();
}

Status GradReducer::reduce(ModuleId m, const std::vector<uint8_t>* has_grad) {
  const ModuleLayout& mod = modules_[m];
  if (mod.frozen) return refuse_frozen("reduce_grads", m);
  if (m.index >= grad_buf_.size() || !grad_buf_[m.index])
    return invalid_argument("reduce_grads(%s) without grads()", mod.name.c_str());
  if (has_grad && has_grad->size() != mod.specs.size()) {
    return invalid_argument("reduce_grads(%s): %zu gradient flags for %zu parameters", mod.name.c_str(),
                            has_grad->size(), mod.specs.size());
  }
  seq_hash_ = seq_hash_ * 0x01000193u ^ static_cast<uint32_t>(m.index + 1);
  std::vector<uint8_t>& got = got_grad_[m.index];
  got.resize(mod.specs.size(), 0);
  for (size_t p = 0; p < got.size(); ++p) got[p] |= has_grad ? ((*has_grad)[p] ? 1 : 0) : 1;
  // Reductions that finished are accumulated; at most kMaxPendingReductions stay in flight (the
  // oldest is waited for), so their buffers take a bounded share of the device.
  ZOE_RETURN_IF_ERROR(complete(false));
  ZOE_RETURN_IF_ERROR(complete(true, kMaxPendingReductions - 1));
  Pending p;
  p.m = m;
  p.grads = std::move(grad_buf_[m.index]);
  // This rank's range: where its sum lands (stage 1-3), or all of it (stage 0, opt_begin 0).
  p.offset = mod.opt_begin;
  if (ctx_.world == 1) {
    // Nothing to reduce: the gradients are accumulated now, from their buffer.
    pending_.push_back(std::move(p));
    return complete(true);
  }
  Status s = start_reduction(m, &p);
  if (!s.is_ok()) {
    (void)p.h.wait();  // the collectives queued so far read its buffers
    return s.with_context("reducing the gradients of module " + mod.name);
  }
  // The reduction runs on the communicator's stream while the caller goes on to the next module;
  // its buffers are given back when it is accumulated (at the latest in the next grads() or step()).
  pending_.push_back(std::move(p));
  return Status::ok();
}

void GradReducer::shutdown() {
  for (auto& p : pending_) (void)p.h.wait();
  pending_.clear();
  for (auto& b : grad_buf_) b.reset();
}

}  // namespace zoe::zero
