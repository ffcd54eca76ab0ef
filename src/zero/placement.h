// The placement planner: from the config and the modules' shapes, every decision the engine makes
// about where bytes live, computed before anything is allocated. Pure: no I/O, no allocation,
// no device, so it can be unit-tested and called by a planning tool on a machine without the
// model (`zoe plan` calls exactly this). Engine::initialize() executes a Placement.
//
// What it decides, per rank:
//  - each module's flat layout: padded size, partition, the range this rank's optimizer owns;
//  - the home of each state: stage-3 parameter partitions (device, host or NVMe tier), the
//    optimizer states and fp32 gradient accumulators (device, host RAM or NVMe), with the
//    partial-offload split (zoe.offload_ratio);
//  - the tier manager's device budget and staging buffers, and the gather/prefetch window;
//  - the optimizer swapper's chunk, buffer size and buffer count;
//  - the bytes each tier needs: exact for what is allocated once (states, buffers), an upper
//    bound for what moves (gathers, gradient buffers, reductions, prefetched partitions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "offload/tier.h"
#include "optim/lowbit.h"
#include "optim/optimizer_kind.h"
#include "zoe/status.h"
#include "zoe/tensor.h"

namespace zoe::zero {

// Partitions hold a whole number of 4 KiB blocks in every dtype (O_DIRECT swapping).
inline constexpr size_t kPartAlign = 2048;
// The optimizer swapper's chunk is at most this many elements (4 MiB fp32 buffers).
inline constexpr size_t kMaxSwapChunkElems = size_t{1} << 20;

// The optimizer swapper's pipeline slot: one buffer per state (fp32 master, Adam m and v, the
// gradient accumulator); it needs this many slots to overlap reads ahead, updates and write-backs.
inline constexpr size_t kSwapStates = 4;
inline constexpr int64_t kMinSwapSlots = 3;

// The optimizer swapper's chunk for zero_optimization.sub_group_size: rounded up to a multiple
// of the norm's chunk (optim::kChunkElems), at most kMaxSwapChunkElems. Warns once (config::
// value_used) when that differs from the value given; `given` false (DeepSpeed's default, not
// written by the user): silently.
size_t swap_chunk_elems(int64_t sub_group_size, bool given = true);
// The optimizer swapper's buffers for offload_optimizer.buffer_count: whole slots of kSwapStates
// buffers, at least kMinSwapSlots of them (DeepSpeed's default of 4 becomes 12). Warns once
// (config::value_used) when that differs from the value given (`given`: as swap_chunk_elems).
size_t swap_buffer_count(int64_t buffer_count, bool given = true);

// Gradient reductions in flight at once: one, overlapping the next module's fetch and backward
// until it asks for its gradient buffer. A reduction runs in place in its module's gradient
// buffer; at stage 2/3 with reduce buckets smaller than a partition it packs each bucket into one
// of kReducePackBuffers send buffers (one fills while the other is reduced). So a module in use,
// its gradients and the reduction fit the reserve the planner keeps: 2 x the largest gathered
// module and those bucket buffers.
inline constexpr size_t kMaxPendingReductions = 1;
inline constexpr size_t kReducePackBuffers = 2;

// Where bytes live is an offload::Tier (device, host, NVMe) everywhere in the engine. The
// config's zero_optimization.offload_*.device says where to offload them ("none", "cpu",
// "nvme"); this is the one conversion, where the config is read.
constexpr offload::Tier offload_tier(zoe::Offload d) {
  return d == zoe::Offload::kNone  ? offload::Tier::kDevice
         : d == zoe::Offload::kCpu ? offload::Tier::kHost
                                   : offload::Tier::kNvme;
}

// What the planner needs to know of a module: its name, the element count of each parameter, and
// whether it is frozen (its compute parameters only: no optimizer states, gradients or reduction).
struct ModuleShape {
  std::string name;
  std::vector<size_t> param_numel;
  bool frozen = false;
  bool held = false;  // fetched beside every other module in use (ModuleOptions::held)
  // The parameters' names and shapes where known (empty: unknown): optimizer.type Muon's matrices
  // (ModulePlacement::muon_flops).
  std::vector<ParamSpec> specs;
};

// What the planner needs to know of the device it plans for. The defaults describe zoe's CPU
// device with the config's budget.
struct PlanTarget {
  uint64_t device_budget = 0;  // 0: the config's zoe.device_budget (64 GiB when unset)
  bool queued_gathers = true;  // gathers may be queued ahead of use (host-memory devices with a
                               // host communicator; false on CUDA)
  // The host's memory (bytes; 0: unknown). Without zoe.host_budget, zoe sizes the buffers the
  // config leaves to it within kAutoHostShareDiv-th of it (see Placement::host_share).
  uint64_t host_memory = 0;
  // The update's kernel can write the compute parameters' memory (zoe's CPU device): a bf16 master
  // with bf16 compute is then the compute copy itself (Placement::master_in_compute).
  bool host_addressable = true;
};

// The host share zoe sizes its own buffers within when zoe.host_budget is not set: this fraction
// of the host's memory.
inline constexpr uint64_t kAutoHostShareDiv = 16;
// What zoe picks for the sizes the config does not give (within the host share): staging pieces
// of at most this many bytes (offload_param.buffer_size), at most this many swapper slots
// (offload_optimizer.buffer_count / 4: read-ahead of chunks, at most one more than the chunks of
// a step).
inline constexpr uint64_t kAutoStagingBytes = 16ull << 20;
// The least zoe cuts its staging pieces to under a zoe.host_budget that cannot hold them at
// kAutoStagingBytes.
inline constexpr uint64_t kMinOwnStagingBytes = 1ull << 20;
inline constexpr size_t kAutoMaxSwapSlots = 16;

struct ModulePlacement {
  std::string name;
  std::vector<size_t> numel, offset;  // per parameter, in the flat group
  size_t total = 0;                   // parameters
  size_t padded = 0;                  // the flat group, padded to kPartAlign x world
  size_t part = 0;                    // one rank's partition: padded / world
  bool partitioned_params = false;    // stage 3 and at least stage3_param_persistence_threshold
  offload::Tier param_home = offload::Tier::kDevice;  // of the partition (partitioned_params only)
  size_t opt_begin = 0, opt_n = 0;                    // the flat range this rank's optimizer owns
  // Where the fp32 master, Adam m/v and the fp32 gradient accumulator of [opt_begin, +opt_n) live.
  offload::Tier opt_home = offload::Tier::kDevice;
  // A frozen module has none of them (opt_home means nothing; [opt_begin, +opt_n) is still the
  // share of its parameters this rank checkpoints).
  bool frozen = false;
  bool held = false;  // ModuleShape::held
  // optimizer.type Muon: the flops of this rank's Newton-Schulz for the module's matrices that
  // overlap [opt_begin, +opt_n) (0 where ModuleShape::specs is unknown), and whether it has any
  // matrix (its U is gathered from the ranks).
  double muon_flops = 0;
  bool muon_matrices = false;
};

// Bytes per tier on this rank.
struct TierBytes {
  uint64_t device = 0, host = 0, nvme = 0;
};

struct Placement {
  int stage = 0;
  int world = 1, rank = 0;
  size_t compute_bytes = 4;  // bytes per compute-parameter element (fp32 4, bf16/fp16 2)
  // The update (optimizer.type): its states per element beside the master, opt_states() of them
  // (AdamW m and v, Lion m, Adagrad the sum).
  optim::OptimizerKind optimizer = optim::OptimizerKind::kAdamW;
  int opt_states() const { return optim::optimizer_state_count(optimizer); }
  // Buffers per slot of the optimizer swapper: one per state it holds (Updater::swapped_states: the
  // master unless master_in_compute, the optimizer's states, the gradient sums), kSwapStates for
  // AdamW with its master. Its pool is whole slots: swap_buffer_count rounded down to a multiple.
  size_t swap_states() const { return (master_in_compute ? 0 : 1) + static_cast<size_t>(opt_states()) + 1; }
  // The optimizer's states (zoe.optimizer_states) and the master (zoe.master_weights) as stored.
  optim::StateFormat state_format = optim::StateFormat::kF32;
  optim::MasterFormat master_format = optim::MasterFormat::kF32;
  // A bf16 master with bf16 compute where the update writes the compute parameters' memory
  // (a host-memory device), without zoe.speculative_step: the master is the compute copy's owned
  // range, stored and moved once (no master among the optimizer states).
  bool master_in_compute = false;
  // Bytes of the master and the optimizer's states of n elements as stored (n a multiple of the
  // states' block: every module's owned range is), and the rate per element.
  uint64_t opt_bytes(uint64_t n) const {
    const uint64_t mb =
        master_in_compute ? 0 : static_cast<uint64_t>(optim::master_bytes_per_element(master_format));
    return n * mb + static_cast<uint64_t>(opt_states()) *
                        static_cast<uint64_t>(optim::state_bytes(state_format, static_cast<size_t>(n)));
  }
  // The same on NVMe, where the optimizer swapper stores them in chunks of `chunk` elements from
  // the module's start: a packed state's blocks start each chunk on a 4096-byte boundary
  // (offload::OptimizerSwapper), so each chunk's states round up to 4096 bytes.
  uint64_t opt_nvme_bytes(uint64_t n, uint64_t chunk) const;
  double opt_bytes_per_elem() const {
    return optim::optimizer_state_bytes_per_param(master_format, state_format, opt_states()) -
           (master_in_compute ? optim::master_bytes_per_element(master_format) : 0.0);
  }
  uint64_t device_budget = 0;
  std::vector<ModulePlacement> modules;
  // Elements per gradient reduction bucket: zero_optimization.reduce_bucket_size, at least one per
  // rank, lowered until the bucket buffers fit the device budget beside the rest (warned once).
  size_t reduce_bucket = 1;
  // Elements of gathered stage-3 modules live at once: stage3_max_live_parameters, at least the
  // largest gathered module (a lower value could never be honoured; warned once).
  size_t max_live_parameters = 0;

  // Stage-3 parameter partitions go through the tier manager.
  bool tier_manager = false;
  uint64_t tm_device_budget = 0;  // the device tier's share: partitions in flight (and homes)
  // Staging buffers for NVMe <-> device pieces (offload_param.buffer_size and buffer_count):
  // tm_staging_count for moves and one for synchronous reads and writes.
  size_t tm_staging_bytes = 1u << 20, tm_staging_count = 4;
  // NVMe-homed partitions: the tier manager's host budget (its staging buffers, the step's two
  // partitions in flight, and up to offload_param.max_in_cpu elements of updated partitions kept
  // as a clean cache that later device fetches copy from); 0: unlimited (host-homed partitions).
  uint64_t tm_host_budget = 0;
  uint64_t tm_host_cache = 0;  // of which the cache of partitions (at least the step's two)
  // Elements of gathered modules prefetch may queue ahead of their fetch.
  size_t gather_window = 0;
  // World size 1: partition bytes the tier's device share holds pinned by modules served in place
  // at once; a fetch beyond them (several modules fetched together, as a PyTorch unit's) reads its
  // partition into a copy instead. 0 where partitions are gathered (world size > 1).
  uint64_t in_place_pins = 0;
  // stage3_prefetch_bucket_size as used for queued gathers: the value given, or the gather window
  // when the device budget left less than it (warned once).
  int64_t prefetch_bucket = 0;

  // Modules whose optimizer states live on NVMe go through the optimizer swapper.
  bool swapper = false;
  size_t swap_chunk_elems = 0;  // swap_chunk_elems(sub_group_size)
  size_t swap_buffer_bytes = 0;
  size_t swap_buffer_count = 0;  // swap_buffer_count(offload_optimizer.buffer_count)
  // Its buffers for the gradient sums written behind the backward: one per chunk of the largest
  // NVMe-resident module's owned range, in [2, offload::kMaxAsyncWriteBuffers], so a module's sums
  // are written without stalling the backward while the next module computes.
  size_t swap_async_buffers = 0;
  // zoe.schedule "layer-major" with micro-batches: the running gradient sums of the module the
  // backward is in, held in host memory across its micro-batches (fp32, the largest NVMe-resident
  // module's owned range) so that they go to NVMe once per step; 0 otherwise.
  uint64_t grad_hold_bytes = 0;

  // What the run allocates once (exact): optimizer states, accumulators, persistent parameters,
  // homes of partitions, the swapper's and tier manager's buffers.
  TierBytes resident;
  // The most each tier holds at once (an upper bound, with one module fetched at a time): resident
  // plus what moves. The engine's measured high-water marks stay at or below these.
  TierBytes peak;
  // The host memory zoe sized the buffers the config leaves to it within: zoe.host_budget, or
  // PlanTarget::host_memory / kAutoHostShareDiv; 0: neither is known, DeepSpeed's defaults are
  // used as they are. Sizes the config gives are used as given.
  uint64_t host_share = 0;
  // The config keys whose values zoe chose from the host share (not given in the config), e.g.
  // "zero_optimization.offload_optimizer.buffer_count".
  std::vector<std::string> chosen;

  // NVMe bytes the swap files need (equals resident.nvme).
  uint64_t nvme_bytes() const { return resident.nvme; }
};

// Plans the placement of `modules` (in forward order) on rank `rank` of `world`. Performance hints
// that do not fit the device budget are lowered to what fits, each warned about once naming the
// key and the value used (stage3_param_persistence_threshold, reduce_bucket_size,
// stage3_max_live_parameters). Errors: a module that cannot fit the device (it must hold one
// gathered module, its gradients and their reduction; the message names zoe.device_budget), a
// zoe.host_budget below what the plan needs, bad shapes.
Result<Placement> plan_placement(const config::Config& cfg, const std::vector<ModuleShape>& modules,
                                 int world, int rank, const PlanTarget& target = {});

}  // namespace zoe::zero
