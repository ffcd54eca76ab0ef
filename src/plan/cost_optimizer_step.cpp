// The cost model, the optimizer step: the NVMe-resident states through the swapper's pipeline (and
// zoe.overlap_step's flow shop behind the next forward), the states in host RAM or on the device,
// the new compute parameters written out, and the step's all-gathers and small all-reduces.
#include "plan/step_model.h"

#include <algorithm>

namespace zoe::plan::detail {

// Where the new compute parameters of module m go, and what that moves. out on the device and
// the kernel elsewhere: a host-to-device copy (and the reverse).
void StepModel::write_out(const zero::ModulePlacement& m, Path::Group* g) {
  const uint64_t bytes = static_cast<uint64_t>(m.opt_n) * es;
  const bool out_dev = !m.partitioned_params || m.param_home == offload::Tier::kDevice;
  const bool kernel_dev = m.opt_home == offload::Tier::kDevice;
  if (copies && out_dev != kernel_dev) {
    (out_dev ? B.host_to_device : B.device_to_host) += bytes;
    path.serial(Resource::kPcie, static_cast<double>(bytes) / pcie);
  }
  if (m.partitioned_params && m.param_home == offload::Tier::kNvme) {
    // The partition comes to the host (from the host cache, else from NVMe: a clean device copy
    // is not used), is updated, and is written back behind the next module's update.
    const uint64_t part = static_cast<uint64_t>(m.part) * es;
    const bool hit = cached[static_cast<size_t>(&m - pl.modules.data())];
    B.nvme_read += hit ? 0 : part;
    g->add(Resource::kNvme, hit ? 0.0 : static_cast<double>(part) / part_sync_r);
    B.nvme_write += part;
    g->add(Resource::kNvme, static_cast<double>(part) / part_sync_w);
    g->add(Resource::kCpu, io_cpu(static_cast<double>((hit ? 0 : part) + part)));
  }
}

// Step 0. optimizer.type Muon, before the update, serial (Updater::muon_prepass): per module with
// matrices, the gradient sums and the momentum read and written once more where they are on NVMe
// (4 + 4 bytes an owned element each way with fp32 states; the momentum as stored) or touched in
// host memory, the module's U all-gathered (world > 1),
// and Newton-Schulz at the compute's flop rate (zoe's CPU device; an estimate on a GPU host, whose
// CPU runs it).
void StepModel::muon_prepass_time() {
  if (pl.optimizer != optim::OptimizerKind::kMuon) return;
  for (const auto& m : pl.modules) {
    if (m.frozen || !m.muon_matrices) continue;
    // The fp32 gradient sums and the momentum as stored: packed blocks (int8/int4) move whole, each
    // swapper chunk's rounded up to 4096 bytes on NVMe (offload::OptimizerSwapper::span_bytes).
    uint64_t mom = static_cast<uint64_t>(m.opt_n) * 4;
    if (optim::state_block_elems(pl.state_format) > 1) {
      const uint64_t B = optim::state_block_elems(pl.state_format),
                     bb = optim::state_block_bytes(pl.state_format);
      const uint64_t chunk = std::max<uint64_t>(pl.swap_chunk_elems, 1);
      mom = 0;
      for (uint64_t i = 0; i < m.opt_n; i += chunk) {
        const uint64_t blocks = (std::min(chunk, m.opt_n - i) + B - 1) / B * bb;
        mom += m.opt_home == offload::Tier::kNvme ? (blocks + 4095) / 4096 * 4096 : blocks;
      }
    }
    const uint64_t bytes = static_cast<uint64_t>(m.opt_n) * 4 + mom;
    if (m.opt_home == offload::Tier::kNvme) {
      B.nvme_read += bytes;
      B.nvme_write += bytes;
      path.serial(Resource::kNvme, static_cast<double>(bytes) / swap_r + static_cast<double>(bytes) / swap_w);
      path.serial(Resource::kCpu, io_cpu(2.0 * static_cast<double>(bytes)));
    }
    B.cpu_optimizer += 2 * bytes;
    path.serial(Resource::kCpu, 2.0 * static_cast<double>(bytes) / cpu + m.muon_flops / rates.flops);
    if (pl.world > 1 && pl.stage >= 1) {
      const auto gather = static_cast<uint64_t>(ring * static_cast<double>(m.padded) * 4);
      B.network += gather;
      B.collectives += 1;
      path.serial(Resource::kNetwork, coll_s(static_cast<double>(gather), 1));
    }
  }
}

// Step 1. NVMe-resident states: the swapper's pipeline (read chunk i+1, update i, write i-1).
void StepModel::nvme_states_time() {
  Path::Group g;
  std::vector<Path::Group> per(pl.modules.size());  // each module's share
  uint64_t rd = 0, wr = 0, elems = 0;
  for (size_t mi = 0; mi < pl.modules.size(); ++mi) {
    const auto& m = pl.modules[mi];
    if (m.opt_home != offload::Tier::kNvme) continue;
    elems += m.opt_n;
    // The preloaded: read during the backward, their gradient given.
    const uint64_t c = pl.swap_chunk_elems;
    const uint64_t r = pl.opt_nvme_bytes(m.opt_n - pre[mi], c) + (m.opt_n - pre[mi]) * 4,
                   wb = pl.opt_nvme_bytes(m.opt_n, c);
    rd += r;
    wr += wb;
    B.cpu_optimizer += static_cast<uint64_t>(static_cast<double>(m.opt_n) * adam_elem);
    per[mi].add(Resource::kCpu, static_cast<double>(m.opt_n) * adam_elem / cpu);
    write_out(m, &per[mi]);
    per[mi].add(Resource::kNvme, static_cast<double>(r) / swap_r + static_cast<double>(wb) / swap_w);
    per[mi].add(Resource::kCpu, io_cpu(static_cast<double>(r + wb)));
    for (int k = 0; k < kResources; ++k) g.t[k] += per[mi].t[k];
  }
  if (!wr) return;
  B.nvme_read += rd;
  B.nvme_write += wr;
  if (cfg.zoe.overlap_step && dev.host_addressable) {
    overlap_step_time(g, per);
  } else {
    // Filling the pipeline: the first chunk is read before any update starts (unless it was
    // read ahead).
    const uint64_t first = std::min<uint64_t>(pl.swap_chunk_elems, elems);
    const auto chunk = static_cast<double>(pl.opt_nvme_bytes(first, pl.swap_chunk_elems) + first * 4);
    if (std::all_of(pre.begin(), pre.end(), [](uint64_t e) { return e == 0; }))
      path.serial(Resource::kNvme, chunk / swap_r);
    path.overlap(g);
  }
}

// zoe's CPU device with zoe.overlap_step: the update runs behind the next forward, module by
// module, and the forward's fetch of module m waits for m's update: a two-stage flow shop. The
// update of m takes max(its NVMe time, its CPU time); the forward of m its compute (2 N_m T / F)
// plus that CPU time (the cores are shared). What the forward waits beyond its compute is on the
// path.
void StepModel::overlap_step_time(const Path::Group& g, const std::vector<Path::Group>& per) {
  double tu = 0, tf = 0, sum_f = 0, sum_c = 0;
  for (size_t mi = 0; mi < pl.modules.size(); ++mi) {
    const double f = f_fwd * static_cast<double>(pl.modules[mi].total) /
                     std::max(1.0, static_cast<double>(w.params)) / rates.flops;
    const double u = per[mi].t[static_cast<int>(Resource::kNvme)];
    const double cpu_s = per[mi].t[static_cast<int>(Resource::kCpu)];
    tu += std::max(u, cpu_s);
    tf = std::max(tf, tu) + f + cpu_s;
    sum_f += f;
    sum_c += cpu_s;
  }
  for (int k = 0; k < kResources; ++k) path.busy[k] += g.t[k];
  path.crit[static_cast<int>(Resource::kCpu)] += sum_c;
  path.crit[static_cast<int>(Resource::kNvme)] += std::max(0.0, tf - sum_f - sum_c);
}

// Step 2. States in host RAM (CPU Adam) or on the device (the device's kernel), module by module.
void StepModel::host_device_states_time() {
  for (size_t mi = 0; mi < pl.modules.size(); ++mi) {
    const auto& m = pl.modules[mi];
    if (m.opt_home == offload::Tier::kNvme) continue;
    Path::Group g;
    const auto bytes = static_cast<uint64_t>(static_cast<double>(m.opt_n) * adam_elem);
    if (m.opt_home == offload::Tier::kDevice) {
      B.device_optimizer += bytes;
      g.add(Resource::kDeviceMem, static_cast<double>(bytes) / hbm);
    } else {
      B.cpu_optimizer += bytes;
      g.add(Resource::kCpu, static_cast<double>(bytes) / cpu);
    }
    write_out(m, &g);
    path.overlap(g);
  }
}

// Step 3. Stage 1/2 (and persistent stage-3 modules): the all-gather of the updated partitions.
void StepModel::allgather_time() {
  if (pl.stage < 1 || pl.world < 2) return;
  uint64_t gather = 0, n = 0;
  for (const auto& m : pl.modules) {
    if (m.partitioned_params || m.frozen) continue;
    gather += static_cast<uint64_t>(ring * static_cast<double>(m.padded * es));
    ++n;
  }
  B.network += gather;
  B.collectives += n;
  path.serial(Resource::kNetwork, coll_s(static_cast<double>(gather), n));
}

// The step's small all-reduces (doubles), serial: the gradient norm (stage 1-3), the check that
// every rank reduced the same modules (two doubles) and which parameters got gradients (one
// double per parameter tensor). Their bytes are nothing; their latency is not.
void StepModel::step_collectives_time() {
  if (pl.world < 2) return;
  uint64_t tensors = 0;
  for (const auto& m : pl.modules) tensors += m.numel.size();
  const uint64_t n = pl.stage >= 1 ? 3 : 2;
  const uint64_t doubles = (pl.stage >= 1 ? 1 : 0) + 2 + tensors;
  const uint64_t bytes = static_cast<uint64_t>(2.0 * ring * static_cast<double>(doubles * 8));
  B.network += bytes;
  B.collectives += n;
  path.serial(Resource::kNetwork, coll_s(static_cast<double>(bytes), n, 2));
}

}  // namespace zoe::plan::detail
