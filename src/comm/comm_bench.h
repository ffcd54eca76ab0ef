// The collectives benchmark behind `zoe bench comm`: all-reduce, reduce-scatter, all-gather and
// broadcast swept over sizes on a Communicator, timed and checked the way nccl-tests does.
//
// Sizes are those of the whole buffer, as in nccl-tests: the all-reduce's and broadcast's buffer,
// the all-gather's output and the reduce-scatter's input (count elements in all; each rank's part
// is count / ranks). algbw = bytes / time; busbw = algbw x bus_factor(op, ranks): 2(n-1)/n for
// all-reduce, (n-1)/n for reduce-scatter and all-gather, 1 for broadcast. busbw is then the
// bytes a rank's link carries per second in a ring, comparable across ops and rank counts, and the
// rate the cost model's network term divides a rank's collective bytes by.
//
// Inputs are fp32 small integers fixed by (rank, element), so every sum is exact in any order and
// each output element has one right value; `wrong` counts the elements that differ from it after
// the timed iterations (every op is idempotent on its buffers, so they all end at that value).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "zoe/status.h"

namespace zoe::comm::bench {

enum class Op : uint8_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast };
inline constexpr Op kAllOps[] = {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather, Op::kBroadcast};
const char* op_name(Op op);  // "allreduce", "reducescatter", "allgather", "broadcast"
// "allreduce,allgather": the ops in the order given; an unknown name is an error naming it.
Result<std::vector<Op>> parse_ops(const std::string& text);
// busbw / algbw for `op` over `ranks` ranks (nccl-tests' factors, above).
double bus_factor(Op op, int ranks);

// "1KiB..64MiB": A, 2A, 4A, ... up to B; "1MiB": one size; "4KiB,1MiB,16MiB": those. Sizes are
// positive and at most max_bytes; errors name the text.
Result<std::vector<uint64_t>> parse_sizes(const std::string& text, uint64_t max_bytes);

// Elements of a collective of `bytes` bytes over `ranks` ranks: bytes / 4, rounded down to a
// multiple of ranks for reduce-scatter and all-gather (each rank's part is whole), at least one
// element per rank.
uint64_t element_count(Op op, uint64_t bytes, int ranks);

// Rank `rank`'s input element i (fp32 small integers: sums over up to 2^17 ranks are exact).
float input_value(int rank, uint64_t i);
// Wrong elements of rank `rank`'s output `out` of `op` over `count` elements in all (the elements
// this rank holds: count / ranks for reduce-scatter, count otherwise), broadcast from rank 0.
uint64_t count_wrong(Op op, int rank, int ranks, uint64_t count, const float* out);

// Where the collectives' buffers live: host memory (LocalComm, MpiComm) or a device's (NcclComm).
struct Memory {
  std::function<Result<void*>(size_t bytes)> allocate;
  std::function<void(void*)> release;
  std::function<Status(void* dst, const void* src_host, size_t bytes)> upload;
  std::function<Status(void* dst_host, const void* src, size_t bytes)> download;
};
Memory host_memory();

struct Config {
  std::vector<Op> ops{std::begin(kAllOps), std::end(kAllOps)};
  std::vector<uint64_t> sizes;
  int warmup = 5;  // untimed iterations per point
  int iters = 20;  // timed iterations per point, queued back to back; time is their mean
  // Called on rank 0 before each point: op, bytes, index and number of points.
  std::function<void(Op, uint64_t, size_t, size_t)> on_point;
};

struct Row {
  Op op = Op::kAllReduce;
  uint64_t bytes = 0;  // count x 4
  uint64_t count = 0;  // fp32 elements of the whole buffer
  double time_us = 0;  // per collective: the slowest rank's mean over the timed iterations
  double algbw_gbps = 0, busbw_gbps = 0;
  uint64_t wrong = 0;  // summed over the ranks
};

struct Report {
  int ranks = 1, nodes = 1;
  std::string backend;             // the communicator's: "local", "mpi", "nccl"
  std::vector<std::string> hosts;  // each rank's host name, by rank
  std::vector<Row> rows;           // ops in the order given, sizes ascending within each
};

// Each rank's host name (gethostname), gathered over `host` (a host-memory communicator) in rank
// order. The nodes of a launch are the distinct names.
Result<std::vector<std::string>> gather_host_names(Communicator& host);
int count_nodes(const std::vector<std::string>& hosts);

// Runs the sweep on `comm` (buffers in `mem`), every rank together. `host` is a host-memory
// communicator over the same ranks (may be `comm` itself when that one takes host memory): the
// host names, the slowest rank's time and the wrong counts travel over it. Every rank gets the
// same Report. An allocation that fails on any rank fails the run on every rank.
Result<Report> run(Communicator& comm, Communicator& host, const Memory& mem, const Config& config);

}  // namespace zoe::comm::bench
