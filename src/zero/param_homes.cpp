// Parameter homes: see param_homes.h.
#include "zero/param_homes.h"

#include <cstring>

namespace zoe::zero {

using offload::Tier;

namespace {
// The tier manager's item holding module m's stage-3 partition: named here only.
offload::ItemId tier_item(ModuleId m) { return offload::ItemId(m.index); }
}  // namespace

void WritebackQueue::push(offload::MoveHandle h, double* t_io) {
  if (q_.size() >= kMax) {
    const uint64_t t0 = now_ns();
    (void)q_.front().wait();
    q_.pop_front();
    *t_io += static_cast<double>(now_ns() - t0) * 1e-9;
  }
  q_.push_back(std::move(h));
}

void WritebackQueue::wait_all() {
  for (auto& h : q_) (void)h.wait();
  q_.clear();
}

Status ParamHomes::place(ModuleId m, const char* cbuf) {
  const ModuleLayout& mod = modules_[m];
  const size_t es = shape_.esize();
  if (full_.size() < modules_.size()) full_.resize(modules_.size());
  if (!mod.partitioned_params) {
    ZOE_ASSIGN_OR_RETURN(full_[m.index], r_.mem->zeroed(mod.padded * es));
    return r_.ops->to_device(full_[m.index].get(), cbuf, mod.padded * es);
  }
  ZOE_RETURN_IF_ERROR_CTX(r_.tm->add_item(tier_item(m), mod.part * es, mod.param_home),
                          "placing the parameters of module " + mod.name);
  return r_.tm->write(tier_item(m), cbuf + static_cast<size_t>(shape_.rank) * mod.part * es);
}

Result<void*> ParamHomes::owned_compute(ModuleId m, double* t_io) {
  const ModuleLayout& mod = modules_[m];
  if (!mod.partitioned_params) return full_[m.index].bytes_ptr() + mod.opt_begin * shape_.esize();
  const uint64_t t0 = now_ns();
  auto p = r_.tm->fetch(tier_item(m), update_tier()).wait();
  *t_io += static_cast<double>(now_ns() - t0) * 1e-9;
  return p;
}

bool ParamHomes::owned_on_device(ModuleId m) const {
  return !modules_[m].partitioned_params || r_.param_offload == Tier::kDevice;
}

void ParamHomes::release_owned(ModuleId m, double* t_io, WritebackQueue* wb) {
  if (!modules_[m].partitioned_params) return;
  r_.tm->unpin(tier_item(m), update_tier(), /*dirty=*/true);
  if (r_.param_offload != Tier::kNvme) return;
  // Write back the host copy and keep it, clean: the next fetch into the device copies from it
  // instead of reading NVMe, as long as the tier's host budget (offload_param.max_in_cpu) keeps
  // it; that budget also bounds what the write-backs in flight hold. (A failed write-back keeps
  // its dirty copy; the tier manager's drain() at the end of the step reports it.)
  wb->push(r_.tm->clean(tier_item(m), Tier::kHost), t_io);
}

Status ParamHomes::gather_updated(ModuleId m) {
  const ModuleLayout& mod = modules_[m];
  const size_t es = shape_.esize();
  Timer t(&clock_.t_comm);
  device::DeviceBuffer& full = full_[m.index];
  ZOE_ASSIGN_OR_RETURN(device::DeviceBuffer tmp, r_.mem->zeroed(mod.part * es));
  Status gs = r_.ops->copy(tmp.get(), full.bytes_ptr() + mod.opt_begin * es, mod.part * es);
  if (gs.is_ok()) gs = r_.ops->synchronize();  // the gather reads tmp on the communicator's stream
  if (gs.is_ok())
    gs = r_.dcomm->all_gather(tmp.get(), full.get(), mod.part, comm::to_comm(shape_.cdt)).wait();
  return gs.is_ok() ? gs : gs.with_context("gathering the updated parameters of module " + mod.name);
}

void ParamHomes::owe_gathers() {
  gather_owed_.assign(modules_.size(), 0);
  for (ModuleId m : modules_.ids()) {
    if (shape_.stage >= 1 && !modules_[m].partitioned_params && !modules_[m].frozen)
      gather_owed_[m.index] = 1;
  }
}

Status ParamHomes::settle(ModuleId m) {
  if (gather_owed_.empty() || !gather_owed_[m.index]) return Status::ok();
  gather_owed_[m.index] = 0;
  return gather_updated(m);
}

Status ParamHomes::settle_all() {
  for (ModuleId m : modules_.ids()) ZOE_RETURN_IF_ERROR(settle(m));
  return Status::ok();
}

Status ParamHomes::read_owned(ModuleId m, size_t begin, size_t n, void* dst) {
  const ModuleLayout& mod = modules_[m];
  const size_t es = shape_.esize();
  if (mod.partitioned_params) return r_.tm->read(tier_item(m), dst, begin * es, n * es);
  const char* src = full_[m.index].bytes_ptr() + (mod.opt_begin + begin) * es;
  // Host-addressable device memory is read without the ops (an asynchronous checkpoint reads on
  // its own thread while the caller's thread uses them).
  if (r_.ops->host_addressable()) {
    memcpy(dst, src, n * es);
    return Status::ok();
  }
  ZOE_RETURN_IF_ERROR(r_.ops->put(dst, false, src, true, n * es));
  return r_.ops->synchronize();
}

Status ParamHomes::write_held(ModuleId m, size_t begin, size_t n, const void* src) {
  const ModuleLayout& mod = modules_[m];
  const size_t es = shape_.esize();
  if (mod.partitioned_params) return r_.tm->write(tier_item(m), src, begin * es, n * es);
  ZOE_RETURN_IF_ERROR(r_.ops->to_device(full_[m.index].bytes_ptr() + begin * es, src, n * es));
  return r_.ops->synchronize();  // the caller reuses src
}

Status ParamHomes::read_owned_f32(ModuleId m, float* out) {
  const ModuleLayout& mod = modules_[m];
  std::vector<char> cbuf(mod.opt_n * shape_.esize());
  ZOE_RETURN_IF_ERROR(read_owned(m, 0, mod.opt_n, cbuf.data()));
  for (size_t i = 0; i < mod.opt_n; ++i) {
    const uint16_t h = shape_.cdt == DType::kF32 ? 0 : reinterpret_cast<const uint16_t*>(cbuf.data())[i];
    out[i] = shape_.cdt == DType::kF32    ? reinterpret_cast<const float*>(cbuf.data())[i]
             : shape_.cdt == DType::kBF16 ? bf16_to_f32(h)
                                          : f16_to_f32(h);
  }
  return Status::ok();
}

Status ParamHomes::read_partition(ModuleId m, void* dst) { return r_.tm->read(tier_item(m), dst); }

Result<void*> ParamHomes::pin_partition(ModuleId m, double* t_io) {
  Timer t(t_io);
  return r_.tm->fetch(tier_item(m), Tier::kDevice).wait();
}

void ParamHomes::unpin_partition(ModuleId m) { r_.tm->unpin(tier_item(m), Tier::kDevice); }

void ParamHomes::prefetch_partition(ModuleId m) { r_.tm->prefetch(tier_item(m), Tier::kDevice); }

uint64_t ParamHomes::pins(ModuleId m) const {
  if (!r_.tm || !modules_[m].partitioned_params) return 0;
  return r_.tm->pins(tier_item(m), Tier::kDevice) + r_.tm->pins(tier_item(m), Tier::kHost);
}

void ParamHomes::begin_trace() {
  if (r_.tm) r_.tm->begin_trace();
}

void ParamHomes::end_trace() {
  if (r_.tm) r_.tm->end_trace();
}

Status ParamHomes::drain() { return r_.tm ? r_.tm->drain() : Status::ok(); }

void ParamHomes::free_device_memory() {
  for (auto& b : full_) b.reset();
}

}  // namespace zoe::zero
