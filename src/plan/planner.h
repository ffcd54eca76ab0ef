// `zoe plan` as a library: every placement of a model on a cluster (stage x parameter offload x
// optimizer offload x offload ratio x bf16 optimizer states), each planned by the engine's own
// placement planner (zero::plan_placement, with shapes built the way the engine registers
// modules), checked against the per-rank memory, and costed by the cost model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/calibration.h"
#include "plan/cost_model.h"
#include "plan/model_desc.h"
#include "zero/placement.h"
#include "zoe/status.h"

namespace zoe::plan {

struct PlanInputs {
  ModelDesc model;
  Topology topo;
  // Memory of one node; a rank gets its share (divided by gpus_per_node).
  uint64_t device_mem = 0, host_mem = 0, nvme_space = 0;
  LinkRates rates;
  Workload work;                   // work.params is set from the model
  bool count_activations = false;  // add the activation estimate to the device's bytes
  bool cuda = true;                // plan for CUDA devices (false: zoe's CPU device)
  config::Config base;             // knobs the rows inherit (buckets, sub_group_size, precision, ...)
};

// One placement: what a row varies.
struct RowPlacement {
  int stage = 1;
  config::OffloadDevice param = config::OffloadDevice::kNone, optimizer = config::OffloadDevice::kNone;
  double ratio = 1.0;  // zoe.offload_ratio (meaningful where the optimizer is offloaded)
  bool bf16_states = false;
  std::string label() const;  // "stage 3, params nvme, optimizer cpu x0.5, bf16 states"
};

struct PlanRow {
  RowPlacement placement;
  bool fits = false;
  // Per rank: plan_placement's peak (device: before the planner caps it at the budget, plus the
  // activations when counted; equal to the planner's peak for every row that fits).
  zero::TierBytes bytes;
  zero::TierBytes lacks;  // per rank: what is missing on each tier (all 0 when it fits)
  uint64_t activation_bytes = 0;
  bool exact = true;              // false: the engine's planner refused the per-rank budget; bytes are its
                                  // plan with an unbounded device (what the placement would need)
  std::string refused;            // the planner's message when it refused
  uint64_t largest_gathered = 0;  // elements (padded) of the largest module stage 3 gathers; 0: none
  StepCost cost;
};

struct PlanResult {
  uint64_t params = 0;
  zero::TierBytes per_rank;   // capacities a rank gets
  std::vector<PlanRow> rows;  // fitting rows first, then by predicted step time
  bool any_fits() const;
};

// Every placement of the matrix, in a fixed order (stage, params, optimizer, ratio, states).
std::vector<RowPlacement> all_placements();
// The engine's config for a row: `base` with the row's stage, offload devices, ratio and state
// dtype (nvme_path: `nvme_path` where a device is nvme and base has none).
config::Config config_for(const config::Config& base, const RowPlacement& p,
                          const std::string& nvme_path = "");
// Activations of one micro-batch kept for the backward pass (an estimate; 0 when the model's
// dimensions are unknown). See docs/cost-model.md.
uint64_t activation_bytes(const ModelDesc& m, const Workload& w, size_t compute_bytes);

Result<PlanResult> make_plan(const PlanInputs& in);
// One row of the matrix (make_plan's rows are these, sorted).
Result<PlanRow> plan_row(const PlanInputs& in, const RowPlacement& p);

// What one rank gets of a node's memory.
zero::TierBytes per_rank_memory(const PlanInputs& in);
// The error when no row fits: names the placement that lacks least and what it lacks where.
Status nothing_fits(const PlanResult& r, const PlanInputs& in);

// This host's defaults: RAM (MemTotal of /proc/meminfo) and free bytes of a directory.
Result<uint64_t> host_memory_bytes();

}  // namespace zoe::plan
