// The cost model's arithmetic (docs/cost-model.md is its specification): the resources, the
// step model's inputs and per-rank rates, its result, and estimate_step, which runs its phases
// (src/plan/step_model.h names the files that hold them).
#include "plan/cost_model.h"

#include <algorithm>

#include "config/value_used.h"
#include "plan/step_model.h"

namespace zoe::plan {

const char* resource_name(Resource r) {
  switch (r) {
    case Resource::kCompute:
      return "compute";
    case Resource::kNvme:
      return "nvme";
    case Resource::kPcie:
      return "pcie";
    case Resource::kNetwork:
      return "network";
    case Resource::kCpu:
      return "cpu_adam";
    case Resource::kDeviceMem:
      return "device_mem";
  }
  return "?";
}

namespace detail {

StepModel::StepModel(const config::Config& cfg_, const zero::Placement& pl_, const Workload& w_,
                     const Topology& topo, const LinkRates& rates_, const DeviceKind& dev_)
    : cfg(cfg_), pl(pl_), w(w_), rates(rates_), dev(dev_) {
  const int world = pl.world;
  const double gb = kGb;
  per_node = std::max(1, topo.gpus_per_node);
  // Per-rank rates, bytes/s: drives and CPU cores are shared by the ranks of a node.
  aio_block = config::aio_block_size_used(cfg.aio.block_size);
  aio_depth = std::max<int64_t>(1, cfg.aio.queue_depth);
  nvme_r = nvme_rate(false, pl.tm_staging_bytes, pl.tm_staging_count);
  part_sync_r = nvme_rate(false, pl.tm_staging_bytes, 1);
  part_sync_w = nvme_rate(true, pl.tm_staging_bytes, 1);
  chunk_bytes = static_cast<uint64_t>(std::max<size_t>(pl.swap_chunk_elems, 1)) * 4;
  slots =
      std::max<uint64_t>(pl.swap_buffer_count / pl.swap_states(), static_cast<uint64_t>(zero::kMinSwapSlots));
  swap_r = nvme_rate(false, chunk_bytes, (slots - 2) * pl.swap_states());
  swap_w = nvme_rate(true, chunk_bytes, 3);
  preloaded_chunks();
  acc_r = nvme_rate(false, chunk_bytes, 1), acc_w = nvme_rate(true, chunk_bytes, 2);
  pcie = rates.h2d_gbps * gb, cpu = rates.cpu_adam_gbps * gb / per_node;
  net = (topo.nodes > 1 ? rates.net_gbps : rates.intra_gbps) * gb;
  lat = topo.nodes > 1 ? rates.net_latency_us * 1e-6 : 0.0;
  hbm = rates.device_mem_gbps * gb;
  es = pl.compute_bytes;
  micro = std::max<int64_t>(1, w.grad_accum);
  tokens = static_cast<double>(w.micro_batch) * static_cast<double>(w.seq);
  ring = world > 1 ? static_cast<double>(world - 1) / world : 0.0;  // ring: bytes sent / size
  stage3 = pl.stage == 3;
  copies = !dev.host_addressable;  // device memory is not host memory: staging copies
  // zoe's CPU device: the CPU time NVMe traffic takes from the cores beside it (the compute in a
  // forward or backward, the update in the step). Where the cores wait for the I/O (a serial
  // read), it hides under the wait and is not counted.
  nvme_cpu = dev.host_addressable ? rates.nvme_cpu_gbps * gb : 0.0;
  queued = pl.gather_window > 0;
  stage3_partitions();
  // A partition moving to the device: NVMe -> staging -> device (both links busy, pipelined in
  // staging pieces), or host -> device. On the CPU device (host_addressable) "host -> device" is a
  // memcpy by the same cores the compute runs on, so it does not hide under the compute: it is on
  // the path, at local_copy_gbps (which counts a copy's read and write).
  local = rates.local_copy_gbps * gb;
  // Stage 3 on the CPU device, per pass: each gather allocates and zeroes the gathered module and
  // the send buffer, copies the partition into the send buffer and the gathered module out of the
  // collective (one rank: a local copy). memcpy and memset by the compute's cores: on the path.
  // Bytes moved per pass: the zeroing writes (padded + part), the copies read and write (2 part +
  // 2 padded).
  for (size_t i = 0; i < pl.modules.size(); ++i) {
    const auto& m = pl.modules[i];
    if (m.partitioned_params)
      gather_local += fetches(i) * 3 * (static_cast<uint64_t>(m.padded) + m.part) * es;
  }
  f_fwd = 2.0 * static_cast<double>(w.params) * tokens;
  // The step touches the master and the optimizer's states (r/w: AdamW's m and v, Lion's m or
  // Adagrad's sum), the gradient (r), the compute copy (w).
  adam_elem = 2 * pl.opt_bytes_per_elem() + 4 + (es == 2 ? 2 : 0);  // master and states read and written
}

// NVMe bytes/s of one stream of `request`-byte transfers, `in_flight` of them at once: the I/O
// engine splits each into aio.block_size chunks and keeps at most aio.queue_depth in flight.
double StepModel::nvme_rate(bool write, uint64_t request, uint64_t in_flight) const {
  const double gb = kGb;
  const int64_t req = static_cast<int64_t>(std::max<uint64_t>(request, 4096));
  const int64_t pieces = (req + aio_block - 1) / aio_block;
  const int64_t depth =
      std::min<int64_t>(aio_depth, static_cast<int64_t>(std::max<uint64_t>(1, in_flight)) * pieces);
  return rates.nvme_at(write, std::min(req, aio_block), depth) * gb / per_node;
}

// The swapper reads the next update's first chunks (up to all its slots but one, in step
// order) during the last micro-batch's backward, and those chunks' gradients go straight into
// its slots: per module, the elements of its preloaded chunks.
void StepModel::preloaded_chunks() {
  pre.assign(pl.modules.size(), 0);
  // Muon's update rewrites the gradient sums first: nothing is read ahead (Updater::muon_prepass).
  uint64_t left = pl.swapper && pl.optimizer != optim::OptimizerKind::kMuon ? slots - 1 : 0;
  const uint64_t chunk = std::max<size_t>(pl.swap_chunk_elems, 1);
  for (size_t i = 0; i < pl.modules.size() && left > 0; ++i) {
    if (pl.modules[i].opt_home != offload::Tier::kNvme) continue;
    for (uint64_t b = 0; b < pl.modules[i].opt_n && left > 0; b += chunk, --left)
      pre[i] += std::min<uint64_t>(chunk, pl.modules[i].opt_n - b);
  }
}

// Stage-3 partitions: what is gathered, which are cached on the host, which loads the cache
// simulation gives, where they come from, and the first fetch of a pass (which waits).
void StepModel::stage3_partitions() {
  for (size_t i = 0; i < pl.modules.size(); ++i) {
    if (!pl.modules[i].partitioned_params) continue;
    gather_elems += fetches(i) * pl.modules[i].padded;
    gathers += static_cast<uint64_t>(fetches(i));
  }
  for (const auto& m : pl.modules) any_off |= m.partitioned_params && m.param_home != offload::Tier::kDevice;
  cached = host_cached(pl);
  // Layer-major: one pass per step crosses the cache (its loads are the first pass's).
  if (stage3 && any_off) sim = simulate_cache(pl, w.layer_major ? 1 : micro, cached);
  for (const auto& m : pl.modules) {
    if (m.partitioned_params) part_home = m.param_home;
  }
  load_res = part_home == offload::Tier::kNvme ? Resource::kNvme : Resource::kPcie;
  for (size_t i = 0; i < pl.modules.size(); ++i) {
    if (pl.modules[i].partitioned_params) {
      first_part = static_cast<uint64_t>(pl.modules[i].part) * es;
      first_cached = cached[i];
      break;
    }
  }
}

// The step's time per resource, its sum, and the bottleneck: the resource with the most seconds
// on the critical path.
StepCost StepModel::result() const {
  StepCost c;
  c.bytes = B;
  for (int r = 0; r < kResources; ++r) {
    c.busy_s[r] = path.busy[r];
    c.critical_s[r] = path.crit[r];
    c.step_s += path.crit[r];
    if (path.crit[r] > path.crit[idx(c.bottleneck)]) c.bottleneck = static_cast<Resource>(r);
  }
  c.bottleneck_share = c.step_s > 0 ? c.critical_s[idx(c.bottleneck)] / c.step_s : 0;
  return c;
}

}  // namespace detail

StepCost estimate_step(const config::Config& cfg, const zero::Placement& pl, const Workload& w,
                       const Topology& topo, const LinkRates& rates, const DeviceKind& dev) {
  detail::StepModel s(cfg, pl, w, topo, rates, dev);
  s.micro_batches();
  s.muon_prepass_time();
  s.nvme_states_time();
  s.host_device_states_time();
  s.allgather_time();
  s.step_collectives_time();
  return s.result();
}

}  // namespace zoe::plan
