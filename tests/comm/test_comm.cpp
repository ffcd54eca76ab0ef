// Single-process communicator tests: the ordered reduction against a scalar reference, LocalComm's
// semantics for every collective and type, buckets, MpiComm as a one-rank world, NcclComm's refusal
// without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm/bucket.h"
#include "comm/reduce.h"
#include "tests/comm/comm_test_util.h"
#include "zoe/features.h"

namespace zoe::comm {
namespace {

using namespace zoe::comm::test;  // NOLINT(google-build-using-namespace)

// A scalar reference written apart from reduce_rows: one element at a time over the rows.
void reference_reduce(const std::vector<const void*>& rows, size_t count, void* out, CommType t,
                      ReduceOp op) {
  for (size_t i = 0; i < count; ++i) {
    if (t == CommType::kI64 || t == CommType::kU8) {
      uint64_t acc = t == CommType::kI64 ? static_cast<const uint64_t*>(rows[0])[i]
                                         : static_cast<const uint8_t*>(rows[0])[i];
      for (size_t r = 1; r < rows.size(); ++r) {
        uint64_t x = t == CommType::kI64 ? static_cast<const uint64_t*>(rows[r])[i]
                                         : static_cast<const uint8_t*>(rows[r])[i];
        if (op == ReduceOp::kSum)
          acc += x;
        else if (t == CommType::kI64 ? static_cast<int64_t>(x) > static_cast<int64_t>(acc) : x > acc)
          acc = x;
      }
      if (t == CommType::kI64)
        static_cast<uint64_t*>(out)[i] = acc;
      else
        static_cast<uint8_t*>(out)[i] = static_cast<uint8_t>(acc);
      continue;
    }
    if (t == CommType::kF64) {
      double acc = static_cast<const double*>(rows[0])[i];
      for (size_t r = 1; r < rows.size(); ++r) {
        double x = static_cast<const double*>(rows[r])[i];
        if (op == ReduceOp::kSum)
          acc += x;
        else if (!std::isnan(acc) && (std::isnan(x) || x > acc))
          acc = x;
      }
      static_cast<double*>(out)[i] = acc;
      continue;
    }
    float acc = static_cast<float>(get(t, rows[0], i));
    for (size_t r = 1; r < rows.size(); ++r) {
      float x = static_cast<float>(get(t, rows[r], i));
      if (op == ReduceOp::kSum)
        acc += x;
      else if (!std::isnan(acc) && (std::isnan(x) || x > acc))
        acc = x;
    }
    if (t == CommType::kF32)
      static_cast<float*>(out)[i] = acc;
    else if (t == CommType::kBF16)
      static_cast<uint16_t*>(out)[i] = f32_to_bf16(acc);
    else
      static_cast<uint16_t*>(out)[i] = f32_to_f16(acc);
  }
}

TEST(CommType, SizesAndNames) {
  EXPECT_EQ(comm_type_size(CommType::kF32), 4u);
  EXPECT_EQ(comm_type_size(CommType::kBF16), 2u);
  EXPECT_EQ(comm_type_size(CommType::kF16), 2u);
  EXPECT_EQ(comm_type_size(CommType::kF64), 8u);
  EXPECT_EQ(comm_type_size(CommType::kU8), 1u);
  EXPECT_EQ(comm_type_size(CommType::kI64), 8u);
  EXPECT_STREQ(comm_type_name(CommType::kBF16), "bf16");
}

TEST(ReduceRows, MatchesScalarReferenceBitForBit) {
  for (CommType t : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (int nrows : {1, 2, 3, 5}) {
        const size_t n = 2500;  // crosses the 1024-element blocks
        std::vector<Buf> rows;
        std::vector<const void*> ptrs;
        for (int r = 0; r < nrows; ++r) {
          rows.emplace_back(t, n);
          fill_random(t, rows.back().data(), n, 100 * r + static_cast<int>(t));
        }
        if (t != CommType::kU8 && t != CommType::kI64) {  // specials: NaN, infinities, signed zeros
          put(t, rows[0].data(), 3, NAN);
          put(t, rows[nrows - 1].data(), 4, INFINITY);
          put(t, rows[0].data(), 5, -0.0);
          put(t, rows[nrows - 1].data(), 5, 0.0);
        }
        for (auto& b : rows) ptrs.push_back(b.data());
        Buf got(t, n), want(t, n);
        reduce_rows(ptrs.data(), nrows, n, got.data(), t, op);
        reference_reduce(ptrs, n, want.data(), t, op);
        size_t es = comm_type_size(t);
        size_t wrong = 0, first = n;
        for (size_t i = 0; i < n; ++i)
          if (std::memcmp(got.bytes.data() + i * es, want.bytes.data() + i * es, es) != 0 && wrong++ == 0)
            first = i;
        EXPECT_EQ(wrong, 0u) << comm_type_name(t) << (op == ReduceOp::kSum ? " sum" : " max") << " rows "
                             << nrows << ": first wrong element " << first;
        // Writing over a row gives the same bits (each element is read before it is written).
        reduce_rows(ptrs.data(), nrows, n, rows[0].data(), t, op);
        EXPECT_EQ(std::memcmp(rows[0].bytes.data(), want.bytes.data(), n * es), 0) << comm_type_name(t);
      }
    }
  }
}

TEST(ReduceRows, HalfSumsRoundOnce) {
  // 1 + 3 * 2^-8 in fp32 rounds once to 1 + 2^-6 in bf16 (1.5 ulp, tie to even); rounding after each
  // add would stay at 1 (each 1 + 2^-8 is a tie that goes back to the even 1.0).
  const uint16_t one = f32_to_bf16(1.0f), small = f32_to_bf16(0x1p-8f);
  const uint16_t r0[1] = {one}, r1[1] = {small};
  const void* rows[4] = {r0, r1, r1, r1};
  uint16_t out = 0;
  reduce_rows(rows, 4, 1, &out, CommType::kBF16, ReduceOp::kSum);
  EXPECT_EQ(bf16_to_f32(out), 1.0f + 0x1p-6f);
}

class LocalCommTest : public testing::Test {
 protected:
  std::unique_ptr<Communicator> comm_ = create_local_comm();
};

TEST_F(LocalCommTest, Identity) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
  EXPECT_EQ(comm_->local_rank(), 0);
  EXPECT_STREQ(comm_->backend(), "local");
}

TEST_F(LocalCommTest, EveryCollectiveEveryTypeCopies) {
  for (CommType t : kAllTypes) {
    for (size_t n : kSizes) {
      Buf send(t, n);
      fill_random(t, send.data(), n, n + 7);
      const size_t nb = n * comm_type_size(t);
      for (int which = 0; which < 3; ++which) {
        Buf recv(t, n);
        CommHandle h = which == 0   ? comm_->all_gather(send.data(), recv.data(), n, t)
                       : which == 1 ? comm_->reduce_scatter(send.data(), recv.data(), n, t, ReduceOp::kSum)
                                    : comm_->all_reduce(send.data(), recv.data(), n, t, ReduceOp::kMax);
        ASSERT_OK(h.wait());
        EXPECT_TRUE(h.ready());
        EXPECT_EQ(std::memcmp(send.bytes.data(), recv.bytes.data(), nb), 0)
            << comm_type_name(t) << " n " << n;
      }
      Buf copy = send;  // in place, and broadcast leaves the data alone
      ASSERT_OK(comm_->all_reduce(copy.data(), copy.data(), n, t, ReduceOp::kSum).wait());
      ASSERT_OK(comm_->broadcast(copy.data(), n, t, 0).wait());
      EXPECT_EQ(std::memcmp(send.bytes.data(), copy.bytes.data(), nb), 0);
    }
  }
}

TEST_F(LocalCommTest, InvalidArguments) {
  float x = 1;
  EXPECT_EQ(comm_->all_reduce(nullptr, &x, 1, CommType::kF32, ReduceOp::kSum).wait().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(comm_->all_gather(&x, nullptr, 1, CommType::kF32).wait().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comm_->reduce_scatter(nullptr, nullptr, 3, CommType::kF32, ReduceOp::kSum).wait().code(),
            StatusCode::kInvalidArgument);
  Status s = comm_->broadcast(&x, 1, CommType::kF32, 1).wait();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("root 1"), std::string::npos) << s.message();
  EXPECT_EQ(comm_->broadcast(&x, 1, CommType::kF32, -1).wait().code(), StatusCode::kInvalidArgument);
  EXPECT_OK(comm_->all_reduce(nullptr, nullptr, 0, CommType::kF32, ReduceOp::kSum).wait());  // count 0: fine
  EXPECT_TRUE(CommHandle().ready());
  EXPECT_OK(CommHandle().wait());
}

TEST_F(LocalCommTest, OrderedOnItsStreamAndDrainedByBarrier) {
  // A host task holds the stream; nothing queued after it may complete before it.
  std::atomic<bool> release{false};
  CommHandle gate = comm_->enqueue_host_task([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    return Status::ok();
  });
  std::vector<float> src(64, 3.0f);
  std::vector<std::vector<float>> dst(50, std::vector<float>(64, 0.0f));
  std::vector<CommHandle> handles;
  for (auto& d : dst)
    handles.push_back(comm_->all_reduce(src.data(), d.data(), 64, CommType::kF32, ReduceOp::kSum));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (auto& h : handles) EXPECT_FALSE(h.ready());
  release = true;
  ASSERT_OK(comm_->barrier());
  for (auto& h : handles) EXPECT_TRUE(h.ready());
  EXPECT_TRUE(gate.ready());
  for (auto& d : dst) EXPECT_EQ(d, src);
}

TEST_F(LocalCommTest, FailureCancelsWhatFollows) {
  CommHandle bad = comm_->enqueue_host_task([] { return internal_error("injected"); });
  float x = 1, y = 0;
  Status s = comm_->all_reduce(&x, &y, 1, CommType::kF32, ReduceOp::kSum).wait();
  EXPECT_EQ(bad.wait().code(), StatusCode::kInternal);
  EXPECT_EQ(s.code(), StatusCode::kCancelled);
  EXPECT_NE(s.message().find("injected"), std::string::npos) << s.message();
}

TEST(LocalComm, DestructorRunsWhatIsQueued) {
  std::vector<double> src(1000, 2.5), dst(1000, 0.0);
  {
    auto comm = create_local_comm();
    for (int i = 0; i < 20; ++i) (void)comm->all_gather(src.data(), dst.data(), 1000, CommType::kF64);
  }
  EXPECT_EQ(src, dst);
}

// Buckets against one collective per tensor: same bits.
void check_bucket(Communicator& comm, BucketOp op, CommType t, uint64_t seed) {
  const int size = comm.size(), rank = comm.rank();
  const std::vector<size_t> counts = {1, 7, 0, 300, 2, 1000, 33};
  const size_t in_mult = op == BucketOp::kReduceScatter ? size : 1;
  const size_t out_mult = op == BucketOp::kAllGather ? size : 1;
  std::vector<Buf> sends, got, want;
  for (size_t k = 0; k < counts.size(); ++k) {
    sends.emplace_back(t, counts[k] * in_mult);
    fill_random(t, sends.back().data(), counts[k] * in_mult, seed + 1000 * rank + k);
    got.emplace_back(t, counts[k] * out_mult);
    want.emplace_back(t, counts[k] * out_mult);
  }
  CommBucket bucket(comm, op, t, ReduceOp::kSum, 600 * out_mult * in_mult);
  std::vector<CommHandle> handles;
  for (size_t k = 0; k < counts.size(); ++k) {
    if (!bucket.add(sends[k].data(), got[k].data(), counts[k])) {
      handles.push_back(bucket.flush());
      EXPECT_TRUE(bucket.empty());
      ASSERT_TRUE(bucket.add(sends[k].data(), got[k].data(), counts[k]));  // 1000 > capacity: alone
    }
  }
  handles.push_back(bucket.flush());
  EXPECT_GE(handles.size(), 3u);
  for (size_t k = 0; k < counts.size(); ++k) {
    CommHandle h = op == BucketOp::kAllReduce
                       ? comm.all_reduce(sends[k].data(), want[k].data(), counts[k], t, ReduceOp::kSum)
                   : op == BucketOp::kReduceScatter
                       ? comm.reduce_scatter(sends[k].data(), want[k].data(), counts[k], t, ReduceOp::kSum)
                       : comm.all_gather(sends[k].data(), want[k].data(), counts[k], t);
    handles.push_back(h);
  }
  for (auto& h : handles) ASSERT_OK(h.wait());
  for (size_t k = 0; k < counts.size(); ++k)
    EXPECT_EQ(
        std::memcmp(got[k].bytes.data(), want[k].bytes.data(), counts[k] * out_mult * comm_type_size(t)), 0)
        << "tensor " << k << " op " << static_cast<int>(op) << " " << comm_type_name(t);
}

TEST(CommBucket, SameBitsAsOneCollectivePerTensorLocal) {
  auto comm = create_local_comm();
  for (BucketOp op : {BucketOp::kAllReduce, BucketOp::kReduceScatter, BucketOp::kAllGather})
    for (CommType t : {CommType::kF32, CommType::kBF16, CommType::kI64}) check_bucket(*comm, op, t, 11);
}

TEST(CommBucket, EmptyFlushAndCapacity) {
  auto comm = create_local_comm();
  float a[4] = {1, 2, 3, 4}, b[4] = {};
  CommBucket bucket(*comm, BucketOp::kAllReduce, CommType::kF32, ReduceOp::kSum, 4);
  EXPECT_TRUE(bucket.flush().ready());
  EXPECT_TRUE(bucket.add(a, b, 3));
  EXPECT_FALSE(bucket.add(a + 3, b + 3, 2));  // 5 > 4
  EXPECT_TRUE(bucket.add(a + 3, b + 3, 1));
  EXPECT_EQ(bucket.elements(), 4u);
  EXPECT_EQ(bucket.tensors(), 2u);
  ASSERT_OK(bucket.flush().wait());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a[i], b[i]);
}

TEST(MpiComm, OneRankWorldWithoutLauncher) {
  if (!ZOE_HAVE_MPI) {
    auto r = create_mpi_comm();
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
    GTEST_SKIP() << "built without MPI";
  }
  auto r = create_mpi_comm();
  ASSERT_OK(r);
  Communicator& comm = *r.value();
  if (comm.size() != 1) GTEST_SKIP() << "launched with " << comm.size() << " ranks";
  EXPECT_STREQ(comm.backend(), "mpi");
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.local_rank(), 0);
  for (CommType t : kAllTypes) {
    for (size_t n : kSizes) {
      Buf send(t, n), a(t, n), b(t, n), c(t, n);
      fill_random(t, send.data(), n, n);
      ASSERT_OK(comm.all_reduce(send.data(), a.data(), n, t, ReduceOp::kSum).wait());
      ASSERT_OK(comm.reduce_scatter(send.data(), b.data(), n, t, ReduceOp::kMax).wait());
      ASSERT_OK(comm.all_gather(send.data(), c.data(), n, t).wait());
      ASSERT_OK(comm.broadcast(send.data(), n, t, 0).wait());
      size_t nb = n * comm_type_size(t);
      EXPECT_EQ(std::memcmp(a.bytes.data(), send.bytes.data(), nb), 0);
      EXPECT_EQ(std::memcmp(b.bytes.data(), send.bytes.data(), nb), 0);
      EXPECT_EQ(std::memcmp(c.bytes.data(), send.bytes.data(), nb), 0);
    }
  }
  ASSERT_OK(comm.barrier());
  float x = 0;
  EXPECT_EQ(comm.broadcast(&x, 1, CommType::kF32, 1).wait().code(), StatusCode::kInvalidArgument);
  for (BucketOp op : {BucketOp::kAllReduce, BucketOp::kReduceScatter, BucketOp::kAllGather})
    check_bucket(comm, op, CommType::kBF16, 5);
}

TEST(NcclComm, RefusesWithoutGpuOrBuild) {
  auto boot = create_local_comm();
  auto r = create_nccl_comm(*boot, 0);
  if (r.is_ok()) GTEST_SKIP() << "a GPU is present: the NCCL suite runs in test_comm_mpi";
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported) << r.status().to_string();
}

}  // namespace
}  // namespace zoe::comm
