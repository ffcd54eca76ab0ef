// The cost model, the micro-batches: each one's forward and backward on the critical path, with
// the partition loads, stage-3 gathers, activation traffic, gradient reductions, the NVMe running
// sums written behind the backward and the accumulation of every reduced gradient.
#include "plan/step_model.h"

#include <algorithm>

namespace zoe::plan::detail {

// `from_cache` of the bytes come from the host cache of NVMe partitions (no NVMe read).
void StepModel::add_loads(Path::Group* g, uint64_t bytes, uint64_t from_cache) {
  if (copies) {
    g->add(Resource::kPcie, static_cast<double>(bytes) / pcie);
  } else {
    path.serial(Resource::kPcie, 2.0 * static_cast<double>(bytes) / local);
  }
  if (part_home == offload::Tier::kNvme) {
    g->add(Resource::kNvme, static_cast<double>(bytes - from_cache) / nvme_r);
    g->add(Resource::kCompute, io_cpu(static_cast<double>(bytes - from_cache)));
  }
}

// Stage 3 on the CPU device: the gathers' local copies and zeroing, on the path.
void StepModel::add_gather_copies() {
  if (stage3 && !copies && gather_local > 0)
    path.serial(Resource::kPcie, static_cast<double>(gather_local) / local);
}

void StepModel::count_loads(uint64_t bytes, uint64_t from_cache) {
  B.host_to_device += bytes;
  if (part_home == offload::Tier::kNvme) B.nvme_read += bytes - from_cache;
}

// A pass's stage-3 all-gathers: queued under the compute (the gather window), else on demand.
void StepModel::add_gathers(Path::Group* g) {
  if (pl.world < 2 || gathers == 0) return;
  const uint64_t gb_bytes = static_cast<uint64_t>(ring * static_cast<double>(gather_elems * es));
  B.network += gb_bytes;
  B.collectives += gathers;
  const double s = coll_s(static_cast<double>(gb_bytes), gathers);
  if (queued)
    g->add(Resource::kNetwork, s);
  else
    path.serial(Resource::kNetwork, s);
}

// Forward: compute, with partition loads prefetched under it and the gathers queued under it
// (host-memory devices) or on demand (otherwise).
void StepModel::forward_time(int64_t j) {
  Path::Group g;
  g.add(Resource::kCompute, static_cast<double>(reps) * f_fwd / rates.flops);
  const uint64_t loads = any_off && stage3 ? sim.at(j)[0] : 0;
  const uint64_t hits = any_off && stage3 ? sim.cached_at(j)[0] : 0;
  if (loads) {
    const uint64_t first = std::min(loads, first_part);  // the first fetch of the pass waits
    const uint64_t first_hit = first_cached ? std::min(first, hits) : 0;
    add_loads(&g, loads - first, hits - first_hit);
    if (first_hit > 0 && copies)
      path.serial(Resource::kPcie, static_cast<double>(first) / pcie);
    else if (first_hit > 0)
      path.serial(Resource::kPcie, 2.0 * static_cast<double>(first) / local);
    else
      path.serial(load_res, load_s(first));
    count_loads(loads, hits);
  }
  add_gathers(&g);
  add_gather_copies();
  activation_traffic(&g, false);
  path.overlap(g);
}

// The activation store's traffic of one micro-batch (w.act): in the forward, the checkpoints
// leaving the device (device -> host, then host -> NVMe for the NVMe tier), written behind the
// compute; in the backward, read back in reverse order ahead of use (prefetch), under the
// backward's compute. On the CPU device the host <-> device moves are memcpy by the store's thread
// (local_copy_gbps, a read and a write) and the NVMe I/O takes CPU time from the compute.
void StepModel::activation_traffic(Path::Group* g, bool backward) {
  const ActivationTraffic& a = w.act;
  const uint64_t moved = (a.host_bytes + a.nvme_bytes) * static_cast<uint64_t>(reps);
  if (moved == 0) return;
  (backward ? B.act_host_to_device : B.act_device_to_host) += moved;
  (backward ? B.host_to_device : B.device_to_host) += moved;
  g->add(Resource::kPcie,
         copies ? static_cast<double>(moved) / pcie : 2.0 * static_cast<double>(moved) / local);
  if (a.nvme_bytes == 0) return;
  const uint64_t nvme = a.nvme_bytes * static_cast<uint64_t>(reps);
  (backward ? B.act_nvme_read : B.act_nvme_write) += nvme;
  (backward ? B.nvme_read : B.nvme_write) += nvme;
  const double rate = nvme_rate(!backward, a.tensor_bytes, 2);
  g->add(Resource::kNvme, static_cast<double>(nvme) / rate);
  g->add(Resource::kCompute, io_cpu(static_cast<double>(nvme)));
}

// Backward: compute with loads, reductions (the communicator's stream) under it; the
// accumulation of each reduced gradient runs on the caller's thread (accumulate_time()).
void StepModel::backward_time(int64_t j) {
  Path::Group g;
  // With checkpointing each block's forward runs again before its backward.
  g.add(Resource::kCompute, static_cast<double>(reps) * (w.act.recompute ? 3.0 : 2.0) * f_fwd / rates.flops);
  const int64_t js = single_pass ? 0 : j;  // layer-major: the loads of one pass
  const uint64_t loads = any_off && stage3 ? sim.at(js)[1] : 0;
  const uint64_t hits = any_off && stage3 ? sim.cached_at(js)[1] : 0;
  if (loads) {
    add_loads(&g, loads, hits);
    count_loads(loads, hits);
  }
  add_gathers(&g);
  add_gather_copies();
  // Each module's reduction runs under the backward of the modules before it; the last one
  // (the first module's) has nothing left to hide under.
  uint64_t red = 0;
  for (const auto& m : pl.modules) {
    const uint64_t n = reductions(m) * static_cast<uint64_t>(reps);
    if (n == 0) continue;
    const uint64_t r =
        static_cast<uint64_t>(reps) *
        static_cast<uint64_t>((pl.stage >= 2 ? 1.0 : 2.0) * ring * static_cast<double>(m.padded * es));
    red += r;
    B.collectives += n;
    const double s = coll_s(static_cast<double>(r), n, pl.stage >= 2 ? 1 : 2);
    if (&m == &pl.modules.front())
      path.serial(Resource::kNetwork, s);
    else
      g.add(Resource::kNetwork, s);
  }
  B.network += red;
  sums_write_behind(&g, j);
  activation_traffic(&g, true);
  path.overlap(g);
  accumulate_time(j);
}

// The running sums of NVMe-resident states are written behind the backward (the swapper's
// two write buffers in flight); their read-back (accumulate_time()) is synchronous.
// In the last micro-batch, the preloaded chunks' sums are not written, and their master and
// moments are read under this backward.
void StepModel::sums_write_behind(Path::Group* g, int64_t j) {
  const bool last = j == micro - 1;
  for (size_t i = 0; i < pl.modules.size(); ++i) {
    const auto& m = pl.modules[i];
    if (m.opt_home != offload::Tier::kNvme) continue;
    // A module's sums leave in a burst once its gradients are reduced: the chunks beyond the
    // swapper's write buffers wait for the first ones (the backward stalls), the rest are
    // written under the next module's backward.
    const uint64_t sums = (m.opt_n - (last ? pre[i] : 0)) * 4;
    const uint64_t chunks = (sums + chunk_bytes - 1) / chunk_bytes;
    const uint64_t stalled =
        std::min(sums, chunks > pl.swap_async_buffers ? (chunks - pl.swap_async_buffers) * chunk_bytes : 0);
    path.serial(Resource::kNvme, static_cast<double>(stalled) / acc_w);
    g->add(Resource::kNvme, static_cast<double>(sums - stalled) / acc_w);
    g->add(Resource::kCompute, io_cpu(static_cast<double>(sums)));
    if (last && pre[i] > 0) {
      const uint64_t states = pl.opt_nvme_bytes(pre[i], pl.swap_chunk_elems);
      B.nvme_read += states;
      g->add(Resource::kNvme, static_cast<double>(states) / swap_r);
      g->add(Resource::kCompute, io_cpu(static_cast<double>(states)));
    }
  }
}

// The accumulation of every reduced gradient, serial on the caller's thread: device memory, a
// device->host copy and a CPU pass, or a CPU pass with the NVMe running sum read back.
void StepModel::accumulate_time(int64_t j) {
  for (size_t i = 0; i < pl.modules.size(); ++i) {
    const auto& m = pl.modules[i];
    const uint64_t n = m.opt_n;
    // Read the gradient, read/write the fp32 sum: each micro-batch's.
    const uint64_t touched = n * (es + 8) * static_cast<uint64_t>(reps);
    if (m.opt_home == offload::Tier::kDevice) {
      B.device_optimizer += touched;
      path.serial(Resource::kDeviceMem, static_cast<double>(touched) / hbm);
      continue;
    }
    if (copies) {
      B.device_to_host += n * es * static_cast<uint64_t>(reps);
      path.serial(Resource::kPcie, static_cast<double>(n * es * static_cast<uint64_t>(reps)) / pcie);
    }
    B.cpu_optimizer += touched;
    path.serial(Resource::kCpu, static_cast<double>(touched) / cpu);
    if (m.opt_home ==
        offload::Tier::kNvme) {  // the running sum on NVMe: read it back (not the first), write it
      // Layer-major (single_pass): held in host memory over the micro-batches, written once.
      const uint64_t rd = j > 0 && !single_pass ? n * 4 : 0, wr = (n - (j == micro - 1 ? pre[i] : 0)) * 4;
      B.nvme_read += rd;
      B.nvme_write += wr;
      path.serial(Resource::kNvme, static_cast<double>(rd) / acc_r);
    }
  }
}

// Micro-batches 2 .. micro-2 are alike (the cache's steady state, a sum to read back): one is
// run and its share repeated, so a long accumulation costs O(1), not O(micro).
void StepModel::micro_batches() {
  if (w.layer_major && micro > 1) return layer_major_pass();
  auto micro_batch = [&](int64_t j) {
    forward_time(j);
    backward_time(j);
  };
  if (micro <= 5) {
    for (int64_t j = 0; j < micro; ++j) micro_batch(j);
  } else {
    micro_batch(0);
    micro_batch(1);
    const Path p0 = path;
    const LinkBytes b0 = B;
    micro_batch(2);
    const uint64_t k = static_cast<uint64_t>(micro - 4);
    for (int r = 0; r < kResources; ++r) {
      path.crit[r] += (path.crit[r] - p0.crit[r]) * static_cast<double>(k);
      path.busy[r] += (path.busy[r] - p0.busy[r]) * static_cast<double>(k);
    }
    for (auto [now, was] : {std::pair{&B.nvme_read, b0.nvme_read},
                            {&B.nvme_write, b0.nvme_write},
                            {&B.host_to_device, b0.host_to_device},
                            {&B.device_to_host, b0.device_to_host},
                            {&B.network, b0.network},
                            {&B.collectives, b0.collectives},
                            {&B.cpu_optimizer, b0.cpu_optimizer},
                            {&B.device_optimizer, b0.device_optimizer},
                            {&B.act_nvme_read, b0.act_nvme_read},
                            {&B.act_nvme_write, b0.act_nvme_write},
                            {&B.act_host_to_device, b0.act_host_to_device},
                            {&B.act_device_to_host, b0.act_device_to_host}}) {
      *now += (*now - was) * k;
    }
    micro_batch(micro - 1);
  }
  B.flops = (w.act.recompute ? 4.0 : 3.0) * f_fwd * static_cast<double>(micro);
}

// Layer-major: one forward and one backward pass carrying every micro-batch: the loads of the
// first micro-batch (the cache's state at a step's start), the last micro-batch's sums handling.
void StepModel::layer_major_pass() {
  reps = micro;
  single_pass = true;
  forward_time(0);
  backward_time(micro - 1);
  reps = 1;
  single_pass = false;
  B.flops = (w.act.recompute ? 4.0 : 3.0) * f_fwd * static_cast<double>(micro);
}

// A module's gradient reductions per micro-batch: stage 2/3, reduce-scatters of at most
// reduce_bucket / w elements per rank (one when its partition fits); stage 0/1, all-reduces of
// at most reduce_bucket elements. None for a frozen module or a world of one.
uint64_t StepModel::reductions(const zero::ModulePlacement& m) const {
  if (m.frozen || pl.world < 2) return 0;
  const uint64_t bucket = std::max<uint64_t>(1, pl.reduce_bucket);
  if (pl.stage >= 2) {
    const uint64_t per_rank = std::max<uint64_t>(1, bucket / static_cast<uint64_t>(pl.world));
    return per_rank < m.part ? (m.part + per_rank - 1) / per_rank : 1;
  }
  return std::max<uint64_t>(1, (m.padded + bucket - 1) / bucket);
}

}  // namespace zoe::plan::detail
