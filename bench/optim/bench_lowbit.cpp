// bench_lowbit: elements per second of the fused AdamW pass with int8 and int4 states (fp32 and
// bf16 master) against the fp32-state kernel (adam_step), in one run, rounds alternated so a
// shared machine's drift hits all alike; medians and ratios to fp32 states.
//
//   bench_lowbit [--params N] [--threads T] [--repeats R] [--simd scalar|avx2|avx512] [--json FILE]
// Every variant reads fp32 gradients and writes a bf16 param_out.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/cpu.h"
#include "optim/adam.h"
#include "optim/lowbit.h"

namespace {

using namespace zoe;
using namespace zoe::optim;

struct Variant {
  std::string name;
  bool legacy;  // adam_step with fp32 states
  StateFormat states;
  MasterFormat master;
  std::vector<double> times;
  double bytes_per_param;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int fail(const Status& s) {
  fprintf(stderr, "bench_lowbit: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  size_t n = size_t(32) << 20;
  int threads = 0, repeats = 7;
  std::string json, simd;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--params")
      n = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (k == "--repeats")
      repeats = std::atoi(argv[i + 1]);
    else if (k == "--json")
      json = argv[i + 1];
    else if (k == "--simd")
      simd = argv[i + 1];
    else
      return fprintf(stderr, "bench_lowbit: unknown flag %s\n", k.c_str()), 2;
  }
  auto pool = CpuPool::create({threads, -1, CpuPool::Backend::kAuto});
  if (!pool.is_ok()) return fail(pool.status());
  Exec e;
  e.pool = pool.value().get();
  if (simd == "scalar")
    e.simd = SimdLevel::kScalar;
  else if (simd == "avx2")
    e.simd = SimdLevel::kAvx2;
  else if (simd == "avx512")
    e.simd = SimdLevel::kAvx512;

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> up(-1.0f, 1.0f), uv(0.0f, 1e-4f);
  std::vector<float> p(n), g(n), m32(n), v32(n);
  std::vector<uint16_t> p16(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = up(rng), g[i] = up(rng) * 8.0f, m32[i] = up(rng) * 1e-2f, v32[i] = uv(rng);
    p16[i] = f32_to_bf16(p[i]);
  }
  std::vector<float> m_f(m32), v_f(v32);
  std::vector<uint8_t> m8(state_bytes(StateFormat::kInt8, n)), v8(m8.size()),
      m4(state_bytes(StateFormat::kInt4, n)), v4(m4.size());
  for (auto [f, m, v] :
       {std::make_tuple(StateFormat::kInt8, &m8, &v8), std::make_tuple(StateFormat::kInt4, &m4, &v4)}) {
    Status s = quantize_state(StateKind::kExpAvg, f, m32.data(), m->data(), n, e);
    if (s.is_ok()) s = quantize_state(StateKind::kExpAvgSq, f, v32.data(), v->data(), n, e);
    if (!s.is_ok()) return fail(s);
  }
  std::vector<Variant> vars = {
      {"fp32 states (adam_step)", true, StateFormat::kF32, MasterFormat::kF32, {}, 4 + 4 + 16 + 2},
      {"int8 states, fp32 master", false, StateFormat::kInt8, MasterFormat::kF32, {}, 0},
      {"int8 states, bf16 master", false, StateFormat::kInt8, MasterFormat::kBF16, {}, 0},
      {"int4 states, fp32 master", false, StateFormat::kInt4, MasterFormat::kF32, {}, 0},
      {"int4 states, bf16 master", false, StateFormat::kInt4, MasterFormat::kBF16, {}, 0}};
  for (auto& v : vars) {
    if (!v.legacy)
      v.bytes_per_param =
          2 * master_bytes_per_element(v.master) + 4 + 4 * state_bytes_per_element(v.states) + 2;
  }
  AdamParams hp;
  hp.lr = 1e-4f, hp.weight_decay = 0.01f;
  for (int round = 0; round <= repeats; ++round) {  // round 0 warms up
    for (auto& v : vars) {
      Status s;
      uint64_t t0 = now_ns();
      if (v.legacy) {
        AdamArgs a{{n, p.data(), g.data(), DType::kF32, m_f.data(), v_f.data(), DType::kF32, out.data(),
                    DType::kBF16},
                   hp,
                   AdamStep{10, 1.0f / 1024.0f}};
        s = adam_step(a, e);
      } else {
        LowbitAdamArgs a;
        const bool i8 = v.states == StateFormat::kInt8;
        a.buf = {n,
                 v.master == MasterFormat::kF32 ? static_cast<void*>(p.data()) : p16.data(),
                 v.master,
                 g.data(),
                 DType::kF32,
                 i8 ? m8.data() : m4.data(),
                 i8 ? v8.data() : v4.data(),
                 v.states,
                 out.data(),
                 DType::kBF16,
                 0};
        a.params = hp;
        a.step = {10, 1.0f / 1024.0f};
        s = adam_step_lowbit(a, e);
      }
      uint64_t t1 = now_ns();
      if (!s.is_ok()) return fail(s);
      if (round > 0) v.times.push_back(double(t1 - t0) * 1e-9);
    }
  }
  const double base = double(n) / median(vars[0].times);
  printf("# bench_lowbit: %zu params, %d thread(s), path %s, CPU %s; medians of %d alternated rounds\n", n,
         pool.value()->threads(), kernel_path_name(e),
         cpu_features().avx512f ? "with AVX-512" : "without AVX-512", repeats);
  printf("%-28s %10s %12s %8s %10s\n", "kernel", "B/param", "Melem/s", "GB/s", "vs fp32");
  std::string js = "{\"params\": " + std::to_string(n) +
                   ", \"threads\": " + std::to_string(pool.value()->threads()) + ", \"simd\": \"" +
                   kernel_path_name(e) + "\", \"kernels\": [";
  for (size_t i = 0; i < vars.size(); ++i) {
    const auto& v = vars[i];
    const double eps = double(n) / median(v.times);
    printf("%-28s %10.3f %12.1f %8.2f %9.2fx\n", v.name.c_str(), v.bytes_per_param, eps / 1e6,
           eps * v.bytes_per_param / 1e9, eps / base);
    char buf[320];
    snprintf(buf, sizeof(buf),
             "%s{\"name\": \"%s\", \"states\": \"%s\", \"master\": \"%s\", \"bytes_per_param\": %.4f, "
             "\"elements_per_s\": %.1f, \"ratio_to_fp32_states\": %.4f}",
             i ? ", " : "", v.name.c_str(), state_format_name(v.states), master_format_name(v.master),
             v.bytes_per_param, eps, eps / base);
    js += buf;
  }
  const double r8 = double(n) / median(vars[1].times) / base;
  js += "], \"int8_ratio_target\": 0.9, \"ok\": " + std::string(r8 >= 0.9 ? "true" : "false") + "}\n";
  printf("# int8 states (fp32 master) / fp32 states: %.2fx (target >= 0.90): %s\n", r8,
         r8 >= 0.9 ? "OK" : "FAILED");
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) return fprintf(stderr, "bench_lowbit: cannot write %s\n", json.c_str()), 1;
    std::fputs(js.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
