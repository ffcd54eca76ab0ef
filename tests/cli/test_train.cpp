// End-to-end tests of `zoe train`: offload changes nothing (bit-identical losses), the loss
// falls, and bad input gets clear messages.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "tests/cli/run_zoe.h"
#include "tests/util/test_util.h"

namespace {

using nlohmann::json;

json train(const std::string& args, CmdResult* raw = nullptr, int timeout_s = 300) {
  CmdResult r = zoe("train --json --quiet " + args, "", timeout_s);
  if (raw) *raw = r;
  EXPECT_EQ(r.rc, 0) << r.err;
  if (r.rc != 0) return json();
  return json::parse(r.out);
}

TEST(Train, NvmeOffloadGivesBitIdenticalLosses) {
  zoe::test::ScratchDir d("train");
  const std::string common =
      "--preset tiny --steps 6 --micro-batch 4 --seq 32 --seed 7 --eval-batches 1 --threads 1 ";
  json none = train(common + "--offload none");
  json cpu = train(common + "--offload cpu");
  json nvme = train(common + "--offload nvme --nvme-path " + d.path() + " --device-budget 2MiB");
  ASSERT_FALSE(none.is_null());
  ASSERT_FALSE(nvme.is_null());
  ASSERT_EQ(none["losses"].size(), 6u);
  // JSON doubles print with round-trip precision: equal text means equal bits.
  EXPECT_EQ(none["losses"].dump(), nvme["losses"].dump());
  EXPECT_EQ(none["losses"].dump(), cpu["losses"].dump());
  EXPECT_EQ(nvme["offload"]["param"], "nvme");
  EXPECT_GT(nvme["bytes_moved"]["host->nvme"].get<uint64_t>(), 0u);
  EXPECT_GT(nvme["high_water_bytes"]["nvme"].get<uint64_t>(), 0u);
  EXPECT_LE(nvme["high_water_bytes"]["device"].get<uint64_t>(), 2u << 20);
  for (const char* k : {"params", "model_state_bytes", "device_budget_bytes", "high_water_bytes",
                        "bytes_moved", "time_s", "losses", "eval_loss"}) {
    EXPECT_TRUE(nvme.contains(k)) << k;
  }
}

// Activation checkpointing through the activation store: the same losses, bit for bit, without it,
// with it and the block inputs on the device, in host memory (the flag, or the config's
// cpu_checkpointing) and on NVMe; the JSON says how many bytes a micro-batch checkpoints and where
// they went. The small preset at micro-batch 16 x 64 tokens: 4 block inputs of 512 KiB.
TEST(Train, ActivationCheckpointingGivesBitIdenticalLossesThroughTheTiers) {
  zoe::test::ScratchDir d("act");
  const std::string base = d.file("base.json"), tight = d.file("tight.json"),
                    section = d.file("section.json");
  const std::string zero = R"("train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 3})";
  std::ofstream(base) << "{" << zero << "}";
  // The device's activation share holds one block input (the last, which never leaves).
  std::ofstream(tight) << "{" << zero
                       << R"(, "zoe": {"activation_device_budget": "600KiB", "activation_nvme_path": ")"
                       << d.path() << R"("}})";
  std::ofstream(section) << "{" << zero << R"(, "activation_checkpointing": {"cpu_checkpointing": true},)"
                         << R"( "zoe": {"activation_device_budget": "600KiB"}})";
  const std::string common = "--preset small --steps 4 --seq 64 --seed 5 --eval-batches 1 --threads 1 ";
  json plain = train(common + "--config " + base);
  json none = train(common + "--config " + base + " --activation-checkpointing");
  json cpu = train(common + "--config " + tight + " --activation-checkpointing --activation-offload cpu");
  // The host budget (2.75 MiB): the NVMe tier's write-behind runs (2 x an eighth of it) and
  // read-ahead blocks (3 x 512 KiB), and one block input; the other two go to NVMe.
  json nvme = train(common + "--config " + tight +
                    " --activation-checkpointing --activation-offload nvme --activation-host-budget 2816KiB");
  json cfg = train(common + "--config " + section);
  for (const json* j : {&plain, &none, &cpu, &nvme, &cfg}) ASSERT_FALSE(j->is_null());
  ASSERT_EQ(plain["losses"].size(), 4u);
  const uint64_t ckpt = 4ull * 16 * 64 * 128 * 4;
  EXPECT_EQ(plain["activation_checkpoint_bytes"].get<uint64_t>(), 0u);
  for (const json* j : {&none, &cpu, &nvme, &cfg}) {
    EXPECT_EQ((*j)["losses"].dump(), plain["losses"].dump());
    EXPECT_EQ((*j)["eval_loss"].dump(), plain["eval_loss"].dump());
    EXPECT_EQ((*j)["activation_checkpoint_bytes"].get<uint64_t>(), ckpt);
  }
  EXPECT_EQ(none["high_water_bytes"]["activation_device"].get<uint64_t>(), ckpt);
  EXPECT_EQ(none["high_water_bytes"]["activation_host"].get<uint64_t>(), 0u);
  for (const json* j : {&cpu, &nvme, &cfg}) {
    EXPECT_LE((*j)["high_water_bytes"]["activation_device"].get<uint64_t>(), 600u << 10);
    EXPECT_GT((*j)["high_water_bytes"]["activation_host"].get<uint64_t>(), 0u);
    EXPECT_GT((*j)["activation_bytes_moved"]["device->host"].get<uint64_t>(), 0u);
  }
  EXPECT_EQ(cpu["high_water_bytes"]["activation_nvme"].get<uint64_t>(), 0u);
  EXPECT_GT(nvme["high_water_bytes"]["activation_nvme"].get<uint64_t>(), 0u);
  EXPECT_GT(nvme["activation_bytes_moved"]["host->nvme"].get<uint64_t>(), 0u);
  EXPECT_GT(nvme["activation_bytes_moved"]["nvme->host"].get<uint64_t>(), 0u);
  EXPECT_LE(nvme["high_water_bytes"]["activation_host"].get<uint64_t>(), 2816u << 10);
  EXPECT_TRUE(nvme["time_s"].contains("activation_stall"));
}

// Two jobs at once with their activations in one directory: each store makes a swap file of its
// own, both train the losses of a run with no checkpointing, bit for bit, and neither leaves a file.
TEST(Train, TwoJobsShareAnActivationDirectory) {
  zoe::test::ScratchDir d("act2"), acts("act2-nvme");
  const std::string cfg = d.file("tight.json");
  write_activation_nvme_config(cfg, acts.path());
  const std::string common =
      "--preset small --steps 30 --seq 64 --seed 5 --eval-batches 1 --threads 1 --config " + cfg;
  json plain = train(common);
  ASSERT_FALSE(plain.is_null());
  const std::string job =
      std::string(ZOE_BIN) + " train --json --quiet " + common +
      " --activation-checkpointing --activation-offload nvme --activation-host-budget 2816KiB";
  const std::string both = "(" + job + " > " + d.file("a.json") + " 2> " + d.file("a.err") + " & " + job +
                           " > " + d.file("b.json") + " 2> " + d.file("b.err") + "; wait)";
  ASSERT_EQ(std::system(both.c_str()), 0);
  for (const char* name : {"a", "b"}) {
    std::ifstream in(d.file(std::string(name) + ".json"));
    json j = json::parse(in, nullptr, false);
    std::ifstream err(d.file(std::string(name) + ".err"));
    ASSERT_FALSE(j.is_discarded()) << name << ": " << std::string(std::istreambuf_iterator<char>(err), {});
    EXPECT_EQ(j["losses"].dump(), plain["losses"].dump()) << name;
    EXPECT_GT(j["high_water_bytes"]["activation_nvme"].get<uint64_t>(), 0u) << name;
  }
  EXPECT_TRUE(std::filesystem::is_empty(acts.path())) << "the activation swap files are removed";
}

TEST(Train, DemoShapeWithEvaluationFinishes) {
  // The README demo's shape (many modules streamed through a 16 MiB device, parameters and
  // optimizer states on NVMe, evaluation between steps): queued gathers read partitions while
  // the tier manager's prefetches stream others. This once deadlocked; the ctest timeout is
  // the guard, and losses must equal those with no offload.
  zoe::test::ScratchDir d("train");
  const std::string common =
      "--preset demo --steps 4 --micro-batch 8 --lr 0.002 --eval-every 2 --eval-batches 1 ";
  json nvme = train(common + "--offload nvme --nvme-path " + d.path() + " --device-budget 16MiB");
  json none = train(common + "--offload none");
  ASSERT_FALSE(nvme.is_null());
  ASSERT_FALSE(none.is_null());
  EXPECT_EQ(none["losses"].dump(), nvme["losses"].dump());
}

TEST(Train, ResumeContinuesBitIdentically) {
  for (const char* off : {"none", "nvme"}) {
    zoe::test::ScratchDir nvme("nvme"), ck("ckpt");
    const std::string common =
        std::string("--preset tiny --micro-batch 4 --seq 32 --seed 11 --eval-batches 1 --threads 1 ") +
        "--offload " + off + " --nvme-path " + nvme.path() + " ";
    json whole = train(common + "--steps 12");
    // The NVMe run saves asynchronously, overlapping the next steps.
    json first = train(common + "--steps 6 --save-every 3 --save-dir " + ck.path() +
                       (std::string(off) == "nvme" ? " --save-async" : ""));
    ASSERT_TRUE(std::filesystem::exists(ck.file("latest")));
    ASSERT_TRUE(std::filesystem::exists(ck.file("step-000006/manifest.json")));
    json rest = train(common + "--steps 12 --resume " + ck.path());
    ASSERT_FALSE(whole.is_null());
    ASSERT_FALSE(rest.is_null());
    ASSERT_EQ(first["losses"].size(), 6u);
    ASSERT_EQ(rest["losses"].size(), 6u) << "steps 7-12 only";
    EXPECT_EQ(rest["start_step"], 6);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(first["losses"][i].dump(), whole["losses"][i].dump()) << off << " step " << i + 1;
      EXPECT_EQ(rest["losses"][i].dump(), whole["losses"][i + 6].dump()) << off << " step " << i + 7;
    }
    // A wrong seed would change the data order: refused.
    std::string other = common;
    other.replace(other.find("--seed 11"), 9, "--seed 12");
    CmdResult r = zoe("train " + other + "--steps 12 --resume " + ck.path());
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find("--seed"), std::string::npos) << r.err;
  }
}

TEST(Train, LossFallsOnArithmetic) {
  // Convergence with a generous bound: the held-out loss starts at ln(256) = 5.5 and the tiny
  // model reaches about 2.3 in 300 steps (measured); the bound is 2.6.
  json j = train(
      "--preset tiny --steps 300 --micro-batch 16 --seq 64 --lr 0.003 --seed 3 --eval-batches 4 --threads 2");
  ASSERT_FALSE(j.is_null());
  EXPECT_GT(j["losses"][0].get<double>(), 5.0);
  EXPECT_LT(j["eval_loss"].get<double>(), 2.6) << j.dump();
  EXPECT_TRUE(j.contains("accuracy"));
}

// scripts/demo.sh's DeepSpeed-style config (the same text, with `nvme` for its scratch folder): the
// tiny model's states on NVMe against a 576 KiB device budget, and the recipe that learns on every
// kernel set (AdamW betas (0.9, 0.95), clipping at 1.0, a 100-step warm-up to 0.003 and a linear
// decay to 0 at step 3000). The schedule ends at step 3000 whatever --steps is, so a run with fewer
// steps is the demo's first steps, bit for bit.
std::string write_demo_config(const zoe::test::ScratchDir& nvme) {
  const std::string path = nvme.file("ds_config.json");
  std::ofstream(path) << R"({
  "train_micro_batch_size_per_gpu": 32,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.9, 0.95], "weight_decay": 0}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.003, "warmup_num_steps": 100,
                           "warmup_type": "linear", "total_num_steps": 3000}},
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 3,
    "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": ")"
                      << nvme.path() << R"("},
    "offload_optimizer": {"device": "nvme", "nvme_path": ")"
                      << nvme.path() << R"("}
  },
  "zoe": {"device_budget": "576KiB"}
})";
  return path;
}

// The demo preset at --seq 256 and micro-batch 8, at a constant lr 1e-3 from the first update,
// goes 2.55 -> 12.8 in one step near step 22 (nearly every position then predicts a byte the
// corpus never holds) and back within three: plain PyTorch does the same on the same initial
// weights and batches, in fp32 and fp64, with clipping at 1.0 or Adam's eps at 1e-6, so it is the
// recipe, not zoe. The default warm-up (--warmup 100) keeps every step within a small rise of
// the one before; the bound (0.5 nats) is ten times the largest rise measured with it and holds on
// any kernel set: the spike is 20 times more.
TEST(Train, DefaultRecipeHasNoLossSpike) {
  json j = train("--preset demo --context 256 --seq 256 --micro-batch 8 --steps 23 --eval-batches 1");
  ASSERT_FALSE(j.is_null());
  const auto& l = j["losses"];
  ASSERT_EQ(l.size(), 23u);
  for (size_t k = 1; k < l.size(); ++k) {
    EXPECT_LT(l[k].get<double>() - l[k - 1].get<double>(), 0.5) << "step " << k << ": " << l.dump();
  }
  EXPECT_LT(l[22].get<double>(), 4.0) << l.dump();
  // The warm-up: update k at lr (1 + (k - 2) (N - 1) / N) / N, lr 1e-3, N = 100.
  const auto& lrs = j["lrs"];
  EXPECT_NEAR(lrs[0].get<double>(), 1e-5, 1e-12) << lrs.dump();
  EXPECT_NEAR(lrs[22].get<double>(), 1e-5 + (1e-3 - 1e-5) * 21 / 100, 1e-12) << lrs.dump();
  // --warmup 0: a constant rate; a one-update warm-up is refused, and so is --warmup beside a config.
  json none = train("--preset tiny --steps 2 --seq 16 --warmup 0 --lr 0.002");
  ASSERT_FALSE(none.is_null());
  EXPECT_EQ(none["lrs"][0].get<double>(), 0.002);
  CmdResult r = zoe("train --preset tiny --steps 1 --warmup 1");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--warmup 1 is not a warm-up"), std::string::npos) << r.err;
  zoe::test::ScratchDir d("warmup");
  std::ofstream(d.file("c.json")) << R"({"train_micro_batch_size_per_gpu": 2})";
  r = zoe("train --preset tiny --steps 1 --warmup 10 --config " + d.file("c.json"));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--warmup cannot be combined with --config"), std::string::npos) << r.err;
}

TEST(Train, TheDemosMainJobLearnsOneDigitAdditions) {
  // scripts/demo.sh's command, on this machine's kernel set: exact-match accuracy on held-out
  // additions starts at 0 and ends at 100 % (measured for seeds 1-3 on every kernel set, docs/benchmarks.md);
  // the bound is 95 %. The model answers 7+5= with 12, and the demo says nothing about its own
  // config (no warning).
  // Under a sanitizer (which changes no bit) the first 300 steps: the path's memory and threads are
  // checked there, the accuracy in the Release build (3000 steps: 75 s there, over 300 s under ASan).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const bool learn = false;
#else
  const bool learn = true;
#endif
  zoe::test::ScratchDir nvme("demo");
  CmdResult raw;
  json j = train("--config " + write_demo_config(nvme) + " --preset tiny --task add1 --seed 2 --steps " +
                     (learn ? "3000 --eval-every 500" : "300 --eval-every 300") +
                     " --sample 13 --prompt 7+5= --temperature 0",
                 &raw, /*timeout_s=*/800);
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(raw.err.find("warning"), std::string::npos) << raw.err;
  EXPECT_GT(j["state_to_budget"].get<double>(), 3.5);
  EXPECT_EQ(j["offload"]["param"], "nvme");
  ASSERT_GE(j["evals"].size(), 2u);
  EXPECT_EQ(j["evals"][0]["step"], 0);
  EXPECT_EQ(j["evals"][0]["accuracy"], 0.0);
  if (!learn) return;
  EXPECT_GE(j["accuracy"].get<double>(), 0.95) << j["kernels"].dump() << " " << j["evals"].dump();
  ASSERT_EQ(j["samples"].size(), 2u);
  EXPECT_EQ(j["samples"][1]["step"], 3000);
  EXPECT_EQ(j["samples"][1]["text"].get<std::string>().substr(0, 7), "7+5=12\n") << j["samples"].dump();
}

// One run of the demo's config (its own NVMe folder) for `steps` steps on one thread, with the
// environment `env` (ZOE_SIMD, OPENBLAS_CORETYPE); the --json summary, or null.
json demo_run(const std::string& env, int seed, int steps) {
  zoe::test::ScratchDir nvme("demo");
  CmdResult r = zoe("train --json --quiet --config " + write_demo_config(nvme) +
                        " --preset tiny --task add1 --threads 1 --seed " + std::to_string(seed) +
                        " --steps " + std::to_string(steps) + " --eval-every " + std::to_string(steps),
                    env, 900);
  EXPECT_EQ(r.rc, 0) << env << " seed " << seed << ": " << r.err;
  return r.rc == 0 ? json::parse(r.out) : json();
}

// Runs f(i) for i in [0, n), two at a time (the test machine's two cores; each run is one thread).
template <typename F>
void in_pairs(size_t n, F f) {
  for (size_t i = 0; i < n; i += 2) {
    std::thread second;
    if (i + 1 < n) second = std::thread([&f, i] { f(i + 1); });
    f(i);
    if (second.joinable()) second.join();
  }
}

// The demo's recipe learns on every kernel set this CPU can run, for seeds 1, 2 and 3 (no seed is
// picked): this machine's own, and every OpenBLAS core zoe has met (Haswell, SkylakeX,
// Cooperlake, Zen; forced with OPENBLAS_CORETYPE where this CPU has the instructions) with each of
// zoe's SIMD levels (ZOE_SIMD). Kernel sets whose first 60 steps are bit-identical compute alike
// (zoe's SIMD levels agree bit for bit by design, OpenBLAS's Zen core uses Haswell's kernels),
// so each group of them trains once per seed. Each run is the demo's first kKernelSetSteps steps:
// measured, every kernel set and seed was at >= 98 % there (docs/benchmarks.md), and the bound is 95 %.
TEST(Train, TheDemosRecipeLearnsOnEveryKernelSetForSeeds1To3) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "convergence on every kernel set is checked in the Release build (a sanitizer changes "
                  "no bit, and would take an hour)";
#endif
  // About 15-20 minutes on 2 cores (some 9 groups x 3 seeds of 2000 steps): ctest runs it as its own
  // entry, test_train_kernel_sets, which sets ZOE_KERNEL_SET_TESTS (tests/cli/CMakeLists.txt);
  // test_train itself skips it.
  if (getenv("ZOE_KERNEL_SET_TESTS") == nullptr) {
    GTEST_SKIP() << "every kernel set x seeds 1-3 takes 15-20 minutes on 2 cores: ctest runs it as "
                    "test_train_kernel_sets (or set ZOE_KERNEL_SET_TESTS=1)";
  }
  constexpr int kKernelSetSteps = 2000;
  CmdResult info = zoe("info --json");
  ASSERT_EQ(info.rc, 0) << info.err;
  const json f = json::parse(info.out)["cpu"]["features"];
  const bool avx2 = f["avx2"].get<bool>() && f["fma"].get<bool>();
  const bool avx512 =
      avx2 && f["avx512f"].get<bool>() && f["avx512bw"].get<bool>() && f["avx512vl"].get<bool>();
  std::vector<std::string> envs = {""};  // this machine's own
  std::vector<std::string> simds = {"scalar"};
  if (avx2) simds.push_back("avx2");
  if (avx512) simds.push_back("avx512");
  std::vector<std::string> cores;
  if (avx2) cores = {"Haswell", "Zen"};
  if (avx512) cores.push_back("SkylakeX");
  if (avx512 && f["avx512_bf16"].get<bool>()) cores.push_back("Cooperlake");
  for (const std::string& core : cores)
    for (const std::string& simd : simds) envs.push_back("ZOE_SIMD=" + simd + " OPENBLAS_CORETYPE=" + core);

  // The kernel sets, grouped by the bits of their first 60 steps (losses and gradient norms).
  std::vector<json> prefix(envs.size());
  in_pairs(envs.size(), [&](size_t i) { prefix[i] = demo_run(envs[i], 2, 60); });
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < envs.size(); ++i) {
    ASSERT_FALSE(prefix[i].is_null()) << envs[i];
    const std::string kernels = prefix[i]["kernels"]["simd"].get<std::string>() + "/" +
                                prefix[i]["kernels"]["blas"].get<std::string>();
    // A forced core this OpenBLAS does not have falls back to another: not that kernel set.
    const size_t at = envs[i].find("OPENBLAS_CORETYPE=");
    if (at != std::string::npos && kernels.find(envs[i].substr(at + 18)) == std::string::npos) continue;
    groups[prefix[i]["losses"].dump() + prefix[i]["grad_norms"].dump()].push_back(i);
  }
  std::vector<std::pair<size_t, int>> runs;  // (the group's first kernel set, seed)
  for (const auto& [bits, members] : groups)
    for (int seed = 1; seed <= 3; ++seed) runs.push_back({members.front(), seed});
  std::vector<json> out(runs.size());
  in_pairs(runs.size(),
           [&](size_t k) { out[k] = demo_run(envs[runs[k].first], runs[k].second, kKernelSetSteps); });
  for (size_t k = 0; k < runs.size(); ++k) {
    ASSERT_FALSE(out[k].is_null());
    std::string same;
    for (const auto& [bits, members] : groups)
      if (members.front() == runs[k].first)
        for (size_t i : members)
          same += " [" + (envs[i].empty() ? std::string("this machine's") : envs[i]) + "]";
    EXPECT_GE(out[k]["accuracy"].get<double>(), 0.95)
        << "seed " << runs[k].second << ", kernel sets" << same << ": " << out[k]["evals"].dump();
  }
  printf("%zu kernel sets in %zu groups of identical bits; %zu runs of %d steps\n", envs.size(),
         groups.size(), runs.size(), kKernelSetSteps);
}

TEST(Train, SamplesOfATextShowItsWords) {
  // --data with a directory: its files in name order; a sample before and after training, with
  // the share of its words found in the text (an untrained byte model's sample has almost none).
  zoe::test::ScratchDir d("text");
  std::string text;
  for (int i = 0; i < 300; ++i) text += "the program is free software and you can share it\n";
  std::ofstream(d.file("a.txt")) << text;
  std::ofstream(d.file("b.txt")) << text;
  json j = train("--preset tiny --seq 32 --steps 300 --micro-batch 16 --lr 0.003 --data " + d.path() +
                 " --sample 64 --prompt the --eval-every 300");
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["data"], d.path() + " (2 files)");
  ASSERT_EQ(j["samples"].size(), 2u);
  EXPECT_EQ(j["samples"][0]["step"], 0);
  EXPECT_EQ(j["samples"][0]["text"].get<std::string>().substr(0, 3), "the");
  EXPECT_LT(j["samples"][0]["known_words"].get<double>(), 0.5) << j["samples"].dump();
  EXPECT_GT(j["samples"][1]["known_words"].get<double>(), 0.8) << j["samples"].dump();
  EXPECT_GT(j["samples"][1]["words"].get<int>(), 5) << j["samples"].dump();
  EXPECT_EQ(j["prompt"], "the");
}

TEST(Train, BadInputGetsClearErrors) {
  zoe::test::ScratchDir d("bad");
  CmdResult r = zoe("train --preset tiny --steps 1 --data " + d.file("missing.txt"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("missing.txt does not exist"), std::string::npos) << r.err;

  r = zoe("train --preset tiny --steps 1 --seq 500");
  EXPECT_EQ(r.rc, 2);  // a usage error
  EXPECT_NE(r.err.find("--seq 500 is longer than the model allows"), std::string::npos) << r.err;

  r = zoe("train --preset small --steps 1 --device-budget 512KiB");  // embed fits, a block does not
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("module block.0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("device budget"), std::string::npos) << r.err;

  r = zoe("train --preset tiny --steps 1 --offload nvme --nvme-path " + d.file("nope"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("nope"), std::string::npos) << r.err;

  r = zoe("train --preset huge");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--preset huge"), std::string::npos) << r.err;
}

TEST(Train, NvmePathTooSmall) {
  zoe::test::ScratchMount m("tmpfs", "size=1m");
  if (!m.ok()) GTEST_SKIP() << "cannot mount tmpfs";
  CmdResult r = zoe("train --preset small --steps 1 --offload nvme --nvme-path " + m.path());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("NVMe swap space"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("free"), std::string::npos) << r.err;
}

// The swap files cut to 0 bytes while the run uses them (a cleanup job, a full-disk script), at
// several moments of the start-up and first steps. Later swap writes extend the files again and
// the holes read back as zeros: that must be an error naming the swap file, never a run that
// finishes (rc 0) on all-zero weights (every loss ln 256). A cut after the last read of what it
// destroyed may still finish, with the reference's losses.
TEST(Train, ATruncatedSwapFileIsAnErrorNeverZeroWeights) {
  const std::string common = "--preset demo --steps 4 --offload nvme --device-budget 16MiB ";
  zoe::test::ScratchDir ref_dir("nvref");
  json ref = train(common + "--nvme-path " + ref_dir.path());
  ASSERT_FALSE(ref.is_null());
  for (const char* delay : {"0.1", "0.2", "0.3", "0.5"}) {
    zoe::test::ScratchDir d("nvcut");
    const std::string files = d.path() + "/zoe-swap-*";
    const std::string cutter = "( for i in $(seq 1 5000); do ls " + files +
                               " >/dev/null 2>&1 && break; sleep 0.001; done; sleep " + delay +
                               "; truncate -s 0 " + files + " ) >/dev/null 2>&1 & ";
    CmdResult r = zoe("train --json --quiet " + common + "--nvme-path " + d.path(), cutter);
    SCOPED_TRACE(std::string("cut ") + delay + " s after the swap file appeared");
    if (r.rc == 0) {
      EXPECT_EQ(json::parse(r.out)["losses"].dump(), ref["losses"].dump()) << "finished on damaged swap data";
      continue;
    }
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_NE(r.err.find("zoe: error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(d.path() + "/zoe-swap-"), std::string::npos) << r.err;
    const bool says = r.err.find("truncated") != std::string::npos ||
                      r.err.find("Short read") != std::string::npos ||
                      r.err.find("lost its guard page") != std::string::npos;
    EXPECT_TRUE(says) << r.err;
  }
}

}  // namespace
