// Pins a short `zoe train` run's losses (demo preset, NVMe offload, fixed seed, a constant learning
// rate: --warmup 0), so that a restructuring of the engine, the tier manager or the config shows
// up as a changed number.
//
// Bits are pinned only where the whole kernel set is known: zoe's SIMD level and the BLAS core
// type OpenBLAS chose (`kernels` in --json; OpenBLAS picks by CPU and by OPENBLAS_CORETYPE, so
// the CPU alone does not fix the last bits of a GEMM). A run whose kernel set is in the table
// must match it bit for bit; any other is held to a 2% band (a wrong schedule misses it by far
// more). Kernel sets every AVX2 (or AVX-512) CPU can run are also forced through ZOE_SIMD and
// OPENBLAS_CORETYPE, so every such machine checks some bits. Independently of the table, the
// placements (no offload, host RAM, NVMe) must give bit-identical losses in the same run.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "tests/cli/run_zoe.h"

namespace {

using nlohmann::json;

// Kernel set ("simd/blas", as `kernels` reports it) -> the six losses.
const std::map<std::string, std::vector<double>>& pinned_losses() {
  static const std::map<std::string, std::vector<double>> pins = {
      // AMD EPYC (Zen 4) with AVX-512 and AVX512-BF16: OpenBLAS picks Cooperlake (and
      // OPENBLAS_CORETYPE=Cooperlake on an EPYC where it picks Haswell: the same bits).
      {"avx512/openblas Cooperlake",
       {5.4841742515563965, 4.5612902641296387, 4.0427761077880859, 3.8425977230072021, 3.5708024501800537,
        3.2644426822662354}},
      // A Xeon with AVX-512 and AMX (OpenBLAS picks SkylakeX), and OPENBLAS_CORETYPE=SkylakeX on
      // the AMD EPYC above: the same bits.
      {"avx512/openblas SkylakeX",
       {5.4841742515563965, 4.5612902641296387, 4.0427765846252441, 3.8425979614257812, 3.5708017349243164,
        3.2644424438476562}},
      // zoe's AVX2 path with OpenBLAS Haswell or Zen (the core an AVX2-only AMD EPYC, Zen 3, gets;
      // its kernels are Haswell's): measured with ZOE_SIMD=avx2 and OPENBLAS_CORETYPE on the EPYC.
      {"avx2/openblas Haswell",
       {5.4841742515563965, 4.5612897872924805, 4.0427765846252441, 3.8425979614257812, 3.5708019733428955,
        3.2644424438476562}},
      {"avx2/openblas Zen",
       {5.4841742515563965, 4.5612897872924805, 4.0427765846252441, 3.8425979614257812, 3.5708019733428955,
        3.2644424438476562}},
      // OPENBLAS_CORETYPE=Haswell on an AVX-512 CPU (any vendor: the same instructions, the same bits).
      {"avx512/openblas Haswell",
       {5.4841742515563965, 4.5612897872924805, 4.0427765846252441, 3.8425979614257812, 3.5708019733428955,
        3.2644424438476562}},
  };
  return pins;
}

// The band any other kernel set must stay within (centred on the first pinned row).
const std::vector<double>& band_center() { return pinned_losses().begin()->second; }

struct TrainRun {
  std::string kernels;
  std::vector<double> losses;
};

TrainRun train_run(const std::string& offload, const std::string& env = "") {
  zoe::test::ScratchDir d("pinned");
  // Without offload the states need the device: a budget that holds them (numbers do not depend on it).
  const std::string where = offload == "nvme"  ? "--device-budget 16MiB --nvme-path " + d.path()
                            : offload == "cpu" ? "--device-budget 16MiB"
                                               : "--device-budget 1GiB";
  CmdResult r =
      zoe("train --json --quiet --preset demo --steps 6 --micro-batch 4 --seq 32 --seed 7 --eval-batches 1 "
          "--threads 1 --warmup 0 --offload " +
              offload + " " + where,
          env);
  EXPECT_EQ(r.rc, 0) << r.err;
  if (r.rc != 0) return {};
  json j = json::parse(r.out);
  TrainRun run;
  run.kernels = j["kernels"]["simd"].get<std::string>() + "/" + j["kernels"]["blas"].get<std::string>();
  run.losses = j["losses"].get<std::vector<double>>();
  return run;
}

// Exact where the kernel set is pinned, within 2% otherwise. Returns whether bits were checked.
bool check_against_pins(const TrainRun& run) {
  auto it = pinned_losses().find(run.kernels);
  const std::vector<double>& want = it != pinned_losses().end() ? it->second : band_center();
  EXPECT_EQ(run.losses.size(), want.size());
  for (size_t k = 0; k < std::min(run.losses.size(), want.size()); ++k) {
    if (it != pinned_losses().end()) {
      EXPECT_EQ(run.losses[k], want[k]) << "step " << k << ", kernel set " << run.kernels;
    } else {
      EXPECT_NEAR(run.losses[k], want[k], 0.02 * want[k]) << "step " << k << ", kernel set " << run.kernels;
    }
  }
  if (it == pinned_losses().end()) {
    std::string row = "{\"" + run.kernels + "\", {";
    for (size_t k = 0; k < run.losses.size(); ++k) {
      char b[40];
      snprintf(b, sizeof(b), "%s%.17g", k ? ", " : "", run.losses[k]);
      row += b;
    }
    printf("kernel set %s is not pinned (checked to 2%%); its row: %s}},\n", run.kernels.c_str(),
           row.c_str());
  }
  return it != pinned_losses().end();
}

TEST(PinnedLosses, DemoNvmeOffloadSixSteps) {
  TrainRun nvme = train_run("nvme");
  ASSERT_FALSE(nvme.losses.empty());
  check_against_pins(nvme);
}

TEST(PinnedLosses, PlacementsGiveTheSameBitsInOneRun) {
  TrainRun nvme = train_run("nvme");
  TrainRun cpu = train_run("cpu");
  TrainRun none = train_run("none");
  ASSERT_FALSE(nvme.losses.empty());
  EXPECT_EQ(cpu.kernels, nvme.kernels);
  EXPECT_EQ(cpu.losses, nvme.losses) << "host-RAM offload differs from NVMe offload";
  EXPECT_EQ(none.losses, nvme.losses) << "no offload differs from NVMe offload";
}

// Kernel sets every CPU of a kind can run, forced through ZOE_SIMD and OPENBLAS_CORETYPE: zoe's
// AVX2 path with OpenBLAS Haswell on any AVX2+FMA CPU; AVX-512 with Haswell and with SkylakeX on
// any AVX-512 one. Each is pinned, so every such machine checks bits, whatever its own kernels.
TEST(PinnedLosses, ForcedKernelSetsArePinnedOnEveryCpuThatRunsThem) {
  CmdResult info = zoe("info --json");
  ASSERT_EQ(info.rc, 0) << info.err;
  json f = json::parse(info.out)["cpu"]["features"];
  if (!f["avx2"].get<bool>() || !f["fma"].get<bool>()) GTEST_SKIP() << "CPU without AVX2+FMA";
  std::vector<std::pair<std::string, std::string>> sets = {{"avx2", "Haswell"}};
  if (f["avx512f"].get<bool>() && f["avx512bw"].get<bool>() && f["avx512vl"].get<bool>()) {
    sets.push_back({"avx512", "Haswell"});
    sets.push_back({"avx512", "SkylakeX"});
  }
  for (const auto& [simd, core] : sets) {
    TrainRun h = train_run("nvme", "ZOE_SIMD=" + simd + " OPENBLAS_CORETYPE=" + core);
    ASSERT_FALSE(h.losses.empty());
    ASSERT_EQ(h.kernels, simd + "/openblas " + core) << "ZOE_SIMD / OPENBLAS_CORETYPE were not honoured";
    EXPECT_TRUE(check_against_pins(h))
        << "kernel set " << h.kernels << " must match its pinned row bit for bit";
  }
}

}  // namespace
