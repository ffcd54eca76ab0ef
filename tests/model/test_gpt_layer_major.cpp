// The layer-major schedule (zoe.schedule "layer-major", GptTrainer::forward_backward_layer_major)
// against the micro-batch schedule (G forward_backward() calls): the same losses and final
// weights, bit for bit, at every placement of the engine matrix (stage 0; 1/2 x optimizer offload;
// 3 x parameter x optimizer offload), fp32 and bf16, G in {1, 3, 8}, at this process's world size
// (1; 2 under mpirun). With checkpointing, the G micro-batches' block inputs go through the
// activation store's host and NVMe tiers and the results stay the same, within the device share.
// The saving itself: with G = 8, parameters and gradient sums on NVMe, the layer-major step reads
// no more from NVMe than a step with G = 1 does. An I/O error in the middle of a layer-major step
// is that step's error.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io/fault_injector.h"
#include "model/gpt_trainer.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"
#include "tests/zero/mlp.h"
#include "tests/zero/shared_runtime.h"
#include "zero/test_hooks.h"

namespace zoe::model {
namespace {

constexpr int kBatch = 2, kT = 32, kD = 64, kSteps = 2;

GptConfig tiny() {
  GptConfig c;
  c.layers = 2;
  c.d_model = kD;
  c.heads = 2;
  c.seq = kT;
  c.vocab = 64;
  return c;
}

// One block input: batch x T x d_model floats.
constexpr uint64_t kTensor = uint64_t{kBatch} * kT * kD * 4;

enum class Act { kOff, kCpu, kNvme };

struct Schedule {
  test::MatrixPlacement pl{0, "none", "none"};
  bool bf16 = true;
  int accum = 3;
  bool layer_major = false;
  Act act = Act::kOff;
  int steps = kSteps;
};

std::string describe(const Schedule& r) {
  return "stage " + std::to_string(r.pl.stage) + ", optimizer " + r.pl.opt + ", params " + r.pl.param + ", " +
         (r.bf16 ? "bf16" : "fp32") + ", G " + std::to_string(r.accum) +
         (r.act == Act::kOff   ? ""
          : r.act == Act::kCpu ? ", activations cpu"
                               : ", activations nvme");
}

std::string config_text(const Schedule& r, const std::string& dir) {
  auto off = [&](const char* dev, bool param) {
    std::string s = std::string("{\"device\": \"") + dev + "\"";
    if (std::string(dev) == "nvme") s += ", \"nvme_path\": \"" + dir + "\"";
    // NVMe-homed partitions are read from NVMe at every fetch (none kept in host memory).
    if (std::string(dev) == "nvme" && param) s += ", \"max_in_cpu\": 0";
    return s + "}";
  };
  std::string zoe = "\"device_budget\": \"64MiB\", \"optimizer_threads\": 1, \"schedule\": \"";
  zoe += r.layer_major ? "layer-major\"" : "micro-batch\"";
  if (r.act != Act::kOff) {
    // The device keeps one block input; the host the rest with cpu; with nvme, the host budget
    // holds only the NVMe tier's buffers, and the others go to NVMe.
    zoe += std::string(", \"activation_offload\": \"") + (r.act == Act::kCpu ? "cpu" : "nvme") + "\"";
    zoe += ", \"activation_min_bytes\": 0, \"activation_device_budget\": " + std::to_string(kTensor);
    const uint64_t host = r.act == Act::kNvme ? uint64_t{128} << 10 : 64 * kTensor;
    zoe += ", \"activation_host_budget\": " + std::to_string(host);
    zoe += ", \"activation_nvme_path\": \"" + dir + "\"";
  }
  char buf[2048];
  snprintf(buf, sizeof(buf),
           "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d, "
           "\"bf16\": {\"enabled\": %s}, "
           "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}, "
           "\"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0, "
           "\"sub_group_size\": 16384, %s\"offload_optimizer\": %s, \"offload_param\": %s}, %s\"zoe\": {%s}}",
           kBatch, r.accum, r.bf16 ? "true" : "false", r.pl.stage,
           // ... nor on the device beyond the one in use (at world size 1 it is served in place, and
           // the device tier's share would otherwise keep this small model's partitions).
           r.pl.stage == 3 && std::string(r.pl.param) == "nvme" ? "\"stage3_prefetch_bucket_size\": 0, " : "",
           off(r.pl.opt, false).c_str(),
           r.pl.stage == 3 ? off(r.pl.param, true).c_str() : "{\"device\": \"none\"}",
           r.act != Act::kOff ? "\"activation_checkpointing\": {\"partition_activations\": false}, " : "",
           zoe.c_str());
  return buf;
}

struct Outcome {
  std::vector<float> losses;
  std::vector<std::vector<float>> weights;  // every parameter's fp32 master, in module order
  ActivationStats acts;
  StepStats first, last;  // after the first step and the last
};

// Tokens of (step, micro-batch, rank): the same for every run.
void batch(int step, int micro, int rank, std::vector<int32_t>* tokens, std::vector<int32_t>* targets) {
  tokens->resize(kBatch * kT);
  targets->resize(kBatch * kT);
  for (size_t i = 0; i < tokens->size(); ++i) {
    const uint64_t h = (static_cast<uint64_t>(step) * 131 + static_cast<uint64_t>(micro) * 17 +
                        static_cast<uint64_t>(rank) * 7919 + i * 2654435761u) %
                       1000003;
    (*tokens)[i] = static_cast<int32_t>(h % 64);
    (*targets)[i] = static_cast<int32_t>((h / 64) % 64);
  }
}

struct Rig {
  std::unique_ptr<Engine> eng;
  std::vector<std::unique_ptr<GptCpu>> models;
  std::vector<GptCpu*> ptrs;
  std::unique_ptr<GptTrainer> trainer;
};

Result<Rig> build(const Schedule& r, const std::string& dir) {
  Runtime& rt = test::shared_runtime();
  const GptConfig c = tiny();
  Rig s;
  ZOE_ASSIGN_OR_RETURN(Config cfg, Config::parse(config_text(r, dir), rt.world_size()));
  ZOE_ASSIGN_OR_RETURN(s.eng, Engine::create(rt, cfg));
  ZOE_RETURN_IF_ERROR(add_gpt_modules(*s.eng, c));
  ZOE_RETURN_IF_ERROR(
      s.eng->initialize([&](size_t m, size_t p, float* x, size_t n) { gpt_init(c, 3, m, p, x, n); }));
  for (int g = 0; g < (r.layer_major ? r.accum : 1); ++g) {
    ZOE_ASSIGN_OR_RETURN(auto m, GptCpu::create(c, kBatch, kT, 1, r.act != Act::kOff));
    s.ptrs.push_back(m.get());
    s.models.push_back(std::move(m));
  }
  s.trainer = std::make_unique<GptTrainer>(*s.eng, *s.models[0], c, kT);
  return s;
}

// One step's micro-batches in the run's schedule; their losses appended to *losses.
Status micro_batches(const Schedule& r, Rig& s, int step, std::vector<float>* losses) {
  const int rank = test::shared_runtime().rank();
  std::vector<std::vector<int32_t>> tokens(r.accum), targets(r.accum);
  for (int g = 0; g < r.accum; ++g) batch(step, g, rank, &tokens[g], &targets[g]);
  if (r.layer_major) {
    ZOE_ASSIGN_OR_RETURN(std::vector<float> l,
                         s.trainer->forward_backward_layer_major(tokens, targets, s.ptrs));
    losses->insert(losses->end(), l.begin(), l.end());
    return Status::ok();
  }
  for (int g = 0; g < r.accum; ++g) {
    ZOE_ASSIGN_OR_RETURN(float loss, s.trainer->forward_backward(tokens[g], targets[g]));
    losses->push_back(loss);
  }
  return Status::ok();
}

Result<Outcome> train(const Schedule& r) {
  test::ScratchDir dir("layer-major");
  ZOE_ASSIGN_OR_RETURN(Rig s, build(r, dir.path()));
  Outcome out;
  for (int step = 0; step < r.steps; ++step) {
    ZOE_RETURN_IF_ERROR(micro_batches(r, s, step, &out.losses));
    ZOE_ASSIGN_OR_RETURN(out.last, s.eng->step());
    if (step == 0) out.first = out.last;
  }
  const std::vector<ModuleSpec> specs = gpt_modules(tiny());
  for (size_t m = 0; m < specs.size(); ++m) {
    for (size_t p = 0; p < specs[m].params.size(); ++p) {
      out.weights.emplace_back(specs[m].params[p].numel());
      ZOE_RETURN_IF_ERROR(s.eng->read_master(m, p, out.weights.back().data()));
    }
  }
  out.acts = s.eng->activations().stats();
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& where) {
  EXPECT_TRUE(same_bits(a.losses, b.losses)) << where << ": losses differ";
  ASSERT_EQ(a.weights.size(), b.weights.size()) << where;
  for (size_t i = 0; i < a.weights.size(); ++i)
    EXPECT_TRUE(same_bits(a.weights[i], b.weights[i])) << where << ": parameter " << i << " differs";
}

TEST(GptLayerMajor, SameBitsAsTheMicroBatchScheduleForEveryPlacement) {
  for (const test::MatrixPlacement& pl : test::matrix_placements()) {
    for (bool bf16 : {false, true}) {
      for (int accum : {1, 3, 8}) {
        // G = 8 on the placements with NVMe (the others' code paths are G = 3's).
        const bool nvme = std::string(pl.opt) == "nvme" || std::string(pl.param) == "nvme";
        if (accum == 8 && !nvme) continue;
        Schedule r{pl, bf16, accum, false, Act::kOff};
        auto ref = train(r);
        ASSERT_OK(ref) << describe(r);
        r.layer_major = true;
        auto lm = train(r);
        ASSERT_OK(lm) << describe(r) << ", layer-major";
        ASSERT_EQ(lm->losses.size(), static_cast<size_t>(accum * kSteps));
        expect_same(*lm, *ref, describe(r));
      }
    }
  }
}

TEST(GptLayerMajor, BlockInputsOfEveryMicroBatchGoThroughHostAndNvmeWithinTheDeviceShare) {
  for (const test::MatrixPlacement& pl :
       {test::MatrixPlacement{2, "cpu", "none"}, test::MatrixPlacement{3, "nvme", "nvme"}}) {
    Schedule r{pl, true, 3, false, Act::kOff};
    auto ref = train(r);  // micro-batch, no checkpointing
    ASSERT_OK(ref) << describe(r);
    for (Act act : {Act::kCpu, Act::kNvme}) {
      r.act = act;
      r.layer_major = true;
      auto lm = train(r);
      ASSERT_OK(lm) << describe(r);
      expect_same(*lm, *ref, describe(r));
      // One step holds G x layers block inputs at once (micro-batch: layers).
      EXPECT_EQ(lm->acts.checkpoint_bytes, 3 * 2 * kTensor) << describe(r);
      EXPECT_LE(lm->acts.high_water_device, kTensor) << describe(r) << ": the device share";
      if (act == Act::kCpu) EXPECT_GT(lm->acts.tier_bytes[1], 0u) << describe(r);
      if (act == Act::kNvme) {
        EXPECT_GT(lm->acts.tier_bytes[2], 0u) << describe(r);
        EXPECT_GT(lm->acts.bytes_nvme_read, 0u) << describe(r) << ": the NVMe tier read back";
      }
    }
  }
}

// Parameters (stage 3) and gradient sums on NVMe: with G = 8 the micro-batch schedule reads every
// parameter 16 times a step and each module's gradient sums 7 times; layer-major reads what a
// G = 1 step reads.
TEST(GptLayerMajor, NvmeReadsPerStepDoNotGrowWithTheMicroBatches) {
  const test::MatrixPlacement pl{3, "nvme", "nvme"};
  // Per step over steps 2-6 (a step's reads may start before it: the update's read-ahead).
  auto reads = [&](int accum, bool layer_major) -> uint64_t {
    auto o = train(Schedule{pl, true, accum, layer_major, Act::kOff, 6});
    EXPECT_OK(o);
    return o.is_ok() ? (o->last.bytes_nvme_read - o->first.bytes_nvme_read) / 5 : 0;
  };
  const uint64_t one = reads(1, false), mb = reads(8, false), lm = reads(8, true);
  printf(
      "[layer-major] NVMe bytes read per step: G=1 %llu, G=8 micro-batch %llu (%.2fx), layer-major %llu "
      "(%.2fx)\n",
      static_cast<unsigned long long>(one), static_cast<unsigned long long>(mb),
      static_cast<double>(mb) / static_cast<double>(one), static_cast<unsigned long long>(lm),
      static_cast<double>(lm) / static_cast<double>(one));
  ASSERT_GT(one, 0u);
  // The G = 1 reads themselves vary by up to 15% from run to run (whether a partition written back
  // is still in flight when it is fetched again depends on timing): the bound leaves room for that.
  EXPECT_LE(static_cast<double>(lm), 1.25 * static_cast<double>(one));
  EXPECT_GT(static_cast<double>(mb), 3.0 * static_cast<double>(lm));
}

// An I/O error at any NVMe read or write of a layer-major step fails that step (the micro-batches'
// call or step()), naming the error; the engine is then destroyed without leaking.
TEST(GptLayerMajor, AnIoErrorInTheMiddleOfAStepIsThatStepsError) {
  // One rank's injected error leaves the others in the step's collectives: one rank only.
  if (test::shared_runtime().world_size() > 1) GTEST_SKIP() << "one rank only";
  const Schedule r{test::MatrixPlacement{3, "nvme", "nvme"}, true, 3, true, Act::kOff};
  int failed = 0;
  for (const io::IoOp op : {io::IoOp::kRead, io::IoOp::kWrite}) {
    for (int k = 1; k < 200; k += 9) {
      test::ScratchDir dir("layer-major");
      io::FaultInjector faults;
      zero::set_engine_io_faults(&faults);
      auto s = build(r, dir.path());
      zero::set_engine_io_faults(nullptr);
      ASSERT_OK(s);
      std::vector<float> losses;
      ASSERT_OK(micro_batches(r, *s, 0, &losses));
      ASSERT_OK(s->eng->step().status());
      faults.clear();
      faults.add(io::FaultKind::kEio, static_cast<uint64_t>(k), 1, op);
      const uint64_t before = faults.injected();
      Status st = micro_batches(r, *s, 1, &losses);
      if (st.is_ok()) st = s->eng->step().status();
      if (faults.injected() == before) break;  // past the step's last transfer of this kind
      if (st.is_ok()) continue;                // a prefetch's read failed and the fetch read again
      ++failed;
      EXPECT_NE(st.message().find("Input/output error"), std::string::npos)
          << io::io_op_name(op) << " " << k << ": " << st.to_string();
    }
  }
  EXPECT_GT(failed, 2);
}

}  // namespace
}  // namespace zoe::model
