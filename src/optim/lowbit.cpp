// Formats, byte counts, argument checks and chunked dispatch of the low-bit state kernels.
#include "optim/lowbit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.h"
#include "optim/kernels.h"

namespace zoe::optim {
namespace {

const kern::LowbitTable* lowbit_table_for(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return kern::avx512_lowbit_table();
    case SimdLevel::kAvx2:
      return kern::avx2_lowbit_table();
    case SimdLevel::kScalar:
      return &kern::scalar_lowbit_table();
  }
  return nullptr;
}

Result<const kern::LowbitTable*> lowbit_dispatch(const Exec& exec) {
  SimdLevel level = exec.simd ? *exec.simd : active_simd_level();
  const kern::LowbitTable* t = simd_level_supported(level) ? lowbit_table_for(level) : nullptr;
  if (t == nullptr) {
    return unsupported("SIMD level %s: not supported by this CPU or build", simd_level_name(level));
  }
  return t;
}

int state_code(StateFormat f, bool stochastic) {
  switch (f) {
    case StateFormat::kF32:
      return 0;
    case StateFormat::kBF16:
      return stochastic ? 3 : 2;
    case StateFormat::kInt8:
      return 4;
    case StateFormat::kInt4:
      return 5;
  }
  return -1;
}

// Runs fn(begin, end) over the kChunkElems chunks of [0, n) (on the pool when there is one) and
// returns the failure of the lowest failing chunk.
template <typename Fn>
kern::BlockError run_chunks(const Exec& exec, size_t n, Fn&& fn) {
  const size_t chunks = (n + kChunkElems - 1) / kChunkElems;
  std::vector<kern::BlockError> errs(chunks, kern::BlockError{kern::kNoError, 0});
  auto one = [&](size_t c) {
    size_t b = c * kChunkElems;
    errs[c] = fn(b, b + kChunkElems < n ? b + kChunkElems : n);
  };
  if (exec.pool == nullptr || exec.pool->threads() <= 1 || chunks <= 1) {
    for (size_t c = 0; c < chunks; ++c) one(c);
  } else {
    exec.pool->for_each(chunks, one);
  }
  for (const auto& e : errs) {
    if (e.begin != kern::kNoError) return e;
  }
  return {kern::kNoError, 0};
}

std::string what_failed(uint32_t what) {
  std::string s;
  auto add = [&](uint32_t bit, const char* name) {
    if (what & bit) s += s.empty() ? name : std::string(", ") + name;
  };
  add(1, "m");
  add(2, "v");
  add(4, "parameter");
  return s;
}

Status block_error(const kern::BlockError& e, size_t n, StateFormat f, const char* op) {
  // The kernels' unit: the format's block (int8 256, int4 128), 256 elements for fp32/bf16.
  const size_t end = std::min(n, e.begin + (f == StateFormat::kInt4 ? 128 : 256));
  if (e.what & (8 | 16)) {
    return corruption(
        "%s: the stored scale of %s of elements [%zu, %zu) (%s optimizer states) is not finite: "
        "the state is corrupt; that block was left as it was",
        op, (e.what & 8) ? "m" : "v", e.begin, end, state_format_name(f));
  }
  return invalid_argument(
      "%s: non-finite (inf or NaN) or negative values in %s of elements [%zu, %zu) (%s "
      "optimizer states); that block was left as it was",
      op, what_failed(e.what).c_str(), e.begin, end, state_format_name(f));
}

Status check_lowbit_buffers(const LowbitBuffers& b) {
  if (b.n == 0) return Status::ok();
  if (b.param == nullptr || b.grad == nullptr || b.exp_avg == nullptr || b.exp_avg_sq == nullptr) {
    return invalid_argument("adam: param, grad, exp_avg and exp_avg_sq must be set for n=%zu", b.n);
  }
  if (b.param_out != nullptr && b.param_out_dtype == DType::kF32) {
    return invalid_argument("adam: param_out must be bf16 or fp16 (the master params are the other copy)");
  }
  if (b.index_base % 16 != 0) {
    return invalid_argument("adam: index_base %llu must be a multiple of 16",
                            static_cast<unsigned long long>(b.index_base));
  }
  return Status::ok();
}

}  // namespace

const char* state_format_name(StateFormat f) {
  switch (f) {
    case StateFormat::kF32:
      return "fp32";
    case StateFormat::kBF16:
      return "bf16";
    case StateFormat::kInt8:
      return "int8";
    case StateFormat::kInt4:
      return "int4";
  }
  return "?";
}

const char* master_format_name(MasterFormat f) { return f == MasterFormat::kF32 ? "fp32" : "bf16"; }

Result<StateFormat> parse_state_format(std::string_view s) {
  for (StateFormat f : {StateFormat::kF32, StateFormat::kBF16, StateFormat::kInt8, StateFormat::kInt4}) {
    if (s == state_format_name(f)) return f;
  }
  return invalid_argument(
      "zoe.optimizer_states: unknown format \"%.*s\"; expected \"fp32\", \"bf16\", \"int8\" or "
      "\"int4\"",
      static_cast<int>(s.size()), s.data());
}

Result<MasterFormat> parse_master_format(std::string_view s) {
  if (s == "fp32") return MasterFormat::kF32;
  if (s == "bf16") return MasterFormat::kBF16;
  if (s == "fp16") {
    return invalid_argument(
        "zoe.master_weights: \"fp16\" is refused: its 5-bit exponent cannot hold both the "
        "weights and their small updates; use \"bf16\" (stochastically rounded) or \"fp32\"");
  }
  return invalid_argument("zoe.master_weights: unknown format \"%.*s\"; expected \"fp32\" or \"bf16\"",
                          static_cast<int>(s.size()), s.data());
}

size_t state_block_elems(StateFormat f) {
  return f == StateFormat::kInt8 ? 256 : f == StateFormat::kInt4 ? 128 : 1;
}

size_t state_block_bytes(StateFormat f) {
  switch (f) {
    case StateFormat::kF32:
      return 4;
    case StateFormat::kBF16:
      return 2;
    case StateFormat::kInt8:
      return 4 + 256;
    case StateFormat::kInt4:
      return 4 + 64;
  }
  return 0;
}

size_t state_bytes(StateFormat f, size_t n) {
  const size_t b = state_block_elems(f), full = n / b, r = n % b;
  size_t bytes = full * state_block_bytes(f);
  if (r != 0) bytes += 4 + (f == StateFormat::kInt8 ? r : (r + 1) / 2);
  return bytes;
}

double state_bytes_per_element(StateFormat f) {
  return double(state_block_bytes(f)) / double(state_block_elems(f));
}

double master_bytes_per_element(MasterFormat f) { return f == MasterFormat::kF32 ? 4.0 : 2.0; }

double optimizer_state_bytes_per_param(MasterFormat master, StateFormat states, int state_count) {
  return master_bytes_per_element(master) + state_count * state_bytes_per_element(states);
}

Status check_state_tiling(StateFormat f, size_t elems, const char* what) {
  const size_t b = state_block_elems(f);
  if (elems % b == 0) return Status::ok();
  return invalid_argument(
      "zoe.optimizer_states \"%s\" quantizes blocks of %zu elements, but %s (%zu elements) is "
      "not a multiple of %zu: choose sizes that are, or another format",
      state_format_name(f), b, what, elems, b);
}

static_assert(kChunkElems % 256 == 0 && kChunkElems % 128 == 0, "blocks must tile a chunk");

Status adam_step_lowbit(const LowbitAdamArgs& args, const Exec& exec) {
  const LowbitBuffers& b = args.buf;
  ZOE_RETURN_IF_ERROR(check_lowbit_buffers(b));
  ZOE_ASSIGN_OR_RETURN(AdamConstants c, make_adam_constants(args.params, args.step));
  if (b.n == 0) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(const kern::LowbitTable* t, lowbit_dispatch(exec));
  const int out = b.param_out == nullptr ? 0 : static_cast<int>(b.param_out_dtype);
  kern::LowbitAdamFn fn =
      t->adam(static_cast<int>(b.grad_dtype), state_code(b.states, args.params.stochastic_rounding),
              b.master == MasterFormat::kF32 ? 0 : 2, out);
  ZOE_CHECK(fn != nullptr);
  kern::LowbitArgs a{
      &c, c.sr_seed ^ kMasterSeedSalt, b.index_base, b.param, b.grad, b.exp_avg, b.exp_avg_sq, b.param_out};
  kern::BlockError e = run_chunks(exec, b.n, [&](size_t lo, size_t hi) { return fn(a, lo, hi); });
  if (e.begin != kern::kNoError) return block_error(e, b.n, b.states, "adam");
  return Status::ok();
}

Status quantize_state(StateKind kind, StateFormat f, const float* src, void* dst, size_t n,
                      const Exec& exec) {
  if (n == 0) return Status::ok();
  if (src == nullptr || dst == nullptr) return invalid_argument("quantize_state: null buffer for n=%zu", n);
  const bool is_v = kind == StateKind::kExpAvgSq;
  if (f == StateFormat::kF32 || f == StateFormat::kBF16) {
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(src[i]) || (is_v && src[i] < 0.0f)) {
        return block_error({i, is_v ? 2u : 1u}, n, f, "quantize_state");
      }
    }
    if (f == StateFormat::kF32) {
      std::memcpy(dst, src, n * 4);
    } else {
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
    }
    return Status::ok();
  }
  ZOE_ASSIGN_OR_RETURN(const kern::LowbitTable* t, lowbit_dispatch(exec));
  kern::QuantizeFn fn = t->quantize(state_code(f, false), is_v);
  kern::BlockError e = run_chunks(exec, n, [&](size_t lo, size_t hi) { return fn(src, dst, lo, hi); });
  if (e.begin != kern::kNoError) return block_error(e, n, f, "quantize_state");
  return Status::ok();
}

Status dequantize_state(StateKind kind, StateFormat f, const void* src, float* dst, size_t n,
                        const Exec& exec) {
  if (n == 0) return Status::ok();
  if (src == nullptr || dst == nullptr) return invalid_argument("dequantize_state: null buffer for n=%zu", n);
  if (f == StateFormat::kF32) {
    std::memcpy(dst, src, n * 4);
    return Status::ok();
  }
  if (f == StateFormat::kBF16) {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
    return Status::ok();
  }
  ZOE_ASSIGN_OR_RETURN(const kern::LowbitTable* t, lowbit_dispatch(exec));
  kern::DequantizeFn fn = t->dequantize(state_code(f, false), kind == StateKind::kExpAvgSq);
  kern::BlockError e = run_chunks(exec, n, [&](size_t lo, size_t hi) { return fn(src, dst, lo, hi); });
  if (e.begin != kern::kNoError) return block_error(e, n, f, "dequantize_state");
  return Status::ok();
}

}  // namespace zoe::optim
