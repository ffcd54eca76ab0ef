// Pins a short `zoe train` run's losses (demo preset, NVMe offload, fixed seed), so that a
// restructuring of the engine, the tier manager or the config shows up as a changed number.
// The figures were recorded on an AVX-512 CPU: there they must match bit for bit. Other SIMD
// levels (AVX2, scalar) and their BLAS kernels round differently, and bf16 parameters amplify a
// last-bit difference, so there the check is a 2% band (a wrong schedule misses it by far more).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "tests/cli/run_zoe.h"

namespace {

using nlohmann::json;

TEST(PinnedLosses, DemoNvmeOffloadSixSteps) {
  zoe::test::ScratchDir d("pinned");
  CmdResult info = zoe("info --json");
  ASSERT_EQ(info.rc, 0) << info.err;
  const bool exact = json::parse(info.out)["cpu"]["simd"] == "avx512";
  CmdResult r =
      zoe("train --json --quiet --preset demo --steps 6 --micro-batch 4 --seq 32 --seed 7 --eval-batches 1 "
          "--threads 1 --offload nvme --device-budget 16MiB --nvme-path " +
          d.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out);
  const std::vector<double> pinned = {5.620694160461426,  4.6613616943359375, 4.096782207489014,
                                      3.8603715896606445, 3.590407133102417,  3.31072998046875};
  const std::vector<double> got = j["losses"].get<std::vector<double>>();
  ASSERT_EQ(got.size(), pinned.size());
  for (size_t k = 0; k < pinned.size(); ++k) {
    if (exact) {
      EXPECT_EQ(got[k], pinned[k]) << "step " << k;
    } else {
      EXPECT_NEAR(got[k], pinned[k], 0.02 * pinned[k]) << "step " << k;
    }
  }
}

}  // namespace
