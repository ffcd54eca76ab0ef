// `zoe plan` through the binary: the JSON shape, the exit code and message when nothing fits, and
// clear errors for bad input (unknown model_type, missing or corrupt calibration file).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli/run_zoe.h"

namespace {

using nlohmann::json;

std::string fixture(const std::string& name) { return std::string(ZOE_PLAN_FIXTURES) + "/" + name; }

// Memory given explicitly: the test does not depend on this host's RAM or disk.
const std::string kMem = " --device-mem 80GiB --host-mem 256GiB --nvme-space 2TiB";

// --activation-checkpointing with offload: every row's JSON says the checkpointed bytes and where
// the activation store would keep them; a device budget of two block inputs sends the rest to the
// host (within --activation-host-budget beside the NVMe buffers) and NVMe, with their link bytes;
// the table shows the three ckpt columns.
TEST(PlanCli, ActivationBytesPerTier) {
  const std::string args = "plan --preset demo --context 1024 --seq 1024 --micro-batch 8" + kMem +
                           " --activation-checkpointing --activation-offload nvme"
                           " --activation-device-budget 16MiB --activation-host-budget 48MiB";
  CmdResult r = zoe(args + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  const uint64_t tensor = 8ull * 1024 * 256 * 4;  // 8 MiB: micro-batch x seq x d_model x fp32
  for (const json& row : j["rows"]) {
    const json& a = row["activations"];
    EXPECT_EQ(a["checkpointing"], true);
    EXPECT_EQ(a["offload"], "nvme");
    EXPECT_EQ(a["checkpoint_bytes"].get<uint64_t>(), 6 * tensor);
    // The host budget less 2 x 8 MiB write runs and 3 read-ahead blocks: one tensor.
    EXPECT_EQ(a["tier_bytes"]["device"].get<uint64_t>(), 2 * tensor);
    EXPECT_EQ(a["tier_bytes"]["host"].get<uint64_t>(), tensor);
    EXPECT_EQ(a["tier_bytes"]["nvme"].get<uint64_t>(), 3 * tensor);
    EXPECT_EQ(row["link_bytes"]["activation_nvme_write"].get<uint64_t>(), 3 * tensor);
    EXPECT_EQ(row["link_bytes"]["activation_device_to_host"].get<uint64_t>(), 4 * tensor);
  }
  r = zoe(args + " --top 3");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("ckpt nvme"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# activation checkpointing, offload nvme: 48 MiB of block inputs"), std::string::npos)
      << r.out;
}

// The same with 4 micro-batches a step in the layer-major schedule: the block inputs of all 4
// micro-batches are held at once (4 x 6 tensors); the store keeps the same 2 on the device and 1 in
// host memory, so the other 21 go to NVMe, and the step writes them all there.
TEST(PlanCli, LayerMajorHoldsTheCheckpointsOfEveryMicroBatch) {
  const std::string args = "plan --preset demo --context 1024 --seq 1024 --micro-batch 8" + kMem +
                           " --activation-checkpointing --activation-offload nvme"
                           " --activation-device-budget 16MiB --activation-host-budget 48MiB --grad-accum 4";
  const uint64_t tensor = 8ull * 1024 * 256 * 4;
  for (const char* schedule : {"micro-batch", "layer-major"}) {
    CmdResult r = zoe(args + " --schedule " + schedule + " --json");
    ASSERT_EQ(r.rc, 0) << r.err;
    json j = json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    const bool lm = std::string(schedule) == "layer-major";
    for (const json& row : j["rows"]) {
      const json& a = row["activations"];
      EXPECT_EQ(a["checkpoint_bytes"].get<uint64_t>(), (lm ? 24 : 6) * tensor) << schedule;
      EXPECT_EQ(a["tier_bytes"]["device"].get<uint64_t>(), 2 * tensor) << schedule;
      EXPECT_EQ(a["tier_bytes"]["host"].get<uint64_t>(), tensor) << schedule;
      EXPECT_EQ(a["tier_bytes"]["nvme"].get<uint64_t>(), (lm ? 21 : 3) * tensor) << schedule;
      // Per step: micro-batch 4 x 3 tensors, layer-major the 21.
      EXPECT_EQ(row["link_bytes"]["activation_nvme_write"].get<uint64_t>(), (lm ? 21 : 12) * tensor)
          << schedule;
    }
  }
}

TEST(PlanCli, JsonHasExactlyParamsAndRows) {
  CmdResult r = zoe("plan --hf-config " + fixture("gpt2.json") + kMem + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  std::set<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.insert(it.key());
  EXPECT_EQ(keys, (std::set<std::string>{"params", "rows"}));
  EXPECT_EQ(j["params"].get<uint64_t>(), 124439808u);
  ASSERT_EQ(j["rows"].size(), 70u);  // 14 at stage 1, 14 at stage 2, 42 at stage 3
  double last = 0;
  bool fitting = true;
  std::set<std::string> placements;
  for (const json& row : j["rows"]) {
    for (const char* k : {"placement", "fits", "bytes", "predicted_step_s", "bottleneck"}) {
      ASSERT_TRUE(row.contains(k)) << k << " in " << row.dump();
    }
    for (const char* k : {"device", "host", "nvme"}) ASSERT_TRUE(row["bytes"][k].is_number_unsigned()) << k;
    const json& p = row["placement"];
    placements.insert(p.dump());
    const bool fits = row["fits"].get<bool>();
    EXPECT_FALSE(fits && !fitting) << "a fitting row after one that does not fit";
    if (fitting && fits) {
      EXPECT_GE(row["predicted_step_s"].get<double>(), last);
      last = row["predicted_step_s"].get<double>();
    }
    fitting = fitting && fits;
    EXPECT_GT(row["predicted_step_s"].get<double>(), 0.0);
    if (p["offload_optimizer"] == "none") {
      EXPECT_TRUE(p["offload_ratio"].is_null());
    }
    if (p["stage"].get<int>() < 3) {
      EXPECT_EQ(p["offload_param"], "none");
    }
    if (p["offload_param"] == "none" && p["offload_optimizer"] == "none") {
      EXPECT_EQ(row["bytes"]["nvme"], 0u);
    }
  }
  EXPECT_EQ(placements.size(), 70u);  // every placement once
}

TEST(PlanCli, TableOnStdoutProgressOnStderr) {
  CmdResult r =
      zoe("plan --preset small --nodes 2 --gpus-per-node 4" + kMem + " --micro-batch 4 --seq 64 --top 5");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("# zoe plan: zoe-gpt small"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 node(s) x 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stage params optim"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("70 placements fit"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("planning 70 placements"), std::string::npos) << r.err;
}

TEST(PlanCli, NothingFitsExitsOneNamingTheClosest) {
  CmdResult r = zoe("plan --hf-config " + fixture("llama-2-7b.json") +
                    " --device-mem 8GiB --host-mem 16GiB --nvme-space 20GiB --json");
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("fits on 1 node(s)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the closest, stage 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("NVMe space per rank"), std::string::npos) << r.err;
  json j = json::parse(r.out, nullptr, false);  // the rows are still printed
  ASSERT_FALSE(j.is_discarded());
  for (const json& row : j["rows"]) EXPECT_FALSE(row["fits"].get<bool>());
}

// Inputs that are not regular files are refused at once, naming the flag and the path: a FIFO
// (with no writer, reading it waited forever) and /dev/zero (read until memory ran out).
TEST(PlanCli, FifoOrDeviceAsAnInputIsRefusedAtOnce) {
  zoe::test::ScratchDir d("plan-fifo");
  const std::string fifo = d.file("fifo.json");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tune --preset tiny" + kMem + " --calibration " + fifo,
       "calibration file " + fifo + " is a FIFO (named pipe), not a regular file"},
      {"tune --preset tiny" + kMem + " --calibration /dev/zero",
       "calibration file /dev/zero is a character device, not a regular file"},
      {"plan --hf-config " + fifo + kMem,
       "--hf-config " + fifo + " is a FIFO (named pipe), not a regular file"},
  };
  for (const auto& [args, message] : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    CmdResult r = zoe(args, "", 30);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.rc, 1) << args << "\n" << r.err;
    EXPECT_LT(s, 5.0) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
}

TEST(PlanCli, BadInputGivesClearErrors) {
  CmdResult bert = zoe("plan --hf-config " + fixture("bert.json") + kMem);
  EXPECT_EQ(bert.rc, 1);
  EXPECT_NE(bert.err.find("model_type \"bert\" is not supported"), std::string::npos) << bert.err;
  EXPECT_NE(bert.err.find("gpt2, llama, mistral, qwen2, gpt_neox"), std::string::npos) << bert.err;

  zoe::test::ScratchDir d("plan-cli");
  CmdResult missing = zoe("plan --preset tiny" + kMem + " --calibration " + d.file("none.json"));
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find(d.file("none.json")), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("calibration"), std::string::npos) << missing.err;

  {
    std::ofstream f(d.file("corrupt.json"));
    f << "{\"nvme_read_gbps\": 3.0, \"h2d_gbps\": ";
  }
  CmdResult corrupt = zoe("plan --preset tiny" + kMem + " --calibration " + d.file("corrupt.json"));
  EXPECT_EQ(corrupt.rc, 1);
  EXPECT_NE(corrupt.err.find("not valid JSON"), std::string::npos) << corrupt.err;

  {
    std::ofstream f(d.file("good.json"));
    f << "{\"version\": 1, \"nvme_read_gbps\": 0.5, \"nvme_write_gbps\": 0.5}";
  }
  CmdResult good = zoe("plan --preset tiny" + kMem + " --calibration " + d.file("good.json"));
  EXPECT_EQ(good.rc, 0) << good.err;
  EXPECT_NE(good.out.find("nvme read 0.50 / write 0.50"), std::string::npos) << good.out;

  CmdResult two = zoe("plan --preset tiny --params 1e6" + kMem);
  EXPECT_EQ(two.rc, 1);
  EXPECT_NE(two.err.find("give one model"), std::string::npos) << two.err;
  CmdResult bad_params = zoe("plan --params 12x" + kMem);
  EXPECT_EQ(bad_params.rc, 1);
  EXPECT_NE(bad_params.err.find("--params 12x"), std::string::npos) << bad_params.err;
}

TEST(PlanCli, HelpExplainsEveryOption) {
  CmdResult r = zoe("plan --help");
  ASSERT_EQ(r.rc, 0);
  for (const char* opt :
       {"--preset",          "--layers",     "--d-model",       "--heads",         "--context",
        "--params",          "--hf-config",  "--nodes",         "--gpus-per-node", "--device-mem",
        "--host-mem",        "--nvme-space", "--nvme-path",     "--calibration",   "--nvme-read-gbps",
        "--nvme-write-gbps", "--h2d-gbps",   "--cpu-adam-gbps", "--flops",         "--net-gbps",
        "--micro-batch",     "--seq",        "--grad-accum",    "--json"}) {
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
  }
}

}  // namespace

namespace {

// A size zoe chooses itself is in tune's config where the candidate's plan chose it (or the base
// config gave it); else the key is left out, and the candidate's knob is the key's default.
void expect_size(const json& section, const char* key, const json& knob, int64_t fallback) {
  if (section.contains(key))
    EXPECT_EQ(section[key], knob) << key;
  else
    EXPECT_EQ(knob, fallback) << key << " left out of " << section.dump();
}

// `zoe tune`: calibrate this host (small), pick a placement, verify the 3 best candidates for two
// steps each, choose the measured best, write it as a config that zoe train runs, plot it.
TEST(TuneCli, CalibrateSearchVerifyWriteAndPlot) {
  zoe::test::ScratchDir d("tune-cli");
  const std::string cal = d.file("cal.json"), cfg = d.file("tuned.json"), png = d.file("tune.png");
  CmdResult r =
      zoe("tune --preset tiny --device cpu --device-mem 64MiB --host-mem 4GiB --nvme-space 1GiB "
          "--nvme-path " +
          d.path() + " --calibrate --calibrate-bytes 16MiB --calibrate-max-spread 1 --calibration-out " +
          cal + " --out " + cfg + " --verify 3 --verify-steps 2 --plot " + png + " --json");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  for (const char* k :
       {"nvme_read_gbps", "nvme_write_gbps", "cpu_adam_gbps", "flops", "h2d_gbps", "nvme_cpu_gbps"}) {
    EXPECT_GT(j["calibration"][k].get<double>(), 0.0) << k;
  }
  EXPECT_GT(j["best"]["predicted_step_s"].get<double>(), 0.0);
  // Each timed model measurement reports its spread (the threshold is wide here: a test shares the
  // machine; the refusal itself is tested on given samples in test_plan): the FLOP rate at the
  // micro-batch (1) and its drift through the calibration, the stage-3 copies.
  for (const char* k : {"flops@1", "flops@1:drift", "local_copy_gbps"}) {
    ASSERT_TRUE(j["calibration"]["spread"].contains(k)) << k << ": " << j["calibration"].dump();
    EXPECT_GE(j["calibration"]["spread"][k].get<double>(), 0.0) << k;
    EXPECT_LE(j["calibration"]["spread"][k].get<double>(), 1.0) << k;
  }
  // The calibration sweeps aio block size x queue depth; the chosen point goes into the config.
  ASSERT_EQ(j["calibration"]["io_sweep"].size(), 9u) << j["calibration"].dump();
  const int64_t bs = j["calibration"]["aio_block_size"].get<int64_t>();
  EXPECT_EQ(j["aio"]["block_size"], bs);
  bool found = false;
  for (const json& p : j["calibration"]["io_sweep"]) found = found || p["block_size"] == bs;
  EXPECT_TRUE(found);
  ASSERT_EQ(j["verified"].size(), 3u);
  // The candidates run in predicted order, one per placement (the best variant of each of the 3
  // best placements); the choice is the one measured fastest.
  size_t fastest = 0;
  EXPECT_EQ(j["verified"][0]["rank_predicted"], 1);
  for (size_t i = 0; i < 3; ++i) {
    const json& v = j["verified"][i];
    for (size_t q = 0; q < i; ++q) {
      EXPECT_NE(v["placement"], j["verified"][q]["placement"]) << "verified twice";
      EXPECT_GT(v["rank_predicted"].get<int>(), j["verified"][q]["rank_predicted"].get<int>());
    }
    EXPECT_EQ(v["steps"], 2);
    EXPECT_GT(v["measured_step_s"].get<double>(), 0.0);
    EXPECT_TRUE(v["config"].contains("zero_optimization"));
    if (i > 0) {
      EXPECT_GE(v["predicted_step_s"].get<double>(), j["verified"][i - 1]["predicted_step_s"].get<double>());
    }
    if (v["measured_step_s"].get<double>() < j["verified"][fastest]["measured_step_s"].get<double>())
      fastest = i;
  }
  EXPECT_EQ(j["chosen"], fastest + 1);
  EXPECT_EQ(j["chosen_differs_from_predicted"], fastest != 0);
  EXPECT_EQ(j["best"]["predicted_step_s"], j["verified"][fastest]["predicted_step_s"]);
  EXPECT_EQ(j["predicted_best"]["predicted_step_s"], j["verified"][0]["predicted_step_s"]);
  EXPECT_LE(j["verified"][fastest]["high_water"]["device"].get<uint64_t>(),
            j["best"]["bytes"]["device"].get<uint64_t>());
  // The written config is the chosen candidate's.
  std::ifstream in(cfg);
  json written = json::parse(in, nullptr, false);
  EXPECT_EQ(written, j["verified"][fastest]["config"]);
  // Its knobs are the chosen candidate's, an aio point of the sweep among them.
  const json& b = j["best"];
  EXPECT_EQ(written["aio"]["block_size"], b["aio"]["block_size"]);
  EXPECT_EQ(written["aio"]["queue_depth"], b["aio"]["queue_depth"]);
  bool swept = false;
  for (const json& p : j["calibration"]["io_sweep"]) {
    swept =
        swept || (p["block_size"] == b["aio"]["block_size"] && p["queue_depth"] == b["aio"]["queue_depth"]);
  }
  EXPECT_TRUE(swept) << b.dump();
  const json& z = written["zero_optimization"];
  expect_size(z, "sub_group_size", b["sub_group_size"], 1000000000);
  EXPECT_EQ(z["stage3_prefetch_bucket_size"], b["stage3_prefetch_bucket_size"]);
  expect_size(z["offload_optimizer"], "buffer_count", b["offload_optimizer_buffer_count"], 4);
  EXPECT_EQ(z["offload_param"]["buffer_count"], b["offload_param_buffer_count"]);
  expect_size(z["offload_param"], "buffer_size", b["offload_param_buffer_size"], 100000000);
  // The plot: a PNG (its signature) of the default size.
  std::ifstream p(png, std::ios::binary);
  std::string head(24, '\0');
  p.read(head.data(), 24);
  ASSERT_TRUE(p) << "no PNG at " << png;
  EXPECT_EQ(head.substr(1, 3), "PNG");
  const auto be32 = [&](size_t at) {
    return (static_cast<uint32_t>(static_cast<unsigned char>(head[at])) << 24) |
           (static_cast<uint32_t>(static_cast<unsigned char>(head[at + 1])) << 16) |
           (static_cast<uint32_t>(static_cast<unsigned char>(head[at + 2])) << 8) |
           static_cast<uint32_t>(static_cast<unsigned char>(head[at + 3]));
  };
  EXPECT_EQ(be32(16), 1200u);
  EXPECT_EQ(be32(20), 800u);
  // The saved calibration is what zoe plan reads.
  CmdResult pl = zoe("plan --preset tiny" + kMem + " --calibration " + cal);
  EXPECT_EQ(pl.rc, 0) << pl.err;
  // The tuned config is one zoe train runs.
  CmdResult t = zoe("train --config " + cfg + " --preset tiny --steps 2 --micro-batch 1 --quiet --json");
  EXPECT_EQ(t.rc, 0) << t.out << t.err;
  // Flags that cannot take effect are refused.
  CmdResult bad = zoe("tune --preset tiny" + kMem + " --plot " + png);
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("needs --verify K"), std::string::npos) << bad.err;
  bad = zoe("tune --preset tiny" + kMem + " --verify-steps 5");
  EXPECT_NE(bad.err.find("--verify-steps has no effect without --verify K"), std::string::npos) << bad.err;
}

// The search keeps this rank's batch (--micro-batch x --grad-accum) and tries every micro-batch
// dividing it: where 64 sequences' activations do not fit the device, a smaller micro-batch with
// the accumulation that keeps 64 does, and the written config trains with it.
TEST(TuneCli, SearchesTheMicroBatchThatKeepsTheBatch) {
  zoe::test::ScratchDir d("tune-micro");
  const std::string cfg = d.file("tuned.json");
  const std::string base =
      "tune --preset tiny --device cpu --device-mem 16MiB --host-mem 4GiB --nvme-space 1GiB"
      " --nvme-path " +
      d.path() + " --micro-batch 64";
  CmdResult r = zoe(base + " --out " + cfg + " --verify 2 --json");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  // Without --verify-steps: at least 3 timed steps and 2 s of them (at most 50).
  ASSERT_EQ(j["verified"].size(), 2u);
  for (const json& v : j["verified"]) {
    const int n = v["steps"].get<int>();
    EXPECT_GE(n, 3);
    EXPECT_LE(n, 50);
    if (n < 50) {
      EXPECT_GE(n * v["measured_step_s"].get<double>(), 1.0) << v.dump();
    }
  }
  const int64_t micro = j["best"]["micro_batch"].get<int64_t>();
  const int64_t accum = j["best"]["gradient_accumulation_steps"].get<int64_t>();
  EXPECT_LT(micro, 64) << "64 sequences' activations do not fit 16 MiB";
  EXPECT_EQ(micro * accum, 64);
  std::ifstream in(cfg);
  json written = json::parse(in, nullptr, false);
  EXPECT_EQ(written["train_micro_batch_size_per_gpu"], micro);
  EXPECT_EQ(written["gradient_accumulation_steps"], accum);
  EXPECT_EQ(written["train_batch_size"], 64);
  CmdResult t = zoe("train --config " + cfg + " --preset tiny --steps 1 --quiet --json");
  EXPECT_EQ(t.rc, 0) << t.out << t.err;
  json tj = json::parse(t.out, nullptr, false);
  EXPECT_EQ(tj["micro_batch"], micro) << t.out;
  EXPECT_EQ(tj["gradient_accumulation_steps"], accum) << t.out;
  // Held at 64, nothing fits, and the error says so.
  CmdResult f = zoe(base + " --fixed-micro-batch");
  EXPECT_EQ(f.rc, 1);
  EXPECT_NE(f.err.find("the closest"), std::string::npos) << f.err;
}

// With micro-batches and parameters and states on NVMe, `zoe plan --schedule` predicts both
// schedules per row (layer-major reads each module once per step: faster where NVMe bounds the
// step), and `zoe tune` proposes layer-major there, saying why; its config trains layer-major.
TEST(TuneCli, ProposesTheLayerMajorScheduleWhereItWins) {
  const std::string mem = " --device cpu --device-mem 20GiB --host-mem 3GiB --nvme-space 100GiB";
  CmdResult p =
      zoe("plan --preset large --grad-accum 8 --micro-batch 1 --seq 16 --schedule layer-major --json" + mem);
  ASSERT_EQ(p.rc, 0) << p.err;
  json j = json::parse(p.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << p.out;
  int faster = 0;
  for (const json& row : j["rows"]) {
    EXPECT_EQ(row["schedule"], "layer-major");
    const json& both = row["predicted_step_s_by_schedule"];
    EXPECT_DOUBLE_EQ(both["layer-major"].get<double>(), row["predicted_step_s"].get<double>());
    const json& pl = row["placement"];
    if (pl["offload_param"] == "nvme" || pl["offload_optimizer"] == "nvme") {
      EXPECT_LE(both["layer-major"].get<double>(), both["micro-batch"].get<double>()) << row.dump();
      faster += both["layer-major"].get<double>() < 0.8 * both["micro-batch"].get<double>();
    }
  }
  EXPECT_GT(faster, 0);
  CmdResult bad = zoe("plan --preset tiny --schedule sideways" + mem);
  EXPECT_EQ(bad.rc, 1) << bad.err;  // as --precision's
  EXPECT_NE(bad.err.find("--schedule sideways: expected micro-batch or layer-major"), std::string::npos)
      << bad.err;

  zoe::test::ScratchDir d("tune-schedule");
  const std::string cfg = d.file("tuned.json");
  CmdResult t =
      zoe("tune --preset small --grad-accum 8 --micro-batch 1 --seq 16 --fixed-micro-batch --nvme-path " +
          d.path() + " --out " + cfg + mem);
  ASSERT_EQ(t.rc, 0) << t.out << t.err;
  EXPECT_NE(
      t.out.find("# schedule layer-major: each module's parameters cross from their tier once per step"),
      std::string::npos)
      << t.out;
  std::ifstream in(cfg);
  json written = json::parse(in, nullptr, false);
  EXPECT_EQ(written["zoe"]["schedule"], "layer-major") << written.dump();
  CmdResult tr = zoe("train --config " + cfg + " --preset small --seq 16 --steps 1 --quiet --json");
  ASSERT_EQ(tr.rc, 0) << tr.out << tr.err;
  EXPECT_EQ(json::parse(tr.out)["schedule"], "layer-major") << tr.out;
}

// An absurd micro-batch: the search is arithmetic, not a loop over a hundred million
// micro-batches, and --calibrate refuses steps that cannot fit this host, naming the flag.
TEST(TuneCli, AbsurdMicroBatchesAreSearchedOrRefusedNamingTheFlag) {
  zoe::test::ScratchDir d("tune-absurd");
  const std::string base = "tune --preset tiny --device cpu" + kMem + " --nvme-path " + d.path() +
                           " --micro-batch 100000000 --out " + d.file("t.json");
  CmdResult r = zoe(base + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["best"]["micro_batch"].get<int64_t>() * j["best"]["gradient_accumulation_steps"].get<int64_t>(),
            100000000);
  CmdResult c = zoe(base + " --calibrate --calibration-out " + d.file("cal.json"));
  EXPECT_EQ(c.rc, 1);
  EXPECT_NE(c.err.find("--calibrate measures model steps at micro-batch 100000000"), std::string::npos)
      << c.err;
  EXPECT_NE(c.err.find("smaller --micro-batch"), std::string::npos) << c.err;
}

// The knob search on rows with NVMe optimizer states (the medium preset with 512 MiB of device
// and of host memory): the base config's knobs are one variant, so the best is at least as fast
// as the plan's best row (the plan runs the base config at the calibration's chosen aio point);
// the sweep has a faster point for the swapper's smaller requests, so the search finds a faster
// one, and every knob it writes is the candidate's.
TEST(TuneCli, KnobSearchOnNvmeRowsBeatsTheBaseConfig) {
  zoe::test::ScratchDir d("tune-knobs");
  {
    std::ofstream f(d.file("cal.json"));
    f << R"({"nvme_read_gbps": 2.0, "nvme_write_gbps": 2.0, "aio_block_size": 1048576, "aio_queue_depth": 8,
      "io_sweep": [{"block_size": 262144, "queue_depth": 32, "read_gbps": 3.0, "write_gbps": 3.0},
                   {"block_size": 1048576, "queue_depth": 8, "read_gbps": 2.0, "write_gbps": 2.0},
                   {"block_size": 1048576, "queue_depth": 32, "read_gbps": 2.5, "write_gbps": 2.5}]})";
  }
  const std::string flags =
      " --preset medium --device cpu --device-mem 512MiB --host-mem 512MiB --nvme-space 8GiB "
      "--micro-batch 4 --calibration " +
      d.file("cal.json");
  CmdResult pl = zoe("plan" + flags + " --json");
  ASSERT_EQ(pl.rc, 0) << pl.err;
  json pj = json::parse(pl.out, nullptr, false);
  ASSERT_FALSE(pj.is_discarded());
  // The plan's fastest row with the config's (fp32) states: tune keeps the user's precision.
  json top;
  for (const json& r : pj["rows"]) {
    if (r["placement"]["optimizer_states"] == "fp32") {
      top = r;
      break;
    }
  }
  ASSERT_FALSE(top.is_null());
  ASSERT_TRUE(top["fits"].get<bool>());
  EXPECT_EQ(top["placement"]["offload_optimizer"], "nvme");
  CmdResult t = zoe("tune" + flags + " --fixed-micro-batch --nvme-path " + d.path() + " --out " +
                    d.file("tuned.json") + " --json");
  ASSERT_EQ(t.rc, 0) << t.err;
  json tj = json::parse(t.out, nullptr, false);
  ASSERT_FALSE(tj.is_discarded()) << t.out;
  const json& b = tj["best"];
  EXPECT_EQ(b["placement"]["offload_optimizer"], "nvme");
  // Precision is the user's: the config's fp32 states, never a format tune picked.
  EXPECT_EQ(b["placement"]["optimizer_states"], "fp32") << b.dump();
  EXPECT_EQ(b["placement"]["bf16_optimizer_states"], false) << b.dump();
  EXPECT_LT(b["predicted_step_s"].get<double>(), 0.9 * top["predicted_step_s"].get<double>()) << b.dump();
  EXPECT_EQ(b["aio"]["block_size"], 262144) << b.dump();
  EXPECT_EQ(b["aio"]["queue_depth"], 32) << b.dump();
  std::ifstream in(d.file("tuned.json"));
  json w = json::parse(in, nullptr, false);
  EXPECT_EQ(w["aio"]["block_size"], 262144);
  EXPECT_EQ(w["aio"]["queue_depth"], 32);
  const json& z = w["zero_optimization"];
  expect_size(z, "sub_group_size", b["sub_group_size"], 1000000000);
  expect_size(z["offload_optimizer"], "buffer_count", b["offload_optimizer_buffer_count"], 4);
  expect_size(z["offload_param"], "max_in_cpu", b["offload_param_max_in_cpu"], 1000000000);
  EXPECT_EQ(w["zero_optimization"]["stage3_max_live_parameters"], b["stage3_max_live_parameters"]);
}

// The drive is calibrated last (after the model steps), so its directory is checked first: a path
// that cannot hold the calibration file is refused before any model step, naming it.
TEST(TuneCli, CalibrationRefusesABadNvmePathBeforeMeasuring) {
  zoe::test::ScratchDir d("tune-bad-path");
  const std::string missing = d.file("no-such-dir");
  CmdResult r = zoe("tune --preset tiny --device cpu --device-mem 64MiB --nvme-path " + missing +
                    " --calibrate --calibrate-bytes 16MiB --calibration-out " + d.file("cal.json") +
                    " --out " + d.file("tuned.json"));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("through the engine"), std::string::npos) << "model steps ran first: " << r.err;
  struct stat st;
  EXPECT_NE(stat(d.file("cal.json").c_str(), &st), 0) << "a calibration file was written";
}

TEST(TuneCli, NothingFitsExitsOne) {
  CmdResult r = zoe("tune --hf-config " + fixture("llama-2-7b.json") +
                    " --device-mem 8GiB --host-mem 16GiB --nvme-space 20GiB");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("the closest"), std::string::npos) << r.err;
}

// A tune that measures this host (--calibrate, --verify) uses the device this host has without
// --device (zoe.device "auto"'s: cpu here), and writes the calibration only where --calibration-out
// asks: nothing into the working directory, and stderr says the rates were not saved.
TEST(TuneCli, MeasuredTuneUsesThisHostsDeviceAndWritesOnlyWhereAsked) {
  zoe::test::ScratchDir d("tune-host");
  CmdResult r =
      zoe("tune --preset tiny --device-mem 64MiB --host-mem 4GiB --nvme-space 1GiB --nvme-path " + d.path() +
              " --calibrate --calibrate-bytes 16MiB --calibrate-max-spread 1 --verify 1 "
              "--verify-steps 1 --out " +
              d.file("tuned.json") + " --json",
          "cd " + d.path() + " &&");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_GT(j["calibration"]["flops"].get<double>(), 0.0);
  EXPECT_FALSE(j.contains("calibration_out")) << r.out;
  std::ifstream in(d.file("tuned.json"));
  json cfg = json::parse(in, nullptr, false);
  ASSERT_FALSE(cfg.is_discarded());
  EXPECT_EQ(cfg["zoe"]["device"], "cpu") << cfg.dump();
  struct stat st;
  EXPECT_NE(stat(d.file("zoe-calibration.json").c_str(), &st), 0) << "a calibration file nobody asked for";
  EXPECT_NE(r.err.find("zoe tune: calibration used for this plan and not saved (--calibration-out FILE"),
            std::string::npos)
      << r.err;
}

// A --device that cannot be used here is refused before anything is measured, naming the flag;
// --calibration-out without --calibrate is refused rather than ignored.
TEST(TuneCli, UnusableDeviceRefusedBeforeMeasuring) {
  zoe::test::ScratchDir d("tune-device");
  const std::string base =
      "tune --preset tiny --device-mem 64MiB --host-mem 4GiB --nvme-space 1GiB --nvme-path " + d.path() +
      " --out " + d.file("tuned.json");
  CmdResult r = zoe(base + " --calibration-out " + d.file("cal.json"));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--calibration-out " + d.file("cal.json") + " has no effect without --calibrate"),
            std::string::npos)
      << r.err;
  CmdResult info = zoe("info");
  if (info.out.find("CUDA       none") == std::string::npos) GTEST_SKIP() << "this host has a GPU";
  for (const std::string measure : {" --calibrate --calibrate-bytes 16MiB", " --verify 1 --verify-steps 1"}) {
    r = zoe(base + " --device cuda" + measure, "", 120);
    EXPECT_EQ(r.rc, 2) << measure << ": " << r.err;
    EXPECT_NE(r.err.find("zoe: error: invalid argument: --device cuda: this host has no usable GPU"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("give --device cpu"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("calibrate:"), std::string::npos) << "measured first: " << r.err;
    struct stat st;
    EXPECT_NE(stat(d.file("tuned.json").c_str(), &st), 0) << measure;
  }
  r = zoe(base + " --device cuda --json");  // planning for a GPU host (nothing measured) stays allowed
  EXPECT_EQ(r.rc, 0) << r.err;
}

}  // namespace
