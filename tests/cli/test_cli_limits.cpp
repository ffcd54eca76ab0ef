// End-to-end tests of zoe at its limits: flag ranges of bench engine, a tight address-space limit
// (ulimit -v), OpenBLAS's thread pool, the stop watchdog's message.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <string>

#include "tests/cli/run_zoe.h"
#include "tests/util/test_util.h"
#include "tools/stop_signals.h"

namespace {

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

TEST(CliLimits, BenchEngineFlagsAreRangeChecked) {
  struct Case {
    const char* args;
    const char* message;
  };
  const Case cases[] = {
      // Below the range, negative, above it: an integer flag.
      {"--modules 2 --steps 0", "--steps 0 is out of range (expected an integer in [1, "},
      {"--modules 2 --steps -1", "--steps -1 is out of range"},
      {"--d 0", "--d 0 is out of range"},
      {"--d 100000", "--d 100000 is out of range"},
      {"--stage -1", "--stage -1 is out of range (expected an integer in [0, 3])"},
      {"--stage 4", "--stage 4 is out of range"},
      // A list of depths: zero, negative, not a number, too deep.
      {"--modules 0", "--modules '0': item 1, '0', is not a positive integer"},
      {"--modules 2,-1", "--modules '2,-1': item 2, '-1', is not a positive integer"},
      {"--modules x", "--modules 'x': item 1, 'x', is not a positive integer"},
      {"--modules 1000000", "--modules 1000000: depth 1000000 is out of range"},
      // A word from a list, a size.
      {"--offload gpu", "--offload 'gpu': expected one of none, cpu, nvme"},
      {"--precision fp8", "--precision 'fp8': expected one of fp32, bf16, fp16"},
      {"--device-budget lots", "--device-budget lots: 'lots' is not a byte size"},
      {"--device-budget 0", "--device-budget 0: expected a size above 0"},
  };
  for (const Case& c : cases) {
    CmdResult r = zoe(std::string("bench engine ") + c.args, "", 60);
    EXPECT_EQ(r.rc, 2) << c.args << ": " << r.err;
    EXPECT_HAS(r.err, std::string("zoe: error: invalid argument: ") + c.message);
  }
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ZOE_SKIP_UNDER_ULIMIT_V() GTEST_SKIP() << "a sanitizer's shadow memory does not fit under ulimit -v"
#else
#define ZOE_SKIP_UNDER_ULIMIT_V() (void)0
#endif

// zoe train under `ulimit -v kib`: a clean error, never a crash or a hang (the timeout's 124).
CmdResult train_under_ulimit(const std::string& args, int kib) {
  return zoe("train --quiet --threads 1 " + args, "ulimit -v " + std::to_string(kib) + ";", 60);
}

TEST(CliLimits, ThreadThatCannotStartInTheEngineIsAnError) {
  ZOE_SKIP_UNDER_ULIMIT_V();
  // 300000 KiB: the libraries load, the engine's first streams start, a later one cannot (its
  // thread's stack does not fit). That failure aborted on the CPU device's destruction.
  CmdResult r = train_under_ulimit("--preset small --offload cpu --steps 1", 300000);
  if (r.err.find("error while loading shared libraries") != std::string::npos) {
    GTEST_SKIP() << "zoe's libraries do not load under this limit here: " << r.err;
  }
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "zoe: error: ");
  EXPECT_HAS(r.err, "ulimit -v");
  EXPECT_EQ(r.err.find("internal check failed"), std::string::npos) << r.err;
}

TEST(CliLimits, AddressSpaceTooSmallForAStepIsRefusedBeforeIt) {
  ZOE_SKIP_UNDER_ULIMIT_V();
  // Room for the engine and the model but not for a step's GEMM buffers: OpenBLAS retried its
  // failed mmap forever in the first step.
  for (const char* args : {"--preset small --offload cpu --steps 2", "--preset tiny --offload none --steps 2",
                           "--preset small --offload nvme --steps 2"}) {
    CmdResult r = train_under_ulimit(args, 600000);
    if (r.err.find("error while loading shared libraries") != std::string::npos) {
      GTEST_SKIP() << "zoe's libraries do not load under this limit here: " << r.err;
    }
    EXPECT_EQ(r.rc, 1) << args << ": " << r.err;
    EXPECT_HAS(r.err, "zoe: error: ");
    EXPECT_HAS(r.err, "ulimit -v");
    EXPECT_EQ(r.err.find("step 1/"), std::string::npos) << "refused before step 1: " << r.err;
  }
}

// What a `zoe train` run started with `env` before it has, 2 seconds in: its OPENBLAS_NUM_THREADS
// (from /proc/<pid>/environ, "-" when unset) and its number of threads.
struct RunState {
  std::string openblas;
  int threads = -1;
};

RunState state_after_start(const std::string& env) {
  zoe::test::ScratchDir d("threads");
  const std::string cmd =
      env + " " + ZOE_BIN + " train --preset tiny --steps 1000000 --threads 1 --quiet " +
      "--save-every 0 >/dev/null 2>" + d.file("err") + " & p=$!; sleep 2; " +
      "(tr \"\\0\" \"\\n\" < /proc/$p/environ | grep ^OPENBLAS_NUM_THREADS= || echo x=-) | " +
      "cut -d= -f2; ls /proc/$p/task | wc -l; kill $p; wait $p 2>/dev/null";
  FILE* f = popen(("bash -c '" + cmd + "'").c_str(), "r");
  RunState st;
  if (f == nullptr) return st;
  char value[64] = {0};
  if (fscanf(f, "%63s %d", value, &st.threads) != 2) st.threads = -1;
  st.openblas = value;
  pclose(f);
  return st;
}

TEST(CliLimits, OpenBlasStartsNoThreadPool) {
  // OpenBLAS sizes its pool when it loads, before main(): zoe sets OPENBLAS_NUM_THREADS=1 and runs
  // itself again (the same process), so a run without the variable runs with it set to 1.
  const RunState unset = state_after_start("env -u OPENBLAS_NUM_THREADS");
  const RunState one = state_after_start("OPENBLAS_NUM_THREADS=1");
  EXPECT_EQ(unset.openblas, "1");
  ASSERT_GT(one.threads, 1);
  // No pool: no more threads than a run with one BLAS thread (the engine's own threads come and go
  // with the step, so only an upper bound holds for a sample).
  EXPECT_LE(unset.threads, one.threads + 1)
      << "unset " << unset.threads << ", OPENBLAS_NUM_THREADS=1 " << one.threads;
  // A value the user set is kept.
  const RunState two = state_after_start("OPENBLAS_NUM_THREADS=2");
  EXPECT_EQ(two.openblas, "2");
}

TEST(CliLimits, StopWatchdogOfOneProcessNamesNoOtherRanks) {
  const std::string one = zoe::cli::StopSignals::timeout_message(0, 1, SIGTERM, 10, 2);
  EXPECT_EQ(one.find("rank 0"), std::string::npos) << one;
  EXPECT_EQ(one.find("mpirun"), std::string::npos) << one;
  EXPECT_EQ(one.find("probably lost"), std::string::npos) << one;
  EXPECT_HAS(one, "zoe: SIGTERM, but the step in progress did not end within 10 s");
  EXPECT_HAS(one, "removed 2 swap file(s); exiting");
  const std::string many = zoe::cli::StopSignals::timeout_message(3, 4, SIGINT, 12, 1);
  EXPECT_HAS(many, "zoe: rank 3: SIGINT, but the step in progress did not end within 12 s");
  EXPECT_HAS(many, "one of them was probably lost; mpirun names it");
}

}  // namespace
