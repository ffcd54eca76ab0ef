// The cost model's internals (src/plan): the critical path it sums, the simulation of the tier
// manager's partition cache (cost_cache.cpp) and StepModel, one estimate_step, whose phases are
// implemented by concept: its inputs and rates and the result (cost_model.cpp), the micro-batches'
// forward and backward (cost_micro_batches.cpp) and the optimizer step (cost_optimizer_step.cpp).
// docs/cost-model.md is the specification.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "plan/calibration.h"
#include "plan/cost_model.h"
#include "zero/placement.h"

namespace zoe::plan::detail {

inline constexpr int idx(Resource r) { return static_cast<int>(r); }

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
std::vector<bool> host_cached(const zero::Placement& pl);

// Simulates min(micro, 4) micro-batches; longer steps repeat the third (the cache's steady
// state) up to the last one.
CacheSim simulate_cache(const zero::Placement& pl, int64_t micro, const std::vector<bool>& cached);

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
  uint64_t es;
  int64_t micro;
  // Layer-major: the step as one pass with `reps` (= micro) micro-batches' compute, reductions,
  // accumulation and activation traffic, the loads of one.
  int64_t reps = 1;
  bool single_pass = false;
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
  double adam_elem;  // bytes the CPU's Adam touches per element (states as stored)

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
  void layer_major_pass();
  void write_out(const zero::ModulePlacement& m, Path::Group* g);
  void muon_prepass_time();
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

}  // namespace zoe::plan::detail
