// End-to-end tests of `zoe train`'s input handling: flags override config keys only when given
// (and say so), bad flag values are usage errors (exit 2) naming the flag, bad config files and
// sizes beyond the host are clear errors (exit 1), never a crash or a silently different run.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/cli/run_zoe.h"

namespace {

using nlohmann::json;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// The smallest run: the tiny model on short sequences (add --steps).
const std::string kTiny = "train --preset tiny --seq 16 --eval-batches 1 --quiet ";
// One step of it.
const std::string kTiny1 = kTiny + "--steps 1 ";

json run_json(const std::string& args, int steps = 1, CmdResult* raw = nullptr) {
  CmdResult r = zoe(kTiny + "--json --steps " + std::to_string(steps) + " " + args);
  if (raw) *raw = r;
  EXPECT_EQ(r.rc, 0) << args << "\n" << r.err;
  if (r.rc != 0) return json();
  return json::parse(r.out);
}

std::string write_file(const zoe::test::ScratchDir& d, const std::string& name, const std::string& text) {
  std::ofstream(d.file(name), std::ios::binary) << text;
  return d.file(name);
}

TEST(TrainInput, ConfigKeysHoldUnlessAFlagIsGiven) {
  zoe::test::ScratchDir d("cfg");
  const std::string cfg = write_file(d, "ds.json", R"({
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.002}}, "zero_optimization": {"stage": 2}})");
  CmdResult raw;
  json j = run_json("--config " + cfg, 1, &raw);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["micro_batch"], 2) << "the --micro-batch default must not replace the config's value";
  EXPECT_EQ(j["gradient_accumulation_steps"], 3);
  EXPECT_EQ(j["lr"], 0.002);
  EXPECT_EQ(j["precision"], "bf16");
  EXPECT_EQ(raw.err.find("overrides"), std::string::npos) << raw.err;

  j = run_json("--config " + cfg + " --micro-batch 3 --precision fp32 --lr 0.01", 1, &raw);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["micro_batch"], 3);
  EXPECT_EQ(j["precision"], "fp32");
  EXPECT_EQ(j["lr"], 0.01);
  EXPECT_HAS(raw.err, "zoe: --micro-batch 3 overrides train_micro_batch_size_per_gpu (2 in " + cfg + ")");
  EXPECT_HAS(raw.err, "zoe: --precision fp32 overrides bf16.enabled / fp16.enabled (bf16 in " + cfg + ")");
  EXPECT_HAS(raw.err, "zoe: --lr 0.01 overrides optimizer.params.lr (0.002 in " + cfg + ")");
}

TEST(TrainInput, StateFormatFlagsOverrideTheConfig) {
  zoe::test::ScratchDir d("cfg");
  const std::string cfg = write_file(d, "ds.json", R"({"train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    "bf16": {"enabled": true}, "zoe": {"bf16_optimizer_states": true}})");
  CmdResult raw;
  json j = run_json("--config " + cfg, 1, &raw);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["optimizer_states"], "bf16");  // the older key's meaning
  EXPECT_EQ(j["master_weights"], "fp32");
  EXPECT_EQ(j["optimizer_state_bytes_per_param"], 8.0);
  j = run_json("--config " + cfg + " --optimizer-states int8 --master-weights bf16", 1, &raw);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["optimizer_states"], "int8");
  EXPECT_EQ(j["master_weights"], "bf16");
  EXPECT_EQ(j["optimizer_state_bytes_per_param"], 2.0 + 2 * 260.0 / 256);
  EXPECT_HAS(raw.err, "zoe: --optimizer-states int8 overrides zoe.optimizer_states");
  EXPECT_HAS(raw.err, "zoe: --master-weights bf16 overrides zoe.master_weights");
}

// --optimizer picks the update (DeepSpeed's defaults for the params nobody gave, the JSON says
// which), overrides the config's optimizer.type once on stderr, and a param the new type has not
// is refused naming the flag and the key.
TEST(TrainInput, OptimizerFlagPicksTheUpdate) {
  CmdResult raw;
  json j = run_json("--optimizer lion", 1, &raw);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["optimizer"], "Lion");
  EXPECT_EQ(j["optimizer_state_bytes_per_param"], 8.0);
  j = run_json("--optimizer adagrad --offload nvme --nvme-path " + zoe::test::ScratchDir("nvme").path(), 1);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["optimizer"], "Adagrad");
  EXPECT_EQ(j["lr"], 0.01);  // DeepSpeed's Adagrad default without --lr
  j = run_json("--optimizer Muon --offload nvme --nvme-path " + zoe::test::ScratchDir("nvme").path(), 3);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["optimizer"], "Muon");
  EXPECT_EQ(j["optimizer_state_bytes_per_param"], 12.0);  // momentum, and the aux AdamW's m and v
  EXPECT_EQ(j["lr"], 0.02);                               // the matrices' rate without --lr
  EXPECT_LT(j["losses"].back().get<double>(), j["losses"][0].get<double>());
  // Adam-mini's heads are the GPT's (optimizer.params.dim and n_heads from --preset's shape).
  j = run_json("--optimizer adam_mini --offload nvme --nvme-path " + zoe::test::ScratchDir("nvme").path(), 3);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["optimizer"], "AdamMini");
  EXPECT_EQ(j["optimizer_state_bytes_per_param"], 8.0);  // the master and m (v: one float a block)
  EXPECT_LT(j["losses"].back().get<double>(), j["losses"][0].get<double>());
  j = run_json("", 1);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["optimizer"], "AdamW");
  zoe::test::ScratchDir d("cfg");
  const std::string cfg = write_file(d, "ds.json", R"({"train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "weight_decay": 0.1}}})");
  j = run_json("--config " + cfg + " --optimizer LION", 1, &raw);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["optimizer"], "Lion");
  EXPECT_EQ(j["lr"], 0.002);
  EXPECT_HAS(raw.err, "zoe: --optimizer LION overrides optimizer.type (AdamW in " + cfg + ")");
  EXPECT_EQ(raw.err.find("overrides optimizer.type"), raw.err.rfind("overrides optimizer.type")) << raw.err;
  const std::string eps =
      write_file(d, "eps.json", R"({"optimizer": {"type": "AdamW", "params": {"eps": 1e-6}}})");
  CmdResult r = zoe(kTiny1 + "--config " + eps + " --optimizer lion");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_HAS(r.err, "optimizer.params.eps: optimizer.type \"Lion\" has no eps");
  EXPECT_HAS(r.err, "--optimizer with --config " + eps);
}

TEST(TrainInput, FlagsThatCannotTakeEffectWithAConfigAreRefused) {
  zoe::test::ScratchDir d("cfg");
  const std::string sched = write_file(d, "s.json", R"({"zero_optimization": {"stage": 2},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.001}}})");
  CmdResult r = zoe(kTiny1 + "--config " + sched + " --lr 0.01");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_HAS(r.err, "--lr 0.01 has no effect with --config " + sched + ": its scheduler WarmupLR");
  r = zoe(kTiny1 + "--config " + sched + " --offload cpu");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_HAS(r.err, "--offload cannot be combined with --config");
  r = zoe(kTiny1 + "--config " + sched + " --nvme-path " + d.path());
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_HAS(r.err, "--nvme-path cannot be combined with --config");
}

// --host-budget is zoe.host_budget: the host buffers zoe sizes itself (swapper slots, staging,
// partition cache) stay within it, it replaces the config's value (said on stderr), a value the
// config gives is the share as given, and a budget below what the placement needs is refused
// naming the key.
TEST(TrainInput, HostBudgetBoundsTheBuffersZoeSizes) {
  zoe::test::ScratchDir d("hostbudget");
  auto host_bytes = [](const json& b) {
    return b["swap_buffer_bytes"].get<uint64_t>() *
               (b["swap_buffer_count"].get<uint64_t>() + b["swap_async_buffers"].get<uint64_t>()) +
           b["staging_bytes"].get<uint64_t>() * b["staging_count"].get<uint64_t>() +
           b["host_cache_bytes"].get<uint64_t>();
  };
  const std::string nvme = "--offload nvme --nvme-path " + d.path() + " ";
  json wide = run_json(nvme);
  json tight = run_json(nvme + "--host-budget 64MiB");
  ASSERT_FALSE(wide.is_null());
  ASSERT_FALSE(tight.is_null());
  EXPECT_EQ(tight["buffers"]["host_share"], 64u << 20);
  EXPECT_LE(host_bytes(tight["buffers"]), 64u << 20) << tight["buffers"].dump();
  EXPECT_LT(tight["buffers"]["swap_buffer_count"].get<uint64_t>(),
            wide["buffers"]["swap_buffer_count"].get<uint64_t>());
  EXPECT_EQ(tight["losses"], wide["losses"]) << "buffer sizes must not change the numbers";

  const std::string cfg = write_file(d, "ds.json",
                                     R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                                         d.path() + R"("},
    "offload_param": {"device": "nvme", "nvme_path": ")" +
                                         d.path() + R"("}}, "bf16": {"enabled": true},
    "zoe": {"host_budget": 75497472}})");
  CmdResult raw;
  json given = run_json("--config " + cfg, 1, &raw);
  ASSERT_FALSE(given.is_null());
  EXPECT_EQ(given["buffers"]["host_share"], 75497472u);
  EXPECT_LE(host_bytes(given["buffers"]), 75497472u);
  json over = run_json("--config " + cfg + " --host-budget 64MiB", 1, &raw);
  ASSERT_FALSE(over.is_null());
  EXPECT_EQ(over["buffers"]["host_share"], 64u << 20);
  EXPECT_HAS(raw.err, "zoe: --host-budget 64MiB overrides zoe.host_budget (75497472 bytes in " + cfg + ")");

  CmdResult r = zoe(kTiny1 + nvme + "--host-budget 64KiB");
  EXPECT_NE(r.rc, 0);
  EXPECT_HAS(r.err, "zoe.host_budget");
}

TEST(TrainInput, LrZeroTakesEffect) {
  // With lr 0 nothing moves: the held-out loss after three steps is the one after one step.
  json one = run_json("--lr 0 --eval-every 1");
  json three = run_json("--lr 0 --eval-every 1", 3);
  json moving = run_json("--lr 0.01 --eval-every 1", 3);
  ASSERT_FALSE(one.is_null());
  ASSERT_FALSE(three.is_null());
  ASSERT_FALSE(moving.is_null());
  EXPECT_EQ(three["lr"], 0.0);
  EXPECT_EQ(one["eval_loss"].dump(), three["eval_loss"].dump());
  EXPECT_NE(one["eval_loss"].dump(), moving["eval_loss"].dump());
}

TEST(TrainInput, SaveInitialWritesTheWeightsBeforeTheFirstUpdate) {
  zoe::test::ScratchDir ck("ckpt");
  json whole = run_json("--save-initial --save-dir " + ck.path(), 3);
  ASSERT_FALSE(whole.is_null());
  ASSERT_TRUE(std::filesystem::exists(ck.file("step-000000/manifest.json")));
  // Resuming from step 0 is training from the initial weights: the same losses, bit for bit.
  json again = run_json("--resume " + ck.file("step-000000"), 3);
  ASSERT_FALSE(again.is_null());
  EXPECT_EQ(again["start_step"], 0);
  EXPECT_EQ(whole["losses"].dump(), again["losses"].dump());

  CmdResult r = zoe(kTiny1 + "--save-initial");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_HAS(r.err, "--save-initial needs --save-dir");
  r = zoe(kTiny1 + "--save-initial --save-dir " + ck.path() + " --resume");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_HAS(r.err, "--save-initial cannot be combined with --resume");
}

TEST(TrainInput, DumpBatchesHoldsEveryMicroBatchsTokens) {
  zoe::test::ScratchDir d("dump");
  zoe::test::ScratchDir cfg_dir("cfg");
  // Two micro-batches per step (gradient accumulation) of 3 sequences.
  const std::string cfg = write_file(cfg_dir, "ds.json", R"({"train_micro_batch_size_per_gpu": 3,
    "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}})");
  auto lines = [&](const std::string& path) {
    std::ifstream in(path);
    std::vector<json> v;
    for (std::string line; std::getline(in, line);) v.push_back(json::parse(line));
    return v;
  };
  json j = run_json("--config " + cfg + " --dump-batches " + d.file("a.jsonl"), 2);
  ASSERT_FALSE(j.is_null());
  std::vector<json> a = lines(d.file("a.jsonl"));
  ASSERT_EQ(a.size(), 4u) << "2 steps x 2 micro-batches";
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["step"], static_cast<int>(i / 2)) << i;
    EXPECT_EQ(a[i]["micro"], static_cast<int>(i % 2)) << i;
    EXPECT_EQ(a[i]["rank"], 0);
    ASSERT_EQ(a[i]["batch"], 3);
    ASSERT_EQ(a[i]["seq"], 16);
    ASSERT_EQ(a[i]["tokens"].size(), 3u);
    for (size_t b = 0; b < 3; ++b) {
      const auto tk = a[i]["tokens"][b].get<std::vector<int>>();
      const auto tg = a[i]["targets"][b].get<std::vector<int>>();
      ASSERT_EQ(tk.size(), 16u);
      ASSERT_EQ(tg.size(), 16u);
      // Targets are the next tokens; the built-in corpus is digits, '+', '=' and newlines.
      for (size_t t = 0; t + 1 < 16; ++t) EXPECT_EQ(tg[t], tk[t + 1]) << i << " " << b << " " << t;
      for (int c : tk)
        EXPECT_TRUE(std::string("0123456789+=\n").find(static_cast<char>(c)) != std::string::npos) << c;
    }
  }
  EXPECT_NE(a[0]["tokens"].dump(), a[1]["tokens"].dump()) << "each micro-batch its own windows";
  // The same seed gives the same batches, another seed others.
  ASSERT_FALSE(run_json("--config " + cfg + " --dump-batches " + d.file("b.jsonl"), 2).is_null());
  ASSERT_FALSE(run_json("--config " + cfg + " --seed 2 --dump-batches " + d.file("c.jsonl"), 2).is_null());
  std::vector<json> b = lines(d.file("b.jsonl")), c = lines(d.file("c.jsonl"));
  ASSERT_EQ(b.size(), 4u);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(a[3].dump(), b[3].dump());
  EXPECT_NE(a[3]["tokens"].dump(), c[3]["tokens"].dump());

  CmdResult r = zoe(kTiny1 + "--dump-batches " + d.path() + "/no/such/dir/x.jsonl");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "--dump-batches " + d.path() + "/no/such/dir/x.jsonl: its directory");
}

TEST(TrainInput, JsonHasPerStepLrAndGradNorm) {
  zoe::test::ScratchDir d("cfg");
  json j = run_json("--lr 0.004 --warmup 0", 3);  // a constant rate (the default warms up)
  ASSERT_FALSE(j.is_null());
  ASSERT_EQ(j["lrs"].size(), 3u);
  ASSERT_EQ(j["grad_norms"].size(), 3u);
  ASSERT_EQ(j["step_time_s"].size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(j["lrs"][k].get<double>(), 0.004) << k;
    const double g = j["grad_norms"][k].get<double>();
    EXPECT_TRUE(std::isfinite(g) && g > 0) << k << " " << g;
    const json& t = j["step_time_s"][k];
    EXPECT_GT(t["compute"].get<double>(), 0) << k;
    // The step's own wall time; after the first (timed since initialisation), the four parts are
    // inside it.
    EXPECT_GT(t["wall"].get<double>(), 0) << k;
    const double parts = t["compute"].get<double>() + t["comm"].get<double>() + t["io_stall"].get<double>() +
                         t["optimizer"].get<double>();
    if (k > 0) {
      EXPECT_LE(parts, 1.02 * t["wall"].get<double>() + 2e-3) << k;
    }
  }
  EXPECT_NE(j["grad_norms"][0].dump(), j["grad_norms"][1].dump());
  // A warm-up schedule: the rate of each update, as the scheduler gives it.
  const std::string sched = write_file(d, "s.json", R"({"zero_optimization": {"stage": 2},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.003,
    "warmup_num_steps": 4, "warmup_type": "linear"}}})");
  j = run_json("--config " + sched, 5);
  ASSERT_FALSE(j.is_null());
  ASSERT_EQ(j["lrs"].size(), 5u);
  for (size_t k = 0; k + 1 < 5; ++k) EXPECT_LE(j["lrs"][k].get<double>(), j["lrs"][k + 1].get<double>()) << k;
  EXPECT_LT(j["lrs"][0].get<double>(), j["lrs"][4].get<double>());
  EXPECT_LE(j["lrs"][4].get<double>(), 0.003);
}

TEST(TrainInput, OptimizerDefaultsAreStatedAndWeightDecayTakesEffect) {
  CmdResult h = zoe("train --help");
  EXPECT_EQ(h.rc, 0);
  EXPECT_HAS(h.out, "lr 1e-3, betas (0.9, 0.999), eps 1e-8");
  EXPECT_HAS(h.out, "weight decay 0");
  EXPECT_HAS(h.out, "torch.optim.AdamW");
  EXPECT_HAS(h.out, "0.01");
  json none = run_json("--lr 0.01", 2);
  json zero = run_json("--lr 0.01 --weight-decay 0", 2);
  json wd = run_json("--lr 0.01 --weight-decay 0.5", 2);
  ASSERT_FALSE(none.is_null());
  ASSERT_FALSE(wd.is_null());
  EXPECT_EQ(none["losses"].dump(), zero["losses"].dump()) << "the default is 0";
  // The first loss comes before any update; the second sees the decayed weights.
  EXPECT_EQ(none["losses"][0].dump(), wd["losses"][0].dump());
  EXPECT_NE(none["losses"][1].dump(), wd["losses"][1].dump());
  zoe::test::ScratchDir d("cfg");
  const std::string cfg = write_file(d, "ds.json", R"({"zero_optimization": {"stage": 2}})");
  CmdResult r = zoe(kTiny1 + "--config " + cfg + " --weight-decay 0.01");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_HAS(r.err, "--weight-decay cannot be combined with --config " + cfg);
  EXPECT_HAS(r.err, "optimizer.params.weight_decay");
  r = zoe(kTiny1 + "--weight-decay -1");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_HAS(r.err, "--weight-decay -1 is not a weight decay");
}

// (width, height) from a PNG's IHDR chunk (the first after the signature); (0, 0) if it is no PNG.
std::pair<uint32_t, uint32_t> png_size(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char h[24] = {};
  in.read(reinterpret_cast<char*>(h), sizeof h);
  static const unsigned char kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (in.gcount() != 24 || memcmp(h, kSig, 8) != 0 || memcmp(h + 12, "IHDR", 4) != 0) return {0, 0};
  auto be32 = [&](int at) {
    return (uint32_t{h[at]} << 24) | (uint32_t{h[at + 1]} << 16) | (uint32_t{h[at + 2]} << 8) | h[at + 3];
  };
  return {be32(16), be32(20)};
}

TEST(TrainInput, PlotWritesAPngOfTheRun) {
  if (system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3-matplotlib is not installed";
  }
  zoe::test::ScratchDir d("plot");
  json j = run_json("--eval-every 2 --plot " + d.file("loss.png"), 4);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(png_size(d.file("loss.png")), std::make_pair(uint32_t{1200}, uint32_t{800}));
  // An unwritable destination fails with the path named, before the run.
  CmdResult r = zoe(kTiny1 + "--plot " + d.path() + "/no/such/dir/loss.png");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "--plot " + d.path() + "/no/such/dir/loss.png");
}

TEST(TrainInput, TaskChoosesTheBuiltInCorpus) {
  zoe::test::ScratchDir d("task");
  json add = run_json("--dump-batches " + d.file("batches.jsonl") + " --eval-every 1", 1);
  json add2 = run_json("--task add2 --eval-every 1", 1);
  ASSERT_FALSE(add.is_null());
  ASSERT_FALSE(add2.is_null());
  EXPECT_EQ(add["data"], "arithmetic(seed=1)");
  EXPECT_EQ(add2["data"], "arithmetic-2digit(seed=1)");
  // --eval-every evaluates the initial weights first: evals[0] is at step 0.
  ASSERT_EQ(add2["evals"].size(), 2u);
  EXPECT_EQ(add2["evals"][0]["step"], 0);
  EXPECT_EQ(add2["evals"][1]["step"], 1);
  CmdResult r = zoe(kTiny1 + "--task add7");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_HAS(r.err, "--task add7 is not add, add2 or add1");
  r = zoe(kTiny1 + "--task add2 --data /etc/os-release");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_HAS(r.err, "--task add2 cannot be combined with --data /etc/os-release");
}

TEST(TrainInput, ProgressOffATerminalIsOneLineEveryFewSteps) {
  // stderr is a file here: 20 steps give the first three steps, then a line every 2 steps (12
  // lines), not 20 (a tiny run's steps take far less than the 10 s that also force a line).
  CmdResult r = zoe("train --preset tiny --seq 16 --eval-batches 1 --steps 20");
  ASSERT_EQ(r.rc, 0) << r.err;
  int lines = 0;
  for (size_t at = 0; (at = r.err.find("step ", at)) != std::string::npos; ++at) ++lines;
  EXPECT_EQ(lines, 12) << r.err;
  EXPECT_HAS(r.err, "step 1/20");
  EXPECT_HAS(r.err, "step 3/20");
  EXPECT_HAS(r.err, "step 20/20");
  EXPECT_EQ(r.err.find("step 5/20"), std::string::npos) << r.err;
  EXPECT_HAS(r.err, "tok/s");
  EXPECT_HAS(r.err, "nvme ");
  EXPECT_HAS(r.err, "stall ");
  EXPECT_HAS(r.err, "eta ");
}

TEST(TrainInput, BadFlagValuesAreUsageErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--eval-batches 0", "--eval-batches 0 is out of range (expected an integer in [1, 1048576])"},
      {"--precision bogus", "--precision bogus is not fp32, bf16 or fp16"},
      {"--lr -1", "--lr -1 is not a learning rate"},
      {"--lr nan", "--lr nan is not a learning rate"},
      {"--lr 1e308", "--lr 1e+308 is not a learning rate"},
      {"--save-every -1", "--save-every -1 is out of range"},
      {"--save-every 2", "--save-every 2 needs --save-dir"},
      {"--layers 0", "--layers 0 is out of range (expected an integer in [1, 4096])"},
      {"--layers 5000", "--layers 5000 is out of range (expected an integer in [1, 4096])"},
      {"--heads 0", "--heads 0 is out of range"},
      {"--d-model 0", "--d-model 0 is out of range"},
      {"--context 0", "--context 0 is out of range"},
      {"--seq 0", "--seq 0 is out of range (expected an integer in [2, 1048576])"},
      {"--seq 500", "--seq 500 is longer than the model allows"},
      {"--threads -1", "--threads -1 is out of range (expected an integer in [0, 4096])"},
      {"--micro-batch 0", "--micro-batch 0 is out of range"},
      {"--seed -1", "--seed -1 is not an unsigned integer"},
      {"--seed 18446744073709551616", "--seed 18446744073709551616 is not an unsigned integer"},
      {"--offload disk", "--offload disk is not none, cpu or nvme"},
      {"--optimizer-states int2", "--optimizer-states int2 is not fp32, bf16, int8 or int4"},
      {"--optimizer sgd", "--optimizer sgd is not adamw, lion, adagrad, muon or adam_mini"},
      {"--master-weights fp16", "--master-weights fp16 is not fp32 or bf16 (an fp16 master cannot hold"},
      {"--device-budget lots", "--device-budget lots is not a byte size"},
      {"--host-budget lots", "--host-budget lots is not a byte size"},
      {"--host-budget -1MiB", "--host-budget -1MiB is not a byte size"},
      {"--preset huge", "--preset huge is not one of"},
      {"--heads 5", "--heads"},    // d_model 128 is not a multiple of 5: the model's check, named
      {"--layers x", "--layers"},  // CLI11's own parse errors share the exit code
      {"--prompt 1+1=", "--prompt has no effect without a sample: give --sample N"},
      {"--sample 0 --temperature 1", "--temperature has no effect without a sample"},
      {"--sample 4 --temperature -1", "--temperature -1 is outside [0, 100]"},
      {"--sample 70000", "--sample 70000 is out of range (expected an integer in [0, 65536])"},
      {"--sample 4 --prompt ''", "--prompt is empty"},
  };
  for (const auto& [args, message] : cases) {
    // The preset "small" (d_model 128, context 64); every case fails before training.
    CmdResult r = zoe("train --steps 1 --quiet " + args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_HAS(r.err, message);
    EXPECT_EQ(r.out, "") << args;
  }
}

TEST(TrainInput, NvmePathsAreJsonValuesAndAllAreUsed) {
  zoe::test::ScratchDir d("nvme");
  // A quote and a backslash: pasted into JSON text these broke the config or became "t/sub".
  const std::string odd = d.file("q\"uote\\sub");
  ASSERT_TRUE(std::filesystem::create_directories(odd));
  CmdResult raw;
  json j = run_json("--offload nvme --nvme-path '" + odd + "'", 1, &raw);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["offload"]["optimizer"], "nvme");
  EXPECT_GT(j["bytes_moved"]["host->nvme"].get<uint64_t>(), 0u);
  // The second --nvme-path is used too (it was ignored): a missing one is named.
  CmdResult r = zoe(kTiny1 + "--offload nvme --nvme-path " + d.path() + " --nvme-path " + d.file("missing"));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, d.file("missing") + "' does not exist");
  r = zoe(kTiny1 + "--offload none --nvme-path " + d.path());
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_HAS(r.err, "--nvme-path has no effect without --offload nvme");
}

TEST(TrainInput, BadConfigFilesAreErrorsNotCrashes) {
  zoe::test::ScratchDir d("cfg");
  std::string deep = "{\"tensorboard\": ";
  deep.append(100000, '[');
  deep.append(100000, ']');
  deep += '}';
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("{\"zoe\":{}}\0{\"zero_optimization\": {\"stage\": 9}}", 45), "a NUL byte at offset 10"},
      {R"({"optimizer": {"params": {"lr": 1e400}}})", "invalid JSON at optimizer.params.lr: number overflow"},
      {deep, "nested more than 64 deep at tensorboard[0]"},
      {R"({"gradient_accumulation_steps": 4294967297})",
       "gradient_accumulation_steps: 4294967297 is out of range (expected an integer in [1, 1048576])"},
      {R"({"gradient_accumulation_steps": 1073741824})", "(expected an integer in [1, 1048576])"},
      {R"({"aio": {"queue_depth": 4294967296}})", "aio.queue_depth: 4294967296 is out of range"},
      {R"({"zoe": {"optimizer_threads": 4294967297}})", "zoe.optimizer_threads: 4294967297 is out of range"},
      {R"({"zero_optimization": {"stage": 2,
           "offload_optimizer": {"device": "cpu", "buffer_count": 4398046511104}}})",
       "buffer_count: 4398046511104 is out of range (expected an integer in [1, 1024])"},
      {R"({"optimizer": {"params": {"eps": 1e-300}}})", "optimizer.params.eps: 1e-300 is out of range"},
      {R"({"optimizer": {"params": {"lr": 1e308}}})", "optimizer.params.lr: 1e+308 is out of range"},
  };
  int i = 0;
  for (const auto& [text, message] : cases) {
    std::string name = "c";
    name += std::to_string(i++);
    const std::string path = write_file(d, name, text);
    CmdResult r = zoe(kTiny1 + "--config " + path);
    EXPECT_EQ(r.rc, 1) << message << "\n" << r.err;
    EXPECT_HAS(r.err, "zoe: error: ");
    EXPECT_HAS(r.err, message);
    EXPECT_HAS(r.err, path);
  }
  CmdResult r = zoe(kTiny1 + "--config /dev/zero");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "config file /dev/zero is a character device, not a regular file");
}

// A config gets one validation whatever the flags: a value derived from train_batch_size, a number
// out of fp32's range, one that underflows to 0 or a null is refused the same with and without
// --threads (which re-validates the config with the flag's value), and a config accepted without
// it is accepted with it.
TEST(TrainInput, OneConfigOneAnswerWhateverTheFlags) {
  zoe::test::ScratchDir d("cfg");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"train_batch_size": 4294967297, "train_micro_batch_size_per_gpu": 1})",
       "gradient_accumulation_steps: 4294967297 (derived: train_batch_size 4294967297 / "
       "(train_micro_batch_size_per_gpu "
       "1 x world size 1)) is out of range (expected an integer in [1, 1048576])"},
      {R"({"train_batch_size": 1073741824, "train_micro_batch_size_per_gpu": 1})",
       "gradient_accumulation_steps: 1073741824"},
      {R"({"train_batch_size": 4398046511104})", "train_micro_batch_size_per_gpu: 4398046511104"},
      {R"({"fp16": {"enabled": true, "loss_scale": 1e308}})", "fp16.loss_scale: 1e+308 is out of range"},
      {R"({"fp16": {"enabled": true, "loss_scale": 1e-300}})", "fp16.loss_scale: 1e-300 is out of range"},
      {R"({"optimizer": {"params": {"lr": 1e-400}}})",
       "optimizer.params.lr: 1e-400 is too small for a double and would be read as 0"},
      {R"({"zero_optimization": {"stage": null}})", "zero_optimization.stage: null is not a value"},
      {R"({"optimizer": {"params": {"lr": null}}})", "optimizer.params.lr: null is not a value"},
      {R"({"bf16": {"enabled": null}})", "bf16.enabled: null is not a value"},
  };
  int i = 0;
  for (const auto& [text, message] : refused) {
    const std::string path = write_file(d, "c" + std::to_string(i++), text);
    for (const std::string flags : {"", "--threads 2 "}) {
      CmdResult r = zoe(kTiny1 + flags + "--config " + path);
      EXPECT_EQ(r.rc, 1) << flags << text << "\n" << r.err;
      EXPECT_HAS(r.err, message);
      EXPECT_HAS(r.err, path);
      EXPECT_EQ(r.err.find("while setting"), std::string::npos) << r.err;
    }
  }
  const std::string ratio0 = write_file(d, "ratio0", R"({"zoe": {"offload_ratio": 0},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})");
  for (const std::string flags : {"", "--threads 2 "}) {
    CmdResult r = zoe(kTiny1 + flags + "--config " + ratio0);
    EXPECT_EQ(r.rc, 0) << flags << "\n" << r.err;
  }
}

// A loss or gradient norm that becomes NaN or inf stops the run at that step (exit 1) when no fp16
// dynamic loss scaler skips such steps, instead of training on and exiting 0.
TEST(TrainInput, NonFiniteLossStopsTheRun) {
  zoe::test::ScratchDir d("cfg");
  const std::string cfg = write_file(d, "wd.json", R"({"optimizer": {"type": "AdamW",
      "params": {"lr": 0.001, "weight_decay": 3e38}}})");
  CmdResult r = zoe(kTiny + "--steps 4 --config " + cfg);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "zoe train stopped at step ");
  EXPECT_HAS(r.err, "not finite numbers (no fp16 dynamic loss scaler");
}

// zoe.host_budget is enforced: a placement that needs more host memory is refused before training.
TEST(TrainInput, HostBudgetIsEnforced) {
  zoe::test::ScratchDir d("cfg");
  const std::string path = write_file(
      d, "hb",
      R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "zoe": {"host_budget": "64KiB"}})");
  CmdResult r = zoe(kTiny1 + "--config " + path);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "zoe.host_budget: this placement needs up to");
  EXPECT_HAS(r.err, "more than the budget of 65536 bytes");
  const std::string ok = write_file(
      d, "hb2",
      R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "zoe": {"host_budget": "1GiB"}})");
  r = zoe(kTiny1 + "--config " + ok);
  EXPECT_EQ(r.rc, 0) << r.err;
}

TEST(TrainInput, HostSizedAllocationsAreCheckedFirst) {
  CmdResult r = zoe("train --preset tiny --steps 1 --quiet --context 65536");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "of host memory (activations of 2 layers x --micro-batch 8 x --seq 65536");
  EXPECT_HAS(r.err, "available");
  // A (sparse) 2 GiB file is over the cap of at most 1 GiB: refused before it is read.
  zoe::test::ScratchDir d("big");
  const std::string big = d.file("big.txt");
  std::ofstream(big).close();
  std::filesystem::resize_file(big, uint64_t{2} << 30);
  r = zoe(kTiny1 + "--data " + big);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "data file " + big + " holds 2147483648 bytes");
  EXPECT_HAS(r.err, "a quarter of the host's available memory");
  r = zoe(kTiny1 + "--data /dev/zero");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "data file /dev/zero is a character device, not a regular file");
}

TEST(TrainInput, AllocationFailureIsAnErrorNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory does not fit under ulimit -v";
#endif
  // Activations of 4096 sequences (about 2 GiB) under a 1 GB address-space limit: the failed
  // allocation ends in the last-resort handler (exit 1), not in abort() (134).
  CmdResult r = zoe(kTiny1 + "--micro-batch 4096", "ulimit -v 1000000;");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "zoe: error: out of memory");
}

TEST(TrainInput, SaveDirIsCreatedAndChecked) {
  zoe::test::ScratchDir d("save");
  const std::string dir = d.file("a/b/c");
  CmdResult r = zoe(kTiny1 + "--save-every 1 --save-dir " + dir);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir + "/step-000001/manifest.json"));
  // A path under a regular file cannot be created: refused before the first step.
  write_file(d, "plain", "x");
  r = zoe("train --preset tiny --steps 1 --seq 16 --eval-batches 1 --save-every 1 --save-dir " +
          d.file("plain/sub"));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "--save-dir " + d.file("plain/sub") + ": Not a directory");
  EXPECT_EQ(r.err.find("step 1/1"), std::string::npos) << "no step before the check: " << r.err;
}

TEST(TrainInput, FileSizeLimitReachesTheErrorMessage) {
  // Under `ulimit -f` a write past the limit must fail with EFBIG and a message, not kill zoe
  // with SIGXFSZ (exit 153).
  zoe::test::ScratchDir d("fsize");
  CmdResult r = zoe(kTiny1 + "--save-every 1 --save-dir " + d.path(), "ulimit -f 64;");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "File too large");
}

// A `zoe train` in the background whose stderr goes to a file, to be sent signals.
class BackgroundRun {
 public:
  BackgroundRun(const std::vector<std::string>& args, const std::string& err_path) : err_path_(err_path) {
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDERR_FILENO);
      int null = open("/dev/null", O_WRONLY);
      dup2(null, STDOUT_FILENO);
      std::vector<char*> argv{const_cast<char*>(ZOE_BIN)};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(ZOE_BIN, argv.data());
      _exit(127);
    }
  }
  ~BackgroundRun() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string err() const {
    std::ifstream in(err_path_);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // Waits (up to 120 s) until stderr contains `text`; false at once if the run ended first.
  bool wait_for(const std::string& text) {
    for (int i = 0; i < 1200; ++i) {
      if (err().find(text) != std::string::npos) return true;
      if (!reaped_ && waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
      if (reaped_) return err().find(text) != std::string::npos;
      usleep(100000);
    }
    return false;
  }
  void signal(int sig) const { kill(pid_, sig); }
  pid_t pid() const { return pid_; }
  // The exit code (128 + signal when killed by one), waiting up to 120 s; -1 on timeout.
  int wait_exit() {
    for (int i = 0; i < 1200; ++i) {
      if (reaped_ || waitpid(pid_, &status_, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_) + 1000;  // +1000: killed
      }
      usleep(100000);
    }
    return -1;
  }

 private:
  std::string err_path_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

// The process keeps the name `zoe` after its start-up re-exec (OPENBLAS_NUM_THREADS), so ps, top,
// pgrep and pkill find it (a re-exec through /proc/self/exe named it `exe`).
TEST(TrainInput, TheRunningProcessIsNamedZoe) {
  zoe::test::ScratchDir d("comm");
  unsetenv("OPENBLAS_NUM_THREADS");  // the run re-executes itself with it set
  BackgroundRun run({"train", "--preset", "tiny", "--steps", "100000"}, d.file("err.txt"));
  ASSERT_TRUE(run.wait_for("step 1/")) << run.err();
  std::ifstream in("/proc/" + std::to_string(run.pid()) + "/comm");
  std::string comm;
  std::getline(in, comm);
  EXPECT_EQ(comm, "zoe");
  std::ifstream env_in("/proc/" + std::to_string(run.pid()) + "/environ");
  const std::string env((std::istreambuf_iterator<char>(env_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(env.find("OPENBLAS_NUM_THREADS=1"), std::string::npos) << "the re-exec happened";
  run.signal(SIGKILL);
}

TEST(TrainInput, SigtermSavesAndStopsAtAStepBoundary) {
  zoe::test::ScratchDir d("sig"), nvme("sig-nvme");
  BackgroundRun run({"train", "--preset", "tiny", "--seq", "16", "--eval-batches", "1", "--steps", "1000000",
                     "--offload", "nvme", "--nvme-path", nvme.path(), "--save-dir", d.file("ck")},
                    d.file("stderr"));
  ASSERT_TRUE(run.wait_for("step 3/")) << run.err();
  EXPECT_FALSE(std::filesystem::is_empty(nvme.path())) << "the swap file is there while training";
  run.signal(SIGTERM);
  EXPECT_EQ(run.wait_exit(), 143) << run.err();
  const std::string err = run.err();
  EXPECT_HAS(err, "zoe: stopped by SIGTERM after step ");
  EXPECT_HAS(err, "saved in " + d.file("ck"));
  EXPECT_TRUE(std::filesystem::exists(d.file("ck/latest"))) << err;
  EXPECT_TRUE(std::filesystem::is_empty(nvme.path())) << "swap files are removed";
}

// The same with the activations on NVMe: the activation store's swap file goes too.
TEST(TrainInput, SigtermRemovesTheActivationSwapFile) {
  zoe::test::ScratchDir d("sig-act"), acts("sig-act-nvme");
  const std::string cfg = d.file("acts.json");
  write_activation_nvme_config(cfg, acts.path());
  BackgroundRun run({"train", "--preset", "small", "--seq", "64", "--eval-batches", "1", "--steps", "1000000",
                     "--config", cfg, "--activation-checkpointing", "--activation-offload", "nvme",
                     "--activation-host-budget", "2816KiB"},
                    d.file("stderr"));
  ASSERT_TRUE(run.wait_for("step 3/")) << run.err();
  EXPECT_FALSE(std::filesystem::is_empty(acts.path())) << "the activation swap file is there while training";
  run.signal(SIGTERM);
  EXPECT_EQ(run.wait_exit(), 143) << run.err();
  EXPECT_HAS(run.err(), "zoe: stopped by SIGTERM after step ");
  EXPECT_TRUE(std::filesystem::is_empty(acts.path())) << "the activation swap file is removed";
}

TEST(TrainInput, SigintStopsAndASecondOneExitsAtOnce) {
  zoe::test::ScratchDir d("sig");
  {
    BackgroundRun run({"train", "--preset", "tiny", "--seq", "16", "--eval-batches", "1", "--steps",
                       "1000000", "--save-dir", d.file("ck")},
                      d.file("stderr"));
    ASSERT_TRUE(run.wait_for("step 2/")) << run.err();
    run.signal(SIGINT);
    EXPECT_EQ(run.wait_exit(), 130) << run.err();
    EXPECT_HAS(run.err(), "zoe: stopped by SIGINT after step ");
    EXPECT_FALSE(std::filesystem::exists(d.file("ck/latest"))) << "SIGINT does not save";
  }
  {
    // A second SIGINT while the first waits for a step boundary (initialising the medium preset's
    // 38M parameters takes seconds).
    BackgroundRun run({"train", "--preset", "medium", "--steps", "1000000"}, d.file("stderr2"));
    ASSERT_TRUE(run.wait_for("initialising")) << run.err();
    run.signal(SIGINT);
    usleep(200000);
    run.signal(SIGINT);
    EXPECT_EQ(run.wait_exit(), 130) << run.err();
    EXPECT_HAS(run.err(), "second SIGINT: exiting at once");
  }
}

mode_t type_of(const std::string& p) {
  struct stat st {};
  return lstat(p.c_str(), &st) == 0 ? (st.st_mode & S_IFMT) : 0;
}

// A run that must end quickly (a FIFO once made it wait forever): its result.
CmdResult quick(const std::string& args) {
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult r = zoe(args, "", 60);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0) << args;
  return r;
}

// A FIFO as --config or --data waited forever for a writer: refused at once, naming the flag's file.
TEST(TrainInput, FifoAsAnInputIsRefusedAtOnce) {
  zoe::test::ScratchDir d("fifo-in");
  const std::string fifo = d.file("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  CmdResult r = quick(kTiny1 + "--config " + fifo);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "config file " + fifo + " is a FIFO (named pipe), not a regular file");
  r = quick(kTiny1 + "--data " + fifo);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "data file " + fifo + " is a FIFO (named pipe), not a regular file");
  EXPECT_HAS(r.err, "--data");
}

// The output flags never replace what is not a regular file (as root --trace replaced /dev/full
// with a regular file) nor write inside the save directory; refused before training.
TEST(TrainInput, OutputFlagsNeverClobber) {
  zoe::test::ScratchDir d("fifo-out");
  const std::string fifo = d.file("fifo"), dev = d.file("null");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const bool root_dev = mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;
  for (const char* flag : {"--trace", "--dump-batches"}) {
    CmdResult r = quick(kTiny1 + flag + " " + fifo);
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_HAS(r.err, std::string(flag) + " " + fifo + " is a FIFO (named pipe), not a regular file");
    EXPECT_EQ(type_of(fifo), static_cast<mode_t>(S_IFIFO));
    if (root_dev) {
      r = quick(kTiny1 + flag + " " + dev);
      EXPECT_EQ(r.rc, 1) << r.err;
      EXPECT_HAS(r.err, std::string(flag) + " " + dev + " is a character device, not a regular file");
      EXPECT_EQ(type_of(dev), static_cast<mode_t>(S_IFCHR));
    }
  }
  // Inside the run's own --save-dir, new or from an earlier run: refused before any step.
  const std::string save = d.file("save");
  CmdResult r = quick(kTiny1 + "--save-dir " + save + " --trace " + save + "/trace.json");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "--trace " + save + "/trace.json lies inside the checkpoint save directory " + save);
  r = zoe(kTiny1 + "--save-dir " + save + " --save-every 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  r = quick(kTiny1 + "--trace " + save + "/latest");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "--trace " + save + "/latest lies inside the checkpoint save directory " + save);
  EXPECT_EQ(zoe("ckpt verify " + save).rc, 0);
  // A normal trace: written whole, nothing left beside it.
  r = zoe(kTiny1 + "--trace " + d.file("t.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(d.path())) n += e.path().filename() != "save";
  EXPECT_EQ(n, root_dev ? 3u : 2u);  // fifo, t.json (and null)
}

}  // namespace
