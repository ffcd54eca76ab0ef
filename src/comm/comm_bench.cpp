// The collectives benchmark (see comm_bench.h).
#include "comm/comm_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <set>

#include "core/clock.h"
#include "core/units.h"

namespace zoe::comm::bench {

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "allreduce";
    case Op::kReduceScatter:
      return "reducescatter";
    case Op::kAllGather:
      return "allgather";
    case Op::kBroadcast:
      return "broadcast";
  }
  return "?";
}

Result<std::vector<Op>> parse_ops(const std::string& text) {
  std::vector<Op> ops;
  ZOE_ASSIGN_OR_RETURN(const std::vector<std::string> names, split_list(text, "--ops"));
  for (const std::string& name : names) {
    auto it =
        std::find_if(std::begin(kAllOps), std::end(kAllOps), [&](Op op) { return name == op_name(op); });
    if (it == std::end(kAllOps))
      return invalid_argument(
          "--ops %s: unknown collective \"%s\" (expected allreduce, reducescatter, "
          "allgather or broadcast, comma-separated)",
          text.c_str(), name.c_str());
    if (std::find(ops.begin(), ops.end(), *it) == ops.end()) ops.push_back(*it);
  }
  if (ops.empty()) return invalid_argument("--ops \"%s\": no collective named", text.c_str());
  return ops;
}

double bus_factor(Op op, int ranks) {
  const double n = ranks;
  switch (op) {
    case Op::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Op::kReduceScatter:
    case Op::kAllGather:
      return (n - 1) / n;
    case Op::kBroadcast:
      return 1.0;
  }
  return 1.0;
}

Result<std::vector<uint64_t>> parse_sizes(const std::string& text, uint64_t max_bytes) {
  std::vector<uint64_t> sizes;
  const size_t dots = text.find("..");
  if (dots != std::string::npos) {
    auto lo = parse_bytes(text.substr(0, dots));
    auto hi = parse_bytes(text.substr(dots + 2));
    if (!lo.is_ok() || !hi.is_ok() || *lo == 0 || *hi < *lo)
      return invalid_argument("--sizes %s: expected A..B with sizes 0 < A <= B, e.g. 1KiB..64MiB",
                              text.c_str());
    for (uint64_t s = *lo; s <= *hi; s *= 2) {
      sizes.push_back(s);
      if (s > *hi / 2) break;
    }
  } else {
    auto list = parse_bytes_list(text, "--sizes");
    if (!list.is_ok()) {
      return invalid_argument("%s; expected a size (1MiB), a list (4KiB,1MiB) or a range (1KiB..64MiB)",
                              list.status().message().c_str());
    }
    sizes = std::move(list).value();
  }
  for (uint64_t s : sizes) {
    if (s == 0 || s > max_bytes)
      return invalid_argument("--sizes %s: %s is out of range (expected 1 B to %s)", text.c_str(),
                              format_bytes(s).c_str(), format_bytes(max_bytes).c_str());
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

uint64_t element_count(Op op, uint64_t bytes, int ranks) {
  const uint64_t n = static_cast<uint64_t>(ranks);
  const uint64_t elems = bytes / sizeof(float);
  if (op == Op::kReduceScatter || op == Op::kAllGather) return std::max(elems / n, uint64_t{1}) * n;
  return std::max<uint64_t>(elems, 1);
}

float input_value(int rank, uint64_t i) {
  return static_cast<float>((static_cast<uint64_t>(rank) * 131 + i * 7) % 61 + 1);
}

namespace {

float sum_over_ranks(int ranks, uint64_t i) {
  float s = 0;
  for (int q = 0; q < ranks; ++q) s += input_value(q, i);
  return s;
}

// This rank's input of `op` (count elements in all; a part of count / ranks for all-gather).
std::vector<float> make_input(Op op, int rank, int ranks, uint64_t count) {
  const uint64_t n = op == Op::kAllGather ? count / static_cast<uint64_t>(ranks) : count;
  std::vector<float> in(n);
  for (uint64_t i = 0; i < n; ++i) in[i] = input_value(rank, i);
  return in;
}

uint64_t out_elements(Op op, int ranks, uint64_t count) {
  return op == Op::kReduceScatter ? count / static_cast<uint64_t>(ranks) : count;
}

}  // namespace

uint64_t count_wrong(Op op, int rank, int ranks, uint64_t count, const float* out) {
  const uint64_t part = count / static_cast<uint64_t>(ranks);
  uint64_t wrong = 0;
  switch (op) {
    case Op::kAllReduce:
      for (uint64_t i = 0; i < count; ++i) wrong += out[i] != sum_over_ranks(ranks, i);
      break;
    case Op::kReduceScatter:
      for (uint64_t i = 0; i < part; ++i)
        wrong += out[i] != sum_over_ranks(ranks, static_cast<uint64_t>(rank) * part + i);
      break;
    case Op::kAllGather:
      for (uint64_t i = 0; i < count; ++i)
        wrong += out[i] != input_value(static_cast<int>(i / part), i % part);
      break;
    case Op::kBroadcast:
      for (uint64_t i = 0; i < count; ++i) wrong += out[i] != input_value(0, i);
      break;
  }
  return wrong;
}

Memory host_memory() {
  Memory m;
  m.allocate = [](size_t bytes) -> Result<void*> {
    void* p = ::operator new(bytes, std::nothrow);
    if (p == nullptr)
      return make_status(StatusCode::kOutOfBudget, "bench comm: cannot allocate %zu bytes", bytes);
    return p;
  };
  m.release = [](void* p) { ::operator delete(p); };
  m.upload = [](void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  };
  m.download = m.upload;
  return m;
}

Result<std::vector<std::string>> gather_host_names(Communicator& host) {
  constexpr size_t kLen = 256;
  char mine[kLen] = {};
  if (gethostname(mine, kLen - 1) != 0) std::snprintf(mine, kLen, "rank-%d", host.rank());
  std::vector<char> all(kLen * static_cast<size_t>(host.size()));
  ZOE_RETURN_IF_ERROR_CTX(host.all_gather(mine, all.data(), kLen, CommType::kU8).wait(),
                          "gathering the ranks' host names");
  std::vector<std::string> names;
  for (int r = 0; r < host.size(); ++r) names.emplace_back(all.data() + static_cast<size_t>(r) * kLen);
  return names;
}

int count_nodes(const std::vector<std::string>& hosts) {
  return static_cast<int>(std::set<std::string>(hosts.begin(), hosts.end()).size());
}

namespace {

// Device (or host) buffers of the sweep, freed at scope exit.
class Buffers {
 public:
  explicit Buffers(const Memory& mem) : mem_(mem) {}
  ~Buffers() {
    if (send_ != nullptr) mem_.release(send_);
    if (recv_ != nullptr) mem_.release(recv_);
  }
  Status allocate(size_t bytes) {
    ZOE_ASSIGN_OR_RETURN(send_, mem_.allocate(bytes));
    ZOE_ASSIGN_OR_RETURN(recv_, mem_.allocate(bytes));
    return Status::ok();
  }
  void* send() const { return send_; }
  void* recv() const { return recv_; }

 private:
  const Memory& mem_;
  void* send_ = nullptr;
  void* recv_ = nullptr;
};

CommHandle launch(Communicator& comm, Op op, const Buffers& b, uint64_t count) {
  const size_t part = count / static_cast<uint64_t>(comm.size());
  switch (op) {
    case Op::kAllReduce:
      return comm.all_reduce(b.send(), b.recv(), count, CommType::kF32, ReduceOp::kSum);
    case Op::kReduceScatter:
      return comm.reduce_scatter(b.send(), b.recv(), part, CommType::kF32, ReduceOp::kSum);
    case Op::kAllGather:
      return comm.all_gather(b.send(), b.recv(), part, CommType::kF32);
    case Op::kBroadcast:
      return comm.broadcast(b.recv(), count, CommType::kF32, 0);
  }
  return CommHandle();
}

// One point: fill, warm up, time `iters` back to back, check. Returns this rank's mean seconds
// and its wrong elements.
Status run_point(Communicator& comm, const Memory& mem, const Buffers& b, const Config& c, Op op,
                 uint64_t count, double* seconds, uint64_t* wrong) {
  const int rank = comm.rank(), ranks = comm.size();
  std::vector<float> in = make_input(op, rank, ranks, count);
  // Broadcast works in place on recv; the others read send.
  ZOE_RETURN_IF_ERROR(
      mem.upload(op == Op::kBroadcast ? b.recv() : b.send(), in.data(), in.size() * sizeof(float)));
  for (int k = 0; k < c.warmup; ++k) ZOE_RETURN_IF_ERROR(launch(comm, op, b, count).wait());
  ZOE_RETURN_IF_ERROR(comm.barrier());
  const uint64_t t0 = now_ns();
  CommHandle last;
  for (int k = 0; k < c.iters; ++k) last = launch(comm, op, b, count);
  ZOE_RETURN_IF_ERROR(last.wait());
  *seconds = static_cast<double>(now_ns() - t0) * 1e-9 / c.iters;
  std::vector<float> out(out_elements(op, ranks, count));
  ZOE_RETURN_IF_ERROR(mem.download(out.data(), b.recv(), out.size() * sizeof(float)));
  *wrong = count_wrong(op, rank, ranks, count, out.data());
  return Status::ok();
}

}  // namespace

Result<Report> run(Communicator& comm, Communicator& host, const Memory& mem, const Config& c) {
  if (c.sizes.empty() || c.ops.empty() || c.iters < 1 || c.warmup < 0)
    return invalid_argument("bench comm: no sizes, no ops, or iters < 1");
  Report rep;
  rep.ranks = comm.size();
  rep.backend = comm.backend();
  ZOE_ASSIGN_OR_RETURN(rep.hosts, gather_host_names(host));
  rep.nodes = count_nodes(rep.hosts);
  uint64_t largest = 0;
  for (Op op : c.ops) {
    for (uint64_t s : c.sizes) largest = std::max(largest, element_count(op, s, rep.ranks) * sizeof(float));
  }
  // Every rank learns whether any rank failed to allocate, so that none waits in a collective.
  Buffers b(mem);
  Status alloc = b.allocate(largest);
  int64_t failed = alloc.is_ok() ? 0 : 1;
  ZOE_RETURN_IF_ERROR(host.all_reduce(&failed, &failed, 1, CommType::kI64, ReduceOp::kMax).wait());
  if (!alloc.is_ok()) return alloc.with_context("allocating two buffers of " + format_bytes(largest));
  if (failed != 0)
    return make_status(StatusCode::kOutOfBudget,
                       "bench comm: another rank could not allocate two buffers of %s",
                       format_bytes(largest).c_str());
  const size_t points = c.ops.size() * c.sizes.size();
  size_t point = 0;
  for (Op op : c.ops) {
    for (uint64_t s : c.sizes) {
      if (c.on_point && comm.rank() == 0) c.on_point(op, s, point, points);
      ++point;
      Row row;
      row.op = op;
      row.count = element_count(op, s, rep.ranks);
      row.bytes = row.count * sizeof(float);
      double secs = 0;
      uint64_t wrong = 0;
      ZOE_RETURN_IF_ERROR_CTX(run_point(comm, mem, b, c, op, row.count, &secs, &wrong),
                              std::string("bench comm: ") + op_name(op) + " of " + format_bytes(row.bytes));
      double slowest = secs;
      int64_t wrong_all = static_cast<int64_t>(wrong);
      ZOE_RETURN_IF_ERROR(host.all_reduce(&slowest, &slowest, 1, CommType::kF64, ReduceOp::kMax).wait());
      ZOE_RETURN_IF_ERROR(host.all_reduce(&wrong_all, &wrong_all, 1, CommType::kI64, ReduceOp::kSum).wait());
      row.time_us = slowest * 1e6;
      row.algbw_gbps = static_cast<double>(row.bytes) / slowest / 1e9;
      row.busbw_gbps = row.algbw_gbps * bus_factor(op, rep.ranks);
      row.wrong = static_cast<uint64_t>(wrong_all);
      rep.rows.push_back(row);
    }
  }
  return rep;
}

}  // namespace zoe::comm::bench
