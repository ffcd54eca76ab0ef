// IoEngine tests, parameterized over backend (uring, threads) x O_DIRECT (on, off) x queue depth.
#include <gtest/gtest.h>

#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <functional>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "io/buffer.h"
#include "io/fault_injector.h"
#include "io/io_engine.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::io {
namespace {

using test::first_mismatch;
using test::random_bytes;
using test::ScratchDir;

struct Param {
  IoBackend backend;
  bool direct;
  uint32_t qd;
};

std::string param_name(const testing::TestParamInfo<Param>& p) {
  return std::string(io_backend_name(p.param.backend)) + (p.param.direct ? "_direct" : "_buffered") + "_qd" +
         std::to_string(p.param.qd);
}

class IoEngineTest : public testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (GetParam().backend == IoBackend::kUring) {
      std::string why = probe_uring();
      if (!why.empty()) GTEST_SKIP() << "io_uring unavailable: " << why;
    }
    opts_.backend = GetParam().backend;
    opts_.queue_depth = GetParam().qd;
    opts_.block_size = 256 * 1024;  // small, so requests get split
    opts_.faults = &faults_;
    auto e = IoEngine::create(opts_);
    ASSERT_OK(e);
    engine_ = std::move(e).value();
    OpenOptions oo;
    oo.create = true;
    oo.direct = GetParam().direct ? DirectMode::kRequire : DirectMode::kOff;
    auto f = File::open(dir_.file("data"), oo);
    ASSERT_OK(f);
    file_ = std::move(f).value();
  }

  AlignedBuffer buffer(size_t n) {
    auto b = AlignedBuffer::allocate(n);
    EXPECT_OK(b);
    return std::move(b).value();
  }

  // Writes `n` random bytes at `offset`, reads them back into a second buffer, compares.
  void roundtrip(uint64_t offset, size_t n, uint64_t seed) {
    auto data = random_bytes(n, seed);
    AlignedBuffer w = buffer(n), r = buffer(n);
    memcpy(w.data(), data.data(), n);
    memset(r.data(), 0xAB, n);
    Status s = engine_->write(*file_, offset, w.data(), n);
    ASSERT_OK(s);
    s = engine_->read(*file_, offset, r.data(), n);
    ASSERT_OK(s);
    EXPECT_EQ(first_mismatch(r.data(), data.data(), n), -1) << "at offset " << offset << " size " << n;
  }

  ScratchDir dir_{"io"};
  FaultInjector faults_;
  IoEngineOptions opts_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<File> file_;
};

TEST_P(IoEngineTest, RoundTripSizes) {
  // Whole blocks, a split request, and sizes that are not multiples of the block size.
  const size_t sizes[] = {4096, 256 * 1024, 3 * 256 * 1024 + 8192, (2 << 20) + 4096};
  uint64_t off = 0;
  for (size_t n : sizes) {
    roundtrip(off, n, n);
    off += n;
  }
  if (!GetParam().direct) {
    roundtrip(12345, 777, 1);  // buffered I/O takes any size and offset
    roundtrip(1, 300000, 2);
  }
  EXPECT_GT(engine_->stats().chunks, 8u);
}

TEST_P(IoEngineTest, OffsetsAboveFourGiB) {
  roundtrip((5ull << 30) + 8192, 512 * 1024 + 4096, 7);
  roundtrip((4ull << 30) - 4096, 3 * 4096, 8);  // straddles 4 GiB
}

TEST_P(IoEngineTest, BatchIsOneCompletion) {
  const size_t n = 64, each = 16384;
  AlignedBuffer w = buffer(n * each), r = buffer(n * each);
  auto data = random_bytes(n * each, 3);
  memcpy(w.data(), data.data(), n * each);
  std::vector<IoRequest> reqs;
  // Written in a scattered order: request i goes to slot (i * 37) % n.
  for (size_t i = 0; i < n; ++i) {
    reqs.push_back({IoOp::kWrite, file_.get(), ((i * 37) % n) * each, w.bytes() + i * each, each});
  }
  std::atomic<int> called{0};
  IoHandle h = engine_->submit(reqs, [&](IoCompletion& c) { called++; });
  ASSERT_OK(h->wait());
  EXPECT_EQ(h->bytes(), n * each);
  for (auto& q : reqs) {
    q.op = IoOp::kRead;
    q.buf = r.bytes() + (static_cast<char*>(q.buf) - w.bytes());
  }
  h = engine_->submit(reqs);
  ASSERT_OK(h->wait());
  EXPECT_OK(engine_->drain());
  EXPECT_EQ(called.load(), 1);
  EXPECT_EQ(first_mismatch(r.data(), data.data(), n * each), -1);
}

TEST_P(IoEngineTest, ManyConcurrentSubmitters) {
  const int threads = 8, per_thread = 24;
  const size_t each = 64 * 1024;
  AlignedBuffer w = buffer(threads * per_thread * each), r = buffer(threads * per_thread * each);
  auto data = random_bytes(w.size(), 11);
  memcpy(w.data(), data.data(), w.size());
  std::atomic<int> callbacks{0};
  auto run = [&](IoOp op, AlignedBuffer& b) {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        std::vector<IoHandle> hs;
        for (int i = 0; i < per_thread; ++i) {
          size_t k = static_cast<size_t>(t * per_thread + i);
          hs.push_back(engine_->submit(IoRequest{op, file_.get(), k * each, b.bytes() + k * each, each},
                                       [&](IoCompletion&) { callbacks++; }));
        }
        for (auto& h : hs) EXPECT_OK(h->wait());
      });
    }
    for (auto& t : ts) t.join();
  };
  run(IoOp::kWrite, w);
  run(IoOp::kRead, r);
  EXPECT_OK(engine_->drain());
  EXPECT_EQ(engine_->outstanding(), 0u);
  EXPECT_EQ(callbacks.load(), 2 * threads * per_thread);
  EXPECT_EQ(first_mismatch(r.data(), data.data(), r.size()), -1);
}

TEST_P(IoEngineTest, CallbacksMaySubmit) {
  // A chain: each completion submits the next request, as the prefetcher and the bench do.
  const size_t each = 32 * 1024, n = 40;
  AlignedBuffer w = buffer(n * each);
  auto data = random_bytes(w.size(), 5);
  memcpy(w.data(), data.data(), w.size());
  std::atomic<size_t> next{0};
  std::function<void()> issue = [&] {
    size_t k = next.fetch_add(1);
    if (k >= n) return;
    engine_->submit(IoRequest{IoOp::kWrite, file_.get(), k * each, w.bytes() + k * each, each},
                    [&](IoCompletion& c) {
                      EXPECT_OK(c.status());
                      issue();
                    });
  };
  issue();
  ASSERT_OK(engine_->drain());
  EXPECT_GE(next.load(), n);
  AlignedBuffer r = buffer(n * each);
  ASSERT_OK(engine_->read(*file_, 0, r.data(), r.size()));
  EXPECT_EQ(first_mismatch(r.data(), data.data(), r.size()), -1);
}

TEST_P(IoEngineTest, ShutdownWithRequestsInFlight) {
  const size_t each = 128 * 1024, n = 64;
  AlignedBuffer w = buffer(n * each);
  memset(w.data(), 0x5A, w.size());
  std::vector<IoHandle> hs;
  for (size_t k = 0; k < n; ++k) {
    hs.push_back(engine_->submit(IoRequest{IoOp::kWrite, file_.get(), k * each, w.bytes() + k * each, each}));
  }
  engine_.reset();  // must wait for everything in flight, then stop cleanly
  for (auto& h : hs) {
    ASSERT_TRUE(h->ready());
    EXPECT_OK(h->status());
  }
}

TEST_P(IoEngineTest, ReadPastEndOfFileIsAClearError) {
  roundtrip(0, 8192, 9);
  AlignedBuffer r = buffer(65536);
  Status s = engine_->read(*file_, 0, r.data(), 65536);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("Short read: end of file"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(file_->path()), std::string::npos) << s.message();
}

TEST_P(IoEngineTest, InjectedEioFailsOnlyItsRequest) {
  const size_t each = 64 * 1024, n = 16;
  AlignedBuffer w = buffer(n * each);
  memset(w.data(), 1, w.size());
  faults_.add(FaultKind::kEio, 5, 1, IoOp::kWrite);
  std::vector<IoHandle> hs;
  for (size_t k = 0; k < n; ++k) {
    hs.push_back(engine_->submit(IoRequest{IoOp::kWrite, file_.get(), k * each, w.bytes() + k * each, each}));
  }
  int failed = 0;
  for (auto& h : hs) {
    Status s = h->wait();
    if (s.is_ok()) continue;
    ++failed;
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_EQ(s.sys_errno(), EIO);
    EXPECT_NE(s.message().find("pwrite 65536 bytes at offset"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(file_->path()), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("Input/output error"), std::string::npos) << s.message();
  }
  EXPECT_EQ(failed, 1);
  Status d = engine_->drain();
  EXPECT_EQ(d.code(), StatusCode::kIoError);  // drain reports the first error since the last drain
  EXPECT_OK(engine_->drain());
  EXPECT_EQ(engine_->stats().errors, 1u);
}

TEST_P(IoEngineTest, InjectedEnospcOnWrite) {
  faults_.add(FaultKind::kEnospc, 1, 1, IoOp::kWrite);
  AlignedBuffer w = buffer(8192);
  Status s = engine_->write(*file_, 0, w.data(), 8192);
  EXPECT_EQ(s.code(), StatusCode::kNoSpace);
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.message();
  EXPECT_OK(engine_->write(*file_, 0, w.data(), 8192));  // the next one goes through
}

TEST_P(IoEngineTest, ShortTransfersAreContinued) {
  // Every other kernel answer is cut in half: the engine must resubmit the rest, exactly.
  const size_t n = 2 * 256 * 1024 + 3 * 4096;
  faults_.add(FaultKind::kShort, 1, 1000);
  roundtrip(4096, n, 21);
  EXPECT_GT(faults_.injected(), 0u);
  EXPECT_GT(engine_->stats().resubmits, 0u);
}

TEST_P(IoEngineTest, EagainIsRetried) {
  faults_.add(FaultKind::kEagain, 1, 3);
  roundtrip(0, 3 * 256 * 1024, 4);
  EXPECT_EQ(faults_.injected(), 3u);
  EXPECT_EQ(engine_->stats().retries, 3u);
}

TEST_P(IoEngineTest, CorruptReadFlipsOneByteOfAReadOnly) {
  // Counts reads only: the write before it is untouched, the read gets one flipped bit.
  faults_.add(FaultKind::kCorruptRead, 1);
  const size_t n = 64 * 1024;
  AlignedBuffer w = buffer(n), r = buffer(n);
  memset(w.data(), 0x33, n);
  ASSERT_OK(engine_->write(*file_, 0, w.data(), n));
  EXPECT_EQ(faults_.injected(), 0u);
  ASSERT_OK(engine_->read(*file_, 0, r.data(), n));  // the engine cannot tell
  EXPECT_EQ(faults_.injected(), 1u);
  EXPECT_EQ(first_mismatch(r.data(), w.data(), n), static_cast<long long>(n / 2));
  EXPECT_EQ(r.bytes()[n / 2], 0x33 ^ 0x20);
}

TEST_P(IoEngineTest, FinishHookRunsBeforeTheCompletionIsReady) {
  const size_t n = 3 * 256 * 1024;
  AlignedBuffer w = buffer(n);
  memset(w.data(), 7, n);
  std::atomic<int> ran{0};
  IoRequest req{IoOp::kWrite, file_.get(), 0, w.data(), n};
  IoHandle h = engine_->submit({&req, 1}, {}, [&] {
    ran++;
    return Status::ok();
  });
  ASSERT_OK(h->wait());
  EXPECT_EQ(ran.load(), 1);
  // Its error becomes the completion's, seen by wait() and drain().
  ASSERT_OK(engine_->drain());
  h = engine_->submit({&req, 1}, {}, [] { return corruption("hook says no"); });
  EXPECT_EQ(h->wait().code(), StatusCode::kCorruption);
  EXPECT_EQ(engine_->drain().code(), StatusCode::kCorruption);
  // A failed transfer does not run it.
  faults_.add(FaultKind::kEio, 1, UINT64_MAX);
  h = engine_->submit({&req, 1}, {}, [&] {
    ran++;
    return Status::ok();
  });
  EXPECT_EQ(h->wait().code(), StatusCode::kIoError);
  EXPECT_EQ(ran.load(), 1);
}

TEST_P(IoEngineTest, AnInlineFinishHookActsLikeAQueuedOne) {
  // finish_inline: run on the completing thread, with the same contract: once, after the data
  // moved, before the completion is ready and before its callback; its error is the completion's.
  const size_t n = 3 * 256 * 1024;
  AlignedBuffer w = buffer(n);
  memset(w.data(), 7, n);
  std::atomic<int> ran{0};
  std::atomic<bool> callback_saw_hook{false};
  IoRequest req{IoOp::kWrite, file_.get(), 0, w.data(), n};
  IoHandle h = engine_->submit(
      {&req, 1}, [&](IoCompletion&) { callback_saw_hook = ran.load() == 1; },
      [&] {
        ran++;
        return Status::ok();
      },
      /*finish_inline=*/true);
  ASSERT_OK(h->wait());
  EXPECT_EQ(ran.load(), 1);
  ASSERT_OK(engine_->drain());
  EXPECT_TRUE(callback_saw_hook.load());
  h = engine_->submit(
      {&req, 1}, {}, [] { return corruption("hook says no"); }, true);
  EXPECT_EQ(h->wait().code(), StatusCode::kCorruption);
  EXPECT_EQ(engine_->drain().code(), StatusCode::kCorruption);
  faults_.add(FaultKind::kEio, 1, UINT64_MAX);
  h = engine_->submit(
      {&req, 1}, {},
      [&] {
        ran++;
        return Status::ok();
      },
      true);
  EXPECT_EQ(h->wait().code(), StatusCode::kIoError);
  EXPECT_EQ(ran.load(), 1);
}

TEST_P(IoEngineTest, PersistentEioNeverHangs) {
  // A dead disk: every answer fails. Every submission must still complete, with an error.
  faults_.add(FaultKind::kEio, 1, UINT64_MAX);
  AlignedBuffer w = buffer(1 << 20);
  std::vector<IoHandle> hs;
  for (int k = 0; k < 20; ++k)
    hs.push_back(engine_->submit(IoRequest{IoOp::kWrite, file_.get(), 0, w.data(), w.size()}));
  for (auto& h : hs) EXPECT_EQ(h->wait().code(), StatusCode::kIoError);
  EXPECT_EQ(engine_->drain().code(), StatusCode::kIoError);
}

INSTANTIATE_TEST_SUITE_P(
    All, IoEngineTest,
    testing::Values(Param{IoBackend::kUring, true, 1}, Param{IoBackend::kUring, true, 8},
                    Param{IoBackend::kUring, true, 64}, Param{IoBackend::kUring, false, 1},
                    Param{IoBackend::kUring, false, 8}, Param{IoBackend::kUring, false, 64},
                    Param{IoBackend::kThreads, true, 1}, Param{IoBackend::kThreads, true, 8},
                    Param{IoBackend::kThreads, true, 64}, Param{IoBackend::kThreads, false, 1},
                    Param{IoBackend::kThreads, false, 8}, Param{IoBackend::kThreads, false, 64}),
    param_name);

// ---------------------------------------------------------------------------------------------

TEST(IoEngine, UnalignedDirectBufferIsAClearError) {
  ScratchDir dir("io");
  OpenOptions oo;
  oo.create = true;
  oo.direct = DirectMode::kRequire;
  auto f = File::open(dir.file("d"), oo);
  ASSERT_OK(f);
  auto e = IoEngine::create({});
  ASSERT_OK(e);
  auto b = AlignedBuffer::allocate(1 << 16);
  ASSERT_OK(b);
  char* unaligned = b->bytes() + 1;
  Status s = e.value()->write(*f.value(), 0, unaligned, 4096);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("O_DIRECT write of 4096 bytes at offset 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("not aligned"), std::string::npos) << s.message();
  // An unaligned offset or length is refused the same way.
  EXPECT_EQ(e.value()->write(*f.value(), 100, b->data(), 4096).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.value()->write(*f.value(), 0, b->data(), 1000).code(), StatusCode::kInvalidArgument);
}

TEST(IoEngine, BadOptionsAreRejected) {
  IoEngineOptions o;
  o.queue_depth = 0;
  EXPECT_EQ(IoEngine::create(o).status().code(), StatusCode::kInvalidArgument);
  o.queue_depth = 8;
  o.block_size = 1000;
  EXPECT_EQ(IoEngine::create(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_io_backend("libaio").status().code(), StatusCode::kInvalidArgument);
}

// Workers that cannot start (their stacks do not fit under RLIMIT_AS) are an error from create(),
// not std::terminate from a joinable thread destroyed while the error unwinds. In a child process
// whose address-space limit ends a little past its mappings; 60 s at most.
TEST(IoEngine, ThreadWorkersThatCannotStartAreAnError) {
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
    const rlim_t limit = static_cast<rlim_t>(kib + 48 * 1024) * 1024;  // a few 8 MiB stacks, not 128
    struct rlimit rl = {limit, limit};
    if (kib == 0 || setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
    IoEngineOptions o;
    o.backend = IoBackend::kThreads;
    o.threads = 128;
    auto e = IoEngine::create(o);
    if (e.is_ok()) _exit(2);
    const std::string m = e.status().message();
    _exit(m.find("cannot start its worker threads") != std::string::npos &&
                  m.find("ulimit -v") != std::string::npos
              ? 0
              : 1);
  }
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
  if (WEXITSTATUS(st) == 2) GTEST_SKIP() << "128 threads fit under the limit here";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "3: no limit set, 1: another message";
}

TEST(IoEngine, AutoPicksAWorkingBackend) {
  auto e = IoEngine::create({});
  ASSERT_OK(e);
  EXPECT_STREQ(e.value()->name(), probe_uring().empty() ? "uring" : "threads");
}

TEST(IoEngine, FixedBuffersAndFiles) {
  if (!probe_uring().empty()) GTEST_SKIP() << "no io_uring";
  ScratchDir dir("io");
  OpenOptions oo;
  oo.create = true;
  auto f = File::open(dir.file("fixed"), oo);
  ASSERT_OK(f);
  IoEngineOptions eo;
  eo.backend = IoBackend::kUring;
  auto e = IoEngine::create(eo);
  ASSERT_OK(e);
  auto pool = BufferPool::create(1 << 20, 4, PinMode::kLock);
  ASSERT_OK(pool);
  iovec v{pool.value()->base(), pool.value()->total_bytes()};
  ASSERT_OK(e.value()->register_buffers({&v, 1}));
  ASSERT_OK(e.value()->register_file(*f.value()));
  auto data = random_bytes(4 << 20, 77);
  memcpy(pool.value()->base(), data.data(), data.size());
  ASSERT_OK(e.value()->write(*f.value(), 0, pool.value()->base(), data.size()));
  memset(pool.value()->base(), 0, data.size());
  ASSERT_OK(e.value()->read(*f.value(), 0, pool.value()->base(), data.size()));
  EXPECT_EQ(first_mismatch(pool.value()->base(), data.data(), data.size()), -1);
  e.value()->unregister_file(*f.value());
}

}  // namespace
}  // namespace zoe::io

namespace zoe::io {
namespace {

// Runs fn in a child process under a seccomp filter that refuses io_uring_setup with EPERM, as
// container runtimes do; returns what fn wrote, or "SKIP" when seccomp is unavailable.
std::string under_uring_seccomp(const std::function<std::string()>& fn) {
  return test::run_in_child([&] {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
      return std::string("SKIP");
    }
    return fn();
  });
}

TEST(IoEngine, FallsBackToThreadsUnderSeccomp) {
  ScratchDir dir("seccomp");
  std::string path = dir.file("f");
  std::string got = under_uring_seccomp([&]() -> std::string {
    if (probe_uring().empty()) return "probe says io_uring works";
    auto e = IoEngine::create({});
    if (!e.is_ok()) return "create failed: " + e.status().to_string();
    std::string name = e.value()->name();
    IoEngineOptions forced;
    forced.backend = IoBackend::kUring;
    auto u = IoEngine::create(forced);
    if (u.is_ok()) return "forced uring unexpectedly worked";
    OpenOptions oo;
    oo.create = true;
    auto f = File::open(path, oo);
    if (!f.is_ok()) return f.status().to_string();
    auto data = random_bytes(1 << 20, 1);
    auto b = AlignedBuffer::allocate(1 << 20).value();
    memcpy(b.data(), data.data(), data.size());
    Status ws = e.value()->write(*f.value(), 0, b.data(), data.size());
    if (!ws.is_ok()) return "write failed: " + ws.to_string();
    memset(b.data(), 0, b.size());
    if (!e.value()->read(*f.value(), 0, b.data(), b.size()).is_ok()) return "read failed";
    if (first_mismatch(b.data(), data.data(), data.size()) != -1) return "data mismatch";
    return name + "|" + u.status().message();
  });
  if (got == "SKIP") GTEST_SKIP() << "seccomp filters unavailable";
  EXPECT_EQ(got.substr(0, got.find('|')), "threads") << "child said: " << got;
  EXPECT_NE(got.find("io_uring_queue_init"), std::string::npos) << got;
}

// A real-time read priority (the activation store's): 4 MiB written and read back in 256 KiB
// pieces; true when the bytes came back. `after`: the priority the engine then uses.
bool read_with_priority(const std::string& path, uint16_t* after) {
  IoEngineOptions eo;
  eo.backend = IoBackend::kUring;
  eo.queue_depth = 4;
  eo.block_size = 256 * 1024;
  eo.read_ioprio = io_read_priority(kIoPrioClassRealtime, 4);
  auto e = IoEngine::create(eo);
  OpenOptions oo;
  oo.create = true;
  auto f = File::open(path, oo);
  if (!e.is_ok() || !f.is_ok()) return false;
  auto data = random_bytes(4 << 20, 3);
  auto b = AlignedBuffer::allocate(4 << 20).value();
  memcpy(b.data(), data.data(), data.size());
  if (!e.value()->write(*f.value(), 0, b.data(), b.size()).is_ok()) return false;
  memset(b.data(), 0, b.size());
  if (!e.value()->read(*f.value(), 0, b.data(), b.size()).is_ok()) return false;
  *after = e.value()->read_ioprio();
  return first_mismatch(b.data(), data.data(), data.size()) == -1;
}

// The capability sets of this thread (capget; version 3: two 32-bit words each).
bool thread_caps(__user_cap_data_struct (*d)[2]) {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  return syscall(SYS_capget, &h, *d) == 0;
}

// Where the kernel allows the real-time class (CAP_SYS_ADMIN or CAP_SYS_NICE) the engine keeps
// it; in a child without both, the first refused read goes again without it, and so do the rest.
TEST(IoEngine, ReadPriorityIsKeptOrDroppedWhereTheKernelRefusesIt) {
  if (!probe_uring().empty()) GTEST_SKIP() << "no io_uring";
  ScratchDir dir("ioprio");
  const uint16_t rt = io_read_priority(kIoPrioClassRealtime, 4);
  __user_cap_data_struct caps[2]{};
  ASSERT_TRUE(thread_caps(&caps));
  const uint32_t both = (1u << CAP_SYS_ADMIN) | (1u << CAP_SYS_NICE);
  uint16_t after = 1;
  ASSERT_TRUE(read_with_priority(dir.file("parent"), &after));
  EXPECT_EQ(after, (caps[0].effective & both) ? rt : 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    caps[0].effective &= ~both;
    __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
    if (syscall(SYS_capset, &h, caps) != 0) _exit(3);
    uint16_t dropped = 1;
    const bool same = read_with_priority(dir.file("child"), &dropped);
    _exit(!same ? 1 : dropped != 0 ? 2 : 0);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "1: wrong bytes or an error, 2: the priority was kept, 3: capset failed";
}

TEST(IoEngine, SqpollRoundTrip) {
  if (!probe_uring().empty()) GTEST_SKIP() << "no io_uring";
  ScratchDir dir("sqpoll");
  IoEngineOptions eo;
  eo.backend = IoBackend::kUring;
  eo.sqpoll = true;
  eo.queue_depth = 16;
  auto e = IoEngine::create(eo);
  if (!e.is_ok()) GTEST_SKIP() << "SQPOLL unavailable: " << e.status().to_string();
  OpenOptions oo;
  oo.create = true;
  auto f = File::open(dir.file("f"), oo).value();
  auto data = random_bytes(4 << 20, 2);
  auto b = AlignedBuffer::allocate(4 << 20).value();
  memcpy(b.data(), data.data(), data.size());
  ASSERT_OK(e.value()->write(*f, 0, b.data(), b.size()));
  memset(b.data(), 0, b.size());
  ASSERT_OK(e.value()->read(*f, 0, b.data(), b.size()));
  EXPECT_EQ(first_mismatch(b.data(), data.data(), data.size()), -1);
}

}  // namespace
}  // namespace zoe::io
