// The public types of include/zoe/ over the engine's internals: the dtype helpers (over
// core/dtype.h), the one Config value the placement sizes (the optimizer swapper's buffers), the
// scoped fetch (Gathered) and the engine's fp32 read/write of a view. The rest of Config is
// src/config/public_config.cpp; Runtime is src/comm/runtime.cpp.
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/log.h"
#include "zero/engine_impl.h"
#include "zero/engine_internal.h"
#include "zero/placement.h"
#include "zoe/zoe.h"

namespace zoe {

// ---------------------------------------------------------------------------------------------
// dtype helpers: loops over core/dtype.h's scalar conversions (the engine's own).

const char* dtype_name(ComputeDType d) { return zoe::dtype_name(internal_dtype(d)); }

float to_f32(uint16_t half, ComputeDType d) {
  return d == ComputeDType::kBF16 ? bf16_to_f32(half) : f16_to_f32(half);
}

uint16_t from_f32(float x, ComputeDType d) {
  return d == ComputeDType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x);
}

void to_f32(const void* src, ComputeDType d, float* dst, size_t n) {
  if (d == ComputeDType::kF32) {
    if (n) memcpy(dst, src, n * 4);
    return;
  }
  const auto* h = static_cast<const uint16_t*>(src);
  if (d == ComputeDType::kBF16) {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
  }
}

void from_f32(const float* src, ComputeDType d, void* dst, size_t n, float scale) {
  if (d == ComputeDType::kF32) {
    auto* f = static_cast<float*>(dst);
    if (scale == 1.0f) {
      if (n) memcpy(f, src, n * 4);
    } else {
      for (size_t i = 0; i < n; ++i) f[i] = src[i] * scale;
    }
    return;
  }
  auto* h = static_cast<uint16_t*>(dst);
  if (d == ComputeDType::kBF16) {
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i] * scale);
  } else {
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i] * scale);
  }
}

// ---------------------------------------------------------------------------------------------
// Config: the optimizer swapper's host buffers, as the placement sizes them (zero::swap_buffer_count
// and swap_chunk_elems)

uint64_t Config::optimizer_swap_buffer_bytes() const {
  const auto& z = impl_->cfg.zero;
  if (z.offload_optimizer.device != zoe::Offload::kNvme) return 0;
  const auto& c = impl_->cfg;
  return static_cast<uint64_t>(zero::swap_buffer_count(
             z.offload_optimizer.buffer_count, c.given("zero_optimization.offload_optimizer.buffer_count"))) *
         zero::swap_chunk_elems(z.sub_group_size, c.given("zero_optimization.sub_group_size")) * 4;
}

// ---------------------------------------------------------------------------------------------
// Engine: the scoped fetch, fp32 access to views

Gathered& Gathered::operator=(Gathered&& o) noexcept {
  if (this != &o) {
    Status s = release();
    if (!s.is_ok()) ZOE_LOG_ERROR("releasing module %zu: %s", m_, s.to_string().c_str());
    engine_ = std::exchange(o.engine_, nullptr);
    m_ = o.m_;
    params_ = std::move(o.params_);
  }
  return *this;
}

Gathered::~Gathered() {
  Status s = release();
  if (!s.is_ok()) ZOE_LOG_ERROR("releasing module %zu at scope exit: %s", m_, s.to_string().c_str());
}

Status Gathered::release() {
  if (!engine_) return Status::ok();
  Engine* e = std::exchange(engine_, nullptr);
  params_ = ModuleParams();
  return e->release(m_);
}

Result<Gathered> Engine::gather(size_t m) {
  ZOE_ASSIGN_OR_RETURN(ModuleParams p, fetch(m));
  return Gathered(this, m, std::move(p));
}

Status Engine::read_f32(const TensorView& view, float* dst) {
  if (view.host_addressable || impl_->ctx.ops->host_addressable()) {
    to_f32(view.data, view.dtype, dst, view.numel);
    return Status::ok();
  }
  std::vector<char> host(view.bytes);
  Status s = impl_->ctx.ops->to_host(host.data(), view.data, view.bytes);
  if (s.is_ok()) s = impl_->ctx.ops->synchronize();
  if (!s.is_ok()) return s.with_context("reading " + std::string(view.name) + " from the device");
  to_f32(host.data(), view.dtype, dst, view.numel);
  return Status::ok();
}

Status Engine::write_f32(const TensorView& view, const float* src, float scale) {
  if (view.host_addressable || impl_->ctx.ops->host_addressable()) {
    from_f32(src, view.dtype, view.data, view.numel, scale);
    return Status::ok();
  }
  std::vector<char> host(view.bytes);
  from_f32(src, view.dtype, host.data(), view.numel, scale);
  Status s = impl_->ctx.ops->to_device(view.data, host.data(), view.bytes);
  if (s.is_ok()) s = impl_->ctx.ops->synchronize();
  if (!s.is_ok()) return s.with_context("writing " + std::string(view.name) + " to the device");
  return Status::ok();
}

}  // namespace zoe
