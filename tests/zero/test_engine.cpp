// The engine's correctness matrix: stage {0,1,2,3} x optimizer offload {none,cpu,nvme} x parameter
// offload {none,cpu,nvme} (stage 3) x {fp32,bf16,fp16}, at this process's world size (1 here,
// 2 and 4 under mpirun). Every run trains a small MLP for a few steps and must
//  - match a dense single-process fp32 AdamW reference within the stated tolerance, and
//  - give bit-identical master parameters to the no-offload run of the same stage and precision.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "comm/communicator.h"
#include "config/config.h"
#include "core/clock.h"
#include "core/log.h"
#include "device/device.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"
#include "tests/zero/mlp.h"
#include "tests/zero/shared_runtime.h"
#include "zero/engine_internal.h"
#include "zero/test_hooks.h"

namespace zoe {
namespace {

using test::Layer;
using test::MlpSpec;

Runtime& runtime() { return test::shared_runtime(); }

using Placement = test::MatrixPlacement;
std::vector<Placement> placements() { return test::matrix_placements(); }

std::string make_config(const Placement& pl, const std::string& precision, const std::string& nvme,
                        int micro = 1, const std::string& extra_fp16 = "",
                        const std::string& extra_top = "") {
  char buf[2048];
  std::string prec;
  if (precision == "bf16") prec = "\"bf16\": {\"enabled\": true},";
  if (precision == "fp16")
    prec = "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 8" + extra_fp16 + "},";
  auto off = [&](const char* dev) {
    std::string s = std::string("{\"device\": \"") + dev + "\"";
    if (std::string(dev) == "nvme") s += ", \"nvme_path\": \"" + nvme + "\"";
    return s + "}";
  };
  snprintf(buf, sizeof(buf),
           "{%s \"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": %d, %s"
           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"betas\": [0.9, 0.999], "
           "\"eps\": 1e-8,"
           " \"weight_decay\": 0.01}},"
           " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0,"
           " \"offload_optimizer\": %s, \"offload_param\": %s},"
           " \"zoe\": {\"device_budget\": \"64MiB\", \"optimizer_threads\": 1}}",
           extra_top.c_str(), micro, prec.c_str(), pl.stage, off(pl.opt).c_str(),
           pl.stage == 3 ? off(pl.param).c_str() : "{\"device\": \"none\"}");
  return buf;
}

// zoe.overlap_step for the runs below (the default: on); the overlap test turns it off.
bool g_overlap = true;

Result<std::vector<Layer>> run(const Placement& pl, const std::string& precision, const MlpSpec& s, int steps,
                               std::vector<StepStats>* stats = nullptr, int inject = -1, int micro = 1,
                               const std::string& extra_fp16 = "", const std::string& extra_top = "") {
  Runtime& rt = runtime();
  test::ScratchDir nvme("nvme");
  auto cfg = config::Config::parse(make_config(pl, precision, nvme.path(), micro, extra_fp16, extra_top),
                                   rt.world_size());
  if (!cfg.is_ok()) return cfg.status();
  cfg.value().zoe.overlap_step = g_overlap;
  ZOE_ASSIGN_OR_RETURN(auto e, zero::create_engine(rt, cfg.value()));
  ZOE_RETURN_IF_ERROR(test::register_mlp(*e, s));
  std::vector<Layer> out;
  ZOE_RETURN_IF_ERROR(
      test::engine_train(*e, s, rt.rank(), rt.world_size(), steps, &out, stats, inject, micro));
  return out;
}

// Runs the MLP with make_config's text edited by `edit` (keys inserted into its sections).
Result<std::vector<Layer>> run_edited(const Placement& pl, const std::string& precision, const MlpSpec& s,
                                      int steps, const std::function<void(std::string&)>& edit,
                                      std::vector<StepStats>* stats, int micro = 1,
                                      bool eval_passes = false) {
  Runtime& rt = runtime();
  test::ScratchDir nvme("nvme");
  std::string text = make_config(pl, precision, nvme.path(), micro);
  edit(text);
  ZOE_ASSIGN_OR_RETURN(auto cfg, config::Config::parse(text, rt.world_size()));
  cfg.zoe.overlap_step = g_overlap;
  ZOE_ASSIGN_OR_RETURN(auto e, zero::create_engine(rt, cfg));
  ZOE_RETURN_IF_ERROR(test::register_mlp(*e, s));
  std::vector<Layer> out;
  ZOE_RETURN_IF_ERROR(
      test::engine_train(*e, s, rt.rank(), rt.world_size(), steps, &out, stats, -1, micro, 0, eval_passes));
  return out;
}

void insert_before(std::string& text, const std::string& key, const std::string& what) {
  size_t at = text.find("\"" + key + "\"");
  ASSERT_NE(at, std::string::npos) << key;
  text.insert(at, what);
}

// Rank 0's `mine`, on every rank (e.g. one checkpoint directory for all).
std::string rank0_string(Runtime& rt, std::string mine) {
  int64_t n = static_cast<int64_t>(mine.size());
  EXPECT_OK(zero::runtime_comm(rt).broadcast(&n, 1, comm::CommType::kI64, 0).wait());
  mine.resize(static_cast<size_t>(n));
  EXPECT_OK(zero::runtime_comm(rt).broadcast(mine.data(), mine.size(), comm::CommType::kU8, 0).wait());
  return mine;
}

struct Diff {
  double max_abs = 0, mean_abs = 0;
  bool identical = true;
};
Diff compare(const std::vector<Layer>& a, const std::vector<Layer>& b) {
  Diff d;
  size_t n = 0;
  for (size_t l = 0; l < a.size(); ++l) {
    for (int which = 0; which < 2; ++which) {
      const auto& x = which ? a[l].b : a[l].w;
      const auto& y = which ? b[l].b : b[l].w;
      if (memcmp(x.data(), y.data(), x.size() * 4) != 0) d.identical = false;
      for (size_t i = 0; i < x.size(); ++i) {
        double e = std::fabs(static_cast<double>(x[i]) - y[i]);
        d.max_abs = std::max(d.max_abs, e);
        d.mean_abs += e;
        ++n;
      }
    }
  }
  d.mean_abs /= static_cast<double>(std::max<size_t>(n, 1));
  return d;
}

// Tolerances against the dense fp32 reference after 3 steps with lr 0.01. fp32 differs only by
// summation order. With 16-bit compute an element whose gradient is tiny can take a step of the
// other sign (Adam normalises: +-lr per step), so the bound on the largest difference is
// 2 x lr x steps, and the mean difference must stay small.
struct Tolerance {
  double max_abs, mean_abs;
};
Tolerance tolerance(const std::string& precision) {
  if (precision == "fp32") return {2e-4, 2e-5};
  return {2 * 0.01 * 3 + 1e-3, 4e-3};
}

TEST(EngineMatrix, EveryPlacementMatchesReferenceAndNoOffloadBitForBit) {
  Runtime& rt = runtime();
  MlpSpec s;
  const int steps = 3;
  auto ref = test::reference_train(s, rt.world_size(), steps);
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    std::map<int, std::vector<Layer>> baseline;  // per stage: offload none/none
    for (const Placement& pl : placements()) {
      std::string what = "world " + std::to_string(rt.world_size()) + " " + precision + " stage " +
                         std::to_string(pl.stage) + " optimizer " + pl.opt + " params " + pl.param;
      std::vector<StepStats> stats;
      auto r = run(pl, precision, s, steps, &stats);
      ASSERT_OK(r) << what;
      for (const auto& st : stats) EXPECT_FALSE(st.skipped) << what;
      Diff dr = compare(r.value(), ref);
      Tolerance tol = tolerance(precision);
      EXPECT_LE(dr.max_abs, tol.max_abs) << what << " vs the dense reference";
      EXPECT_LE(dr.mean_abs, tol.mean_abs) << what << " vs the dense reference";
      if (!baseline.count(pl.stage)) {
        baseline[pl.stage] = r.value();
      } else {
        Diff db = compare(r.value(), baseline[pl.stage]);
        EXPECT_TRUE(db.identical) << what << " differs from the no-offload run (max " << db.max_abs << ")";
      }
      if (rt.rank() == 0) {
        printf("[matrix] %-60s max %.2e mean %.2e vs reference\n", what.c_str(), dr.max_abs, dr.mean_abs);
      }
    }
  }
}

// The overlapped step (the update behind the next forward) gives the serial step's bits for every
// placement and precision, with evaluation passes that reach modules before their update is done,
// gradient accumulation, and an fp16 overflow (a skipped step) while the pipeline is in flight.
TEST(EngineOverlap, OverlappedStepGivesTheSerialBitsForEveryPlacement) {
  Runtime& rt = runtime();
  MlpSpec s;
  const int steps = 4;
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    for (const Placement& pl : placements()) {
      const std::string what = "world " + std::to_string(rt.world_size()) + " " + precision + " stage " +
                               std::to_string(pl.stage) + " optimizer " + pl.opt + " params " + pl.param;
      auto edit = [](std::string&) {};
      const int inject = precision == "fp16" ? 2 : -1;  // an overflow at step 2: skipped, scale halved
      std::vector<StepStats> st_serial, st_overlap;
      g_overlap = false;
      auto serial = pl.stage == 3
                        ? run_edited(pl, precision, s, steps, edit, &st_serial, 1, /*eval_passes=*/true)
                        : run(pl, precision, s, steps, &st_serial, inject);
      g_overlap = true;
      auto overlap = pl.stage == 3 ? run_edited(pl, precision, s, steps, edit, &st_overlap, 1, true)
                                   : run(pl, precision, s, steps, &st_overlap, inject);
      ASSERT_OK(serial) << what;
      ASSERT_OK(overlap) << what;
      Diff d = compare(serial.value(), overlap.value());
      EXPECT_TRUE(d.identical) << what << ": overlapped differs from serial (max " << d.max_abs << ")";
      ASSERT_EQ(st_serial.size(), st_overlap.size());
      for (size_t k = 0; k < st_serial.size(); ++k) {
        EXPECT_EQ(st_serial[k].grad_norm, st_overlap[k].grad_norm) << what << " step " << k;
        EXPECT_EQ(st_serial[k].skipped, st_overlap[k].skipped) << what << " step " << k;
        EXPECT_EQ(st_serial[k].loss_scale, st_overlap[k].loss_scale) << what << " step " << k;
        EXPECT_EQ(st_serial[k].t_update_overlapped, 0.0) << what;
      }
      if (inject >= 0 && pl.stage != 3) {
        EXPECT_TRUE(st_overlap[inject].skipped) << what;
      }
      double behind = 0;
      for (const auto& st : st_overlap) behind += st.t_update_overlapped;
      EXPECT_GT(behind, 0.0) << what << ": no update ran behind a forward";
    }
  }
  g_overlap = true;
}

// The device ops' stream contract (zero/device_ops.h): every op may still be pending when it
// returns, and the engine synchronizes before any other agent touches what an op reads or writes.
// In the deferred mode the CPU ops run only at synchronize(), so a hand-off the engine forgot reads
// stale bytes here as it would on a GPU. Every placement and precision, serial and overlapped, with
// accumulation, reduce buckets (the packed reduce-scatter), evaluation passes (stage 3) and clipping,
// then fp16 with an overflow (a skipped step), must give the eager run's bits and statistics.
// Checkpoint.ResumeIsBitIdentical runs its saves and loads in this mode too.
TEST(EngineMatrix, DeferredDeviceOpsGiveTheEagerBits) {
  Runtime& rt = runtime();
  MlpSpec s;
  s.clip = 0.05;
  const int steps = 3;
  struct Restore {
    ~Restore() {
      zero::set_deferred_device_ops(false);
      g_overlap = true;
    }
  } restore;
  auto edit = [](std::string& t) {
    insert_before(t, "train_micro_batch_size_per_gpu", "\"gradient_clipping\": 0.05, ");
    insert_before(t, "stage3_param_persistence_threshold", "\"reduce_bucket_size\": 1000, ");
  };
  for (const std::string precision : {"fp32", "bf16", "fp16"}) {
    for (const Placement& pl : placements()) {
      for (bool overlap : {false, true}) {
        const std::string what = "world " + std::to_string(rt.world_size()) + " " + precision + " stage " +
                                 std::to_string(pl.stage) + " optimizer " + pl.opt + " params " + pl.param +
                                 (overlap ? " overlapped" : " serial");
        g_overlap = overlap;
        std::vector<StepStats> st_eager, st_deferred;
        zero::set_deferred_device_ops(false);
        auto eager = run_edited(pl, precision, s, steps, edit, &st_eager, /*micro=*/2, pl.stage == 3);
        zero::set_deferred_device_ops(true);
        auto deferred = run_edited(pl, precision, s, steps, edit, &st_deferred, 2, pl.stage == 3);
        zero::set_deferred_device_ops(false);
        ASSERT_OK(eager) << what;
        ASSERT_OK(deferred) << what;
        Diff d = compare(eager.value(), deferred.value());
        EXPECT_TRUE(d.identical) << what << ": deferred device ops differ (max " << d.max_abs << ")";
        ASSERT_EQ(st_eager.size(), st_deferred.size()) << what;
        for (size_t k = 0; k < st_eager.size(); ++k) {
          EXPECT_EQ(st_eager[k].grad_norm, st_deferred[k].grad_norm) << what << " step " << k;
          EXPECT_EQ(st_eager[k].skipped, st_deferred[k].skipped) << what << " step " << k;
        }
      }
    }
  }
  // fp16 with an overflow at step 2 (skipped, scale halved), serial and overlapped.
  for (const Placement& pl : placements()) {
    for (bool overlap : {false, true}) {
      const std::string what = "fp16 overflow, stage " + std::to_string(pl.stage) + " optimizer " + pl.opt +
                               " params " + pl.param + (overlap ? " overlapped" : " serial");
      g_overlap = overlap;
      std::vector<StepStats> st_eager, st_deferred;
      zero::set_deferred_device_ops(false);
      auto eager = run(pl, "fp16", s, 4, &st_eager, /*inject=*/2);
      zero::set_deferred_device_ops(true);
      auto deferred = run(pl, "fp16", s, 4, &st_deferred, 2);
      zero::set_deferred_device_ops(false);
      ASSERT_OK(eager) << what;
      ASSERT_OK(deferred) << what;
      EXPECT_TRUE(compare(eager.value(), deferred.value()).identical) << what;
      ASSERT_EQ(st_eager.size(), st_deferred.size()) << what;
      EXPECT_TRUE(st_deferred[2].skipped) << what;
      for (size_t k = 0; k < st_eager.size(); ++k) {
        EXPECT_EQ(st_eager[k].loss_scale, st_deferred[k].loss_scale) << what << " step " << k;
        EXPECT_EQ(st_eager[k].skipped, st_deferred[k].skipped) << what << " step " << k;
      }
    }
  }
}

// --trace: the caller's compute, the optimizer's chunks and NVMe reads/writes, the gathers and the
// tier manager's transfers land on separate, named tracks (what a person opening it in Perfetto
// needs to see the overlap).
TEST(EngineTrace, TracksForComputeOptimizerIoAndGathers) {
  Runtime& rt = runtime();
  test::ScratchDir nvme("trace");
  auto cfg = config::Config::parse(make_config({3, "nvme", "nvme"}, "bf16", nvme.path()), rt.world_size());
  ASSERT_OK(cfg);
  auto e = zero::create_engine(rt, cfg.value());
  ASSERT_OK(e);
  MlpSpec s;
  ASSERT_OK(test::register_mlp(*e.value(), s));
  e.value()->enable_trace(true);
  std::vector<Layer> out;
  ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &out));
  e.value()->record_compute("forward", now_ns() - 1000, now_ns());
  const std::string path = nvme.path() + "/trace.json";
  ASSERT_OK(e.value()->write_trace(path));
  std::ifstream f(path);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* track : {"compute (forward/backward)", "optimizer chunks", "optimizer NVMe reads",
                            "optimizer NVMe writes", "parameter gathers", "nvme->device"}) {
    EXPECT_NE(text.find(std::string("\"name\":\"") + track + "\""), std::string::npos)
        << "no track " << track;
  }
}

// Gradient accumulation over two micro-batches with the pipeline in flight.
TEST(EngineOverlap, AccumulationWithTheUpdateBehind) {
  MlpSpec s;
  for (const Placement& pl :
       {Placement{2, "cpu", "none"}, Placement{3, "nvme", "nvme"}, Placement{1, "none", "none"}}) {
    g_overlap = false;
    auto serial = run(pl, "bf16", s, 3, nullptr, -1, /*micro=*/2);
    g_overlap = true;
    auto overlap = run(pl, "bf16", s, 3, nullptr, -1, /*micro=*/2);
    ASSERT_TRUE(serial.is_ok() && overlap.is_ok());
    EXPECT_TRUE(compare(serial.value(), overlap.value()).identical) << "stage " << pl.stage << " " << pl.opt;
  }
}

TEST(Engine, GradientAccumulation) {
  Runtime& rt = runtime();
  MlpSpec s;
  auto ref = test::reference_train(s, rt.world_size(), 2, /*micro=*/2);
  for (const Placement& pl : {Placement{2, "cpu", "none"}, Placement{3, "nvme", "nvme"}}) {
    auto r = run(pl, "fp32", s, 2, nullptr, -1, /*micro=*/2);
    ASSERT_OK(r);
    Diff d = compare(r.value(), ref);
    EXPECT_LE(d.max_abs, 2e-4) << "stage " << pl.stage;
  }
}

TEST(Engine, ReduceBucketsDoNotChangeResults) {
  // Gradients reduced in buckets of 1000 elements (many per module) equal one collective per module.
  MlpSpec s;
  for (const Placement& pl :
       {Placement{1, "cpu", "none"}, Placement{2, "none", "none"}, Placement{3, "nvme", "cpu"}}) {
    auto whole = run(pl, "bf16", s, 2);
    ASSERT_OK(whole);
    auto out = run_edited(
        pl, "bf16", s, 2,
        [](std::string& t) {
          insert_before(t, "stage3_param_persistence_threshold", "\"reduce_bucket_size\": 1000, ");
        },
        nullptr);
    ASSERT_OK(out);
    EXPECT_TRUE(compare(out.value(), whole.value()).identical) << "stage " << pl.stage;
  }
}

// The device bytes a run needs beyond what it keeps resident: the high-water mark of training
// (stage `stage`, optimizer states on the host, stage-3 partitions in `param` (the device by
// default), nothing prefetched) less the bytes in use after initialize().
struct WorkingSet {
  uint64_t resident = 0, high_water = 0;
  std::vector<Layer> out;
};
Result<WorkingSet> train_for_working_set(int stage, const MlpSpec& s, int64_t reduce_bucket,
                                         const char* param = "none") {
  Runtime& rt = runtime();
  test::ScratchDir nvme("nvme");
  std::string text = make_config({stage, "cpu", param}, "fp32", nvme.path());
  text.insert(
      text.find("\"stage3_param_persistence_threshold\""),
      "\"reduce_bucket_size\": " + std::to_string(reduce_bucket) + ", \"stage3_prefetch_bucket_size\": 0, ");
  ZOE_ASSIGN_OR_RETURN(auto cfg, config::Config::parse(text, rt.world_size()));
  ZOE_ASSIGN_OR_RETURN(auto e, zero::create_engine(rt, cfg));
  ZOE_RETURN_IF_ERROR(test::register_mlp(*e, s));
  WorkingSet ws;
  ws.resident = e->memory_in_use().device;
  std::vector<StepStats> stats;
  ZOE_RETURN_IF_ERROR(test::engine_train(*e, s, rt.rank(), rt.world_size(), 2, &ws.out, &stats));
  ws.high_water = stats.back().high_water[0];
  return ws;
}

// A module in use needs its gathered parameters (stage 3; at world size 1 the partition is served
// in place, with no gathered copy) and its gradient buffer on the device, the reduction running in
// place in that buffer (with reduce buckets smaller than a partition, plus two bucket-packed send
// buffers), the next module's gradients allocated only once the reduction is accumulated, and
// nothing reduced at world size 1. Results are those of one collective per module, bit for bit,
// and the reference's.
TEST(EngineMemory, AModuleInUseNeedsItsParametersGradientsAndOneBucketPair) {
  Runtime& rt = runtime();
  MlpSpec s;
  s.d = 96;
  const size_t world = static_cast<size_t>(rt.world_size());
  const size_t unit = 2048 * world, elems = static_cast<size_t>(s.d * s.d + s.d);
  const size_t padded = (elems + unit - 1) / unit * unit, part = padded / world;
  const uint64_t module_bytes = padded * 4;
  auto ref = test::reference_train(s, rt.world_size(), 2);
  for (int stage : {1, 2, 3}) {
    std::vector<Layer> whole;
    for (int64_t bucket : {int64_t{500000000}, int64_t{2048}}) {
      const std::string what = "world " + std::to_string(world) + " stage " + std::to_string(stage) +
                               " reduce_bucket_size " + std::to_string(bucket);
      auto ws = train_for_working_set(stage, s, bucket);
      ASSERT_OK(ws) << what;
      const size_t per_rank = std::max<size_t>(1, static_cast<size_t>(bucket) / world);
      const uint64_t packs = stage >= 2 && world > 1 && per_rank < part ? 2 * per_rank * world * 4 : 0;
      const uint64_t in_use = ws->high_water - ws->resident;
      const uint64_t bound = (stage == 3 && world > 1 ? 2 : 1) * module_bytes + packs;
      printf(
          "%s: module %llu bytes, device beyond the resident states %llu bytes (%.2f modules), bound %llu\n",
          what.c_str(), static_cast<unsigned long long>(module_bytes),
          static_cast<unsigned long long>(in_use),
          static_cast<double>(in_use) / static_cast<double>(module_bytes),
          static_cast<unsigned long long>(bound));
      EXPECT_LE(in_use, bound) << what;
      EXPECT_LE(compare(ws->out, ref).max_abs, 2e-4) << what;
      if (whole.empty()) {
        whole = ws->out;
      } else {
        EXPECT_TRUE(compare(ws->out, whole).identical) << what;
      }
    }
  }
}

// Stage 3 with the partitions offloaded (host memory, NVMe): the device holds the module in use's
// parameters and its gradients, with the partition it reads them from. At world size 1 the
// partition is the parameters (served in place): two modules in all, where a gathered copy made it
// three. Beyond one world size: the gathered module, its gradients, and the tier manager's share of
// two partitions in flight (each 1/world of a module). The bound is the high-water mark less what
// initialize() left in use, and the results are the reference's and the device-homed run's bits.
TEST(EngineMemory, AtStage3TheOffloadedWorkingSetIsTwoModulesAndThePartition) {
  Runtime& rt = runtime();
  MlpSpec s;
  s.d = 96;
  const size_t world = static_cast<size_t>(rt.world_size());
  const size_t unit = 2048 * world, elems = static_cast<size_t>(s.d * s.d + s.d);
  const size_t padded = (elems + unit - 1) / unit * unit;
  const uint64_t module_bytes = padded * 4, part_bytes = module_bytes / world;
  auto ref = test::reference_train(s, rt.world_size(), 2);
  auto home = train_for_working_set(3, s, 500000000, "none");
  ASSERT_OK(home);
  for (const char* param : {"cpu", "nvme"}) {
    const std::string what = "world " + std::to_string(world) + " offload_param " + param;
    auto ws = train_for_working_set(3, s, 500000000, param);
    ASSERT_OK(ws) << what;
    const uint64_t in_use = ws->high_water - ws->resident;
    const uint64_t bound = 2 * module_bytes + (world > 1 ? 2 * part_bytes : 0);
    printf("%s: module %llu bytes, device beyond the resident states %llu bytes (%.2f modules), bound %llu\n",
           what.c_str(), static_cast<unsigned long long>(module_bytes),
           static_cast<unsigned long long>(in_use),
           static_cast<double>(in_use) / static_cast<double>(module_bytes),
           static_cast<unsigned long long>(bound));
    EXPECT_LE(in_use, bound) << what;
    EXPECT_LE(compare(ws->out, ref).max_abs, 2e-4) << what;
    EXPECT_TRUE(compare(ws->out, home->out).identical) << what;
  }
}

// A performance hint whose value does not fit the device budget never fails the run: the planner
// uses what fits and says so once, naming the key, and the run trains to the bits of a run with a
// value that fits. (Values no other test uses: the warning is once per process.)
TEST(EngineHints, HintsThatDoNotFitAreLoweredWithOneWarningEach) {
  Runtime& rt = runtime();
  MlpSpec s;
  s.d = 96;
  const size_t world = static_cast<size_t>(rt.world_size());
  const size_t unit = 2048 * world, padded = (static_cast<size_t>(s.d * s.d + s.d) + unit - 1) / unit * unit;
  struct Case {
    int stage;
    const char* key;
    int64_t given, fitting;
    uint64_t budget;             // zoe.device_budget; 0: make_config's
    const char* param = "none";  // offload_param.device
  };
  std::vector<Case> cases = {
      // Queued gathers (at world size 1, partitions moved ahead) of 4e7 elements: far beyond 64 MiB.
      {3, "stage3_prefetch_bucket_size", 40000001, static_cast<int64_t>(2 * padded), 0, "cpu"},
      // Below one module: the module in use must be live.
      {3, "stage3_max_live_parameters", 1001, 1000000000, 0},
  };
  if (world > 1) {
    // Two bucket-packed buffers of nearly a module each, with room for half a module beside the
    // parameters (all three modules) and one module's gradients.
    cases.push_back({2, "reduce_bucket_size", 12001, 500000000, (3 * padded + padded + padded / 2) * 4});
  }
  for (const Case& c : cases) {
    auto with = [&](int64_t value) {
      return [&c, value](std::string& t) {
        insert_before(t, "stage3_param_persistence_threshold",
                      "\"" + std::string(c.key) + "\": " + std::to_string(value) + ", ");
        if (c.budget) {
          const std::string from = "\"device_budget\": \"64MiB\"";
          t.replace(t.find(from), from.size(), "\"device_budget\": " + std::to_string(c.budget));
        }
      };
    };
    const LogLevel level = log_level();
    set_log_level(LogLevel::kWarn);
    testing::internal::CaptureStderr();
    auto lowered = run_edited({c.stage, "cpu", c.param}, "fp32", s, 2, with(c.given), nullptr);
    std::string err = testing::internal::GetCapturedStderr();
    set_log_level(level);
    ASSERT_OK(lowered) << c.key;
    const std::string said =
        "zero_optimization." + std::string(c.key) + " is " + std::to_string(c.given) + "; zoe uses ";
    size_t n = 0;
    for (size_t at = err.find(said); at != std::string::npos; at = err.find(said, at + 1)) ++n;
    EXPECT_EQ(n, 1u) << c.key << "\n" << err;
    auto fitting = run_edited({c.stage, "cpu", c.param}, "fp32", s, 2, with(c.fitting), nullptr);
    ASSERT_OK(fitting) << c.key;
    EXPECT_TRUE(compare(lowered.value(), fitting.value()).identical) << c.key;
  }
}

TEST(Engine, GradientClipping) {
  Runtime& rt = runtime();
  MlpSpec s;
  s.clip = 0.05;
  auto ref = test::reference_train(s, rt.world_size(), 3);
  MlpSpec unclipped;
  auto ref_free = test::reference_train(unclipped, rt.world_size(), 3);
  ASSERT_GT(compare(ref, ref_free).max_abs, 1e-3) << "the clip must bite for this test to mean anything";
  std::vector<Layer> first;
  for (const Placement& pl : {Placement{2, "none", "none"}, Placement{3, "nvme", "cpu"}}) {
    std::vector<StepStats> stats;
    auto r = run(pl, "fp32", s, 3, &stats, -1, 1, "", "\"gradient_clipping\": 0.05,");
    ASSERT_OK(r);
    EXPECT_LE(compare(r.value(), ref).max_abs, 2e-4) << "stage " << pl.stage;
    EXPECT_GT(stats[0].grad_norm, 0.05);
    if (first.empty())
      first = r.value();
    else
      EXPECT_TRUE(compare(r.value(), first).identical) << "stage " << pl.stage;
  }
}

// zoe.speculative_step: each module's update runs during the backward as if the step will neither
// clip nor overflow. Both outcomes, for every placement (the speculation applies to states in host
// RAM; the rest update in the step) and micro-batch counts 1 and 2: a clip that never bites (the
// updates stand), one that bites (every speculative update is undone and redone), and fp16 with an
// overflow (undone, step skipped). Every run gives the bits and statistics of the run without it.
TEST(EngineSpeculative, BothOutcomesGiveTheSerialBitsForEveryPlacement) {
  Runtime& rt = runtime();
  MlpSpec s;
  const int steps = 3;
  struct Case {
    const char* precision;
    const char* clip;  // gradient_clipping
    int inject;        // fp16 overflow at this step
    int micro;
    bool stands;  // the speculation stands (else it is undone) at the steps without an overflow
  };
  const Case cases[] = {{"bf16", "1e6", -1, 1, true},
                        {"bf16", "1e-6", -1, 1, false},
                        {"fp32", "0.0", -1, 2, true},
                        {"fp16", "0.0", 1, 1, true}};
  for (const Case& c : cases) {
    for (const Placement& pl : placements()) {
      const std::string what = "world " + std::to_string(rt.world_size()) + " " + c.precision + " clip " +
                               c.clip + " micro " + std::to_string(c.micro) + " stage " +
                               std::to_string(pl.stage) + " optimizer " + pl.opt + " params " + pl.param;
      auto train = [&](bool spec, std::vector<StepStats>* st) -> Result<std::vector<Layer>> {
        test::ScratchDir nvme("nvme");
        std::string text = make_config(pl, c.precision, nvme.path(), c.micro, "",
                                       std::string("\"gradient_clipping\": ") + c.clip + ",");
        if (spec) insert_before(text, "device_budget", "\"speculative_step\": true, ");
        ZOE_ASSIGN_OR_RETURN(auto cfg, config::Config::parse(text, rt.world_size()));
        ZOE_ASSIGN_OR_RETURN(auto e, zero::create_engine(rt, cfg));
        ZOE_RETURN_IF_ERROR(test::register_mlp(*e, s));
        std::vector<Layer> out;
        ZOE_RETURN_IF_ERROR(
            test::engine_train(*e, s, rt.rank(), rt.world_size(), steps, &out, st, c.inject, c.micro));
        return out;
      };
      std::vector<StepStats> st_off, st_on;
      auto off = train(false, &st_off);
      auto on = train(true, &st_on);
      ASSERT_OK(off) << what;
      ASSERT_OK(on) << what;
      Diff d = compare(off.value(), on.value());
      EXPECT_TRUE(d.identical) << what << ": speculative differs from serial (max " << d.max_abs << ")";
      ASSERT_EQ(st_off.size(), st_on.size());
      for (size_t k = 0; k < st_on.size(); ++k) {
        EXPECT_EQ(st_off[k].grad_norm, st_on[k].grad_norm) << what << " step " << k;
        EXPECT_EQ(st_off[k].skipped, st_on[k].skipped) << what << " step " << k;
        EXPECT_EQ(st_off[k].loss_scale, st_on[k].loss_scale) << what << " step " << k;
        EXPECT_EQ(st_off[k].speculative_kept + st_off[k].speculative_undone, 0u) << what;
        // Which modules speculated: those whose states are in host RAM (all of them here).
        const uint64_t modules = std::string(pl.opt) == "cpu" ? static_cast<uint64_t>(s.layers) : 0;
        const bool stands = c.stands && static_cast<int>(k) != c.inject;
        EXPECT_EQ(st_on[k].speculative_kept, stands ? modules : 0) << what << " step " << k;
        EXPECT_EQ(st_on[k].speculative_undone, stands ? 0 : modules) << what << " step " << k;
      }
    }
  }
}

// A read of the states between the backward and step() (read_master, a checkpoint) sees the
// states of the last step taken, not the speculative update; the step then updates from them and
// the run keeps the serial bits. A checkpoint saved there resumes to the same bits too.
TEST(EngineSpeculative, ReadsAndCheckpointsBeforeTheStepSeeTheStepTaken) {
  Runtime& rt = runtime();
  MlpSpec s;
  for (const Placement& pl : {Placement{1, "cpu", "none"}, Placement{3, "cpu", "cpu"}}) {
    const std::string what = "stage " + std::to_string(pl.stage);
    test::ScratchDir ck("ckpt");
    const std::string dir = rank0_string(rt, ck.path());
    std::map<bool, std::vector<float>> mid;
    std::map<bool, std::vector<Layer>> final_bits;
    for (bool spec : {false, true}) {
      test::ScratchDir nvme("nvme");
      std::string text = make_config(pl, "bf16", nvme.path());
      if (spec) insert_before(text, "device_budget", "\"speculative_step\": true, ");
      auto cfg = config::Config::parse(text, rt.world_size());
      ASSERT_OK(cfg);
      auto e = zero::create_engine(rt, cfg.value());
      ASSERT_OK(e);
      ASSERT_OK(test::register_mlp(*e.value(), s));
      Engine& eng = *e.value();
      std::vector<float>& w = mid[spec];
      auto before = [&](int k) -> Status {
        if (k != 1) return Status::ok();
        w.resize(static_cast<size_t>(s.d * s.d));
        ZOE_RETURN_IF_ERROR(eng.read_master(0, 0, w.data()));
        return spec ? eng.save(dir, "mid", "{\"step\": 1}") : Status::ok();
      };
      std::vector<StepStats> st;
      Status r = test::engine_train(eng, s, rt.rank(), rt.world_size(), 3, &final_bits[spec], &st, -1, 1, 0,
                                    false, before);
      ASSERT_OK(r) << what;
      if (spec) {
        // The read and the save undid every speculation made before them (a reduction still in
        // flight at the read may speculate after it, and the save undoes that one).
        EXPECT_EQ(st[1].speculative_kept, 0u) << what << ": the save undid the speculation";
        EXPECT_EQ(st[1].speculative_undone, static_cast<uint64_t>(s.layers)) << what;
        EXPECT_EQ(st[2].speculative_kept, static_cast<uint64_t>(s.layers)) << what;
      }
    }
    EXPECT_EQ(mid[false], mid[true]) << what << ": read_master before the step saw the speculative update";
    EXPECT_TRUE(compare(final_bits[false], final_bits[true]).identical) << what;
    // The checkpoint saved before step 1 resumes at step 1 to the same final bits.
    test::ScratchDir nvme("nvme");
    std::string text = make_config(pl, "bf16", nvme.path());
    insert_before(text, "device_budget", "\"speculative_step\": true, ");
    auto cfg = config::Config::parse(text, rt.world_size());
    ASSERT_OK(cfg);
    auto e = zero::create_engine(rt, cfg.value());
    ASSERT_OK(e);
    ASSERT_OK(test::register_mlp(*e.value(), s));
    auto ts = e.value()->load(dir);
    ASSERT_OK(ts) << what;
    EXPECT_EQ(e.value()->steps_taken(), 1);
    std::vector<Layer> out;
    ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &out, nullptr, -1, 1, 1));
    EXPECT_TRUE(compare(out, final_bits[false]).identical)
        << what << ": resumed from the mid-step checkpoint";
    ASSERT_OK(zero::runtime_comm(rt).barrier());
  }
}

TEST(Engine, Bf16OptimizerStates) {
  // Adam m and v kept in bf16: close to the fp32-state reference, identical across placements.
  Runtime& rt = runtime();
  MlpSpec s;
  auto ref = test::reference_train(s, rt.world_size(), 3);
  std::map<int, std::vector<Layer>> base;
  for (const Placement& pl :
       {Placement{1, "none", "none"}, Placement{1, "nvme", "none"}, Placement{3, "none", "none"},
        Placement{3, "nvme", "nvme"}, Placement{3, "cpu", "cpu"}}) {
    auto r = run(pl, "bf16", s, 3, nullptr, -1, 1, "", "");
    ASSERT_OK(r);
    auto bf = run_edited(
        pl, "bf16", s, 3,
        [](std::string& t) { insert_before(t, "optimizer_threads", "\"bf16_optimizer_states\": true, "); },
        nullptr);
    ASSERT_OK(bf);
    const std::vector<Layer>& out = bf.value();
    Diff d = compare(out, ref);
    Tolerance tol = tolerance("bf16");
    EXPECT_LE(d.max_abs, tol.max_abs);
    EXPECT_LE(d.mean_abs, tol.mean_abs);
    if (!base.count(pl.stage))
      base[pl.stage] = out;
    else
      EXPECT_TRUE(compare(out, base[pl.stage]).identical)
          << "stage " << pl.stage << " " << pl.opt << "/" << pl.param;
  }
}

TEST(Engine, PartialOffloadAndNvmeGradientsMatchNoOffloadBitForBit) {
  // zoe.offload_ratio 0.5 keeps some modules' optimizer states on the device and offloads the
  // others. Layers of 200x200 with sub_group_size 16384 stream each NVMe module's states and
  // gradients (accumulated over 2 micro-batches on NVMe) through the pipeline in several chunks.
  MlpSpec s;
  s.d = 200;
  s.clip = 0.05;  // the clip must bite: the norm, accumulated in pieces, must have the same bits
  const int steps = 2, micro = 2;
  for (const std::string precision : {"fp32", "bf16"}) {
    std::map<int, std::vector<Layer>> base;
    for (int st : {2, 3}) {
      auto r = run_edited(
          {st, "none", "none"}, precision, s, steps,
          [](std::string& t) {
            insert_before(t, "train_micro_batch_size_per_gpu", "\"gradient_clipping\": 0.05, ");
          },
          nullptr, micro);
      ASSERT_OK(r);
      base[st] = r.value();
    }
    for (const Placement& pl : {Placement{2, "cpu", "none"}, Placement{2, "nvme", "none"},
                                Placement{3, "nvme", "nvme"}, Placement{3, "cpu", "nvme"}}) {
      std::map<std::string, uint64_t> nvme_hw;
      for (const char* ratio : {"0.5", "1", "0"}) {
        std::string what = precision + " stage " + std::to_string(pl.stage) + " optimizer " + pl.opt +
                           " params " + pl.param + " ratio " + ratio;
        std::vector<StepStats> stats;
        auto r = run_edited(
            pl, precision, s, steps,
            [&](std::string& t) {
              insert_before(t, "train_micro_batch_size_per_gpu", "\"gradient_clipping\": 0.05, ");
              insert_before(t, "stage3_param_persistence_threshold", "\"sub_group_size\": 16384, ");
              insert_before(t, "optimizer_threads", std::string("\"offload_ratio\": ") + ratio + ", ");
            },
            &stats, micro);
        ASSERT_OK(r) << what;
        EXPECT_TRUE(compare(r.value(), base[pl.stage]).identical)
            << what << " differs from the no-offload run";
        nvme_hw[ratio] = stats.back().high_water[2];
      }
      if (std::string(pl.opt) == "nvme" && std::string(pl.param) == "none") {
        // NVMe holds the offloaded share only: all of it at ratio 1, some at 0.5, none at 0.
        EXPECT_EQ(nvme_hw["0"], 0u) << precision << " stage " << pl.stage;
        EXPECT_GT(nvme_hw["0.5"], 0u) << precision << " stage " << pl.stage;
        EXPECT_LT(nvme_hw["0.5"], nvme_hw["1"]) << precision << " stage " << pl.stage;
      }
    }
  }
}

TEST(Engine, AModuleWithoutGradientsBesideChunksReadAhead) {
  // With NVMe optimizer states the swapper reads the next update's first chunks during the
  // backward, and the gradients of those chunks go straight into its slots. A step in which the
  // first module produces no gradients (its accumulator is zeroed, a write of the gradient state)
  // drops the chunks read ahead: the gradients handed over are written home first, and the
  // result equals the no-offload run's bit for bit (also with one more sub-group chunk a module).
  MlpSpec s;
  s.layers = 4;
  s.no_grads_at = 1;
  const int steps = 3;
  for (const std::string sub : {"100000", "1024"}) {
    auto edit = [&](std::string& t) {
      insert_before(t, "stage3_param_persistence_threshold", "\"sub_group_size\": " + sub + ", ");
    };
    for (const int st : {1, 3}) {
      auto base = run_edited({st, "none", "none"}, "fp32", s, steps, edit, nullptr);
      ASSERT_OK(base);
      for (const char* param : {"none", "nvme"}) {
        if (st == 1 && std::string(param) != "none") continue;
        auto r = run_edited({st, "nvme", param}, "fp32", s, steps, edit, nullptr);
        ASSERT_OK(r);
        EXPECT_TRUE(compare(r.value(), base.value()).identical)
            << "stage " << st << " params " << param << " sub_group_size " << sub;
      }
    }
  }
}

TEST(Engine, GathersArePrefetchedInTheRecordedOrder) {
  // Stage 3: after the first step recorded the fetch order, each fetch queues the all-gathers of
  // the next modules. Results equal those with prefetching off, and with an unrecorded forward
  // pass between steps (the engine follows the change and drops what it queued).
  MlpSpec s;
  s.layers = 4;
  const int steps = 3;
  // At world size 1 the partitions are served in place and prefetch moves them towards the device,
  // each once its update is done: behind an overlapped step, how many are moved ahead depends on
  // the update's speed. Counted here without the overlap.
  const bool overlap = g_overlap;
  g_overlap = runtime().world_size() > 1;
  for (const Placement& pl :
       {Placement{3, "nvme", "nvme"}, Placement{3, "none", "cpu"}, Placement{3, "cpu", "none"}}) {
    std::string what = std::string("optimizer ") + pl.opt + " params " + pl.param;
    std::vector<Layer> results[3];
    for (int variant = 0; variant < 3; ++variant) {  // prefetch on, off, on with eval passes
      std::vector<StepStats> stats;
      auto r = run_edited(
          pl, "bf16", s, steps,
          [&](std::string& t) {
            if (variant == 1)
              insert_before(t, "stage3_param_persistence_threshold", "\"stage3_prefetch_bucket_size\": 0, ");
          },
          &stats, 1, /*eval_passes=*/variant == 2);
      ASSERT_OK(r) << what;
      results[variant] = r.value();
      // The first step records the order: every gather is on demand (4 forward + 4 backward).
      EXPECT_EQ(stats[0].gathers_prefetched, 0u) << what;
      EXPECT_EQ(stats[0].gathers_on_demand, 8u) << what;
      for (int k = 1; k < steps; ++k) {
        const uint64_t fetches = variant == 2 ? 12u : 8u;
        EXPECT_EQ(stats[k].gathers_prefetched + stats[k].gathers_on_demand, fetches) << what << " step " << k;
        if (variant == 1) {
          EXPECT_EQ(stats[k].gathers_prefetched, 0u) << what << " step " << k;
        } else {
          // All but the step's first fetch and the backward re-fetch of the last module (it was
          // still fetched when the next modules were queued).
          EXPECT_GE(stats[k].gathers_prefetched, 6u) << what << " variant " << variant << " step " << k;
        }
      }
    }
    EXPECT_TRUE(compare(results[0], results[1]).identical) << what << ": prefetch on vs off";
    EXPECT_TRUE(compare(results[0], results[2]).identical) << what << ": with unrecorded forward passes";
  }
  g_overlap = overlap;
}

// The engine on a GPU (zoe.device "cuda"): device-resident states updated by the GPU Adam,
// offloaded ones by the CPU's, NCCL for the device collectives. Skips where no GPU is present.
// Compared with the dense reference (same tolerances as the matrix) and with the CPU device's
// run of the same config (the GPU Adam rounds like the reference, the CPU's fuses multiply-adds:
// a few ulps per step).
TEST(EngineCuda, PlacementsMatchTheReferenceAndTheCpuDevice) {
  std::string why;
  if (device::cuda_device_count(&why) <= 0) GTEST_SKIP() << "no GPU: " << why;
  static std::unique_ptr<device::Device> copier = [] {
    auto d = device::create_cuda_device(0, 1ull << 20);
    return d.is_ok() ? std::move(d).value() : nullptr;
  }();
  ASSERT_NE(copier, nullptr);
  const test::DeviceCopy gpu_copy = [](void* dst, const void* src, size_t bytes, bool to_device) {
    Status s = to_device ? copier->copy_to_device(dst, src, bytes) : copier->copy_to_host(dst, src, bytes);
    if (!s.is_ok()) {
      fprintf(stderr, "device copy: %s\n", s.to_string().c_str());
      abort();
    }
  };
  struct Reset {
    ~Reset() { test::device_copy() = nullptr; }
  } reset;  // whatever way the test ends, later tests see host memory again
  Runtime& rt = runtime();
  MlpSpec s;
  auto ref = test::reference_train(s, rt.world_size(), 3);
  for (const std::string precision : {"fp32", "bf16"}) {
    for (const Placement& pl :
         {Placement{0, "none", "none"}, Placement{1, "none", "none"}, Placement{2, "cpu", "none"},
          Placement{3, "none", "none"}, Placement{3, "nvme", "nvme"}, Placement{3, "cpu", "cpu"}}) {
      for (const char* ratio : {"1", "0.5"}) {
        if (std::string(ratio) == "0.5" && std::string(pl.opt) == "none") continue;
        std::string what = precision + " stage " + std::to_string(pl.stage) + " optimizer " + pl.opt +
                           " params " + pl.param + " ratio " + ratio;
        std::vector<Layer> got[2];
        for (int gpu = 0; gpu < 2; ++gpu) {
          test::device_copy() = gpu ? gpu_copy : nullptr;  // the CPU device's memory is host memory
          auto r = run_edited(
              pl, precision, s, 3,
              [&](std::string& t) {
                insert_before(t, "optimizer_threads", std::string("\"offload_ratio\": ") + ratio + ", ");
                if (gpu) insert_before(t, "optimizer_threads", "\"device\": \"cuda\", ");
              },
              nullptr);
          ASSERT_OK(r) << what << (gpu ? " on the GPU: " : " on the CPU: ");
          got[gpu] = r.value();
        }
        Tolerance tol = tolerance(precision);
        Diff dr = compare(got[1], ref), dc = compare(got[1], got[0]);
        EXPECT_LE(dr.max_abs, tol.max_abs) << what << " vs the dense reference";
        EXPECT_LE(dr.mean_abs, tol.mean_abs) << what << " vs the dense reference";
        EXPECT_LE(dc.max_abs, precision == "fp32" ? 1e-5 : tol.max_abs) << what << " vs the CPU device";
        printf("[cuda] %-50s max %.2e vs reference, %.2e vs CPU device\n", what.c_str(), dr.max_abs,
               dc.max_abs);
      }
    }
  }
}

TEST(Engine, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  MlpSpec s;
  std::vector<StepStats> stats;
  auto r = run({3, "cpu", "cpu"}, "fp16", s, 3, &stats, /*inject=*/1, 1, ", \"hysteresis\": 1");
  ASSERT_OK(r);
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_FALSE(stats[0].skipped);
  EXPECT_TRUE(stats[1].skipped);
  EXPECT_FALSE(stats[2].skipped);
  EXPECT_EQ(stats[0].loss_scale, 256.0);
  EXPECT_EQ(stats[1].loss_scale, 128.0);
  EXPECT_EQ(stats[1].step, 1);  // the skipped step does not count
  EXPECT_EQ(stats[2].step, 2);
  // With NVMe optimizer states the skipped step drops the chunks read ahead during its backward
  // (and the gradients handed to them): the next step reads and fills afresh, and every run
  // equals the no-offload run bit for bit.
  for (const int st : {1, 3}) {
    std::vector<StepStats> base_stats;
    auto base = run({st, "none", "none"}, "fp16", s, 4, &base_stats, /*inject=*/1, 1, ", \"hysteresis\": 1");
    ASSERT_OK(base);
    for (const char* param : {"none", "nvme"}) {
      if (st == 1 && std::string(param) != "none") continue;
      std::vector<StepStats> nv;
      auto r2 = run({st, "nvme", param}, "fp16", s, 4, &nv, 1, 1, ", \"hysteresis\": 1");
      ASSERT_OK(r2);
      ASSERT_EQ(nv.size(), 4u);
      EXPECT_TRUE(nv[1].skipped);
      EXPECT_TRUE(compare(r2.value(), base.value()).identical) << "stage " << st << " params " << param;
    }
  }
}

TEST(Engine, StatsReportTimesAndHighWater) {
  MlpSpec s;
  std::vector<StepStats> stats;
  auto r = run({3, "nvme", "nvme"}, "bf16", s, 2, &stats);
  ASSERT_OK(r);
  const StepStats& st = stats.back();
  EXPECT_GT(st.high_water[0], 0u);
  EXPECT_GT(st.high_water[1], 0u);
  EXPECT_GT(st.high_water[2], 0u);
  // Every step updates NVMe-resident states: the caller waited for it, and the run read and wrote
  // them (which step a read ahead counts in depends on timing, so only the sums are asserted).
  uint64_t read = 0, written = 0;
  for (const StepStats& x : stats) {
    EXPECT_GT(x.t_optimizer, 0.0) << "step " << x.step;
    read += x.step_bytes_nvme_read;
    written += x.step_bytes_nvme_write;
  }
  // The steps' parts add up to no more than the totals since initialize().
  EXPECT_GT(read, 0u);
  EXPECT_GT(written, 0u);
  EXPECT_LE(read, st.bytes_nvme_read);
  EXPECT_LE(written, st.bytes_nvme_write);
}

// Resume: 2 steps, save, a fresh engine loads and takes step 3; the result equals 3 steps
// uninterrupted, bit for bit, for every stage and placement.
// Also with the device ops deferred (zero/device_ops.h's contract, as in the matrix above): the
// save and load paths hand device memory to the checkpoint's reader and writer.
TEST(Checkpoint, ResumeIsBitIdentical) {
  Runtime& rt = runtime();
  MlpSpec s;
  struct Restore {
    ~Restore() { zero::set_deferred_device_ops(false); }
  } restore;
  std::map<std::string, std::vector<Layer>> eager;
  for (bool deferred : {false, true}) {
    zero::set_deferred_device_ops(deferred);
    for (int stage : {1, 2, 3}) {
      for (const char* off : {"none", "cpu", "nvme"}) {
        Placement pl{stage, off, stage == 3 ? off : "none"};
        std::string what = std::string("stage ") + std::to_string(stage) + " offload " + off +
                           (deferred ? " (deferred device ops)" : "");
        auto whole = run(pl, "bf16", s, 3);
        ASSERT_OK(whole) << what;
        const std::string key = std::to_string(stage) + off;
        if (!deferred) eager[key] = whole.value();
        EXPECT_TRUE(compare(whole.value(), eager[key]).identical) << what << ": differs from the eager run";
        test::ScratchDir nvme("nvme"), ck("ckpt");
        // Every rank must use the same checkpoint directory: rank 0's name.
        const std::string dir = rank0_string(rt, ck.path());
        auto cfg = config::Config::parse(make_config(pl, "bf16", nvme.path()), rt.world_size());
        ASSERT_OK(cfg);
        {
          auto e = zero::create_engine(rt, cfg.value());
          ASSERT_OK(e);
          ASSERT_OK(test::register_mlp(*e.value(), s));
          std::vector<Layer> out;
          ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 2, &out));
          Status sv = e.value()->save(dir, "step-2", "{\"step\": 2}");
          ASSERT_OK(sv) << what;
        }
        auto e = zero::create_engine(rt, cfg.value());
        ASSERT_OK(e);
        ASSERT_OK(test::register_mlp(*e.value(), s));
        auto ts = e.value()->load(dir);
        ASSERT_OK(ts) << what;
        EXPECT_EQ(ts.value(), "{\"step\":2}");
        EXPECT_EQ(e.value()->steps_taken(), 2);
        std::vector<Layer> out;
        ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &out, nullptr, -1, 1, 2));
        EXPECT_TRUE(compare(out, whole.value()).identical)
            << what << ": resumed run differs (max " << compare(out, whole.value()).max_abs << ")";
        ASSERT_OK(
            zero::runtime_comm(rt).barrier());  // rank 0 removes the directory only after everyone is done
      }
    }
  }
}

// A checkpoint loads into another stage and placement: the master values come back exactly.
TEST(Checkpoint, LoadsIntoAnotherPlacement) {
  Runtime& rt = runtime();
  MlpSpec s;
  test::ScratchDir nvme("nvme"), ck("ckpt");
  const std::string dir = rank0_string(rt, ck.path());
  std::vector<Layer> saved;
  {
    auto cfg = config::Config::parse(make_config({3, "nvme", "nvme"}, "bf16", nvme.path()), rt.world_size());
    ASSERT_OK(cfg);
    auto e = zero::create_engine(rt, cfg.value());
    ASSERT_OK(e);
    ASSERT_OK(test::register_mlp(*e.value(), s));
    ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 2, &saved));
    ASSERT_OK(e.value()->save(dir, "step-2", "{}"));
  }
  for (const Placement& pl :
       {Placement{1, "cpu", "none"}, Placement{2, "none", "none"}, Placement{3, "none", "cpu"}}) {
    auto cfg = config::Config::parse(make_config(pl, "bf16", nvme.path()), rt.world_size());
    ASSERT_OK(cfg);
    auto e = zero::create_engine(rt, cfg.value());
    ASSERT_OK(e);
    ASSERT_OK(test::register_mlp(*e.value(), s));
    auto ts = e.value()->load(dir);
    ASSERT_OK(ts);
    for (int l = 0; l < s.layers; ++l) {
      std::vector<float> w(static_cast<size_t>(s.d * s.d)), b(static_cast<size_t>(s.d));
      ASSERT_OK(e.value()->read_master(static_cast<size_t>(l), 0, w.data()));
      ASSERT_OK(e.value()->read_master(static_cast<size_t>(l), 1, b.data()));
      EXPECT_EQ(memcmp(w.data(), saved[static_cast<size_t>(l)].w.data(), w.size() * 4), 0)
          << "stage " << pl.stage;
      EXPECT_EQ(memcmp(b.data(), saved[static_cast<size_t>(l)].b.data(), b.size() * 4), 0)
          << "stage " << pl.stage;
    }
  }
  ASSERT_OK(zero::runtime_comm(rt).barrier());
}

// Resharding, across two ctest runs of different world sizes: ZOE_RESHARD_DIR names a shared
// directory; role "save" trains 2 steps and saves (with the master values beside it), role
// "load" loads into this world size and checks every master value.
TEST(Checkpoint, Reshard) {
  const char* dir = getenv("ZOE_RESHARD_DIR");
  const char* role = getenv("ZOE_RESHARD_ROLE");
  if (!dir || !role) GTEST_SKIP() << "run by the reshard ctest pair";
  Runtime& rt = runtime();
  MlpSpec s;
  Placement pl{3, "cpu", "nvme"};
  test::ScratchDir nvme("nvme");
  auto cfg = config::Config::parse(make_config(pl, "bf16", nvme.path()), rt.world_size());
  ASSERT_OK(cfg);
  auto e = zero::create_engine(rt, cfg.value());
  ASSERT_OK(e);
  ASSERT_OK(test::register_mlp(*e.value(), s));
  std::string values = std::string(dir) + "/master-values.bin";
  if (std::string(role) == "save") {
    std::filesystem::create_directories(dir);
    std::vector<Layer> out;
    ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 2, &out));
    ASSERT_OK(e.value()->save(dir, "step-2", "{}"));
    if (rt.rank() == 0) {
      FILE* f = fopen(values.c_str(), "wb");
      ASSERT_NE(f, nullptr);
      for (const auto& l : out) {
        fwrite(l.w.data(), 4, l.w.size(), f);
        fwrite(l.b.data(), 4, l.b.size(), f);
      }
      fclose(f);
    }
  } else {
    ASSERT_OK(e.value()->load(dir));
    std::vector<float> want(static_cast<size_t>(s.layers) * static_cast<size_t>(s.d * s.d + s.d));
    FILE* f = fopen(values.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(fread(want.data(), 4, want.size(), f), want.size());
    fclose(f);
    size_t off = 0;
    for (int l = 0; l < s.layers; ++l) {
      std::vector<float> w(static_cast<size_t>(s.d * s.d)), b(static_cast<size_t>(s.d));
      ASSERT_OK(e.value()->read_master(static_cast<size_t>(l), 0, w.data()));
      ASSERT_OK(e.value()->read_master(static_cast<size_t>(l), 1, b.data()));
      EXPECT_EQ(memcmp(w.data(), want.data() + off, w.size() * 4), 0) << "layer " << l << " w";
      off += w.size();
      EXPECT_EQ(memcmp(b.data(), want.data() + off, b.size() * 4), 0) << "layer " << l << " b";
      off += b.size();
    }
    // And it trains on from there.
    std::vector<Layer> out;
    EXPECT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &out, nullptr, -1, 1, 2));
  }
}

TEST(Engine, MisuseIsAClearError) {
  Runtime& rt = runtime();
  auto cfg = config::Config::parse(
      "{\"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 0}}", rt.world_size());
  ASSERT_OK(cfg);
  auto e = zero::create_engine(rt, cfg.value());
  ASSERT_OK(e);
  EXPECT_EQ(e.value()->fetch(0).status().code(), StatusCode::kInvalidArgument);  // before initialize
  MlpSpec s;
  ASSERT_OK(test::register_mlp(*e.value(), s));
  EXPECT_EQ(e.value()->add_module("late", {{"w", {4}}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.value()->release(0).code(), StatusCode::kInvalidArgument);  // not fetched
  EXPECT_EQ(e.value()->fetch(99).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.value()->reduce_grads(0).code(), StatusCode::kInvalidArgument);  // no grads()
}

}  // namespace
}  // namespace zoe
