// The engine's public calls of the forward and backward: fetch/release of parameters
// (ParamGather), the gradient buffer and its reduction (GradReducer), and read_master (Updater).
// Each checks its arguments, counts its time as the engine's, and hands the call to one part.
#include <cstring>
#include <memory>

#include "zero/engine_impl.h"

namespace zoe {

using zero::Timer;

Result<ModuleParams> Engine::fetch(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.clock.t_engine);
  if (!I.initialized) return invalid_argument("fetch() before initialize()");
  ZOE_RETURN_IF_ERROR(I.awake("fetch()"));
  ZOE_ASSIGN_OR_RETURN(zero::ModuleId id, I.module_id("fetch", m));
  return I.gather->fetch(id, [&I] { return I.make_room(); });
}

Status Engine::release(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.clock.t_engine);
  if (!I.initialized) return invalid_argument("release() before initialize()");
  ZOE_RETURN_IF_ERROR(I.awake("release()"));
  ZOE_ASSIGN_OR_RETURN(zero::ModuleId id, I.module_id("release", m));
  return I.gather->release(id);
}

Result<ModuleParams> Engine::grads(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.clock.t_engine);
  if (!I.initialized) return invalid_argument("grads() before initialize()");
  ZOE_RETURN_IF_ERROR(I.awake("grads()"));
  ZOE_ASSIGN_OR_RETURN(zero::ModuleId id, I.module_id("grads", m));
  return I.grads->grads(id);
}

Status Engine::reduce_grads(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.clock.t_engine);
  if (!I.initialized) return invalid_argument("reduce_grads() before initialize()");
  ZOE_RETURN_IF_ERROR(I.awake("reduce_grads()"));
  ZOE_ASSIGN_OR_RETURN(zero::ModuleId id, I.module_id("reduce_grads", m));
  return I.grads->reduce(id);
}

Status Engine::reduce_grads(size_t m, const std::vector<bool>& has_grad) {
  Impl& I = *impl_;
  Timer te(&I.clock.t_engine);
  if (!I.initialized) return invalid_argument("reduce_grads() before initialize()");
  ZOE_RETURN_IF_ERROR(I.awake("reduce_grads()"));
  ZOE_ASSIGN_OR_RETURN(zero::ModuleId id, I.module_id("reduce_grads", m));
  const std::vector<uint8_t> flags(has_grad.begin(), has_grad.end());
  return I.grads->reduce(id, &flags);
}

Status Engine::read_master(size_t m, size_t p, float* out) {
  Impl& I = *impl_;
  if (!I.initialized) return invalid_argument("read_master() before initialize()");
  ZOE_RETURN_IF_ERROR(I.awake("read_master()"));
  ZOE_RETURN_IF_ERROR(I.update->finish());
  I.update->unspeculate_all();  // the states before this step's update, which step() has not taken yet
  if (m >= I.modules.size() || p >= I.modules[zero::ModuleId(m)].specs.size())
    return invalid_argument("read_master(%zu, %zu): no such parameter", m, p);
  return I.update->read_master(zero::ModuleId(m), p, out);
}

Status Engine::read_module_master(size_t m, float* out) {
  Impl& I = *impl_;
  if (!I.initialized) return invalid_argument("read_module_master() before initialize()");
  ZOE_RETURN_IF_ERROR(I.awake("read_module_master()"));
  ZOE_ASSIGN_OR_RETURN(zero::ModuleId id, I.module_id("read_module_master", m));
  ZOE_RETURN_IF_ERROR(I.update->finish());
  I.update->unspeculate_all();  // as read_master()
  const zero::ModuleLayout& mod = I.modules[id];
  // The parameters are back to back from the module's start (its padding after them): read
  // straight into `out` where this rank holds the whole fp32 master.
  ZOE_ASSIGN_OR_RETURN(const bool direct, I.update->read_master_direct(id, mod.total, out));
  if (direct) return Status::ok();
  std::unique_ptr<float[]> full(new float[mod.padded]);
  ZOE_RETURN_IF_ERROR(I.update->read_module_master(id, full.get()));
  for (size_t p = 0; p < mod.numel.size(); ++p) {
    memcpy(out, full.get() + mod.offset[p], mod.numel[p] * 4);
    out += mod.numel[p];
  }
  return Status::ok();
}

}  // namespace zoe
