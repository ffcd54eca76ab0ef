// Device tests: one behavioural suite run on CpuDevice and on CudaDevice (when a GPU is present).
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "device/device.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::device {
namespace {

using test::first_mismatch;
using test::random_bytes;

constexpr uint64_t kBudget = 4ull << 20;

enum class Backend { kCpu, kCuda };

// A door host functions wait at until the test opens it. Shared so that a host function still
// queued when a test fails early never touches a destroyed gate.
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Opens the gate when the scope ends, so that a failing assertion cannot leave a stream blocked
// (declare it after the streams whose destructors would wait).
struct GateOpener {
  std::shared_ptr<Gate> gate;
  ~GateOpener() { gate->open(); }
};

class DeviceTest : public testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kCuda) {
      std::string why;
      if (cuda_device_count(&why) == 0)
        GTEST_SKIP() << "no CUDA device to compare with the CPU device: " << why;
    }
    dev_ = make_device(kBudget);
    ASSERT_NE(dev_, nullptr);
  }

  std::unique_ptr<Device> make_device(uint64_t budget) {
    auto d = GetParam() == Backend::kCpu ? create_cpu_device(budget) : create_cuda_device(0, budget);
    EXPECT_OK(d);
    return d.is_ok() ? std::move(d).value() : nullptr;
  }
  std::unique_ptr<Stream> stream() {
    auto s = dev_->create_stream();
    EXPECT_OK(s);
    return s.is_ok() ? std::move(s).value() : nullptr;
  }
  std::unique_ptr<Event> event() {
    auto e = dev_->create_event();
    EXPECT_OK(e);
    return e.is_ok() ? std::move(e).value() : nullptr;
  }
  void* alloc(size_t n) {
    auto p = dev_->allocate(n);
    EXPECT_OK(p);
    return p.is_ok() ? *p : nullptr;
  }

  std::unique_ptr<Device> dev_;
};

// ---- budget ----------------------------------------------------------------------------------

TEST_P(DeviceTest, BudgetFillsExactlyAndOneByteOverFailsWithAClearMessage) {
  EXPECT_EQ(dev_->budget_bytes(), kBudget);
  EXPECT_EQ(dev_->used_bytes(), 0u);
  void* a = alloc(kBudget - 1000);
  void* b = alloc(1000);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(dev_->used_bytes(), kBudget);

  auto over = dev_->allocate(1);
  ASSERT_FALSE(over.is_ok());
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfBudget);
  dev_->free(b);
  EXPECT_EQ(dev_->used_bytes(), kBudget - 1000);

  over = dev_->allocate(1001);
  ASSERT_FALSE(over.is_ok());
  const std::string msg = over.status().to_string();
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfBudget) << msg;
  EXPECT_NE(msg.find("device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1001 bytes"), std::string::npos) << "names the request: " << msg;
  EXPECT_NE(msg.find(std::to_string(kBudget - 1000) + " bytes"), std::string::npos)
      << "names the bytes in use: " << msg;
  EXPECT_NE(msg.find(std::to_string(kBudget) + "-byte budget"), std::string::npos)
      << "names the budget: " << msg;
  EXPECT_EQ(dev_->used_bytes(), kBudget - 1000) << "a failed allocation takes nothing";

  void* c = alloc(1000);  // free returned the capacity
  EXPECT_NE(c, nullptr);
  dev_->free(c);
  dev_->free(a);
  dev_->free(nullptr);
  EXPECT_EQ(dev_->used_bytes(), 0u);
  EXPECT_EQ(dev_->high_water_bytes(), kBudget);
  auto whole = dev_->allocate(kBudget);
  ASSERT_OK(whole);
  dev_->free(*whole);
}

TEST_P(DeviceTest, HighWaterTracksThePeak) {
  void* a = alloc(100000);
  void* b = alloc(200000);
  dev_->free(a);
  void* c = alloc(50000);
  EXPECT_EQ(dev_->used_bytes(), 250000u);
  EXPECT_EQ(dev_->high_water_bytes(), 300000u);
  dev_->free(b);
  dev_->free(c);
  EXPECT_EQ(dev_->high_water_bytes(), 300000u);
}

TEST_P(DeviceTest, AllocationsAreAlignedAndDistinct) {
  std::vector<void*> ptrs;
  for (size_t n : {size_t{1}, size_t{3}, size_t{255}, size_t{257}, size_t{4096}, size_t{100001}}) {
    void* p = alloc(n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << n << " bytes";
    std::vector<unsigned char> fill(n, 0x5A), back(n, 0);
    ASSERT_OK(dev_->copy_to_device(p, fill.data(), n));
    ASSERT_OK(dev_->copy_to_host(back.data(), p, n));
    EXPECT_EQ(first_mismatch(fill.data(), back.data(), n), -1);
    for (void* q : ptrs) EXPECT_NE(p, q);
    ptrs.push_back(p);
  }
  for (void* p : ptrs) dev_->free(p);
  EXPECT_EQ(dev_->used_bytes(), 0u);
}

TEST_P(DeviceTest, AllocateZeroIsAnError) {
  auto p = dev_->allocate(0);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
}

TEST_P(DeviceTest, ConcurrentAllocatorsNeverPassTheBudget) {
  const int kThreads = 4;
  const int kIters = GetParam() == Backend::kCpu ? 3000 : 400;
  std::atomic<bool> over{false};
  std::atomic<bool> done{false};
  std::atomic<int> refused{0};
  std::atomic<uint64_t> held{0};  // bytes the test threads hold, by their own count
  std::thread watcher([&] {
    while (!done.load()) {
      if (dev_->used_bytes() > kBudget) over = true;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::vector<std::pair<void*, size_t>> mine;
      for (int i = 0; i < kIters; ++i) {
        // Up to six allocations of up to a third of the budget each: one thread alone reaches
        // the budget, whatever the scheduler does with the others.
        if (mine.size() < 6 && rng() % 3 != 0) {
          size_t n = 1 + rng() % (kBudget / 3);
          auto p = dev_->allocate(n);
          if (p.is_ok()) {
            mine.emplace_back(*p, n);
            if (held.fetch_add(n) + n > kBudget) over = true;
          } else {
            EXPECT_EQ(p.status().code(), StatusCode::kOutOfBudget) << p.status().to_string();
            ++refused;
          }
          if (dev_->used_bytes() > kBudget) over = true;
        } else if (!mine.empty()) {
          size_t k = rng() % mine.size();
          held.fetch_sub(mine[k].second);
          dev_->free(mine[k].first);
          mine.erase(mine.begin() + static_cast<long>(k));
        }
      }
      for (auto& [p, n] : mine) {
        held.fetch_sub(n);
        dev_->free(p);
      }
    });
  }
  for (auto& t : threads) t.join();
  done = true;
  watcher.join();
  EXPECT_FALSE(over.load()) << "used bytes went past the budget";
  EXPECT_GT(refused.load(), 0) << "the load should have hit the budget";
  EXPECT_EQ(dev_->used_bytes(), 0u);
  EXPECT_LE(dev_->high_water_bytes(), kBudget);
  EXPECT_GT(dev_->high_water_bytes(), kBudget / 2);
}

// ---- streams ---------------------------------------------------------------------------------

TEST_P(DeviceTest, CopiesAndHostFunctionsRunInOrder) {
  const size_t kN = 512;
  auto s = stream();
  auto* a = static_cast<uint32_t*>(alloc(kN * 4));
  auto* b = static_cast<uint32_t*>(alloc(kN * 4));
  std::vector<uint32_t> src(kN), out(kN, 0);
  for (size_t i = 0; i < kN; ++i) src[i] = static_cast<uint32_t>(i * 2654435761u + 1);
  std::vector<size_t> seq;
  size_t wrong = 0;
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_OK(s->copy_h2d(a + i, &src[i], 4));
    ASSERT_OK(s->copy_d2d(b + i, a + i, 4));
    ASSERT_OK(s->copy_d2h(&out[i], b + i, 4));
    // The host function sees the copies enqueued before it.
    ASSERT_OK(s->enqueue_host([&, i] {
      seq.push_back(i);
      if (out[i] != src[i]) ++wrong;
    }));
  }
  ASSERT_OK(s->synchronize());
  ASSERT_EQ(seq.size(), kN);
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(seq[i], i) << "host functions out of order at " << i;
  EXPECT_EQ(wrong, 0u) << "host functions ran before the copies enqueued ahead of them";
  EXPECT_EQ(first_mismatch(out.data(), src.data(), kN * 4), -1);
  dev_->free(a);
  dev_->free(b);
}

TEST_P(DeviceTest, RoundTripOfRandomDataMatches) {
  const size_t kBytes = 1 << 20;
  auto data = random_bytes(kBytes, 42);
  std::vector<unsigned char> back(kBytes, 0);
  auto s = stream();
  auto* a = static_cast<unsigned char*>(alloc(kBytes));
  auto* b = static_cast<unsigned char*>(alloc(kBytes));
  ASSERT_OK(s->copy_h2d(a, data.data(), kBytes));
  ASSERT_OK(s->copy_d2d(b, a, kBytes));
  ASSERT_OK(s->copy_d2h(back.data(), b, kBytes));
  ASSERT_OK(s->synchronize());
  EXPECT_EQ(first_mismatch(back.data(), data.data(), kBytes), -1);

  // Unaligned pieces inside the allocations, and a zero-byte copy.
  const size_t off = 13, len = 70001;
  std::vector<unsigned char> piece(len, 0);
  ASSERT_OK(s->copy_d2d(a + off, b + 2 * off, len));
  ASSERT_OK(s->copy_d2h(piece.data(), a + off, len));
  ASSERT_OK(s->copy_h2d(a, data.data(), 0));
  ASSERT_OK(s->synchronize());
  EXPECT_EQ(first_mismatch(piece.data(), data.data() + 2 * off, len), -1);
  dev_->free(a);
  dev_->free(b);
}

TEST_P(DeviceTest, SynchronizeWaitsForEnqueuedWork) {
  auto s = stream();
  std::atomic<bool> ran{false};
  ASSERT_OK(s->enqueue_host([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ran = true;
  }));
  ASSERT_OK(s->synchronize());
  EXPECT_TRUE(ran.load());
  ASSERT_OK(s->synchronize());  // nothing queued: returns at once
}

TEST_P(DeviceTest, ThreadsEnqueueingOnOneStreamKeepTheirOwnOrder) {
  auto s = stream();
  const int kThreads = 4, kPer = 300;
  std::vector<std::pair<int, int>> seq;  // touched only by the stream's host functions
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPer; ++k) EXPECT_OK(s->enqueue_host([&seq, t, k] { seq.emplace_back(t, k); }));
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_OK(s->synchronize());
  ASSERT_EQ(seq.size(), size_t{kThreads} * kPer);
  std::vector<int> next(kThreads, 0);
  for (auto [t, k] : seq) ASSERT_EQ(k, next[t]++) << "thread " << t;
}

TEST_P(DeviceTest, HostFunctionExceptionSurfacesAtSynchronize) {
  auto s = stream();
  std::atomic<bool> later{false};
  ASSERT_OK(s->enqueue_host([] { throw std::runtime_error("boom"); }));
  ASSERT_OK(s->enqueue_host([&] { later = true; }));
  Status st = s->synchronize();
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.to_string();
  EXPECT_NE(st.message().find("boom"), std::string::npos) << st.to_string();
  EXPECT_TRUE(later.load()) << "work after the failure still runs";
  EXPECT_OK(s->synchronize());  // reported once
}

// ---- events ----------------------------------------------------------------------------------

TEST_P(DeviceTest, EventMakesAnotherStreamWait) {
  auto a = stream();
  auto b = stream();
  auto e = event();
  std::atomic<bool> a_done{false};
  std::atomic<bool> b_saw_a{false};
  ASSERT_OK(a->enqueue_host([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    a_done = true;
  }));
  ASSERT_OK(a->record(*e));
  ASSERT_OK(b->wait_event(*e));
  ASSERT_OK(b->enqueue_host([&] { b_saw_a = a_done.load(); }));
  ASSERT_OK(b->synchronize());
  EXPECT_TRUE(b_saw_a.load()) << "stream B ran past wait_event before stream A reached the event";
  ASSERT_OK(a->synchronize());
}

TEST_P(DeviceTest, EventQueryIsFalseUntilTheWorkIsDone) {
  auto s = stream();
  auto e = event();
  EXPECT_TRUE(e->query()) << "an event never recorded is complete";
  EXPECT_OK(e->synchronize());
  auto gate = std::make_shared<Gate>();
  GateOpener opener{gate};
  ASSERT_OK(s->enqueue_host([gate] { gate->wait(); }));
  ASSERT_OK(s->record(*e));
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(e->query());
  gate->open();
  ASSERT_OK(e->synchronize());
  EXPECT_TRUE(e->query());
  ASSERT_OK(s->synchronize());
}

TEST_P(DeviceTest, RecordingAgainTracksTheLatestRecord) {
  auto s = stream();
  auto e = event();
  ASSERT_OK(s->record(*e));
  ASSERT_OK(e->synchronize());
  EXPECT_TRUE(e->query());
  auto gate = std::make_shared<Gate>();
  GateOpener opener{gate};
  ASSERT_OK(s->enqueue_host([gate] { gate->wait(); }));
  ASSERT_OK(s->record(*e));
  EXPECT_FALSE(e->query()) << "the event moved to the new, unfinished point";
  gate->open();
  ASSERT_OK(e->synchronize());
  EXPECT_TRUE(e->query());
}

TEST_P(DeviceTest, WaitingOnANeverRecordedEventDoesNotBlock) {
  auto s = stream();
  auto e = event();
  std::atomic<bool> ran{false};
  ASSERT_OK(s->wait_event(*e));
  ASSERT_OK(s->enqueue_host([&] { ran = true; }));
  ASSERT_OK(s->synchronize());
  EXPECT_TRUE(ran.load());
}

// ---- lifetimes -------------------------------------------------------------------------------

TEST_P(DeviceTest, DestroyingAStreamDrainsQueuedWork) {
  const int kN = 100;
  std::atomic<int> ran{0};
  std::vector<uint64_t> src(kN), out(kN, 0);
  for (int i = 0; i < kN; ++i) src[i] = 0x1234567800000000ull + static_cast<uint64_t>(i);
  auto* d = static_cast<uint64_t*>(alloc(size_t{kN} * 8));
  {
    auto s = stream();
    for (int i = 0; i < kN; ++i) {
      ASSERT_OK(s->enqueue_host([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        ++ran;
      }));
      ASSERT_OK(s->copy_h2d(d + i, &src[i], 8));
      ASSERT_OK(s->copy_d2h(&out[i], d + i, 8));
    }
  }  // destroyed with most of the work still queued
  EXPECT_EQ(ran.load(), kN);
  EXPECT_EQ(first_mismatch(out.data(), src.data(), size_t{kN} * 8), -1);
  dev_->free(d);
}

TEST_P(DeviceTest, DestroyingTheDeviceReleasesForgottenAllocations) {
  auto other = make_device(kBudget);
  ASSERT_NE(other, nullptr);
  auto p = other->allocate(12345);
  ASSERT_OK(p);
  other.reset();  // logs a warning; leak checkers see nothing left behind
}

TEST_P(DeviceTest, FreeAfterReturnsTheBudgetWhenTheStreamPassesIt) {
  auto s = stream();
  const size_t kKeep = 4096;
  void* p = alloc(kBudget - kKeep);
  void* q = alloc(kKeep);
  ASSERT_TRUE(p && q);
  auto gate = std::make_shared<Gate>();
  GateOpener opener{gate};
  ASSERT_OK(s->enqueue_host([gate] { gate->wait(); }));
  // Device to device: with pageable host memory a CUDA copy may wait for the (blocked) stream.
  ASSERT_OK(s->copy_d2d(q, p, kKeep));
  ASSERT_OK(dev_->free_after(*s, p));
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(dev_->used_bytes(), kBudget) << "the bytes stay counted while queued work may use them";
  EXPECT_FALSE(dev_->allocate(1).is_ok());
  gate->open();
  ASSERT_OK(s->synchronize());
  EXPECT_EQ(dev_->used_bytes(), kKeep);
  EXPECT_EQ(dev_->high_water_bytes(), kBudget);
  auto again = dev_->allocate(kBudget - kKeep);
  ASSERT_OK(again);
  dev_->free(*again);
  dev_->free(q);
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceTest, testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const testing::TestParamInfo<Backend>& p) {
                           return std::string(p.param == Backend::kCpu ? "cpu" : "cuda");
                         });

// ---- backend specifics -----------------------------------------------------------------------

TEST(CpuDevice, CopiesOutsideDeviceMemoryAreRejected) {
  auto dev = create_cpu_device(kBudget);
  ASSERT_OK(dev);
  auto s = (*dev)->create_stream();
  ASSERT_OK(s);
  auto p = (*dev)->allocate(1000);
  ASSERT_OK(p);
  auto* d = static_cast<char*>(*p);
  std::vector<char> host(2000);
  Status st = (*s)->copy_h2d(host.data(), d, 100);  // arguments swapped: host pointer as device
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("copy_h2d"), std::string::npos) << st.to_string();
  st = (*s)->copy_d2h(host.data(), d + 900, 101);  // runs off the end
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_OK((*s)->copy_d2h(host.data(), d + 900, 100));
  st = (*s)->copy_h2d(d, nullptr, 10);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_OK((*s)->synchronize());
  (*dev)->free(*p);
  s->reset();
}

// Minor page faults of this process so far (pages the kernel had to hand over on first touch).
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// The engine frees and allocates the same large sizes every micro-batch: a freed block is reused
// for the next allocation of its size instead of coming back as fresh pages from the kernel
// (40 MiB: above the C library's largest mmap threshold, so without the reuse every allocation
// is new pages), and the reused block is not device memory while it waits (copies into it are
// refused).
TEST(CpuDevice, AFreedLargeBlockIsReusedWithoutNewPagesAndWithinTheBudget) {
  constexpr size_t kBig = 40ull << 20;
  auto dev = create_cpu_device(kBig + (8ull << 20));
  ASSERT_OK(dev);
  auto touch = [](void* p) {
    long before = minor_faults();
    std::memset(p, 1, kBig);
    return minor_faults() - before;
  };
  auto a = (*dev)->allocate(kBig);
  ASSERT_OK(a);
  const long fresh = touch(*a);
  (*dev)->free(*a);
  EXPECT_EQ((*dev)->used_bytes(), 0u);
  auto s = (*dev)->create_stream();
  ASSERT_OK(s);
  std::vector<char> host(64);
  Status st = (*s)->copy_h2d(*a, host.data(), host.size());  // the freed (cached) block
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  auto b = (*dev)->allocate(kBig);
  ASSERT_OK(b);
  const long reused = touch(*b);
  EXPECT_LT(reused * 4, fresh) << "fresh " << fresh << " faults, reused " << reused;
  // Live plus cached stay within the budget: with the big block cached, two 6 MiB blocks need
  // its room, and get it.
  ASSERT_OK((*dev)->free_after(**s, *b));
  EXPECT_OK((*s)->synchronize());
  auto c = (*dev)->allocate(6ull << 20);
  auto d = (*dev)->allocate(6ull << 20);
  ASSERT_OK(c);
  ASSERT_OK(d);
  EXPECT_LE((*dev)->used_bytes(), kBig + (8ull << 20));
  (*dev)->free(*c);
  (*dev)->free(*d);
  s->reset();
}

TEST(CpuDevice, ProgrammingErrorsAbortWithTheReason) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto dev = create_cpu_device(kBudget);
        int not_device_memory = 0;
        (*dev)->free(&not_device_memory);
      },
      "did not allocate");
  EXPECT_DEATH(
      {
        auto dev = create_cpu_device(kBudget);
        auto s = (*dev)->create_stream();
        (void)std::move(s).value().release();  // the stream outlives its device
        dev->reset();
      },
      "streams are alive");
}

TEST(CpuDevice, ZeroBudgetIsRejected) {
  auto dev = create_cpu_device(0);
  ASSERT_FALSE(dev.is_ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kInvalidArgument);
}

TEST(CudaDevice, WithoutAGpuCreationSaysWhy) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_FALSE(why.empty());
  auto dev = create_cuda_device(0, kBudget);
  ASSERT_FALSE(dev.is_ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(dev.status().message().find(why), std::string::npos) << dev.status().to_string();
}

}  // namespace
}  // namespace zoe::device
