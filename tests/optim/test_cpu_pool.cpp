// CpuPool: every index exactly once on both backends, NUMA binding, argument errors.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/topology.h"
#include "optim/cpu_pool.h"
#include "tests/util/status_test_util.h"
#include "zoe/features.h"

namespace zoe::optim {
namespace {

std::vector<CpuPool::Backend> backends() {
  std::vector<CpuPool::Backend> b = {CpuPool::Backend::kStdThread};
  if (ZOE_HAVE_TBB) b.push_back(CpuPool::Backend::kTbb);
  return b;
}

TEST(CpuPool, EveryIndexOnce) {
  for (auto be : backends()) {
    for (int t : {1, 2, 4}) {
      auto pool = CpuPool::create({t, -1, be});
      ASSERT_OK(pool);
      EXPECT_EQ((*pool)->threads(), t);
      for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1000)}) {
        for (int rep = 0; rep < 3; ++rep) {
          std::vector<std::atomic<int>> hits(n);
          (*pool)->for_each(n, [&](size_t i) { hits[i].fetch_add(1); });
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(hits[i].load(), 1) << (*pool)->backend_name() << " t=" << t << " i=" << i;
        }
      }
    }
  }
}

TEST(CpuPool, NumaBindingKeepsCallerAffinity) {
  const Topology& topo = topology();
  ASSERT_FALSE(topo.numa_nodes.empty());
  int node = topo.numa_nodes[0].os_index;
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  for (auto be : backends()) {
    auto pool = CpuPool::create({0, node, be});
    ASSERT_OK(pool);
    EXPECT_EQ((*pool)->threads(), static_cast<int>(topo.numa_nodes[0].cpus.size()));
    std::atomic<int> bad{0};
    (*pool)->for_each(64, [&](size_t) {
      int cpu = sched_getcpu();
      bool in_node = false;
      for (int c : topo.numa_nodes[0].cpus) in_node |= c == cpu;
      if (!in_node) bad.fetch_add(1);
    });
    EXPECT_EQ(bad.load(), 0);
    cpu_set_t after;
    ASSERT_EQ(sched_getaffinity(0, sizeof(after), &after), 0);
    EXPECT_TRUE(CPU_EQUAL(&before, &after)) << (*pool)->backend_name();
  }
}

TEST(CpuPool, Errors) {
  EXPECT_EQ(CpuPool::create({-1, -1, CpuPool::Backend::kAuto}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CpuPool::create({1, 9999, CpuPool::Backend::kAuto}).status().code(),
            StatusCode::kInvalidArgument);
  if (!ZOE_HAVE_TBB) {
    EXPECT_EQ(CpuPool::create({1, -1, CpuPool::Backend::kTbb}).status().code(), StatusCode::kUnsupported);
  }
}

}  // namespace
}  // namespace zoe::optim

// ZOE_SIMD lowers the default level (ctest runs this suite once more with ZOE_SIMD=scalar);
// set_simd_override changes it for the process and refuses levels this CPU lacks.
#include "optim/adam.h"
#include "tests/util/status_test_util.h"

namespace zoe::optim {
namespace {

TEST(SimdDispatch, EnvAndOverride) {
  const char* env = std::getenv("ZOE_SIMD");
  if (env != nullptr && std::string(env) == "scalar") {
    EXPECT_EQ(active_simd_level(), SimdLevel::kScalar);
    EXPECT_STREQ(kernel_path_name(), "scalar");
  } else if (env == nullptr) {
    EXPECT_EQ(active_simd_level(), detected_simd_level());
  }
  ASSERT_OK(set_simd_override(SimdLevel::kScalar));
  EXPECT_EQ(active_simd_level(), SimdLevel::kScalar);
  EXPECT_STREQ(kernel_path_name(), "scalar");
  ASSERT_OK(set_simd_override(std::nullopt));
  if (detected_simd_level() != SimdLevel::kAvx512) {
    EXPECT_EQ(set_simd_override(SimdLevel::kAvx512).code(), StatusCode::kUnsupported);
  }
  Exec e;
  e.simd = SimdLevel::kAvx512;
  if (!simd_level_supported(SimdLevel::kAvx512)) {
    float x = 0;
    EXPECT_EQ(grad_norm_sq(&x, DType::kF32, 1, e).status().code(), StatusCode::kUnsupported);
  }
}

// A worker thread that cannot start (its stack does not fit under RLIMIT_AS) is an error from
// create(), not std::terminate from a joinable thread destroyed while the error unwinds. Run in a
// child process, whose address-space limit ends where the test's mappings do.
TEST(CpuPool, WorkersThatCannotStartAreAnError) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory does not fit under RLIMIT_AS";
#endif
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    FILE* f = fopen("/proc/self/status", "r");
    unsigned long long kib = 0;
    char line[256];
    while (f != nullptr && fgets(line, sizeof line, f) != nullptr) {
      if (sscanf(line, "VmSize: %llu kB", &kib) == 1) break;
    }
    if (f != nullptr) fclose(f);
    // Room for a few 8 MiB thread stacks, not for 64.
    const rlim_t limit = static_cast<rlim_t>(kib + 48 * 1024) * 1024;
    struct rlimit rl = {limit, limit};
    if (kib == 0 || setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
    CpuPool::Options o;
    o.threads = 64;
    o.backend = CpuPool::Backend::kStdThread;
    auto pool = CpuPool::create(o);
    if (pool.is_ok()) _exit(2);  // every thread started: the limit did not bite
    const std::string m = pool.status().message();
    _exit(m.find("cannot start 63 worker threads") != std::string::npos &&
                  m.find("ulimit -v") != std::string::npos
              ? 0
              : 1);
  }
  // A child that hangs (a thread left joinable ends in std::terminate, which can hang in a forked
  // child) fails the test in 60 s.
  int st = 0;
  pid_t got = 0;
  for (int i = 0; i < 600 && (got = waitpid(pid, &st, WNOHANG)) == 0; ++i) usleep(100 * 1000);
  if (got == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    FAIL() << "the child did not end within 60 s";
  }
  ASSERT_EQ(got, pid);
  ASSERT_TRUE(WIFEXITED(st)) << "the child was killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  if (WEXITSTATUS(st) == 2) GTEST_SKIP() << "64 threads fit under the limit here";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "3: no limit set, 1: another message";
}

}  // namespace
}  // namespace zoe::optim
