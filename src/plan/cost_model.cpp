// The cost model's arithmetic (docs/cost-model.md is its specification).
#include "plan/cost_model.h"

#include <algorithm>
#include <array>
#include <limits>
#include <vector>

#include "config/value_used.h"

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

namespace {

constexpr int idx(Resource r) { return static_cast<int>(r); }

// The critical path, resource by resource: serial work adds its time; a group of work that
// overlaps adds the time of its slowest resource (to that resource), the others hide under it.
struct Path {
  double crit[kResources] = {};
  double busy[kResources] = {};
  void serial(Resource r, double s) {
    crit[idx(r)] += s;
    busy[idx(r)] += s;
  }
  struct Group {
    double t[kResources] = {};
    void add(Resource r, double s) { t[idx(r)] += s; }
  };
  void overlap(const Group& g) {
    int win = 0;
    for (int r = 0; r < kResources; ++r) {
      busy[r] += g.t[r];
      if (g.t[r] > g.t[win]) win = r;
    }
    crit[win] += g.t[win];
  }
};

// Which fetches of stage-3 partitions homed off the device move bytes: the tier manager keeps
// fetched partitions in its device tier (budget `capacity`) and, after the first iteration,
// evicts the copy used furthest ahead in the recorded order (Belady). The step's update drops
// every device copy (the new values are written to the home), so each step starts cold.
struct CacheSim {
  // Bytes loaded into the device per micro-batch, [0 forward / 1 backward], for the first
  // min(micro, 4) micro-batches; at(j) gives any micro-batch's.
  std::vector<std::array<uint64_t, 2>> loaded;
  std::vector<std::array<uint64_t, 2>> cached;  // of those, copied from the host cache of NVMe partitions
  int64_t micro = 0;
  size_t index(int64_t j) const {
    return static_cast<size_t>(j < 3 || micro < 4 ? j : j == micro - 1 ? 3 : 2);
  }
  std::array<uint64_t, 2> at(int64_t j) const {
    return loaded.empty() ? std::array<uint64_t, 2>{0, 0} : loaded[index(j)];
  }
  std::array<uint64_t, 2> cached_at(int64_t j) const {
    return cached.empty() ? std::array<uint64_t, 2>{0, 0} : cached[index(j)];
  }
};

// Which NVMe-homed partitions the tier manager's host cache holds in steady state: all of them
// when the cache (pl.tm_host_cache) has room; otherwise the first ones in forward order that fit
// beside the step's two working copies (the step updates in forward order, and the trace policy
// keeps the copies used soonest: the next forward's first modules). An approximation when they
// do not all fit (docs/cost-model.md).
std::vector<bool> host_cached(const zero::Placement& pl) {
  std::vector<bool> out(pl.modules.size(), false);
  auto alloc = [&](const zero::ModulePlacement& m) {
    return (static_cast<uint64_t>(m.part) * pl.compute_bytes + 4095) / 4096 * 4096;
  };
  uint64_t parts = 0, biggest = 0;
  for (const auto& m : pl.modules) {
    if (m.partitioned_params && m.param_home == offload::Tier::kNvme)
      parts += alloc(m), biggest = std::max(biggest, alloc(m));
  }
  const bool all = pl.tm_host_cache >= parts;
  uint64_t room = all ? parts : (pl.tm_host_cache > 2 * biggest ? pl.tm_host_cache - 2 * biggest : 0);
  for (size_t i = 0; i < pl.modules.size(); ++i) {
    const auto& m = pl.modules[i];
    if (!m.partitioned_params || m.param_home != offload::Tier::kNvme || alloc(m) > room) {
      if (!all && m.partitioned_params && m.param_home == offload::Tier::kNvme)
        room = 0;  // in order: no gaps
      continue;
    }
    out[i] = true;
    room -= alloc(m);
  }
  return out;
}

// Simulates min(micro, 4) micro-batches; longer steps repeat the third (the cache's steady
// state) up to the last one.
CacheSim simulate_cache(const zero::Placement& pl, int64_t micro, const std::vector<bool>& cached) {
  const size_t n = pl.modules.size();
  const int64_t sim_micro = std::min<int64_t>(micro, 4);
  CacheSim sim;
  sim.micro = micro;
  std::vector<std::array<uint64_t, 2>>& loaded = sim.loaded;
  loaded.assign(static_cast<size_t>(sim_micro), {0, 0});
  sim.cached.assign(static_cast<size_t>(sim_micro), {0, 0});
  std::vector<size_t> order;
  std::vector<uint8_t> phase;  // 0 forward, 1 backward
  std::vector<int64_t> mb;
  for (int64_t j = 0; j < sim_micro; ++j) {
    for (size_t m = 0; m < n; ++m) order.push_back(m), phase.push_back(0), mb.push_back(j);
    for (size_t m = n; m-- > 0;) order.push_back(m), phase.push_back(1), mb.push_back(j);
  }
  // next[t]: the next position of order[t]'s module after t (SIZE_MAX: none).
  constexpr size_t kNever = std::numeric_limits<size_t>::max();
  std::vector<size_t> next(order.size(), kNever), seen(n, kNever);
  for (size_t t = order.size(); t-- > 0;) {
    next[t] = seen[order[t]];
    seen[order[t]] = t;
  }
  const uint64_t capacity = pl.tm_device_budget ? pl.tm_device_budget : pl.device_budget;
  std::vector<bool> in(n, false);
  std::vector<size_t> next_use(n, kNever);
  uint64_t used = 0;
  auto bytes_of = [&](size_t m) { return static_cast<uint64_t>(pl.modules[m].part) * pl.compute_bytes; };
  for (size_t t = 0; t < order.size(); ++t) {
    const size_t m = order[t];
    const zero::ModulePlacement& mp = pl.modules[m];
    if (!mp.partitioned_params || mp.param_home == offload::Tier::kDevice) continue;
    next_use[m] = next[t];
    if (in[m]) continue;
    const uint64_t b = bytes_of(m);
    while (used + b > capacity) {  // evict the copy used furthest ahead
      size_t victim = n;
      for (size_t c = 0; c < n; ++c) {
        if (in[c] && (victim == n || next_use[c] > next_use[victim])) victim = c;
      }
      if (victim == n) break;
      in[victim] = false;
      used -= bytes_of(victim);
    }
    in[m] = true;
    used += b;
    loaded[static_cast<size_t>(mb[t])][phase[t]] += b;
    if (cached[m]) sim.cached[static_cast<size_t>(mb[t])][phase[t]] += b;
  }
  return sim;
}

// One estimate_step: its inputs, the per-rank rates and streams derived from them, the cache
// simulation, and the critical path and bytes being summed. Each phase of docs/cost-model.md's
// "Time: the critical path" is one member function.
struct StepModel {
  static constexpr double kGb = 1e9;

  const config::Config& cfg;
  const zero::Placement& pl;
  const Workload& w;
  const LinkRates& rates;
  const DeviceKind& dev;
  LinkBytes B;
  Path path;

  double per_node;
  int64_t aio_block, aio_depth;
  // Stage-3 partitions: staged moves (the tier manager's staging buffers, all in flight), and
  // synchronous reads and writes through its one sync buffer (the step's).
  double nvme_r = 0, part_sync_r = 0, part_sync_w = 0;
  // The optimizer swapper: chunks of 4-byte (or state_bytes) elements, one request per state;
  // of its slots one is being updated and one written back, the rest read ahead (4 states each).
  uint64_t chunk_bytes = 0, slots = 0;
  double swap_r = 0, swap_w = 0;
  // Per module, the elements of the chunks the swapper reads ahead (preloaded_chunks()).
  std::vector<uint64_t> pre;
  // The gradient accumulator on NVMe: a synchronous read of one chunk at a time; writes behind
  // the caller, up to the swapper's two write buffers in flight.
  double acc_r = 0, acc_w = 0;
  double pcie, cpu, net, hbm;
  // Seconds every collective costs beside its bytes (across nodes; 0 inside one node).
  double lat;
  uint64_t es, sb;
  int64_t micro;
  double tokens, ring;
  bool stage3, copies;
  double nvme_cpu;
  uint64_t gather_elems = 0;  // stage 3: partitioned modules, gathered at each fetch (x fetches per pass)
  uint64_t gathers = 0;       // stage 3: gathers per pass
  bool queued;
  CacheSim sim;
  bool any_off = false;
  std::vector<bool> cached;
  offload::Tier part_home =
      offload::Tier::kDevice;  // the offload device of stage-3 partitions (one for the model)
  Resource load_res = Resource::kPcie;
  uint64_t first_part = 0;  // the first partitioned module's partition: fetched on demand
  bool first_cached = false;
  double local;
  uint64_t gather_local = 0;
  double f_fwd;
  uint64_t adam_elem;

  StepModel(const config::Config& cfg_, const zero::Placement& pl_, const Workload& w_, const Topology& topo,
            const LinkRates& rates_, const DeviceKind& dev_);

  double nvme_rate(bool write, uint64_t request, uint64_t in_flight) const;
  void preloaded_chunks();
  void stage3_partitions();
  double io_cpu(double bytes) const { return nvme_cpu > 0 ? bytes / nvme_cpu : 0.0; }
  double load_s(uint64_t bytes) const {
    return static_cast<double>(bytes) / (part_home == offload::Tier::kNvme ? nvme_r : pcie);
  }
  void add_loads(Path::Group* g, uint64_t bytes, uint64_t from_cache);
  void add_gather_copies();
  void count_loads(uint64_t bytes, uint64_t from_cache);
  void add_gathers(Path::Group* g);
  void forward_time(int64_t j);
  void backward_time(int64_t j);
  void activation_traffic(Path::Group* g, bool backward);
  void sums_write_behind(Path::Group* g, int64_t j);
  void accumulate_time(int64_t j);
  void micro_batches();
  void write_out(const zero::ModulePlacement& m, Path::Group* g);
  void nvme_states_time();
  void overlap_step_time(const Path::Group& g, const std::vector<Path::Group>& per);
  void host_device_states_time();
  void allgather_time();
  void step_collectives_time();
  StepCost result() const;
  int fetches(size_t i) const {
    return i < w.fetches_per_pass.size() ? std::max(1, w.fetches_per_pass[i]) : 1;
  }
  // Collectives of `bus_bytes` sent in all, `n` of them: their seconds. A gather or a
  // reduce-scatter pays the latency once; an all-reduce (`rounds` 2) twice: it is a reduce-scatter
  // and then an all-gather (a ring's 2(w-1) steps; zoe's MPI path, an all-to-all and an all-gather).
  double coll_s(double bus_bytes, uint64_t n, uint64_t rounds = 1) const {
    return bus_bytes / net + static_cast<double>(n * rounds) * lat;
  }
  uint64_t reductions(const zero::ModulePlacement& m) const;
};

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
  slots = std::max<uint64_t>(pl.swap_buffer_count / zero::kSwapStates,
                             static_cast<uint64_t>(zero::kMinSwapSlots));
  swap_r = nvme_rate(false, chunk_bytes, (slots - 2) * 4);
  swap_w = nvme_rate(true, chunk_bytes, 3);
  preloaded_chunks();
  acc_r = nvme_rate(false, chunk_bytes, 1), acc_w = nvme_rate(true, chunk_bytes, 2);
  pcie = rates.h2d_gbps * gb, cpu = rates.cpu_adam_gbps * gb / per_node;
  net = (topo.nodes > 1 ? rates.net_gbps : rates.intra_gbps) * gb;
  lat = topo.nodes > 1 ? rates.net_latency_us * 1e-6 : 0.0;
  hbm = rates.device_mem_gbps * gb;
  es = pl.compute_bytes, sb = pl.state_bytes;
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
  // The step. Adam touches master (r/w), m and v (r/w), the gradient (r), the compute copy (w).
  adam_elem = 8 + 4 * sb + 4 + (es == 2 ? 2 : 0);
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
  uint64_t left = pl.swapper ? slots - 1 : 0;
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
  if (stage3 && any_off) sim = simulate_cache(pl, micro, cached);
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
  g.add(Resource::kCompute, f_fwd / rates.flops);
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
  const uint64_t moved = a.host_bytes + a.nvme_bytes;
  if (moved == 0) return;
  (backward ? B.act_host_to_device : B.act_device_to_host) += moved;
  (backward ? B.host_to_device : B.device_to_host) += moved;
  g->add(Resource::kPcie,
         copies ? static_cast<double>(moved) / pcie : 2.0 * static_cast<double>(moved) / local);
  if (a.nvme_bytes == 0) return;
  (backward ? B.act_nvme_read : B.act_nvme_write) += a.nvme_bytes;
  (backward ? B.nvme_read : B.nvme_write) += a.nvme_bytes;
  const double rate = nvme_rate(!backward, a.tensor_bytes, 2);
  g->add(Resource::kNvme, static_cast<double>(a.nvme_bytes) / rate);
  g->add(Resource::kCompute, io_cpu(static_cast<double>(a.nvme_bytes)));
}

// Backward: compute with loads, reductions (the communicator's stream) under it; the
// accumulation of each reduced gradient runs on the caller's thread (accumulate_time()).
void StepModel::backward_time(int64_t j) {
  Path::Group g;
  // With checkpointing each block's forward runs again before its backward.
  g.add(Resource::kCompute, (w.act.recompute ? 3.0 : 2.0) * f_fwd / rates.flops);
  const uint64_t loads = any_off && stage3 ? sim.at(j)[1] : 0;
  const uint64_t hits = any_off && stage3 ? sim.cached_at(j)[1] : 0;
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
    const uint64_t n = reductions(m);
    if (n == 0) continue;
    const uint64_t r =
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
      B.nvme_read += pre[i] * (4 + 2 * sb);
      g->add(Resource::kNvme, static_cast<double>(pre[i] * (4 + 2 * sb)) / swap_r);
      g->add(Resource::kCompute, io_cpu(static_cast<double>(pre[i] * (4 + 2 * sb))));
    }
  }
}

// The accumulation of every reduced gradient, serial on the caller's thread: device memory, a
// device->host copy and a CPU pass, or a CPU pass with the NVMe running sum read back.
void StepModel::accumulate_time(int64_t j) {
  for (size_t i = 0; i < pl.modules.size(); ++i) {
    const auto& m = pl.modules[i];
    const uint64_t n = m.opt_n, touched = n * (es + 8);  // read the gradient, read/write the fp32 sum
    if (m.opt_home == offload::Tier::kDevice) {
      B.device_optimizer += touched;
      path.serial(Resource::kDeviceMem, static_cast<double>(touched) / hbm);
      continue;
    }
    if (copies) {
      B.device_to_host += n * es;
      path.serial(Resource::kPcie, static_cast<double>(n * es) / pcie);
    }
    B.cpu_optimizer += touched;
    path.serial(Resource::kCpu, static_cast<double>(touched) / cpu);
    if (m.opt_home ==
        offload::Tier::kNvme) {  // the running sum on NVMe: read it back (not the first), write it
      const uint64_t rd = j > 0 ? n * 4 : 0, wr = (n - (j == micro - 1 ? pre[i] : 0)) * 4;
      B.nvme_read += rd;
      B.nvme_write += wr;
      path.serial(Resource::kNvme, static_cast<double>(rd) / acc_r);
    }
  }
}

// Micro-batches 2 .. micro-2 are alike (the cache's steady state, a sum to read back): one is
// run and its share repeated, so a long accumulation costs O(1), not O(micro).
void StepModel::micro_batches() {
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
    const uint64_t r = (m.opt_n - pre[mi]) * (4 + 2 * sb + 4), wb = m.opt_n * (4 + 2 * sb);
    rd += r;
    wr += wb;
    B.cpu_optimizer += m.opt_n * adam_elem;
    per[mi].add(Resource::kCpu, static_cast<double>(m.opt_n * adam_elem) / cpu);
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
    const double chunk =
        static_cast<double>(std::min<uint64_t>(pl.swap_chunk_elems, elems)) * (4 + 2 * sb + 4);
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
    const uint64_t bytes = m.opt_n * adam_elem;
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

}  // namespace

StepCost estimate_step(const config::Config& cfg, const zero::Placement& pl, const Workload& w,
                       const Topology& topo, const LinkRates& rates, const DeviceKind& dev) {
  StepModel s(cfg, pl, w, topo, rates, dev);
  s.micro_batches();
  s.nvme_states_time();
  s.host_device_states_time();
  s.allgather_time();
  s.step_collectives_time();
  return s.result();
}

}  // namespace zoe::plan
