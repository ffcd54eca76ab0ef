// Gradient reduction: see grad_reducer.h.
#include "zero/grad_reducer.h"

#include "config/value_used.h"
#include "core/log.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zoe::zero {

GradReducer::GradReducer(const RunShape& shape, const ModuleTable& modules, GradSink& sink, StepClock& clock,
                         const Resources& r)
    : shape_(shape), modules_(modules), sink_(sink), clock_(clock), r_(r) {
  // Buckets of reduce_bucket_size elements as the planner resolved it (at least one per rank,
  // within the device budget).
  r_.reduce_bucket = std::max<size_t>(1, r_.reduce_bucket);
  const size_t n = modules.size();
  grad_buf_.resize(n);
  acc_count_.assign(n, 0);
  got_grad_.assign(n, {});
  norm_parts_.resize(n);
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
    if (s.is_ok()) s = accumulate(m, p.grads.bytes_ptr() + p.offset * shape_.esize());
    pending_.pop_front();  // its buffers go back to the device either way
    if (!s.is_ok())
      return s.with_context("reducing and accumulating the gradients of module " + modules_[m].name);
  }
  return Status::ok();
}

bool GradReducer::last_micro_batch(ModuleId m) const {
  return acc_count_[m.index] + 1 >= std::max<int64_t>(1, r_.micro_batches);
}

// Hands this micro-batch's reduced gradients of the owned range (compute dtype) to the sums,
// which compute the norm of the new sums in the same pass.
Status GradReducer::accumulate(ModuleId m, const void* src) {
  const ModuleLayout& mod = modules_[m];
  std::vector<double>& norm = norm_parts_[m.index];
  norm.resize(optim::norm_chunks(mod.opt_n));
  GradBatch b;
  b.src = src;
  b.first = acc_count_[m.index] == 0;
  b.last = last_micro_batch(m);
  std::vector<uint8_t> untouched_now;
  if (b.last) {
    untouched_now = untouched(m);
    b.untouched = &untouched_now;
  }
  b.norm = norm.data();
  ZOE_RETURN_IF_ERROR(sink_.add_grads(m, b));
  acc_count_[m.index]++;
  return Status::ok();
}

Result<optim::NormResult> GradReducer::local_norm() {
  optim::NormResult local;
  for (ModuleId m : modules_.ids()) {
    if (modules_[m].frozen) continue;  // no gradients: not part of the norm
    if (acc_count_[m.index] == 0) {
      norm_parts_[m.index].assign(optim::norm_chunks(modules_[m].opt_n), 0.0);
      ZOE_RETURN_IF_ERROR_CTX(sink_.zero_grads(m), "zeroing the gradients of module " + modules_[m].name);
    }
    double sum = 0.0;
    for (double p : norm_parts_[m.index]) sum += p;
    local.sum_sq += sum;
    local.finite = local.finite && std::isfinite(sum);
  }
  return local;
}

void GradReducer::end_step() {
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
    auto buf = r_.mem->zeroed(mod.padded * shape_.esize());
    if (!buf.is_ok()) return buf.status().with_context("the gradient buffer of module " + mod.name);
    grad_buf_[m.index] = std::move(buf).value();
  }
  return r_.mem->views(mod, grad_buf_[m.index].get());
}

// Stage 2/3 with buckets smaller than a partition: a bucket holds the same slice of every rank's
// part, so each bucket is packed rank-major into one of the pack buffers (the other may still be
// read by the previous bucket's collective), and its sum lands in this rank's part of the gradient
// buffer, whose bytes there were packed already and which later buckets do not read.
Status GradReducer::reduce_scatter_buckets(ModuleId m, size_t per_rank, Pending* p) {
  const ModuleLayout& mod = modules_[m];
  const size_t es = shape_.esize();
  const size_t world = static_cast<size_t>(shape_.world);
  const size_t mine = static_cast<size_t>(shape_.rank) * mod.part;
  char* src = p->grads.bytes_ptr();
  comm::CommHandle used[kReducePackBuffers];
  for (size_t b = 0, k = 0; b < mod.part; b += per_rank, ++k) {
    const size_t n = std::min(per_rank, mod.part - b);
    device::DeviceBuffer& pack = p->pack[k % kReducePackBuffers];
    if (!pack) {
      ZOE_ASSIGN_OR_RETURN(pack, r_.mem->zeroed(per_rank * world * es));
    }
    ZOE_RETURN_IF_ERROR(used[k % kReducePackBuffers].wait());
    for (size_t r = 0; r < world; ++r) {
      ZOE_RETURN_IF_ERROR(r_.ops->copy(pack.bytes_ptr() + r * n * es, src + (r * mod.part + b) * es, n * es));
    }
    // The collective reads the packed copy on the communicator's stream.
    ZOE_RETURN_IF_ERROR(r_.ops->synchronize());
    p->h = r_.dcomm->reduce_scatter(pack.get(), src + (mine + b) * es, n, comm::to_comm(shape_.cdt),
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
  const comm::CommType ct = comm::to_comm(shape_.cdt);
  const size_t es = shape_.esize();
  const size_t bucket = r_.reduce_bucket;
  char* g = p->grads.bytes_ptr();
  if (shape_.stage >= 2) {
    const size_t per_rank = std::max<size_t>(1, bucket / static_cast<size_t>(shape_.world));
    if (per_rank < mod.part) return reduce_scatter_buckets(m, per_rank, p);
    p->h = r_.dcomm->reduce_scatter(g, g + p->offset * es, mod.part, ct, comm::ReduceOp::kSum);
    return Status::ok();
  }
  for (size_t b = 0; b < mod.padded; b += bucket) {
    const size_t n = std::min(bucket, mod.padded - b);
    p->h = r_.dcomm->all_reduce(g + b * es, g + b * es, n, ct, comm::ReduceOp::kSum);
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
  if (shape_.world == 1) {
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
