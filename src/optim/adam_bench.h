// Benchmark harness for the CPU optimizer step, shared by `zoe bench adam` and bench_adam.
// Config::optimizer picks AdamW (adam_step) or Lion / Adagrad (lion_adagrad.h: one state where
// Adam has two; the same variants, with that optimizer's step in place of Adam's).
//
// Measures, alternately in one run (roofline, fused, full, separate, roofline, ...) so drift of
// a shared machine hits all of them alike, and reports medians:
//   roofline  roofline_pass(): the fused kernel's exact streams with trivial arithmetic
//   fused     adam_step(): one pass, scale folded in, optional bf16/fp16 param copy
//   full      grad_norm_sq() + adam_step(): the whole step on a shard
//   separate  norm; scale grads in place; Adam with fp32 m/v; cast p to param_out: the
//             unfused step (DeepSpeed's CPU-offload flow), always with fp32 m/v
//   separate_fp32  the same with fp32 gradients (DeepSpeed's gradients reach the host as
//             fp32); only measured when --grad-dtype is not fp32 (else it is `separate`)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "optim/adam.h"
#include "optim/lion_adagrad.h"

namespace zoe::optim::bench {

enum class Optimizer { kAdam, kLion, kAdagrad };
const char* optimizer_name(Optimizer o);  // "adam", "lion", "adagrad"
inline int state_count(Optimizer o) { return o == Optimizer::kAdam ? 2 : 1; }

struct Config {
  Optimizer optimizer = Optimizer::kAdam;
  size_t params = size_t(64) << 20;
  int threads = 0;  // 0: all PUs
  int numa_node = -1;
  DType grad_dtype = DType::kF32;
  std::optional<DType> out_dtype;  // bf16/fp16 param copy, none when unset
  DType state_dtype = DType::kF32;
  bool stochastic_rounding = false;  // bf16 m/v only
  int repeats = 5;
  std::optional<SimdLevel> simd;
};

// Bytes per parameter each variant must move (reads + writes, no read-for-ownership counted).
struct Bytes {
  double fused;  // = roofline = the full step's minimum (norm fused into the receive pass)
  double norm;
  double full;           // norm + fused
  double separate;       // norm + scale + Adam(fp32 m/v) + cast
  double separate_fp32;  // the same with fp32 gradients
};
Bytes bytes_per_param(const Config& c);

// Host buffers for one configuration, allocated 2 MiB-aligned (transparent huge pages asked
// for) and first touched by the pool that will use them. Frees them on destruction.
class Buffers {
 public:
  static Result<std::unique_ptr<Buffers>> create(const Config& c, CpuPool* pool);
  ~Buffers();
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  AdamBuffers fused() const;     // state_dtype m/v, param_out when configured
  AdamBuffers separate() const;  // fp32 m/v, no param_out (cast is its own pass)
  // Lion / Adagrad: m is the one state.
  OneStateBuffers one_state() const;           // as fused()
  OneStateBuffers one_state_separate() const;  // as separate()
  void* param_out() const { return out_; }
  void* grad() const { return g_; }
  void* grad32() const { return g32_; }  // fp32 copy of the gradients (g_ itself when fp32)

 private:
  Buffers() = default;
  Config c_;
  std::vector<std::pair<void*, size_t>> allocs_;
  float* p_ = nullptr;
  void *g_ = nullptr, *m_ = nullptr, *v_ = nullptr, *m32_ = nullptr, *v32_ = nullptr, *out_ = nullptr,
       *g32_ = nullptr;
};

// One timed call of each variant, in seconds.
Result<double> time_roofline(const Buffers& b, const Config& c, const Exec& e);
Result<double> time_fused(const Buffers& b, const Config& c, const Exec& e);
Result<double> time_norm(const Buffers& b, const Config& c, const Exec& e);
Result<double> time_full(const Buffers& b, const Config& c, const Exec& e);
// scale alternates between 2 and 0.5 so repeated runs keep the gradients' magnitudes.
Result<double> time_separate(const Buffers& b, const Config& c, const Exec& e, float scale,
                             bool fp32_grads = false);

struct Stat {
  double median_s = 0, min_s = 0;
};
struct Report {
  Config config;
  std::string simd_path, pool_backend;
  int threads = 0;
  Bytes bytes{};
  Stat roofline, fused, norm, full, separate, separate_fp32;
  double gbps(const Stat& s, double bytes_per_param) const {
    return s.median_s > 0 ? bytes_per_param * double(config.params) / s.median_s / 1e9 : 0;
  }
  double roofline_gbps() const { return gbps(roofline, bytes.fused); }
  double fused_gbps() const { return gbps(fused, bytes.fused); }
  double fused_fraction() const { return fused_gbps() / roofline_gbps(); }
  // The full step's minimal bytes (= fused) over its time, against the roofline's bandwidth.
  double full_gbps_minimal() const { return gbps(full, bytes.fused); }
  double full_fraction() const { return full_gbps_minimal() / roofline_gbps(); }
  double separate_speedup() const { return separate.median_s / full.median_s; }
  // The full step's own bytes (norm pass + fused pass) over its time, against the roofline.
  double full_fraction_own_bytes() const { return gbps(full, bytes.full) / roofline_gbps(); }
  // Against the separate passes with fp32 gradients (DeepSpeed's flow), whatever grad_dtype is.
  double separate_fp32_speedup() const { return separate_fp32.median_s / full.median_s; }
};

// Runs `repeats` rounds after one warm-up round; progress(round, rounds) after each.
Result<Report> run(const Config& c, const std::function<void(int, int)>& progress = {});

}  // namespace zoe::optim::bench
