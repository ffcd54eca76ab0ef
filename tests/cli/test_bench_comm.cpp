// `zoe bench comm` end to end: one rank without a launcher, and 2 and 3 ranks under mpirun on this
// host: the JSON's shape, exact results (wrong == 0), nccl-tests' algbw and busbw relations per op,
// the human table, and refused flags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "tests/cli/run_zoe.h"

namespace {

using nlohmann::json;

double bus_factor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "reducescatter" || op == "allgather") return (n - 1.0) / n;
  return 1.0;
}

// Checks one --json report of `ranks` ranks over the ops and sizes given.
void check_report(const json& j, int ranks, const std::vector<std::string>& ops,
                  const std::vector<uint64_t>& sizes) {
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("ranks").get<int>(), ranks);
  EXPECT_EQ(j.at("nodes").get<int>(), 1);
  ASSERT_EQ(j.at("rows").size(), ops.size() * sizes.size()) << j.dump();
  size_t k = 0;
  for (const std::string& op : ops) {
    for (uint64_t size : sizes) {
      const json& r = j["rows"][k++];
      for (const char* key : {"op", "bytes", "count", "time_us", "algbw_gbps", "busbw_gbps", "wrong"})
        EXPECT_TRUE(r.contains(key)) << key << " in " << r.dump();
      EXPECT_EQ(r["op"].get<std::string>(), op);
      EXPECT_EQ(r["wrong"].get<uint64_t>(), 0u) << r.dump();
      const uint64_t count = r["count"].get<uint64_t>(), bytes = r["bytes"].get<uint64_t>();
      EXPECT_EQ(bytes, count * 4);
      // The whole buffer: size / 4 elements, whole parts per rank for the scatter and gather.
      uint64_t want = size / 4;
      if (op == "reducescatter" || op == "allgather") want = std::max<uint64_t>(want / ranks, 1) * ranks;
      EXPECT_EQ(count, std::max<uint64_t>(want, 1)) << r.dump();
      const double t = r["time_us"].get<double>(), alg = r["algbw_gbps"].get<double>();
      ASSERT_GT(t, 0);
      EXPECT_NEAR(alg, static_cast<double>(bytes) / t / 1e3, 1e-9 * alg) << r.dump();
      EXPECT_NEAR(r["busbw_gbps"].get<double>(), alg * bus_factor(op, ranks), 1e-9 * alg) << r.dump();
    }
  }
}

TEST(BenchComm, OneRankWithoutLauncher) {
  CmdResult r = zoe("bench comm --sizes 1KiB..64KiB --iters 3 --warmup 1 --json", "", 120);
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out);
  check_report(j, 1, {"allreduce", "reducescatter", "allgather", "broadcast"},
               {1024, 2048, 4096, 8192, 16384, 32768, 65536});
  EXPECT_EQ(j["backend"].get<std::string>(), "local");
  EXPECT_EQ(j["hosts"].size(), 1u);
  // The human table: nccl-tests' columns and its closing lines.
  r = zoe("bench comm --ops allgather,broadcast --sizes 4KiB,1MiB --iters 2 --warmup 0", "", 120);
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* want : {"#wrong", "busbw", "algbw", "(elements)", "allgather", "broadcast", "1048576",
                           "Avg bus bandwidth, allgather", "Out of bounds values : 0 OK"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  EXPECT_EQ(r.out.find("\nallreduce "), std::string::npos) << r.out;  // no row of an op not asked for
}

TEST(BenchComm, RefusesBadFlags) {
  struct Case {
    const char* args;
    const char* message;
  } cases[] = {
      {"--ops allreduce,alltoall", "--ops allreduce,alltoall: unknown collective \"alltoall\""},
      {"--sizes 64KiB..1KiB", "--sizes 64KiB..1KiB: expected A..B"},
      {"--sizes 32GiB", "--sizes 32GiB: 32 GiB is out of range (expected 1 B to 16 GiB)"},
      {"--sizes lots", "--sizes 'lots': item 1: 'lots' is not a byte size"},
      {"--backend gloo", "--backend gloo: expected auto, host or nccl"},
      {"--iters 0", "--iters 0 is out of range"},
  };
  for (const Case& c : cases) {
    CmdResult r = zoe(std::string("bench comm ") + c.args, "", 60);
    EXPECT_EQ(r.rc, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << ": " << r.err;
  }
}

#ifdef ZOE_MPIEXEC
TEST(BenchComm, SeveralRanksUnderMpirun) {
  for (int np : {2, 3}) {
    const std::string mpi = std::string(ZOE_MPIEXEC) +
                            " --oversubscribe --allow-run-as-root --bind-to none --mca btl self,vader -np " +
                            std::to_string(np) + " ";
    CmdResult r = zoe("bench comm --sizes 1KiB..256KiB --iters 3 --warmup 1 --json", mpi, 300);
    ASSERT_EQ(r.rc, 0) << np << " ranks: " << r.err;
    json j = json::parse(r.out);  // rank 0 alone prints
    check_report(j, np, {"allreduce", "reducescatter", "allgather", "broadcast"},
                 {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144});
    EXPECT_EQ(j["backend"].get<std::string>(), "mpi");
    EXPECT_EQ(j["hosts"].size(), static_cast<size_t>(np));
    EXPECT_EQ(std::set<std::string>(j["hosts"].begin(), j["hosts"].end()).size(), 1u);
  }
}
#endif

}  // namespace
