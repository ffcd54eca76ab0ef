// Device memory and host arenas of the engine's parts: see part_resources.h.
#include "zero/part_resources.h"

#include <cstring>

namespace zoe::zero {

Result<device::DeviceBuffer> DeviceMemory::zeroed(size_t bytes) {
  auto r = device::DeviceBuffer::allocate(dev_, bytes);
  if (!r.is_ok() && r.status().code() == StatusCode::kOutOfBudget) {
    // Every device allocation of the engine lives within zoe.device_budget: name the key to change.
    return r.status().with_context(
        "allocating device memory within zoe.device_budget (raise zoe.device_budget, or offload more: "
        "zero_optimization.offload_param / offload_optimizer)");
  }
  if (!r.is_ok()) return r.status().with_context("allocating device memory");
  device::DeviceBuffer b = std::move(r).value();
  // Zeroed before anyone else sees it (b frees itself on an error).
  ZOE_RETURN_IF_ERROR(ops_.zero(b.get(), bytes));
  ZOE_RETURN_IF_ERROR(ops_.synchronize());
  return b;
}

ModuleParams DeviceMemory::views(const ModuleLayout& mod, void* flat) const {
  ModuleParams out;
  out.dtype = public_dtype(cdt_);
  const size_t es = dtype_size(cdt_);
  const bool host = ops_.host_addressable();
  out.tensors.reserve(mod.specs.size());
  out.data.reserve(mod.specs.size());
  out.numel.reserve(mod.specs.size());
  for (size_t p = 0; p < mod.specs.size(); ++p) {
    TensorView v;
    v.name = mod.specs[p].name;
    v.shape = &mod.specs[p].shape;
    v.dtype = out.dtype;
    v.data = static_cast<char*>(flat) + mod.offset[p] * es;
    v.numel = mod.numel[p];
    v.bytes = mod.numel[p] * es;
    v.host_addressable = host;
    out.tensors.push_back(v);
    out.data.push_back(v.data);
    out.numel.push_back(v.numel);
  }
  return out;
}

Result<void*> HostArena::zeroed(size_t bytes) {
  ZOE_ASSIGN_OR_RETURN(io::AlignedBuffer b, io::AlignedBuffer::allocate(bytes, pin_));
  memset(b.data(), 0, bytes);
  bytes_ += bytes;
  void* p = b.data();
  bufs_.push_back(std::move(b));
  return p;
}

}  // namespace zoe::zero
