// End-to-end tests of the zoe CLI: JSON output shapes, validation runs, and errors on bad input.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli/run_zoe.h"
#include "tests/util/test_util.h"

namespace {

using nlohmann::json;

// Swap files left in dir (their names carry a random suffix, so look for any).
int swap_files_in(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.path().extension() == ".swap";
  return n;
}

TEST(Cli, HelpExplainsCommands) {
  CmdResult r = zoe("--help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("info"), std::string::npos);
  EXPECT_NE(r.out.find("bench"), std::string::npos);
  r = zoe("bench io --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("--qd"), std::string::npos);
  EXPECT_NE(r.out.find("--validate"), std::string::npos);
}

TEST(Cli, InfoJson) {
  zoe::test::ScratchDir d("info");
  CmdResult r = zoe("info --json --path " + d.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_FALSE(j["cpu"]["model"].get<std::string>().empty());
  EXPECT_GE(j["cpu"]["cores"].get<int>(), 1);
  EXPECT_GE(j["cpu"]["numa_nodes"].size(), 1u);
  std::string simd = j["cpu"]["simd"];
  EXPECT_TRUE(simd == "avx512" || simd == "avx2" || simd == "scalar") << simd;
  EXPECT_GT(j["memory"]["total_bytes"].get<uint64_t>(), 0u);
  EXPECT_TRUE(j["io_uring"].contains("works"));
  EXPECT_TRUE(j["mpi"].contains("built"));
  EXPECT_TRUE(j["nccl"].contains("built"));
  EXPECT_TRUE(j["cuda"]["devices"].is_array());
  if (j["cuda"]["devices"].empty()) {
    EXPECT_FALSE(j["cuda"]["error"].get<std::string>().empty());
  }
  ASSERT_EQ(j["paths"].size(), 1u);
  EXPECT_EQ(j["paths"][0]["path"], d.path());
  EXPECT_TRUE(j["paths"][0]["o_direct"].is_boolean());
  EXPECT_GT(j["paths"][0]["free_bytes"].get<uint64_t>(), 0u);
}

TEST(Cli, BenchIoJsonValidates) {
  zoe::test::ScratchDir d("bench");
  CmdResult r = zoe("bench io --json --validate --path " + d.path() +
                    " --size 8MiB --bs 256KiB,1MiB --qd 1,4 --engine uring,threads --loops 1 --warmup 0");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 2u * 2u * 2u * 2u);
  for (const auto& row : j["rows"]) {
    for (const char* k : {"engine", "bs", "qd", "rw", "gbps", "iops", "p50_us", "p99_us", "wrong_bytes"}) {
      EXPECT_TRUE(row.contains(k)) << k;
    }
    EXPECT_EQ(row["wrong_bytes"].get<uint64_t>(), 0u);
    EXPECT_GT(row["gbps"].get<double>(), 0.0);
    EXPECT_GE(row["p99_us"].get<double>(), row["p50_us"].get<double>());
  }
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["best"]["read"]["rw"], "read");
  EXPECT_EQ(j["best"]["write"]["rw"], "write");
  EXPECT_NE(r.err.find("pass"), std::string::npos) << "progress goes to stderr";
  // The file is removed afterwards (no --keep).
  EXPECT_EQ(swap_files_in(d.path()), 0);
}

TEST(Cli, BenchIoStripesOverPaths) {
  zoe::test::ScratchDir a("b0"), b("b1");
  CmdResult r = zoe("bench io --json --validate --keep --path " + a.path() + " --path " + b.path() +
                    " --size 4MiB --stripe 256KiB --qd 8 --loops 1 --warmup 0");
  ASSERT_EQ(r.rc, 0) << r.err;
  // Each file's share of the 4 MiB, and its guard page (io/swap_file.h).
  EXPECT_EQ(std::filesystem::file_size(a.file("zoe-bench.0.swap")), (2u << 20) + 4096);
  EXPECT_EQ(std::filesystem::file_size(b.file("zoe-bench.1.swap")), (2u << 20) + 4096);
}

TEST(Cli, BadInputGetsClearErrors) {
  CmdResult r = zoe("bench io --path /nonexistent/dir --size 4MiB");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("/nonexistent/dir"), std::string::npos) << r.err;
  r = zoe("bench io --bs 1000");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--bs"), std::string::npos) << r.err;
  r = zoe("bench io --size 12XB");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("12XB"), std::string::npos) << r.err;
  r = zoe("bench io --engine libaio");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("libaio"), std::string::npos) << r.err;
  r = zoe("bench io --no-such-flag");
  EXPECT_NE(r.rc, 0);
  r = zoe("frobnicate");
  EXPECT_NE(r.rc, 0);
}

// zoe tune takes zoe train's --device-budget: one rank's device memory, the same plan as
// --device-mem of that many bytes per rank (the whole JSON, every candidate's bytes and predicted
// time, is the same), and refused where it disagrees with --device-mem.
TEST(Cli, TuneTakesTrainsDeviceBudget) {
  zoe::test::ScratchDir d("tune-budget");
  const std::string base =
      "tune --preset demo --device cpu --micro-batch 2 --host-mem 4GiB --nvme-space 1GiB "
      "--nvme-path " +
      d.path() + " --json ";
  auto run = [&](const std::string& flags) {
    CmdResult r = zoe(base + flags);
    EXPECT_EQ(r.rc, 0) << flags << ": " << r.err;
    json j = json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    return j;
  };
  const json mem = run("--device-mem 16MiB");
  const json budget = run("--device-budget 16MiB");
  ASSERT_TRUE(mem.contains("best")) << mem.dump();
  EXPECT_EQ(budget, mem);
  EXPECT_EQ(run("--device-budget 16MiB --device-mem 16MiB"), mem);
  // A different budget plans differently (the flag is not ignored): 16 MiB does not hold the
  // demo's states, 1 GiB does.
  const json big = run("--device-budget 1GiB");
  EXPECT_NE(big["best"]["bytes"], mem["best"]["bytes"]);
  EXPECT_EQ(big, run("--device-mem 1GiB"));
  // Per rank: two ranks of 16 MiB are a node of 32 MiB.
  EXPECT_EQ(run("--gpus-per-node 2 --device-budget 16MiB"), run("--gpus-per-node 2 --device-mem 32MiB"));
  // 0 is the whole device, as zoe train takes it: the default.
  EXPECT_EQ(run("--device-budget 0"), run(""));
  CmdResult r = zoe(base + "--device-budget 16MiB --device-mem 32MiB");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--device-budget 16MiB (one rank's device memory) and --device-mem 32MiB"),
            std::string::npos)
      << r.err;
  r = zoe(base + "--device-budget lots");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--device-budget lots is not a byte size"), std::string::npos) << r.err;
}

// zoe plan takes it too (the same shared option): the same rows as --device-mem of its ranks.
TEST(Cli, PlanTakesTrainsDeviceBudget) {
  zoe::test::ScratchDir d("plan-budget");
  const std::string base =
      "plan --preset demo --device cpu --micro-batch 2 --host-mem 4GiB --nvme-space 1GiB "
      "--nvme-path " +
      d.path() + " --json ";
  auto rows = [&](const std::string& flags) {
    CmdResult r = zoe(base + flags);
    json j = json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << flags << ": " << r.err;
    return j.is_discarded() ? json() : j["rows"];
  };
  const json mem = rows("--device-mem 16MiB");
  ASSERT_FALSE(mem.empty());
  EXPECT_EQ(rows("--device-budget 16MiB"), mem);
  EXPECT_NE(rows("--device-budget 1GiB"), mem);
  EXPECT_EQ(rows("--gpus-per-node 2 --device-budget 16MiB"), rows("--gpus-per-node 2 --device-mem 32MiB"));
  CmdResult r = zoe(base + "--device-budget 16MiB --device-mem 32MiB");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--device-budget 16MiB (one rank's device memory) and --device-mem 32MiB"),
            std::string::npos)
      << r.err;
}

// zoe bench adam --optimizer lion|adagrad: the one-state steps' bytes (no v) in the JSON; an
// unknown optimizer is refused naming the flag and the choices.
TEST(Cli, BenchAdamOptimizers) {
  for (const char* opt : {"lion", "adagrad", "adam"}) {
    CmdResult r =
        zoe(std::string("bench adam --json --params 1M --repeats 1 --threads 1 --optimizer ") + opt);
    ASSERT_EQ(r.rc, 0) << opt << ": " << r.err;
    json j = json::parse(r.out);
    EXPECT_EQ(j["optimizer"], opt);
    // fp32 p read and written, fp32 gradients read, each fp32 state read and written, a bf16 copy.
    EXPECT_EQ(j["bytes_per_param"], std::string(opt) == "adam" ? 30.0 : 22.0) << opt;
    EXPECT_GT(j["params_per_s"].get<double>(), 0.0) << opt;
  }
  CmdResult r = zoe("bench adam --optimizer sgd");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("--optimizer sgd: expected adam, lion or adagrad"), std::string::npos) << r.err;
}

TEST(Cli, BenchSwapJson) {
  zoe::test::ScratchDir d("swap");
  CmdResult r =
      zoe("bench swap --json --params 3M --sub-group 1M --buffer-size 1MiB --buffers 8 --repeats 1 --path " +
          d.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out);
  for (const char* k : {"t_step", "t_io_only", "t_compute_only", "overlap", "peak_rss_bytes", "bytes_read",
                        "bytes_written"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(j["params"], 3000000);
  EXPECT_EQ(j["groups"], 3);
  // p, m, v and bf16 gradients are read; p, m, v written (rounded up to whole 4 KiB blocks).
  EXPECT_GE(j["bytes_read"].get<uint64_t>(), 3000000ull * 14);
  EXPECT_GE(j["bytes_written"].get<uint64_t>(), 3000000ull * 12);
  EXPECT_LT(j["bytes_written"].get<uint64_t>(), j["bytes_read"].get<uint64_t>());
  EXPECT_GT(j["t_step"].get<double>(), 0.0);
  EXPECT_EQ(swap_files_in(d.path()), 0);  // removed afterwards
  r = zoe("bench swap --params 1M --buffers 3 --path " + d.path());
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("buffer_count 3"), std::string::npos) << r.err;
}

TEST(Cli, BenchIoFullDisk) {
  zoe::test::ScratchMount m("tmpfs", "size=2m");
  if (!m.ok()) GTEST_SKIP() << "cannot mount tmpfs";
  CmdResult r = zoe("bench io --path " + m.path() + " --size 16MiB");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(m.path()), std::string::npos) << r.err;
}

}  // namespace
