// Parameter homes: see param_homes.h.
#include "zero/param_homes.h"

namespace zoe::zero {

using config::OffloadDevice;
using offload::Tier;

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
  const size_t es = ctx_.esize();
  if (full_.size() < modules_.size()) full_.resize(modules_.size());
  if (!mod.partitioned_params) {
    ZOE_ASSIGN_OR_RETURN(full_[m.index], ctx_.dalloc(mod.padded * es));
    return ctx_.ops->to_device(full_[m.index].get(), cbuf, mod.padded * es);
  }
  const Home h = ctx_.placement.modules[m.index].param_home;
  const Tier home = h == Home::kDevice ? Tier::kDevice : h == Home::kHost ? Tier::kHost : Tier::kNvme;
  ZOE_RETURN_IF_ERROR_CTX(ctx_.tm->add_item(tier_item(m), mod.part * es, home),
                          "placing the parameters of module " + mod.name);
  return ctx_.tm->write(tier_item(m), cbuf + static_cast<size_t>(ctx_.rank) * mod.part * es);
}

Result<void*> ParamHomes::owned_compute(ModuleId m, double* t_io) {
  const ModuleLayout& mod = modules_[m];
  if (!mod.partitioned_params) return full_[m.index].bytes_ptr() + mod.opt_begin * ctx_.esize();
  const uint64_t t0 = now_ns();
  auto p = ctx_.tm->fetch(tier_item(m), ctx_.update_tier()).wait();
  *t_io += static_cast<double>(now_ns() - t0) * 1e-9;
  return p;
}

bool ParamHomes::owned_on_device(ModuleId m) const {
  return !modules_[m].partitioned_params || ctx_.param_off == OffloadDevice::kNone;
}

void ParamHomes::release_owned(ModuleId m, double* t_io, WritebackQueue* wb) {
  if (!modules_[m].partitioned_params) return;
  ctx_.tm->unpin(tier_item(m), ctx_.update_tier(), /*dirty=*/true);
  if (ctx_.param_off != OffloadDevice::kNvme) return;
  // Write back the host copy and keep it, clean: the next fetch into the device copies from it
  // instead of reading NVMe, as long as the tier's host budget (offload_param.max_in_cpu) keeps
  // it; that budget also bounds what the write-backs in flight hold. (A failed write-back keeps
  // its dirty copy; the tier manager's drain() at the end of the step reports it.)
  wb->push(ctx_.tm->clean(tier_item(m), Tier::kHost), t_io);
}

Status ParamHomes::gather_updated(ModuleId m) {
  const ModuleLayout& mod = modules_[m];
  const size_t es = ctx_.esize();
  Timer t(&clock_.t_comm);
  device::DeviceBuffer& full = full_[m.index];
  ZOE_ASSIGN_OR_RETURN(device::DeviceBuffer tmp, ctx_.dalloc(mod.part * es));
  Status gs = ctx_.ops->copy(tmp.get(), full.bytes_ptr() + mod.opt_begin * es, mod.part * es);
  if (gs.is_ok()) gs = ctx_.ops->synchronize();  // the gather reads tmp on the communicator's stream
  if (gs.is_ok()) gs = ctx_.dcomm->all_gather(tmp.get(), full.get(), mod.part, to_comm(ctx_.cdt)).wait();
  return gs.is_ok() ? gs : gs.with_context("gathering the updated parameters of module " + mod.name);
}

void ParamHomes::owe_gathers() {
  gather_owed_.assign(modules_.size(), 0);
  for (ModuleId m : modules_.ids()) {
    if (ctx_.stage >= 1 && !modules_[m].partitioned_params && !modules_[m].frozen) gather_owed_[m.index] = 1;
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

Status ParamHomes::read_owned_f32(ModuleId m, float* out) {
  const ModuleLayout& mod = modules_[m];
  const size_t es = ctx_.esize();
  std::vector<char> cbuf(mod.opt_n * es);
  if (mod.partitioned_params) {
    ZOE_RETURN_IF_ERROR(ctx_.tm->read(tier_item(m), cbuf.data(), 0, cbuf.size()));
  } else {
    ZOE_RETURN_IF_ERROR(ctx_.ops->put(cbuf.data(), false, full_[m.index].bytes_ptr() + mod.opt_begin * es,
                                      true, cbuf.size()));
    ZOE_RETURN_IF_ERROR(ctx_.ops->synchronize());
  }
  for (size_t i = 0; i < mod.opt_n; ++i) {
    const uint16_t h = ctx_.cdt == DType::kF32 ? 0 : reinterpret_cast<const uint16_t*>(cbuf.data())[i];
    out[i] = ctx_.cdt == DType::kF32    ? reinterpret_cast<const float*>(cbuf.data())[i]
             : ctx_.cdt == DType::kBF16 ? bf16_to_f32(h)
                                        : f16_to_f32(h);
  }
  return Status::ok();
}

void ParamHomes::free_device_memory() {
  for (auto& b : full_) b.reset();
}

}  // namespace zoe::zero
