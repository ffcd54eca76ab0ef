// The engine's view of a model's tensors: what a module's parameters are (ParamSpec, given to
// Engine::add_module) and how the engine hands them out (TensorView, ModuleParams). Plain values,
// valid as each Engine call that returns them says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zoe/dtype.h"

namespace zoe {

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// One parameter (or its gradient) as the engine hands it out.
struct TensorView {
  std::string_view name;                        // as registered (valid for the engine's life)
  const std::vector<int64_t>* shape = nullptr;  // as registered (valid for the engine's life)
  ComputeDType dtype = ComputeDType::kF32;
  void* data = nullptr;
  size_t numel = 0;
  size_t bytes = 0;  // numel x dtype_size(dtype)
  // True when host code may read and write `data` directly (the CPU device: its device memory
  // is host memory). False: device memory (CUDA); use Engine::read_f32/write_f32 or kernels.
  bool host_addressable = true;

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// A module's parameters as the compute sees them: full (gathered) tensors on the device, in
// the compute dtype (fp32, or bf16/fp16 with mixed precision); or its gradient buffers.
struct ModuleParams {
  ComputeDType dtype = ComputeDType::kF32;
  std::vector<TensorView> tensors;  // one per ParamSpec, in registration order
  // The same pointers and element counts as `tensors`, for loops over raw buffers.
  std::vector<void*> data;
  std::vector<size_t> numel;

  size_t size() const { return tensors.size(); }
  const TensorView& operator[](size_t i) const { return tensors[i]; }
};

}  // namespace zoe
