// Multi-rank communicator tests, run under mpirun (nccl-tests style): deterministic inputs whose
// exact results are known, wrong elements counted, every collective x type x size; queued ops,
// barrier, determinism, equality with the one-process computation, buckets, chunked rounds, and
// NcclComm against MpiComm where GPUs are present.
// Every rank runs the same tests in the same order; checks never return early from a collective
// sequence, so a failure on one rank cannot leave the others waiting.
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/bucket.h"
#include "comm/comm_bench.h"
#include "comm/reduce.h"
#include "tests/comm/comm_test_util.h"
#include "zoe/features.h"

#if ZOE_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace zoe::comm {
namespace {

using namespace zoe::comm::test;  // NOLINT(google-build-using-namespace)

Communicator* g_comm = nullptr;

const char* op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

size_t count_wrong(CommType t, const void* buf, size_t n, const std::function<double(size_t)>& want,
                   size_t* first) {
  size_t wrong = 0;
  *first = n;
  for (size_t i = 0; i < n; ++i)
    if (get(t, buf, i) != want(i) && wrong++ == 0) *first = i;
  return wrong;
}

// Expected reduction of reduce_input over ranks at global element g.
double reduced_input(ReduceOp op, int size, size_t g) {
  double acc = reduce_input(0, g);
  for (int r = 1; r < size; ++r)
    acc = op == ReduceOp::kSum ? acc + reduce_input(r, g) : std::max(acc, reduce_input(r, g));
  return acc;
}

void run_all_gather(Communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  for (CommType t : kAllTypes) {
    for (size_t n : kSizes) {
      for (bool in_place : {false, true}) {
        Buf send(t, n), recv(t, n * size);
        void* src = in_place ? recv.bytes.data() + rank * n * comm_type_size(t) : send.data();
        for (size_t i = 0; i < n; ++i) put(t, src, i, gather_input(t, rank, i));
        EXPECT_OK(comm.all_gather(src, recv.data(), n, t).wait());
        size_t first;
        size_t wrong = count_wrong(
            t, recv.data(), n * size, [&](size_t g) { return gather_input(t, g / n, g % n); }, &first);
        EXPECT_EQ(wrong, 0u) << "all_gather " << comm_type_name(t) << " n " << n
                             << (in_place ? " in place" : "") << " first wrong " << first;
      }
    }
  }
}

void run_reduce_scatter(Communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  for (CommType t : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (size_t n : kSizes) {
        for (bool in_place : {false, true}) {
          Buf send(t, n * size), recv(t, n);
          for (size_t g = 0; g < n * size; ++g) put(t, send.data(), g, reduce_input(rank, g));
          void* dst = in_place ? send.bytes.data() + rank * n * comm_type_size(t) : recv.data();
          EXPECT_OK(comm.reduce_scatter(send.data(), dst, n, t, op).wait());
          size_t first;
          size_t wrong = count_wrong(
              t, dst, n, [&](size_t i) { return reduced_input(op, size, rank * n + i); }, &first);
          EXPECT_EQ(wrong, 0u) << "reduce_scatter " << comm_type_name(t) << " " << op_name(op) << " n " << n
                               << (in_place ? " in place" : "") << " first wrong " << first;
        }
      }
    }
  }
}

void run_all_reduce(Communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  for (CommType t : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (size_t n : kSizes) {
        for (bool in_place : {false, true}) {
          Buf send(t, n), recv(t, n);
          for (size_t i = 0; i < n; ++i) put(t, send.data(), i, reduce_input(rank, i));
          void* dst = in_place ? send.data() : recv.data();
          EXPECT_OK(comm.all_reduce(send.data(), dst, n, t, op).wait());
          size_t first;
          size_t wrong = count_wrong(
              t, dst, n, [&](size_t i) { return reduced_input(op, size, i); }, &first);
          EXPECT_EQ(wrong, 0u) << "all_reduce " << comm_type_name(t) << " " << op_name(op) << " n " << n
                               << (in_place ? " in place" : "") << " first wrong " << first;
        }
      }
    }
  }
}

TEST(MpiComm, Identity) {
  EXPECT_STREQ(g_comm->backend(), "mpi");
  EXPECT_GE(g_comm->size(), 1);
  EXPECT_EQ(g_comm->local_rank(), g_comm->rank());  // one node here
}

TEST(MpiComm, AllGather) { run_all_gather(*g_comm); }
TEST(MpiComm, ReduceScatter) { run_reduce_scatter(*g_comm); }
TEST(MpiComm, AllReduce) { run_all_reduce(*g_comm); }

TEST(MpiComm, BroadcastFromEveryRoot) {
  const int rank = g_comm->rank(), size = g_comm->size();
  for (CommType t : kAllTypes) {
    for (size_t n : kSizes) {
      for (int root = 0; root < size; ++root) {
        Buf buf(t, n);
        for (size_t i = 0; i < n; ++i) put(t, buf.data(), i, rank == root ? gather_input(t, root, i) : 0);
        EXPECT_OK(g_comm->broadcast(buf.data(), n, t, root).wait());
        size_t first;
        size_t wrong = count_wrong(
            t, buf.data(), n, [&](size_t i) { return gather_input(t, root, i); }, &first);
        EXPECT_EQ(wrong, 0u) << "broadcast " << comm_type_name(t) << " n " << n << " root " << root;
      }
    }
  }
}

TEST(MpiComm, InvalidArgumentsQueueNothing) {
  float x = 0;
  EXPECT_EQ(g_comm->broadcast(&x, 1, CommType::kF32, g_comm->size()).wait().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(g_comm->all_reduce(nullptr, &x, 5, CommType::kF32, ReduceOp::kSum).wait().code(),
            StatusCode::kInvalidArgument);
  EXPECT_OK(g_comm->barrier());  // still in step
}

TEST(MpiComm, ManyQueuedOpsThenWaitOnAll) {
  const int rank = g_comm->rank(), size = g_comm->size();
  const size_t n = 777;
  const int kOps = 60;
  std::vector<Buf> sends, recvs;
  std::vector<CommHandle> handles;
  for (int k = 0; k < kOps; ++k) {
    int kind = k % 3;
    sends.emplace_back(CommType::kF32, kind == 1 ? n * size : n);
    recvs.emplace_back(CommType::kF32, kind == 0 ? n * size : n);
  }
  for (int k = 0; k < kOps; ++k) {
    Buf& s = sends[k];
    for (size_t g = 0; g < s.count; ++g)
      put(CommType::kF32, s.data(), g,
          k % 3 == 0 ? gather_input(CommType::kF32, rank, g) : reduce_input(rank, g));
    int kind = k % 3;
    handles.push_back(
        kind == 0   ? g_comm->all_gather(s.data(), recvs[k].data(), n, CommType::kF32)
        : kind == 1 ? g_comm->reduce_scatter(s.data(), recvs[k].data(), n, CommType::kF32, ReduceOp::kSum)
                    : g_comm->all_reduce(s.data(), recvs[k].data(), n, CommType::kF32, ReduceOp::kSum));
  }
  for (int k = kOps - 1; k >= 0; --k) {
    EXPECT_OK(handles[k].wait());
    if (k == kOps - 1) {
      for (auto& h : handles) EXPECT_TRUE(h.ready()) << "the last handle was ready before an earlier one";
    }
  }
  size_t wrong = 0;
  for (int k = 0; k < kOps; ++k) {
    size_t first;
    int kind = k % 3;
    if (kind == 0)
      wrong += count_wrong(
          CommType::kF32, recvs[k].data(), n * size,
          [&](size_t g) { return gather_input(CommType::kF32, g / n, g % n); }, &first);
    if (kind == 1)
      wrong += count_wrong(
          CommType::kF32, recvs[k].data(), n,
          [&](size_t i) { return reduced_input(ReduceOp::kSum, size, rank * n + i); }, &first);
    if (kind == 2)
      wrong += count_wrong(
          CommType::kF32, recvs[k].data(), n,
          [&](size_t i) { return reduced_input(ReduceOp::kSum, size, i); }, &first);
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(MpiComm, BarrierWaitsForQueuedWork) {
  const size_t n = 100003;
  Buf send(CommType::kF64, n), recv(CommType::kF64, n);
  for (size_t i = 0; i < n; ++i) put(CommType::kF64, send.data(), i, reduce_input(g_comm->rank(), i));
  CommHandle h = g_comm->all_reduce(send.data(), recv.data(), n, CommType::kF64, ReduceOp::kSum);
  EXPECT_OK(g_comm->barrier());
  EXPECT_TRUE(h.ready());
  for (int i = 0; i < 5; ++i) EXPECT_OK(g_comm->barrier());
}

// Random (not exactly summable) inputs: the same reduction twice gives the same bits, and they equal
// reduce_rows over every rank's input computed in this one process.
void check_against_one_process(Communicator& comm, CommType t, ReduceOp op, size_t n, bool scatter) {
  const int rank = comm.rank(), size = comm.size();
  const size_t total = scatter ? n * size : n;
  std::vector<Buf> inputs;
  for (int r = 0; r < size; ++r) {
    inputs.emplace_back(t, total);
    fill_random(t, inputs.back().data(), total, 9000 + 31 * r + static_cast<int>(t));
  }
  Buf a(t, n), b(t, n), want(t, total);
  const void* mine = inputs[rank].data();
  auto issue = [&](Buf& out) {
    return scatter ? comm.reduce_scatter(mine, out.data(), n, t, op)
                   : comm.all_reduce(mine, out.data(), n, t, op);
  };
  CommHandle ha = issue(a), hb = issue(b);
  EXPECT_OK(ha.wait());
  EXPECT_OK(hb.wait());
  std::vector<const void*> rows;
  for (auto& in : inputs) rows.push_back(in.data());
  reduce_rows(rows.data(), size, total, want.data(), t, op);
  const size_t es = comm_type_size(t);
  const unsigned char* expect = want.bytes.data() + (scatter ? rank * n * es : 0);
  EXPECT_EQ(std::memcmp(a.bytes.data(), b.bytes.data(), n * es), 0)
      << "not deterministic: " << comm_type_name(t);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += std::memcmp(a.bytes.data() + i * es, expect + i * es, es) != 0;
  EXPECT_EQ(wrong, 0u) << (scatter ? "reduce_scatter " : "all_reduce ") << comm_type_name(t) << " "
                       << op_name(op) << " n " << n << " differs from the one-process reduction";
}

TEST(MpiComm, DeterministicAndEqualToOneProcessReduction) {
  for (CommType t : kAllTypes)
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax})
      for (size_t n : {size_t{1}, size_t{1000}, size_t{100003}})
        for (bool scatter : {false, true}) check_against_one_process(*g_comm, t, op, n, scatter);
}

TEST(MpiComm, Bf16SumRoundsOnce) {
  // Rank 0 gives 1, the others 2^-8: in fp32 the sum is 1 + (size-1) * 2^-8, rounded once to bf16.
  const int size = g_comm->size();
  uint16_t v = f32_to_bf16(g_comm->rank() == 0 ? 1.0f : 0x1p-8f);
  EXPECT_OK(g_comm->all_reduce(&v, &v, 1, CommType::kBF16, ReduceOp::kSum).wait());
  EXPECT_EQ(v, f32_to_bf16(1.0f + static_cast<float>(size - 1) * 0x1p-8f));
}

TEST(MpiComm, ChunkedRoundsGiveTheSameResults) {
  MpiCommOptions opt;
  opt.chunk_bytes = 96;  // a few elements per peer and round, and chunked all_gather
  auto r = create_mpi_comm(opt);
  ASSERT_OK(r);  // same answer on every rank (thread level)
  Communicator& small = *r.value();
  for (CommType t : {CommType::kF32, CommType::kBF16, CommType::kI64})
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}})
      for (bool scatter : {false, true}) check_against_one_process(small, t, ReduceOp::kSum, n, scatter);
  const int rank = small.rank(), size = small.size();
  for (size_t n : {size_t{7}, size_t{1000}}) {
    Buf send(CommType::kI64, n), recv(CommType::kI64, n * size);
    for (size_t i = 0; i < n; ++i) put(CommType::kI64, send.data(), i, gather_input(CommType::kI64, rank, i));
    EXPECT_OK(small.all_gather(send.data(), recv.data(), n, CommType::kI64).wait());
    size_t first;
    EXPECT_EQ(count_wrong(
                  CommType::kI64, recv.data(), n * size,
                  [&](size_t g) { return gather_input(CommType::kI64, g / n, g % n); }, &first),
              0u);
  }
  EXPECT_OK(small.barrier());
}

TEST(MpiComm, BucketsGiveTheSameBitsAsSingleCollectives) {
  const int rank = g_comm->rank(), size = g_comm->size();
  for (BucketOp op : {BucketOp::kAllReduce, BucketOp::kReduceScatter, BucketOp::kAllGather}) {
    for (CommType t : {CommType::kF32, CommType::kBF16, CommType::kF16}) {
      const std::vector<size_t> counts = {1, 7, 0, 300, 2, 1000, 33};
      const size_t in_mult = op == BucketOp::kReduceScatter ? size : 1;
      const size_t out_mult = op == BucketOp::kAllGather ? size : 1;
      std::vector<Buf> sends, got, want;
      for (size_t k = 0; k < counts.size(); ++k) {
        sends.emplace_back(t, counts[k] * in_mult);
        fill_random(t, sends.back().data(), counts[k] * in_mult, 77 + 1000 * rank + k);
        got.emplace_back(t, counts[k] * out_mult);
        want.emplace_back(t, counts[k] * out_mult);
      }
      CommBucket bucket(*g_comm, op, t, ReduceOp::kSum, 600 * size);
      std::vector<CommHandle> handles;
      for (size_t k = 0; k < counts.size(); ++k) {
        if (!bucket.add(sends[k].data(), got[k].data(), counts[k])) {
          handles.push_back(bucket.flush());
          EXPECT_TRUE(bucket.add(sends[k].data(), got[k].data(), counts[k]));
        }
      }
      handles.push_back(bucket.flush());
      for (size_t k = 0; k < counts.size(); ++k)
        handles.push_back(
            op == BucketOp::kAllReduce
                ? g_comm->all_reduce(sends[k].data(), want[k].data(), counts[k], t, ReduceOp::kSum)
            : op == BucketOp::kReduceScatter
                ? g_comm->reduce_scatter(sends[k].data(), want[k].data(), counts[k], t, ReduceOp::kSum)
                : g_comm->all_gather(sends[k].data(), want[k].data(), counts[k], t));
      for (auto& h : handles) EXPECT_OK(h.wait());
      for (size_t k = 0; k < counts.size(); ++k)
        EXPECT_EQ(
            std::memcmp(got[k].bytes.data(), want[k].bytes.data(), counts[k] * out_mult * comm_type_size(t)),
            0)
            << "bucket op " << static_cast<int>(op) << " " << comm_type_name(t) << " tensor " << k;
    }
  }
}

// `zoe bench comm`'s sweep over every rank: exact results, every rank the same report, busbw by
// nccl-tests' factors, and an all-reduce of the bench's inputs that count_wrong accepts.
TEST(MpiComm, BenchSweepIsExactOnEveryRank) {
  Communicator& comm = *g_comm;
  bench::Config c;
  c.sizes = {4, 1000, 1u << 16, 3u << 20};
  c.iters = 2;
  c.warmup = 1;
  auto r = bench::run(comm, comm, bench::host_memory(), c);
  ASSERT_OK(r);
  EXPECT_EQ(r->ranks, comm.size());
  EXPECT_EQ(r->nodes, 1);
  EXPECT_EQ(r->rows.size(), 16u);
  double t = 0;
  for (const bench::Row& row : r->rows) {
    EXPECT_EQ(row.wrong, 0u) << bench::op_name(row.op) << " " << row.bytes;
    const bool parts = row.op == bench::Op::kAllGather || row.op == bench::Op::kReduceScatter;
    EXPECT_EQ(row.count % (parts ? comm.size() : 1), 0u);
    EXPECT_DOUBLE_EQ(row.busbw_gbps, row.algbw_gbps * bench::bus_factor(row.op, comm.size()));
    t += row.time_us;
  }
  // The slowest rank's time: the same on every rank.
  double tmax = t, tneg = -t;
  EXPECT_OK(comm.all_reduce(&tmax, &tmax, 1, CommType::kF64, ReduceOp::kMax).wait());
  EXPECT_OK(comm.all_reduce(&tneg, &tneg, 1, CommType::kF64, ReduceOp::kMax).wait());
  EXPECT_EQ(tmax, -tneg);
  // The expected sums, against an all-reduce of the inputs through the communicator directly.
  const size_t n = 257;
  std::vector<float> in(n), out(n);
  for (size_t i = 0; i < n; ++i) in[i] = bench::input_value(comm.rank(), i);
  EXPECT_OK(comm.all_reduce(in.data(), out.data(), n, CommType::kF32, ReduceOp::kSum).wait());
  EXPECT_EQ(bench::count_wrong(bench::Op::kAllReduce, comm.rank(), comm.size(), n, out.data()), 0u);
}

#if ZOE_HAVE_NCCL
// NcclComm against MpiComm on the same inputs (skipped without one GPU per rank).
TEST(NcclComm, MatchesMpiComm) {
  int ngpu = 0;
  int64_t enough = cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu >= g_comm->size() ? 1 : 0;
  int64_t all_enough = enough;
  ASSERT_OK(g_comm->all_reduce(&enough, &all_enough, 1, CommType::kI64, ReduceOp::kSum).wait());
  if (all_enough != g_comm->size()) GTEST_SKIP() << "needs one GPU per rank (" << ngpu << " visible)";
  auto r = create_nccl_comm(*g_comm, -1);
  ASSERT_OK(r);
  Communicator& nccl = *r.value();
  EXPECT_STREQ(nccl.backend(), "nccl");
  const int rank = g_comm->rank(), size = g_comm->size();
  for (CommType t : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (size_t n : kSizes) {
        const size_t es = comm_type_size(t);
        Buf send(t, n * size), host(t, n * size), mpi(t, n * size);
        for (size_t g = 0; g < n * size; ++g) put(t, send.data(), g, reduce_input(rank, g));
        void *dsend = nullptr, *drecv = nullptr;
        ASSERT_EQ(cudaMalloc(&dsend, n * size * es + 1), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&drecv, n * size * es + 1), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(dsend, send.data(), n * size * es, cudaMemcpyHostToDevice), cudaSuccess);
        for (int which = 0; which < 3; ++which) {
          size_t out = which == 0 ? n : which == 1 ? n : n * size;
          CommHandle hn = which == 0   ? nccl.all_reduce(dsend, drecv, n, t, op)
                          : which == 1 ? nccl.reduce_scatter(dsend, drecv, n, t, op)
                                       : nccl.all_gather(dsend, drecv, n, t);
          CommHandle hm = which == 0   ? g_comm->all_reduce(send.data(), mpi.data(), n, t, op)
                          : which == 1 ? g_comm->reduce_scatter(send.data(), mpi.data(), n, t, op)
                                       : g_comm->all_gather(send.data(), mpi.data(), n, t);
          EXPECT_OK(hn.wait());
          EXPECT_OK(hm.wait());
          ASSERT_EQ(cudaMemcpy(host.data(), drecv, out * es, cudaMemcpyDeviceToHost), cudaSuccess);
          EXPECT_EQ(std::memcmp(host.bytes.data(), mpi.bytes.data(), out * es), 0)
              << "collective " << which << " " << comm_type_name(t) << " " << op_name(op) << " n " << n;
        }
        cudaFree(dsend);
        cudaFree(drecv);
      }
    }
  }
  EXPECT_OK(nccl.barrier());
}
#endif

}  // namespace
}  // namespace zoe::comm

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  auto r = zoe::comm::create_mpi_comm();
  if (!r.is_ok()) {
    std::fprintf(stderr, "test_comm_mpi: %s\n", r.status().to_string().c_str());
    return 1;
  }
  zoe::comm::g_comm = r.value().get();
  int rc = RUN_ALL_TESTS();
  r.value().reset();  // before MPI is finalised at exit
  return rc;
}
