// Google Benchmark cases for the fused CPU Adam step: 64M and 256M params, 1 thread and all
// threads, fp32 and bf16 grads, with and without a bf16 param copy, bf16 m/v (RNE and stochastic
// rounding); and the fused Lion and Adagrad steps (lion/..., adagrad/...) with fp32 states.
//
// Each case runs rounds of (roofline, fused, norm, full step, separate passes) alternately on the
// same buffers and reports the fused pass's time as the benchmark's time, with counters:
//   fused_GBps, roofline_GBps, frac_roofline (fused / roofline, target >= 0.90),
//   full_frac_roofline (norm + fused moving the fused pass's bytes, target >= 0.85),
//   sep_speedup (separate passes / full step, target >= 1.4; >= 1.8 with bf16 m/v).
// All counters are medians over the rounds. Filter with --benchmark_filter=64M etc.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/topology.h"
#include "optim/adam_bench.h"

namespace {

using zoe::DType;
namespace ob = zoe::optim::bench;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void run_case(benchmark::State& state, ob::Config c) {
  auto pool = zoe::optim::CpuPool::create({c.threads, -1, zoe::optim::CpuPool::Backend::kAuto});
  if (!pool.is_ok()) return state.SkipWithError(pool.status().to_string().c_str());
  zoe::optim::Exec e;
  e.pool = pool.value().get();
  auto bufs = ob::Buffers::create(c, e.pool);
  if (!bufs.is_ok()) return state.SkipWithError(bufs.status().to_string().c_str());
  const ob::Buffers& b = *bufs.value();
  ob::Bytes bytes = ob::bytes_per_param(c);
  std::vector<double> tr, tf, tu, ts;
  bool warm = false;
  int round = 0;
  for (auto _ : state) {
    auto r = ob::time_roofline(b, c, e);
    auto f = ob::time_fused(b, c, e);
    auto u = ob::time_full(b, c, e);
    auto s = ob::time_separate(b, c, e, round++ % 2 ? 0.5f : 2.0f);
    if (!r.is_ok() || !f.is_ok() || !u.is_ok() || !s.is_ok()) return state.SkipWithError("kernel failed");
    state.SetIterationTime(f.value());
    if (!warm) {  // the first round only faults pages in and warms caches
      warm = true;
      continue;
    }
    tr.push_back(r.value()), tf.push_back(f.value()), tu.push_back(u.value()), ts.push_back(s.value());
  }
  double moved = bytes.fused * double(c.params);
  state.SetBytesProcessed(static_cast<int64_t>(moved * double(state.iterations())));
  state.counters["fused_GBps"] = moved / median(tf) / 1e9;
  state.counters["roofline_GBps"] = moved / median(tr) / 1e9;
  state.counters["frac_roofline"] = median(tr) / median(tf);
  state.counters["full_frac_roofline"] = median(tr) / median(tu);
  state.counters["sep_speedup"] = median(ts) / median(tu);
  state.counters["threads"] = pool.value()->threads();
}

void register_cases() {
  const int all = std::max(1, zoe::topology().pus);
  struct Variant {
    const char* name;
    DType grad;
    bool out;
    DType state;
    bool sr = false;
  };
  const Variant variants[] = {{"g_fp32", DType::kF32, false, DType::kF32},
                              {"g_bf16", DType::kBF16, false, DType::kF32},
                              {"g_fp32/out_bf16", DType::kF32, true, DType::kF32},
                              {"g_bf16/out_bf16", DType::kBF16, true, DType::kF32},
                              {"g_bf16/out_bf16/mv_bf16", DType::kBF16, true, DType::kBF16},
                              {"g_bf16/out_bf16/mv_bf16_sr", DType::kBF16, true, DType::kBF16, true}};
  for (size_t mparams : {64, 256}) {
    for (int threads : {1, all}) {
      for (ob::Optimizer opt : {ob::Optimizer::kAdam, ob::Optimizer::kLion, ob::Optimizer::kAdagrad}) {
        for (const Variant& v : variants) {
          // Lion and Adagrad: the fp32-state variants (their bf16 state is the same pass, one stream).
          if (opt != ob::Optimizer::kAdam && v.state != DType::kF32) continue;
          ob::Config c;
          c.optimizer = opt;
          c.params = mparams << 20;
          c.threads = threads;
          c.grad_dtype = v.grad;
          c.state_dtype = v.state;
          c.stochastic_rounding = v.sr;
          if (v.out) c.out_dtype = DType::kBF16;
          std::string name = std::string(ob::optimizer_name(opt)) + "/" + std::to_string(mparams) +
                             "M/threads:" + std::to_string(threads) + "/" + v.name;
          benchmark::RegisterBenchmark(name.c_str(), run_case, c)
              ->UseManualTime()
              ->Iterations(6)
              ->Unit(benchmark::kMillisecond);
        }
      }
      if (all == 1) break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_cases();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
