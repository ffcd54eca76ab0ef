// `zoe tune --calibrate` under a launch of several ranks: the collectives' rate at the sizes a
// step of the planned model moves (see tune_internal.h).
#include <algorithm>
#include <cmath>
#include <map>

#include "cli/tune_internal.h"
#include "comm/comm_bench.h"
#include "core/units.h"
#include "zero/engine_internal.h"

namespace zoe::cli::tune {

namespace cb = comm::bench;

NetworkRate measure_network(Runtime& rt, const plan::PlanInputs& pre, Progress* progress) {
  NetworkRate nr;
  comm::Communicator& comm = zero::runtime_comm(rt);
  if (comm.size() < 2) return nr;
  // Each module's gather and reduce-scatter move its parameters in the compute dtype; sizes
  // bucketed to powers of two within [4 KiB, 64 MiB], each counted once per module of that size.
  const double e = pre.base.bf16 || pre.base.fp16.enabled ? 2.0 : 4.0;
  std::map<uint64_t, int> modules_at;
  for (const auto& m : pre.model.modules) {
    double elems = 0;
    for (size_t x : m.param_numel) elems += static_cast<double>(x);
    const double bytes = std::clamp(elems * e, 4096.0, 64.0 * (1 << 20));
    ++modules_at[uint64_t{1} << static_cast<int>(std::lround(std::log2(bytes)))];
  }
  if (modules_at.empty()) modules_at[uint64_t{1} << 20] = 1;
  cb::Config c;
  c.ops = {cb::Op::kAllGather, cb::Op::kReduceScatter};
  // The smallest size first: its time is the latency every collective pays beside its bytes.
  constexpr uint64_t kLatencyBytes = 4096;
  c.sizes.push_back(kLatencyBytes);
  for (const auto& [bytes, n] : modules_at) {
    if (bytes != kLatencyBytes) c.sizes.push_back(bytes);
  }
  c.warmup = 2;
  c.iters = 5;
  c.on_point = [&](cb::Op op, uint64_t bytes, size_t i, size_t n) {
    progress->update(fmt("calibrate: %s of %s across %d ranks (%zu/%zu)", cb::op_name(op),
                         format_bytes(bytes).c_str(), comm.size(), i + 1, n));
  };
  const cb::Report r = value_or_fail(cb::run(comm, comm, cb::host_memory(), c));
  double latency_s = 0;
  for (size_t k = 0; k < r.rows.size(); ++k) {
    const cb::Row& row = r.rows[k];  // ops x sizes, in the order given
    if (row.wrong != 0)
      fail(internal_error("calibrate: %s of %s across the ranks gave %llu wrong element(s)",
                          cb::op_name(row.op), format_bytes(row.bytes).c_str(),
                          static_cast<unsigned long long>(row.wrong)));
    if (k % c.sizes.size() == 0) latency_s += row.time_us * 1e-6 / static_cast<double>(c.ops.size());
  }
  // The rate a step sees beyond the latency: its modules' bus bytes over their time less one
  // latency per collective, as the cost model adds them back (docs/cost-model.md).
  double bus_bytes = 0, seconds = 0, count = 0;
  for (size_t k = 0; k < r.rows.size(); ++k) {
    const cb::Row& row = r.rows[k];
    const auto it = modules_at.find(c.sizes[k % c.sizes.size()]);
    if (it == modules_at.end()) continue;
    bus_bytes += it->second * row.busbw_gbps * 1e9 * row.time_us * 1e-6;
    seconds += it->second * row.time_us * 1e-6;
    count += it->second;
  }
  // Modules as small as the latency probe, or times within its noise: the rate without it.
  const double beyond = seconds - count * latency_s;
  const bool split = beyond > 0.1 * seconds;
  nr.nodes = r.nodes;
  nr.ranks = r.ranks;
  nr.gbps = seconds > 0 ? bus_bytes / (split ? beyond : seconds) / 1e9 : 0;
  nr.latency_us = split ? latency_s * 1e6 : 0;
  return nr;
}

}  // namespace zoe::cli::tune
