// `zoe tune --calibrate`: this host's link rates (see tune_internal.h).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/tune_internal.h"
#include "config/config.h"
#include "core/clock.h"
#include "core/dir_check.h"
#include "core/units.h"
#include "io/buffer.h"
#include "io/io_bench.h"
#include "io/swap_file.h"
#include "model/gpt.h"
#include "model/gpt_trainer.h"
#include "optim/adam_bench.h"
#include "plan/calibration.h"
#include "plan/options.h"
#include "plan/planner.h"
#include "zero/engine_internal.h"
#include "zoe/cli.h"
#include "zoe/engine.h"

namespace zoe::cli::tune {

using nlohmann::json;

namespace {

using plan::Repeated;
using plan::RepeatPolicy;
using Spreads = std::vector<std::pair<std::string, double>>;

// The calibration's file at `dir`: `bytes` laid out (written once), in *ext.
Result<std::unique_ptr<io::SwapFile>> lay_out(const std::string& dir, uint64_t bytes, io::Extent* ext,
                                              Progress* progress) {
  io::SwapFileOptions so;
  so.dirs = {dir};
  so.name = "zoe-tune-calibrate";
  so.grow_bytes = 0;
  ZOE_ASSIGN_OR_RETURN(auto sf, io::SwapFile::create(so));
  ZOE_ASSIGN_OR_RETURN(*ext, sf->allocate(bytes));
  progress->update("calibrate: laying out " + format_bytes(bytes) + " at " + dir);
  ZOE_RETURN_IF_ERROR_CTX(io::write_pattern(*sf, *ext, 0x5eed), "laying out " + dir);
  return std::unique_ptr<io::SwapFile>(std::move(sf));
}

// The I/O engine over aio block sizes x queue depths on the laid-out file at `dir`: reads, then
// writes over it (each point: one untimed and two timed passes over the extent).
Result<std::vector<plan::IoPoint>> sweep_nvme(const io::SwapFile& sf, const io::Extent& ext,
                                              const std::string& dir, Progress* progress) {
  const size_t kBlocks[] = {256u << 10, 1u << 20, 4u << 20};
  const uint32_t kDepths[] = {4, 8, 32};
  std::vector<plan::IoPoint> pts;
  for (size_t bs : kBlocks) {
    for (uint32_t qd : kDepths) pts.push_back({static_cast<int64_t>(bs), qd, 0, 0});
  }
  const size_t n = pts.size();
  for (int w = 0; w < 2; ++w) {
    const io::IoOp op = w ? io::IoOp::kWrite : io::IoOp::kRead;
    for (size_t i = 0; i < n; ++i) {
      plan::IoPoint& p = pts[i];
      io::IoBenchConfig cfg;
      cfg.file = &sf;
      cfg.extent = ext;
      cfg.loops = 2;
      cfg.warmup = 1;
      cfg.on_pass = [&](int pass, int passes) {
        progress->update(fmt("calibrate: NVMe %s at %s, %s x qd %lld (%zu/%zu), pass %d/%d",
                             w ? "write" : "read", dir.c_str(),
                             format_bytes(static_cast<uint64_t>(p.block_size)).c_str(),
                             static_cast<long long>(p.queue_depth), i + 1, n, pass + 1, passes));
      };
      io::IoBenchCase c{io::IoBackend::kAuto, static_cast<size_t>(p.block_size),
                        static_cast<uint32_t>(p.queue_depth), op};
      ZOE_ASSIGN_OR_RETURN(io::IoBenchRow row, io::run_io_bench(cfg, c));
      (w ? p.write_gbps : p.read_gbps) = row.gbps;
    }
  }
  return pts;
}

// The sweep's point for the engine: the fastest read followed by a write of the same bytes (the
// optimizer's swap), 1 / (1/read + 1/write).
const plan::IoPoint& best_io_point(const std::vector<plan::IoPoint>& pts) {
  return *std::max_element(pts.begin(), pts.end(), [](const plan::IoPoint& a, const plan::IoPoint& b) {
    return a.read_then_write_gbps() < b.read_then_write_gbps();
  });
}

// zoe's GPT kernels on this host (what zoe's CPU device computes with): one forward and backward
// pass, 6 N tokens, of the planned model's shape at its micro-batch (a GEMM's rate depends on its
// shape: a small model's is far below a large one's): the whole model where it is small enough,
// else one block of it; the "small" preset when the model has no dimensions (--params).
class KernelPass {
 public:
  static Result<std::unique_ptr<KernelPass>> create(const plan::ModelDesc& m, const plan::Workload& w) {
    auto kp = std::unique_ptr<KernelPass>(new KernelPass);
    ZOE_RETURN_IF_ERROR(kp->init(m, w));
    return kp;
  }
  void run() {
    const size_t L = static_cast<size_t>(c_.layers);
    k_->embed_forward(tokens_.data(), pp_[0].data());
    for (size_t l = 0; l < L; ++l) k_->block_forward(static_cast<int>(l), pp_[l + 1].data());
    (void)k_->head_forward(pp_[L + 1].data(), pp_[0].data(), targets_.data());
    k_->head_backward(pp_[L + 1].data(), pp_[0].data(), gp_[L + 1].data(), gp_[0].data());
    for (size_t l = L; l-- > 0;)
      k_->block_backward(static_cast<int>(l), pp_[l + 1].data(), gp_[l + 1].data());
    k_->embed_backward(gp_[0].data());
  }
  double flops() const { return 6.0 * static_cast<double>(c_.num_params()) * batch_ * T_; }
  int batch() const { return batch_; }

 private:
  KernelPass() = default;
  Status init(const plan::ModelDesc& m, const plan::Workload& w) {
    const model::GptPreset* small = model::find_gpt_preset("small");
    c_.layers = small->layers;
    c_.d_model = small->d_model;
    c_.heads = small->heads;
    c_.seq = small->context;
    c_.vocab = 256;
    T_ = c_.seq;
    if (m.d_model > 0 && m.heads > 0 && m.context > 0) {
      // Bounded so that calibration stays short and small: a width above 4096 is measured at 4096
      // (the rate of wider GEMMs is no lower), at most 512 positions and 2048 tokens a pass.
      // The whole model when its fp32 parameters and gradients take at most 2 GiB, else one block.
      c_.layers = 8.0 * static_cast<double>(m.params) <= 2.0 * (1u << 30) ? std::max(1, m.layers) : 1;
      c_.d_model = std::min(m.d_model, 4096);
      c_.heads = c_.d_model == m.d_model ? m.heads : c_.d_model / 128;
      T_ = static_cast<int>(std::min<int64_t>({w.seq > 0 ? w.seq : m.context, m.context, 512}));
      c_.seq = T_;
      batch_ = static_cast<int>(std::clamp<int64_t>(w.micro_batch, 1, std::max(1, 2048 / T_)));
    }
    ZOE_ASSIGN_OR_RETURN(k_, model::GptCpu::create(c_, batch_, T_));
    const auto mods = model::gpt_modules(c_);
    p_.resize(mods.size());
    g_.resize(mods.size());
    pp_.resize(mods.size());
    gp_.resize(mods.size());
    for (size_t i = 0; i < mods.size(); ++i) {
      for (size_t t = 0; t < mods[i].params.size(); ++t) {
        p_[i].emplace_back(mods[i].params[t].numel());
        g_[i].emplace_back(mods[i].params[t].numel(), 0.0f);
        model::gpt_init(c_, 1, i, t, p_[i].back().data(), p_[i].back().size());
      }
      for (auto& v : p_[i]) pp_[i].push_back(v.data());
      for (auto& v : g_[i]) gp_[i].push_back(v.data());
    }
    tokens_.resize(static_cast<size_t>(batch_ * T_));
    targets_.resize(tokens_.size());
    for (size_t i = 0; i < tokens_.size(); ++i) {
      tokens_[i] = static_cast<int32_t>((i * 7) % 256);
      targets_[i] = static_cast<int32_t>((i * 7 + 1) % 256);
    }
    return Status::ok();
  }
  model::GptConfig c_;
  int batch_ = 8, T_ = 0;
  std::unique_ptr<model::GptCpu> k_;
  std::vector<std::vector<std::vector<float>>> p_, g_;
  std::vector<std::vector<const float*>> pp_;
  std::vector<std::vector<float*>> gp_;
  std::vector<int32_t> tokens_, targets_;
};

// FLOP/s of zoe's GPT kernels (KernelPass): passes after a warm-up, repeated until they agree
// (Repeated: at most about 10 s of them), the median of the closest.
Result<double> measure_flops(const plan::ModelDesc& m, const plan::Workload& w, RepeatPolicy pol,
                             Spreads* spreads, Progress* progress) {
  ZOE_ASSIGN_OR_RETURN(auto kp, KernelPass::create(m, w));
  progress->update("calibrate: FLOP/s of zoe's GPT kernels");
  kp->run();  // warm-up
  Repeated rep(pol);
  while (!rep.done()) {
    const uint64_t t0 = now_ns();
    kp->run();
    const double s = static_cast<double>(now_ns() - t0) * 1e-9;
    if (rep.samples() == 0 && s > 0) {
      pol.max_samples = static_cast<int>(std::clamp(std::ceil(10.0 / s), static_cast<double>(pol.window),
                                                    static_cast<double>(pol.max_samples)));
      rep = Repeated(pol);
    }
    rep.add(s);
    progress->update(fmt("calibrate: FLOP/s of zoe's GPT kernels, pass %zu (spread %.1f%%)", rep.samples(),
                         rep.samples() >= 2 ? 100 * rep.spread() : 0.0));
  }
  ZOE_RETURN_IF_ERROR(plan::check_stable(rep, "FLOP/s of zoe's GPT kernels"));
  spreads->emplace_back(fmt("flops@%d", kp->batch()), rep.spread());
  return kp->flops() / rep.value();
}

// The CPU cost of NVMe traffic on zoe's CPU device (LinkRates::nvme_cpu_gbps): zoe's GPT kernels
// (KernelPass, about half a second of passes) alone and beside a thread streaming reads then
// writes over the calibration file at the chosen aio point, alternately, three rounds each. The
// cost is the median of the rounds' added seconds over the bytes the stream moved meanwhile (its
// rate times the window). 0 when the kernels slow by under 1 % (the cost is below what this can
// see).
Result<double> measure_nvme_cpu(const io::SwapFile& sf, const io::Extent& ext, const plan::IoPoint& pt,
                                const plan::ModelDesc& m, const plan::Workload& w, Progress* progress) {
  ZOE_ASSIGN_OR_RETURN(auto kp, KernelPass::create(m, w));
  progress->update("calibrate: the CPU cost of NVMe I/O beside zoe's GPT kernels");
  kp->run();  // warm-up
  uint64_t t0 = now_ns();
  kp->run();
  const double one = std::max(1e-6, static_cast<double>(now_ns() - t0) * 1e-9);
  const int passes = static_cast<int>(std::clamp(std::ceil(0.5 / one), 1.0, 64.0));
  auto window = [&] {
    const uint64_t s = now_ns();
    for (int i = 0; i < passes; ++i) kp->run();
    return static_cast<double>(now_ns() - s) * 1e-9;
  };
  std::vector<double> added, bytes;
  for (int round = 0; round < 3; ++round) {
    progress->update(fmt("calibrate: the CPU cost of NVMe I/O beside zoe's GPT kernels (%d/3)", round + 1));
    const double alone = window();
    std::atomic<bool> stop{false};
    uint64_t moved = 0;
    double io_s = 0;
    Status io_status = Status::ok();
    std::thread io([&] {
      for (int op = 0; !stop.load(); op ^= 1) {
        io::IoBenchConfig cfg;
        cfg.file = &sf;
        cfg.extent = ext;
        cfg.loops = 1;
        cfg.warmup = 0;
        cfg.stop = &stop;
        io::IoBenchCase c{io::IoBackend::kAuto, static_cast<size_t>(pt.block_size),
                          static_cast<uint32_t>(pt.queue_depth), op ? io::IoOp::kWrite : io::IoOp::kRead};
        auto row = io::run_io_bench(cfg, c);
        if (!row.is_ok()) {
          if (!stop.load()) io_status = row.status();
          return;
        }
        moved += row->bytes;
        io_s += row->seconds;
      }
    });
    const double with = window();
    stop.store(true);
    io.join();
    ZOE_RETURN_IF_ERROR(io_status);
    if (!(io_s > 0)) continue;  // no pass finished: the window was shorter than one pass
    added.push_back(with - alone);
    bytes.push_back(static_cast<double>(moved) / io_s * with);
  }
  if (added.empty()) return 0.0;
  std::vector<size_t> order(added.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return added[a] < added[b]; });
  const size_t med = order[order.size() / 2];
  const double base = one * passes;
  if (!(added[med] > 0.01 * base)) return 0.0;
  return bytes[med] / added[med] / 1e9;
}

// What a few steps of the planned model through an in-memory engine show.
struct TrainRates {
  double flops = 0;            // 0: not measured
  double engine_gbps = 0;      // 0: not measured
  double local_copy_gbps = 0;  // 0: not measured
};

// zoe's GPT as `zoe train` runs it: a few steps of the planned model through an engine that keeps
// every state in memory (stage 1, no offload, the config's overlap_step). Per step (the median of
// three after two untimed ones), the wall time splits into what the engine spent visibly on the
// gradients' accumulation and the update (t_comm + t_optimizer: a world of one rank has no
// collectives), its I/O stall, and the rest, which is the caller's: the kernels, the trainer's
// dtype conversions and its calls into the engine. So:
//   * flops = 6 N tokens over the rest (the compute term of the cost model);
//   * engine_gbps = the bytes the cost model streams through the optimizer for this placement
//     (accumulation and Adam) over the visible engine time: the rate of zoe's update as it runs
//     here, on this model, with its threads shared with the next forward (it is several times
//     below the fused kernel's benchmark on a small machine).
//   * local_copy_gbps = the model's bytes of stage 3's gather copies and zeroing (the CPU device's
//     own buffer traffic) over what the same steps at stage 3 add to the wall time.
// All 0 when the model is not zoe's GPT or its states would take more than a quarter of the
// host's available memory; engine_gbps and local_copy_gbps 0 when their time is under a
// millisecond.
// The calibration's model steps at micro-batch `micro` fit this host: their activations (fp32 on
// zoe's CPU device) with the states take at most half its available memory. Refused with the flag
// to change rather than failing as an allocation somewhere in the model.
Status check_steps_fit(const plan::PlanInputs& pre, int64_t micro) {
  const plan::ModelDesc& m = pre.model;
  if (!m.zoe_gpt) return Status::ok();
  const double state_bytes = 16.0 * static_cast<double>(m.params);
  const uint64_t avail = host_memory_available();
  if (avail == 0 || state_bytes > static_cast<double>(avail) / 4) return Status::ok();  // not measured
  plan::Workload w = pre.work;
  w.micro_batch = std::max<int64_t>(1, micro);
  const uint64_t act = plan::activation_bytes(m, w, 4);
  if (micro <= (1 << 30) && state_bytes + static_cast<double>(act) <= static_cast<double>(avail) / 2)
    return Status::ok();
  return invalid_argument(
      "--calibrate measures model steps at micro-batch %lld (--micro-batch, or a divisor of "
      "--micro-batch x --grad-accum): their activations take %s with %s of states, more than half "
      "of this host's available memory (%s); give a smaller --micro-batch and a larger --grad-accum "
      "for the same batch",
      static_cast<long long>(micro), format_bytes(act).c_str(),
      format_bytes(static_cast<uint64_t>(state_bytes)).c_str(), format_bytes(avail).c_str());
}

// At micro-batch `micro`; with `rates_too` false, the FLOP rate only (one engine, stage 1).
Result<TrainRates> measure_train(const plan::PlanInputs& pre, int64_t micro, bool rates_too,
                                 const RepeatPolicy& policy, Spreads* spreads, Progress* progress) {
  const plan::ModelDesc& m = pre.model;
  if (!m.zoe_gpt) return TrainRates{};
  const double state_bytes = 16.0 * static_cast<double>(m.params);
  const uint64_t avail = host_memory_available();
  if (avail == 0 || state_bytes > static_cast<double>(avail) / 4) return TrainRates{};
  ZOE_RETURN_IF_ERROR(check_steps_fit(pre, micro));
  config::Config cfg = pre.base;
  cfg.zero.stage = 1;
  cfg.zero.offload_param.device = zoe::Offload::kNone;
  cfg.zero.offload_optimizer.device = zoe::Offload::kNone;
  cfg.zoe.device = "cpu";
  cfg.zoe.device_budget_bytes = 0;
  const int B = static_cast<int>(std::max<int64_t>(1, micro));
  const int T = static_cast<int>(std::min<int64_t>(pre.work.seq > 0 ? pre.work.seq : m.context, m.context));
  cfg.train_micro_batch_size_per_gpu = B;
  cfg.gradient_accumulation_steps = 1;
  // On this rank alone: under a launch of several ranks, an engine across them would count their
  // skew and the network's latency into the caller's time (rest() below), and the spread of a
  // small model's steps would refuse the calibration before it reached the network.
  Runtime& rt = local_runtime();
  cfg.train_batch_size = static_cast<int64_t>(B) * rt.world_size();
  const model::GptConfig gc = gpt_config_of(m);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * static_cast<size_t>(T)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7) % static_cast<size_t>(gc.vocab));
    targets[i] = static_cast<int32_t>((i * 7 + 1) % static_cast<size_t>(gc.vocab));
  }
  struct Split {
    double wall, engine, io;
    double rest() const { return wall - engine - io; }
  };
  // The step of `c` that measures it (after two untimed ones, as --verify and the grid's runs: the
  // first records the fetch order, the second is the first prefetched one and warms the pools):
  // steps are repeated until the closest RepeatPolicy::window of them agree (Repeated) in the
  // caller's time (by_rest: the wall less the engine's visible time and I/O stall) or in the wall
  // time, and the median of those is the measurement.
  // At most 30 steps and about 15 s of them. A measurement that does not settle ends the
  // calibration: a rate it cannot trust is not written.
  auto median_step = [&](const config::Config& c, const char* what, const std::string& spread_key,
                         bool by_rest) -> Result<Split> {
    ZOE_ASSIGN_OR_RETURN(auto eng, zero::create_engine(rt, c));
    ZOE_RETURN_IF_ERROR(model::add_gpt_modules(*eng, gc));
    ZOE_RETURN_IF_ERROR(eng->initialize(
        [&](size_t mi, size_t p, float* x, size_t n) { model::gpt_init(gc, 1, mi, p, x, n); }));
    ZOE_ASSIGN_OR_RETURN(auto gm, model::GptCpu::create(gc, B, T));
    model::GptTrainer trainer(*eng, *gm, gc, T);
    constexpr int kUntimed = 2;
    RepeatPolicy pol = policy;
    std::vector<Split> t;
    Repeated rep(pol);
    for (int k = 0; k < kUntimed || !rep.done(); ++k) {
      progress->update(fmt("calibrate: %s through the engine (%s), step %d (spread %s)", m.name.c_str(), what,
                           k + 1, rep.samples() >= 2 ? fmt("%.1f%%", 100 * rep.spread()).c_str() : "-"));
      const uint64_t t0 = now_ns();
      ZOE_RETURN_IF_ERROR(trainer.forward_backward(tokens, targets).status());
      ZOE_ASSIGN_OR_RETURN(StepStats st, eng->step());
      const double wall = static_cast<double>(now_ns() - t0) * 1e-9;
      if (k < kUntimed) continue;
      const Split sp{wall, st.t_comm + st.t_optimizer, st.t_io_stall};
      t.push_back(sp);
      rep.add(by_rest ? sp.rest() : sp.wall);
      if (t.size() == 1 && wall > 0) {  // about 15 s of steps
        pol.max_samples = static_cast<int>(std::clamp(std::ceil(15.0 / wall), static_cast<double>(pol.window),
                                                      static_cast<double>(pol.max_samples)));
        rep = Repeated(pol);
        rep.add(by_rest ? sp.rest() : sp.wall);
      }
    }
    ZOE_RETURN_IF_ERROR(plan::check_stable(rep, fmt("%s through the engine (%s)", m.name.c_str(), what)));
    spreads->emplace_back(spread_key, rep.spread());
    return t[rep.median_index()];
  };
  ZOE_ASSIGN_OR_RETURN(const Split med,
                       median_step(cfg, fmt("stage 1, micro-batch %d", B).c_str(), fmt("flops@%d", B), true));
  const double rest = med.wall - med.engine - med.io;
  TrainRates r;
  if (!(rest > 0)) return r;
  r.flops = 6.0 * static_cast<double>(m.params) * B * T / rest;
  if (!rates_too) return r;
  plan::RowPlacement rp;
  rp.stage = 1;
  rp.bf16_states = cfg.zoe.bf16_optimizer_states;
  rp.states = cfg.zoe.optimizer_states;
  plan::PlanInputs in = pre;
  in.work.micro_batch = B;
  in.work.grad_accum = 1;
  in.cuda = false;
  auto row = plan::plan_row(in, rp);
  if (row.is_ok() && med.engine >= 1e-3) {
    const uint64_t bytes = row->cost.bytes.device_optimizer;
    if (bytes > 0) r.engine_gbps = static_cast<double>(bytes) / med.engine / 1e9;
  }
  // The same at stage 3 (parameters partitioned, on the device): what it adds is the engine's
  // copies and zeroing of each gather's buffers. local_copy_gbps is the model's bytes for them
  // (its seconds at 1 GB/s) over the added wall time.
  config::Config c3 = cfg;
  c3.zero.stage = 3;
  ZOE_ASSIGN_OR_RETURN(const Split med3, median_step(c3, "stage 3", "local_copy_gbps", false));
  plan::RowPlacement rp3 = rp;
  rp3.stage = 3;
  in.rates.local_copy_gbps = 1.0;
  auto row3 = plan::plan_row(in, rp3);
  const double added = med3.wall - med.wall;
  if (row3.is_ok() && added >= 1e-3) {
    const double at_1gbps = row3->cost.critical_s[static_cast<int>(plan::Resource::kPcie)];
    if (at_1gbps > 0) r.local_copy_gbps = at_1gbps / added;
  }
  return r;
}

// Host memory copy GB/s (a copy's read and write counted): zoe's CPU device's "host <-> device"
// and device-memory rate, at the size of the model's largest module in the compute dtype (2 bytes
// an element), within [1 MiB, 64 MiB]: the engine copies a module at a time, and a small model's
// modules stay in the caches, where copies run several times faster than through DRAM.
double measure_memcpy(const plan::ModelDesc& m) {
  size_t largest = 0;
  for (const auto& mod : m.modules) {
    size_t e = 0;
    for (size_t x : mod.param_numel) e += x;
    largest = std::max(largest, e * 2);
  }
  const size_t n = std::clamp<size_t>(largest, size_t{1} << 20, size_t{64} << 20);
  std::vector<char> a(n, 1), b(n, 0);
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {
    const uint64_t t0 = now_ns();
    memcpy(b.data(), a.data(), n);
    best = std::min(best, static_cast<double>(now_ns() - t0) * 1e-9);
  }
  return 2.0 * static_cast<double>(n) / best / 1e9;  // read + write
}

// The model steps' rates (measure_train) at --micro-batch, then at the other micro-batches the
// search may choose, then the first again: r's flops, flops_by_micro_batch and their spreads.
// kUnsupported when a timing does not settle or the first rate drifted (the machine's speed changed
// while it was measured).
Result<TrainRates> measure_model_rates(const plan::PlanInputs& pre, const RepeatPolicy& pol,
                                       plan::LinkRates* r, Progress* progress) {
  ZOE_ASSIGN_OR_RETURN(const TrainRates tr,
                       measure_train(pre, pre.work.micro_batch, true, pol, &r->spread, progress));
  if (tr.flops > 0) {
    r->flops = tr.flops;
  } else {
    ZOE_ASSIGN_OR_RETURN(r->flops, measure_flops(pre.model, pre.work, pol, &r->spread, progress));
  }
  if (tr.flops > 0) {
    // The other micro-batches tune's search may choose (those dividing micro x accumulation, with
    // at most 16 micro-batches a step; at most 6 of them, nearest first): a GEMM's rate depends on
    // its row count, and a step of 2 x 4 sequences is slower than one of 8.
    r->flops_by_micro_batch.emplace_back(pre.work.micro_batch, tr.flops);
    const int64_t total = pre.work.micro_batch * pre.work.grad_accum;
    std::vector<int64_t> others;
    for (int64_t d = 1; d <= total; ++d) {
      if (total % d == 0 && d != pre.work.micro_batch && total / d <= 16) others.push_back(d);
    }
    std::sort(others.begin(), others.end(), [&](int64_t a, int64_t b) {
      const auto dist = [&](int64_t x) {
        return std::abs(std::log(static_cast<double>(x) / pre.work.micro_batch));
      };
      return dist(a) < dist(b);
    });
    if (others.size() > 6) others.resize(6);
    for (int64_t d : others) {
      ZOE_ASSIGN_OR_RETURN(const TrainRates t, measure_train(pre, d, false, pol, &r->spread, progress));
      if (t.flops > 0) r->flops_by_micro_batch.emplace_back(d, t.flops);
    }
    // The machine's speed must hold through the calibration: the first rate, measured again last,
    // agrees with itself (a process that starts meanwhile, a clock that drops, would leave rates
    // measured at two speeds, each steady on its own).
    ZOE_ASSIGN_OR_RETURN(const TrainRates again,
                         measure_train(pre, pre.work.micro_batch, false, pol, &r->spread, progress));
    const std::string what = fmt("flops@%lld", static_cast<long long>(pre.work.micro_batch));
    // The repeat's own spread is not reported again: its drift is what it measures.
    if (!r->spread.empty() && r->spread.back().first == what) r->spread.pop_back();
    if (again.flops > 0) {
      ZOE_RETURN_IF_ERROR(plan::check_drift(tr.flops, again.flops, pol.max_spread, what));
      r->spread.emplace_back(what + ":drift", plan::two_spread(tr.flops, again.flops));
    }
  }
  return tr;
}

}  // namespace

plan::LinkRates calibrate(const TuneOpts& o, const plan::PlanInputs& pre) {
  Progress progress(true);
  plan::LinkRates r;
  const std::string dir = value_or_fail(plan::local_nvme_dir(o.plan));
  const uint64_t bytes = value_or_fail(parse_bytes(o.calibrate_bytes)) / 4096 * 4096;
  if (bytes < (16u << 20))
    fail(invalid_argument("--calibrate-bytes %s: at least 16MiB", o.calibrate_bytes.c_str()));
  Status fits = check_steps_fit(pre, pre.work.micro_batch);  // before minutes of measuring
  if (!fits.is_ok()) fail(fits);
  // The drive is measured last (below); its directory is checked now.
  Status holds = check_dir_holds_files(
      o.plan.nvme_path.empty() ? "the default NVMe directory ($ZOE_SCRATCH or /var/tmp; give --nvme-path)"
                               : "--nvme-path",
      dir);
  if (!holds.is_ok()) fail(holds.with_context("calibrating NVMe reads and writes"));
  progress.update("calibrate: CPU Adam");
  optim::bench::Config ac;
  ac.params = size_t{16} << 20;
  ac.out_dtype = DType::kBF16;
  ac.repeats = 3;
  auto adam = optim::bench::run(ac);
  if (!adam.is_ok()) fail(adam.status().with_context("calibrating CPU Adam"));
  r.cpu_adam_gbps = adam->fused_gbps();
  // The rates `zoe train` sees where the model fits in memory here, else its kernels' rate and
  // the benchmarks'.
  RepeatPolicy pol;
  pol.max_spread = o.calibrate_max_spread;
  auto refused = [&](const Status& s) {
    progress.done();
    fail(s.with_context(o.calibration_out.empty()
                            ? std::string("calibrating")
                            : "calibrating (nothing is written to " + o.calibration_out + ")"));
  };
  // A timing that does not settle, or a first rate that drifted, is measured again (the whole set:
  // on a virtual machine the host's own work comes and goes), three times at most; then refused.
  constexpr int kAttempts = 3;
  Result<TrainRates> tr = TrainRates{};
  for (int a = 1; a <= kAttempts; ++a) {
    plan::LinkRates tmp = r;
    tr = measure_model_rates(pre, pol, &tmp, &progress);
    if (tr.is_ok()) {
      r = std::move(tmp);
      break;
    }
    if (tr.status().code() != StatusCode::kUnsupported || a == kAttempts) refused(tr.status());
    progress.done();
    // The refusal's advice (a quiet machine) is for the last attempt; before it, what happened.
    std::string what = tr.status().message();
    what = what.substr(0, what.find("; run it on a quiet machine"));
    fprintf(stderr, "zoe tune: %s\n  measuring the model steps again (attempt %d of %d)\n", what.c_str(),
            a + 1, kAttempts);
  }
  r.h2d_gbps = r.device_mem_gbps = measure_memcpy(pre.model);
  if (tr->engine_gbps > 0 && !pre.cuda) {
    // The CPU device's memory is host memory: its update and accumulation are the same CPU work
    // as the offloaded optimizer's, at the rate measured through the engine.
    r.cpu_adam_gbps = r.device_mem_gbps = tr->engine_gbps;
  }
  if (tr->local_copy_gbps > 0 && !pre.cuda) r.local_copy_gbps = tr->local_copy_gbps;
  // The drive last: writing gigabytes leaves a virtual machine's host flushing them for a while
  // after, and the cores run slower meanwhile (13 % measured on a 2-vCPU VM: the model steps right
  // after the sweep were slower than the same steps 20 s later, and than zoe train's). The model
  // steps come first, on a machine the calibration has not yet disturbed.
  io::Extent ext;
  auto sf = lay_out(dir, bytes, &ext, &progress);
  if (!sf.is_ok()) fail(sf.status().with_context("calibrating NVMe reads and writes"));
  auto sweep = sweep_nvme(**sf, ext, dir, &progress);
  if (!sweep.is_ok()) fail(sweep.status().with_context("calibrating NVMe reads and writes"));
  r.io_sweep = std::move(sweep).value();
  const plan::IoPoint& best = best_io_point(r.io_sweep);
  r.nvme_read_gbps = best.read_gbps;
  r.nvme_write_gbps = best.write_gbps;
  r.aio_block_size = best.block_size;
  r.aio_queue_depth = best.queue_depth;
  if (!pre.cuda) {  // zoe's CPU device: the cores the I/O takes time from are the compute's
    auto cost = measure_nvme_cpu(**sf, ext, best, pre.model, pre.work, &progress);
    if (!cost.is_ok()) fail(cost.status().with_context("calibrating the CPU cost of NVMe I/O"));
    // Unseen (under 1 % of the kernels' time): an I/O rate far above the drive's, so it costs ~0.
    r.nvme_cpu_gbps = *cost > 0 ? *cost : 1000.0;
  }
  sf->reset();
  // Under a launch of several ranks (mpirun, srun): the collectives' rate, across nodes when the
  // ranks span several, else inside this one.
  const NetworkRate net = measure_network(runtime(), pre, &progress);
  if (net.gbps > 0) {
    (net.nodes > 1 ? r.net_gbps : r.intra_gbps) = net.gbps;
    if (net.nodes > 1 && net.latency_us > 0) r.net_latency_us = net.latency_us;
    fprintf(stderr, "zoe tune: collectives across %d rank(s) on %d node(s): %.3f GB/s bus bandwidth (%s)%s\n",
            net.ranks, net.nodes, net.gbps, net.nodes > 1 ? "net_gbps" : "intra_gbps",
            net.nodes > 1 && net.latency_us > 0
                ? fmt(" + %.0f us per collective (net_latency_us)", net.latency_us).c_str()
                : "");
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  r.host = host;
  progress.done();
  return r;
}

}  // namespace zoe::cli::tune
