// The NVMe drive's wear through the binary: `zoe plan` and `zoe tune` give the bytes a rank writes
// to NVMe per step and per 1,000 steps and, with --drive-tbw, the steps a drive's rated endurance
// allows; `zoe train` reports the bytes its run wrote (and with zoe.drive_tbw the share of the
// endurance used), which the plan of the same config predicts; `zoe info` says what SMART gives.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/run_zoe.h"
#include "tests/util/test_util.h"

namespace {

using nlohmann::json;

// Memory given explicitly: the plan does not depend on this host's RAM or disk.
const std::string kMem = " --device-mem 80GiB --host-mem 256GiB --nvme-space 2TiB";

json parse_ok(const CmdResult& r) {
  EXPECT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

// Every row: per 1,000 steps is 1000 x per step, per step is the cost model's NVMe bytes written,
// and the steps are the rated bytes over the bytes the node's ranks write per step.
void expect_wear(const json& row, double tbw, int ranks) {
  const uint64_t per_step = row["nvme_bytes_written_per_step"].get<uint64_t>();
  EXPECT_EQ(per_step, row["link_bytes"]["nvme_write"].get<uint64_t>()) << row.dump();
  EXPECT_EQ(row["nvme_bytes_written_per_1000_steps"].get<uint64_t>(), 1000 * per_step);
  if (tbw <= 0) {
    EXPECT_FALSE(row.contains("steps_per_drive_endurance"));
  } else if (per_step == 0) {
    EXPECT_TRUE(row["steps_per_drive_endurance"].is_null());
  } else {
    EXPECT_EQ(row["steps_per_drive_endurance"].get<double>(),
              std::floor(tbw * 1e12 / (static_cast<double>(per_step) * ranks)));
  }
}

TEST(DriveWear, PlanGivesBytesWrittenPerStepAndTheStepsTheDriveAllows) {
  const std::string args = "plan --preset demo --micro-batch 4 --seq 256" + kMem;
  json plain = parse_ok(zoe(args + " --json"));
  json rated = parse_ok(zoe(args + " --drive-tbw 600 --json"));
  json shared =
      parse_ok(zoe("plan --preset demo --micro-batch 4 --seq 256 --gpus-per-node 2 --device-mem 160GiB "
                   "--host-mem 256GiB --nvme-space 2TiB --drive-tbw 600 --json"));
  ASSERT_TRUE(rated.contains("rows"));
  EXPECT_FALSE(plain.contains("drive_tbw"));
  EXPECT_EQ(rated["drive_tbw"].get<double>(), 600.0);
  EXPECT_EQ(shared["ranks_per_drive"].get<int>(), 2);
  int writing = 0;
  for (const json& row : plain["rows"]) expect_wear(row, 0, 1);
  for (const json& row : rated["rows"]) {
    expect_wear(row, 600, 1);
    writing += row["nvme_bytes_written_per_step"].get<uint64_t>() > 0;
  }
  for (const json& row : shared["rows"]) expect_wear(row, 600, 2);
  EXPECT_GT(writing, 0) << "no placement writes to NVMe";
  // The text: one line for the first row.
  CmdResult r = zoe(args + " --drive-tbw 600 --top 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("# NVMe wear (the first row): "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("per 1,000 steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("a 600 TB drive"), std::string::npos) << r.out;
}

TEST(DriveWear, TuneGivesTheChosenCandidatesWear) {
  json j = parse_ok(
      zoe("tune --preset demo --micro-batch 4 --seq 256 --device cpu" + kMem + " --drive-tbw 600 --json"));
  ASSERT_TRUE(j.contains("best")) << j.dump();
  const json& b = j["best"];
  const uint64_t per_step = b["nvme_bytes_written_per_step"].get<uint64_t>();
  EXPECT_EQ(b["nvme_bytes_written_per_1000_steps"].get<uint64_t>(), 1000 * per_step);
  EXPECT_TRUE(b.contains("steps_per_drive_endurance"));
  EXPECT_EQ(j["drive_tbw"].get<double>(), 600.0);
  CmdResult r = zoe("tune --preset demo --micro-batch 4 --seq 256 --device cpu" + kMem);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("# NVMe wear (the starred candidate): "), std::string::npos) << r.out;
}

TEST(DriveWear, ABadDriveTbwIsRefusedNamingTheFlag) {
  for (const char* cmd : {"plan", "tune"}) {
    for (const char* v : {"0", "-600", "abc", "inf", "nan", "600TB"}) {
      CmdResult r = zoe(std::string(cmd) + " --preset tiny" + kMem + " --drive-tbw " + v);
      EXPECT_NE(r.rc, 0) << cmd << " " << v;
      EXPECT_NE(r.err.find("--drive-tbw"), std::string::npos) << cmd << " " << v << ": " << r.err;
    }
  }
}

// A stage-3 config with parameters and optimizer states on NVMe in `dir`, the tiny model's states
// several times a 256 KiB device budget; `zoe` holds the zoe section's extra keys.
std::string write_nvme_config(const zoe::test::ScratchDir& dir, const std::string& zoe = "") {
  const std::string path = dir.file("ds_config.json");
  std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": ")"
                      << dir.path() << R"("}, "offload_optimizer": {"device": "nvme", "nvme_path": ")"
                      << dir.path() << R"("}}, "zoe": {"device_budget": "576KiB")" << zoe << "}}";
  return path;
}

const std::string kArgs = " --quiet --preset tiny --steps 4 --seq 32 --seed 7 --eval-batches 1 --threads 1";
const std::string kTrain = "train --json" + kArgs;

TEST(DriveWear, TrainReportsTheBytesItWroteAndTheShareOfTheDrive) {
  zoe::test::ScratchDir d("wear");
  json j = parse_ok(zoe(kTrain + " --config " + write_nvme_config(d, R"(, "drive_tbw": 600)")));
  ASSERT_TRUE(j.contains("nvme_bytes_written")) << j.dump();
  const uint64_t written = j["nvme_bytes_written"].get<uint64_t>();
  uint64_t sum = 0;
  for (const json& s : j["nvme_bytes_written_by_step"]) sum += s.get<uint64_t>();
  ASSERT_EQ(j["nvme_bytes_written_by_step"].size(), 4u);
  EXPECT_GT(written, 0u);
  EXPECT_EQ(written, sum);
  // The engine's own counter, and the activation store's (nothing: no checkpointing here).
  EXPECT_EQ(written, j["bytes_moved"]["host->nvme"].get<uint64_t>());
  EXPECT_EQ(j["drive_tbw"].get<double>(), 600.0);
  EXPECT_DOUBLE_EQ(j["drive_endurance_used"].get<double>(), static_cast<double>(written) / 600e12);

  zoe::test::ScratchDir d2("wear-text");
  CmdResult r = zoe("train" + kArgs + " --config " + write_nvme_config(d2, R"(, "drive_tbw": 600)"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("nvme written    "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of a 600 TB drive's rated endurance (zoe.drive_tbw)"), std::string::npos) << r.out;

  zoe::test::ScratchDir d3("wear-none");
  json none = parse_ok(zoe(kTrain + " --config " + write_nvme_config(d3)));
  EXPECT_GT(none["nvme_bytes_written"].get<uint64_t>(), 0u);
  EXPECT_FALSE(none.contains("drive_endurance_used"));
}

TEST(DriveWear, ABadDriveTbwKeyIsRefusedNamingIt) {
  for (const char* v : {"-1", "\"600TB\"", "true"}) {
    zoe::test::ScratchDir d("wear-bad");
    CmdResult r = zoe(kTrain + " --config " + write_nvme_config(d, std::string(R"(, "drive_tbw": )") + v));
    EXPECT_NE(r.rc, 0) << v;
    EXPECT_NE(r.err.find("zoe.drive_tbw"), std::string::npos) << v << ": " << r.err;
  }
}

// The plan's wear figure against the bytes a run of the same config wrote: the plan's row of the
// config's placement predicts a steady-state step's NVMe writes (every step after the first: the
// optimizer states written back by the swapper and the stage-3 partitions written home by the
// update). Exactly: these bytes do not depend on timing (the cost model counts the engine's
// writes, as tests/plan's CostModelVsEngine checks on the library); a tolerance would hide a
// state the model forgets.
TEST(DriveWear, PlanPredictsTheBytesARunWritesPerStep) {
  zoe::test::ScratchDir d("wear-plan");
  const std::string cfg = write_nvme_config(d);
  json run = parse_ok(zoe(kTrain + " --config " + cfg));
  json plan =
      parse_ok(zoe("plan --preset tiny --device cpu --device-budget 576KiB"
                   " --host-mem 16GiB --nvme-space 1TiB --json --config " +
                   cfg));
  ASSERT_TRUE(run.contains("nvme_bytes_written_by_step")) << run.dump();
  const uint64_t measured = run["nvme_bytes_written_by_step"][2].get<uint64_t>();
  EXPECT_EQ(run["nvme_bytes_written_by_step"][3].get<uint64_t>(), measured) << "not a steady state";
  const json* row = nullptr;
  for (const json& r : plan["rows"]) {
    const json& p = r["placement"];
    if (p["stage"] == 3 && p["offload_param"] == "nvme" && p["offload_optimizer"] == "nvme" &&
        p["offload_ratio"] == 1.0 && p["bf16_optimizer_states"] == false)
      row = &r;
  }
  ASSERT_NE(row, nullptr) << plan.dump();
  const uint64_t predicted = (*row)["nvme_bytes_written_per_step"].get<uint64_t>();
  EXPECT_GT(measured, 0u);
  EXPECT_EQ(predicted, measured) << "predicted " << predicted << ", measured " << measured;
}

TEST(DriveWear, InfoGivesTheDriveOrWhyNot) {
  zoe::test::ScratchDir d("wear-info");
  const auto t0 = std::chrono::steady_clock::now();
  json j = parse_ok(zoe("info --json --path " + d.path()));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(j.contains("drive")) << j.dump();
  const json& drive = j["drive"];
  for (const char* k :
       {"path", "device", "smart", "reason", "bytes_written", "endurance_used", "rated_bytes_written"})
    EXPECT_TRUE(drive.contains(k)) << k << " in " << drive.dump();
  EXPECT_EQ(drive["path"], d.path());
  if (drive["smart"].is_null()) {
    ASSERT_TRUE(drive["reason"].is_string()) << drive.dump();
    EXPECT_EQ(drive["reason"].get<std::string>().rfind("no SMART data: ", 0), 0u) << drive.dump();
    EXPECT_TRUE(drive["bytes_written"].is_null());
  } else {
    EXPECT_TRUE(drive["smart"] == "nvme-cli" || drive["smart"] == "smartctl") << drive.dump();
    EXPECT_TRUE(drive["reason"].is_null());
    EXPECT_GE(drive["bytes_written"].get<double>(), 0.0);
  }
  EXPECT_LT(s, 20.0) << "zoe info took " << s << " s";
  CmdResult r = zoe("info --path " + d.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("drive      " + d.path()), std::string::npos) << r.out;
}

}  // namespace
