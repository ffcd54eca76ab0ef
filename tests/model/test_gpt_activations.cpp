// Activation checkpointing through the engine's activation store (Engine::activations()): the
// reference GPT trained by GptTrainer gives the same losses and final weights, bit for bit,
// without checkpointing and with it, the checkpoints kept on the device, in host memory and on
// NVMe, at every placement of the engine matrix (stage 0; 1/2 x optimizer offload; 3 x parameter
// x optimizer offload), at this process's world size (1; 2 under mpirun). The store's budgets
// make each offload setting reach its tier, and its device high-water stays within its share.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "model/gpt_trainer.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"
#include "tests/zero/mlp.h"
#include "tests/zero/shared_runtime.h"

namespace zoe::model {
namespace {

constexpr int kBatch = 4, kT = 64, kD = 128, kAccum = 2, kSteps = 2;

GptConfig tiny() {
  GptConfig c;
  c.layers = 3;
  c.d_model = kD;
  c.heads = 4;
  c.seq = kT;
  c.vocab = 64;
  return c;
}

// One block input: batch x T x d_model floats (128 KiB: more than one of the store's NVMe runs at
// this host budget, so it gets its own extent, written and read back, not served from the run still
// being filled).
constexpr uint64_t kTensor = uint64_t{kBatch} * kT * kD * 4;

enum class Act { kOff, kNone, kCpu, kNvme };
const char* act_name(Act a) {
  return a == Act::kOff ? "no checkpointing" : a == Act::kNone ? "none" : a == Act::kCpu ? "cpu" : "nvme";
}

// The run's config: the placement's offloads (as the engine matrix's), bf16, two micro-batches a
// step; with checkpointing, the store's device share holds one block input (the last, which never
// leaves), the host the rest with cpu, and one of them beside the NVMe tier's buffers with nvme.
std::string config_text(const test::MatrixPlacement& pl, Act act, const std::string& dir) {
  auto off = [&](const char* dev) {
    std::string s = std::string("{\"device\": \"") + dev + "\"";
    if (std::string(dev) == "nvme") s += ", \"nvme_path\": \"" + dir + "\"";
    return s + "}";
  };
  std::string zoe = "\"device_budget\": \"64MiB\", \"optimizer_threads\": 1";
  if (act != Act::kOff) {
    zoe += std::string(", \"activation_offload\": \"") + act_name(act) + "\"";
    zoe += ", \"activation_min_bytes\": 0";
    // Without offload the device keeps all three (an explicit share: the placement may leave none).
    zoe += ", \"activation_device_budget\": " + std::to_string(act == Act::kNone ? 8 * kTensor : kTensor);
    // With nvme, 700 KiB: the store's write-behind runs (2 x an eighth of it) and read-ahead blocks
    // (3 block inputs) beside one block input; the other goes to NVMe.
    const uint64_t host = act == Act::kNvme ? uint64_t{700} << 10 : 8 * kTensor;
    zoe += ", \"activation_host_budget\": " + std::to_string(host);
    zoe += ", \"activation_nvme_path\": \"" + dir + "\"";
  }
  char buf[2048];
  snprintf(buf, sizeof(buf),
           "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d, "
           "\"bf16\": {\"enabled\": true}, "
           "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}, "
           "\"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0, "
           "\"offload_optimizer\": %s, \"offload_param\": %s}, %s\"zoe\": {%s}}",
           kBatch, kAccum, pl.stage, off(pl.opt).c_str(),
           pl.stage == 3 ? off(pl.param).c_str() : "{\"device\": \"none\"}",
           act != Act::kOff ? "\"activation_checkpointing\": {\"partition_activations\": false}, " : "",
           zoe.c_str());
  return buf;
}

struct Outcome {
  std::vector<float> losses;
  std::vector<std::vector<float>> weights;  // every parameter's fp32 master, in module order
  ActivationStats stats;
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

Result<Outcome> train(const test::MatrixPlacement& pl, Act act) {
  Runtime& rt = test::shared_runtime();
  test::ScratchDir dir("act");
  const GptConfig c = tiny();
  ZOE_ASSIGN_OR_RETURN(Config cfg, Config::parse(config_text(pl, act, dir.path()), rt.world_size()));
  ZOE_ASSIGN_OR_RETURN(auto eng, Engine::create(rt, cfg));
  ZOE_RETURN_IF_ERROR(add_gpt_modules(*eng, c));
  ZOE_RETURN_IF_ERROR(
      eng->initialize([&](size_t m, size_t p, float* x, size_t n) { gpt_init(c, 3, m, p, x, n); }));
  ZOE_ASSIGN_OR_RETURN(auto gpt, GptCpu::create(c, kBatch, kT, 1, act != Act::kOff));
  GptTrainer trainer(*eng, *gpt, c, kT);
  Outcome out;
  std::vector<int32_t> tokens, targets;
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < kAccum; ++micro) {
      batch(step, micro, rt.rank(), &tokens, &targets);
      ZOE_ASSIGN_OR_RETURN(float loss, trainer.forward_backward(tokens, targets));
      out.losses.push_back(loss);
    }
    ZOE_RETURN_IF_ERROR(eng->step().status());
    // An evaluation forward between steps: it saves nothing and changes nothing.
    batch(step, 9, rt.rank(), &tokens, &targets);
    ZOE_ASSIGN_OR_RETURN(float eval, trainer.forward(tokens, targets));
    out.losses.push_back(eval);
  }
  const std::vector<ModuleSpec> specs = gpt_modules(c);
  for (size_t m = 0; m < specs.size(); ++m) {
    for (size_t p = 0; p < specs[m].params.size(); ++p) {
      out.weights.emplace_back(specs[m].params[p].numel());
      ZOE_RETURN_IF_ERROR(eng->read_master(m, p, out.weights.back().data()));
    }
  }
  out.stats = eng->activations().stats();
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(GptActivations, CheckpointedAndOffloadedRunsGiveTheSameBitsForEveryPlacement) {
  for (const test::MatrixPlacement& pl : test::matrix_placements()) {
    const std::string where =
        "stage " + std::to_string(pl.stage) + ", optimizer " + pl.opt + ", params " + pl.param;
    auto ref = train(pl, Act::kOff);
    ASSERT_OK(ref) << where;
    for (Act act : {Act::kNone, Act::kCpu, Act::kNvme}) {
      auto r = train(pl, act);
      ASSERT_OK(r) << where << ", activations " << act_name(act);
      EXPECT_TRUE(same_bits(r->losses, ref->losses)) << where << ", activations " << act_name(act);
      ASSERT_EQ(r->weights.size(), ref->weights.size());
      for (size_t i = 0; i < ref->weights.size(); ++i)
        EXPECT_TRUE(same_bits(r->weights[i], ref->weights[i]))
            << where << ", activations " << act_name(act) << ": parameter " << i << " differs";
      const ActivationStats& s = r->stats;
      EXPECT_EQ(s.checkpoint_bytes, 3 * kTensor) << where;
      EXPECT_LE(s.high_water_device, act == Act::kNone ? 3 * kTensor : kTensor)
          << where << ": the device share";
      EXPECT_EQ(s.tier_bytes[1] > 0, act == Act::kCpu || act == Act::kNvme) << where << " " << act_name(act);
      EXPECT_EQ(s.tier_bytes[2] > 0, act == Act::kNvme) << where << " " << act_name(act);
      if (act == Act::kNvme) EXPECT_GT(s.bytes_nvme_read, 0u) << where << ": the NVMe tier read back";
    }
  }
}

}  // namespace
}  // namespace zoe::model
