// Ranks given different configs (an MPMD mpirun line with one config per rank): every rank stops
// with a clear error before training (the disagreeing rank names the keys and both values, rank 0
// names the rank), and nothing hangs; configs that differ only in their NVMe directories train.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/cli/run_zoe.h"

namespace {

#ifdef ZOE_MPIEXEC
// `mpirun` with rank 0 running `zoe <args0>` and rank 1 `zoe <args1>` (its part is run_zoe's).
CmdResult two_ranks(const std::string& args0, const std::string& args1) {
  const std::string mpi = "timeout -k 5 300 " + std::string(ZOE_MPIEXEC) +
                          " --oversubscribe --allow-run-as-root --bind-to none --mca btl self,vader -np 1 " +
                          std::string(ZOE_BIN) + " " + args0 + " : -np 1";
  return zoe(args1, mpi, 300);
}

TEST(RanksConfig, DisagreeingRanksFailAlikeAndNothingHangs) {
  zoe::test::ScratchDir d("ranks-config");
  std::ofstream(d.file("a.json"))
      << R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}})";
  std::ofstream(d.file("b.json"))
      << R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}})";
  const std::string common = "train --preset tiny --steps 2 --seq 16 --config ";
  CmdResult r = two_ranks(common + d.file("a.json"), common + d.file("b.json"));
  EXPECT_NE(r.rc, 0) << r.err;
  EXPECT_NE(r.rc, 124) << "a hang: " << r.err;
  EXPECT_NE(
      r.err.find("rank 1's config differs from rank 0's (zero_optimization.stage: 2 here, 3 on rank 0; "),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("the ranks' configs differ: rank(s) 1 were given a config other than rank 0's"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("step 1"), std::string::npos) << "trained: " << r.err;

  // Only the NVMe directories differ (each rank its own drive): the job trains.
  const std::string n0 = d.file("n0"), n1 = d.file("n1");
  for (const std::string& n : {n0, n1}) ASSERT_EQ(system(("mkdir -p " + n).c_str()), 0);
  auto nvme = [&](const std::string& path, const std::string& dir) {
    std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3, )"
                        << R"("offload_optimizer": {"device": "nvme", "nvme_path": ")" << dir << R"("}}})";
  };
  nvme(d.file("c.json"), n0);
  nvme(d.file("e.json"), n1);
  r = two_ranks(common + d.file("c.json"), common + d.file("e.json") + " --json");
  EXPECT_EQ(r.rc, 0) << r.err;
}
#endif

}  // namespace
