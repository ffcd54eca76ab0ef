// GlooComm (gloo's TCP transport), its ranks as threads of one process meeting through an
// in-process store over loopback: every collective x type x size against reduce_rows over all
// ranks' inputs computed in one process (the bits MpiComm gives: test_comm_mpi checks the same),
// chunked rounds, broadcast, barrier, and a rank that never comes or leaves: an error within the
// timeout naming the rank, never a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/reduce.h"
#include "tests/comm/comm_test_util.h"
#include "tests/util/status_test_util.h"
#include "zoe/features.h"

namespace zoe::comm {
namespace {

using namespace zoe::comm::test;  // NOLINT(google-build-using-namespace)

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// The ranks' meeting point: keys set once, get() waits for them.
class MemoryStore final : public KeyValueStore {
 public:
  Status set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    kv_[key] = value;
    cv_.notify_all();
    return Status::ok();
  }
  Result<std::string> get(const std::string& key, int64_t timeout_ms) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return kv_.count(key) > 0; }))
      return make_status(StatusCode::kIoError, "store: key %s was not set within %lld ms", key.c_str(),
                         static_cast<long long>(timeout_ms));
    return kv_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

GlooCommOptions options(std::shared_ptr<KeyValueStore> store, int rank, int size, const std::string& prefix) {
  GlooCommOptions o;
  o.rank = rank, o.size = size, o.local_rank = rank;
  o.store = std::move(store);
  o.prefix = prefix;
  o.hostname = "127.0.0.1";
  o.timeout_s = 20;
  return o;
}

// Runs body(comm) on `size` ranks, each a thread with its own GlooComm.
void on_ranks(int size, const std::string& prefix, size_t chunk_bytes,
              const std::function<void(Communicator&)>& body) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      GlooCommOptions o = options(store, r, size, prefix);
      o.chunk_bytes = chunk_bytes;
      auto comm = create_gloo_comm(o);
      ASSERT_OK(comm.status());
      EXPECT_STREQ(comm.value()->backend(), "gloo");
      EXPECT_EQ(comm.value()->rank(), r);
      body(*comm.value());
    });
  }
  for (auto& t : threads) t.join();
}

// Every rank's random input of `count * size` elements (seeded by rank), and reduce_rows over them.
std::vector<unsigned char> input_of(CommType t, int rank, size_t n) {
  std::vector<unsigned char> b(n * comm_type_size(t) + 1);
  fill_random(t, b.data(), n, 1000 + rank);
  return b;
}
std::vector<unsigned char> reference(CommType t, ReduceOp op, int size, size_t n) {
  std::vector<std::vector<unsigned char>> in;
  std::vector<const void*> rows;
  for (int r = 0; r < size; ++r) in.push_back(input_of(t, r, n));
  for (auto& b : in) rows.push_back(b.data());
  std::vector<unsigned char> out(n * comm_type_size(t) + 1);
  reduce_rows(rows.data(), size, n, out.data(), t, op);
  return out;
}

void check_collectives(Communicator& c) {
  const int rank = c.rank(), size = c.size();
  for (CommType t : kAllTypes) {
    const size_t es = comm_type_size(t);
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{30011}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        const auto want = reference(t, op, size, n * size);
        auto in = input_of(t, rank, n * size);
        std::vector<unsigned char> out(n * size * es + 1);
        ASSERT_OK(c.all_reduce(in.data(), out.data(), n * size, t, op).wait());
        EXPECT_EQ(0, std::memcmp(out.data(), want.data(), n * size * es))
            << "all_reduce " << comm_type_name(t) << " n " << n * size;
        std::vector<unsigned char> part(n * es + 1);
        ASSERT_OK(c.reduce_scatter(in.data(), part.data(), n, t, op).wait());
        EXPECT_EQ(0, std::memcmp(part.data(), want.data() + rank * n * es, n * es))
            << "reduce_scatter " << comm_type_name(t) << " n " << n;
      }
      for (bool in_place : {false, true}) {
        Buf send(t, n), recv(t, n * size);
        void* src = in_place ? recv.bytes.data() + rank * n * es : send.data();
        for (size_t i = 0; i < n; ++i) put(t, src, i, gather_input(t, rank, i));
        ASSERT_OK(c.all_gather(src, recv.data(), n, t).wait());
        size_t wrong = 0;
        for (size_t g = 0; g < n * size; ++g)
          wrong += get(t, recv.data(), g) != gather_input(t, g / n, g % n);
        EXPECT_EQ(wrong, 0u) << "all_gather " << comm_type_name(t) << " n " << n
                             << (in_place ? " in place" : "");
      }
    }
  }
  std::vector<int64_t> b(1001, rank == size - 1 ? 42 : -1);
  ASSERT_OK(c.broadcast(b.data(), b.size(), CommType::kI64, size - 1).wait());
  EXPECT_EQ(b.front(), 42);
  EXPECT_EQ(b.back(), 42);
  EXPECT_OK(c.barrier());
}

#if ZOE_HAVE_GLOO

TEST(GlooComm, CollectivesGiveTheBitsOfTheOrderedReductionOnTwoAndThreeRanks) {
  for (int size : {2, 3}) {
    std::string prefix = "world";
    prefix += std::to_string(size);
    on_ranks(size, prefix, 0, check_collectives);
  }
}

TEST(GlooComm, ChunkedRoundsGiveTheSameBits) {
  on_ranks(2, "chunked", 4096, check_collectives);  // 4 KiB rounds: the larger sizes run in many rounds
}

TEST(GlooComm, QueuedCollectivesCompleteInOrder) {
  on_ranks(2, "queued", 0, [](Communicator& c) {
    std::vector<std::vector<float>> in(16, std::vector<float>(4096)), out(16, std::vector<float>(4096));
    std::vector<CommHandle> h;
    for (int k = 0; k < 16; ++k) {
      for (size_t i = 0; i < in[k].size(); ++i) in[k][i] = float(k * 10 + c.rank());
      h.push_back(c.all_reduce(in[k].data(), out[k].data(), in[k].size(), CommType::kF32, ReduceOp::kSum));
    }
    for (int k = 0; k < 16; ++k) {
      ASSERT_OK(h[k].wait());
      EXPECT_EQ(out[k][0], float(k * 20 + 1));
      EXPECT_EQ(out[k][4095], float(k * 20 + 1));
    }
  });
}

TEST(GlooComm, BadOptionsNameWhatIsWrong) {
  GlooCommOptions o = options(std::make_shared<MemoryStore>(), 2, 2, "bad");
  auto r = create_gloo_comm(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(r.status().message(), "rank 2 is not in a world of 2");
  o = options(nullptr, 0, 2, "bad");
  EXPECT_HAS(create_gloo_comm(o).status().message(), "no store");
}

TEST(GlooComm, ARankThatNeverComesIsAnErrorWithinTheTimeout) {
  GlooCommOptions o = options(std::make_shared<MemoryStore>(), 0, 2, "alone");
  o.timeout_s = 1;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = create_gloo_comm(o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_HAS(r.status().message(), "rank 0 of 2");
  EXPECT_LT(s, 10.0);
}

TEST(GlooComm, ARankThatLeavesFailsThePeersCollectiveWithinTheTimeout) {
  auto store = std::make_shared<MemoryStore>();
  std::thread leaver([&] {
    GlooCommOptions o = options(store, 1, 2, "leave");
    o.timeout_s = 2;
    auto c = create_gloo_comm(o);
    ASSERT_OK(c.status());
    EXPECT_OK(c.value()->barrier());
  });  // rank 1's communicator is gone after the barrier
  GlooCommOptions o = options(store, 0, 2, "leave");
  o.timeout_s = 2;
  auto c = create_gloo_comm(o);
  ASSERT_OK(c.status());
  EXPECT_OK(c.value()->barrier());
  leaver.join();
  std::vector<float> v(1000, 1.0f), out(1000);
  const auto t0 = std::chrono::steady_clock::now();
  Status s = c.value()->all_reduce(v.data(), out.data(), v.size(), CommType::kF32, ReduceOp::kSum).wait();
  EXPECT_FALSE(s.is_ok());
  EXPECT_HAS(s.message(), "gloo");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  // Collectives queued after a failure fail too (the ranks are out of step).
  EXPECT_FALSE(c.value()->barrier().is_ok());
}

#else

TEST(GlooComm, WithoutGlooCreatingOneSaysHowToGetIt) {
  auto r = create_gloo_comm(options(std::make_shared<MemoryStore>(), 0, 1, "x"));
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_HAS(r.status().message(), "libgloo-dev");
}

#endif

}  // namespace
}  // namespace zoe::comm
