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
#include "zoe/activations.h"
#include "zoe/status.h"

namespace zoe::plan {

// Activation checkpointing and the activation store's tiers (zoe/activations.h) of the run planned:
// with checkpointing, each block's input is kept for the backward (the rest is recomputed) and
// the store places it on the device, in host memory or on NVMe as `offload` allows.
struct ActivationOptions {
  bool checkpointing = false;
  ActivationOffload offload = ActivationOffload::kNone;
  uint64_t host_budget = 0;  // zoe.activation_host_budget; 0: the engine's default (below)
  // The engine's default host budget: a quarter of zoe.host_budget when it is given (host_share),
  // else 1/16 of a rank's host memory; at most what the placement leaves of the host.
  uint64_t host_share = 0;
  uint64_t device_budget = 0;       // zoe.activation_device_budget; 0: what the device has left
  uint64_t min_bytes = 256 * 1024;  // zoe.activation_min_bytes: smaller tensors stay on the device
  // The NVMe tier's pinned host buffers, inside the host budget: write-behind runs and the blocks
  // the backward reads ahead into (prefetch + 1 of the largest tensor).
  // run_bytes 0: as the engine sizes them, host budget / 8 in 4 KiB multiples within [64 KiB, 8 MiB].
  uint64_t run_bytes = 0;
  uint32_t write_buffers = 2, prefetch = 2;
};

// One micro-batch's activations as the planner counts them.
struct ActivationSizes {
  uint64_t workspace = 0;   // on the device: everything but the checkpoints (one block's intermediates
                            // and the head with checkpointing; all of it without)
  uint64_t checkpoint = 0;  // checkpointed block inputs, wherever they are (0 without checkpointing)
  uint64_t tensor = 0;      // one checkpointed tensor
  uint64_t count = 0;       // checkpointed tensors (layers)
};

struct PlanInputs {
  ModelDesc model;
  Topology topo;
  // Memory of one node; a rank gets its share (divided by gpus_per_node).
  uint64_t device_mem = 0, host_mem = 0, nvme_space = 0;
  LinkRates rates;
  Workload work;                   // work.params is set from the model
  bool count_activations = false;  // add the activation estimate to the device's bytes
  ActivationOptions act;           // checkpointing and the activation store's tiers
  bool cuda = true;                // plan for CUDA devices (false: zoe's CPU device)
  config::Config base;             // knobs the rows inherit (buckets, sub_group_size, precision, ...)
};

// One placement: what a row varies.
struct RowPlacement {
  int stage = 1;
  zoe::Offload param = zoe::Offload::kNone, optimizer = zoe::Offload::kNone;
  double ratio = 1.0;  // zoe.offload_ratio (meaningful where the optimizer is offloaded)
  bool bf16_states = false;
  // zoe.optimizer_states of the row: "bf16" or "fp32" (bf16_states), or the config's "int8"/"int4"
  // (a low-bit format the config chose is kept in every row: precision is the user's choice).
  std::string states = "fp32";
  std::string label() const;  // "stage 3, params nvme, optimizer cpu x0.5, bf16 states"
};

struct PlanRow {
  RowPlacement placement;
  bool fits = false;
  // Per rank: plan_placement's peak (device: before the planner caps it at the budget, plus the
  // activations when counted; equal to the planner's peak for every row that fits).
  zero::TierBytes bytes;
  zero::TierBytes lacks;          // per rank: what is missing on each tier (all 0 when it fits)
  uint64_t activation_bytes = 0;  // on the device: the workspace and the checkpoints kept there
  // With activation checkpointing: the checkpointed bytes of one micro-batch and where the
  // activation store keeps them (device, host, nvme; in bytes, activation_bytes and lacks above).
  uint64_t checkpoint_bytes = 0;
  zero::TierBytes checkpoint_tiers;
  bool exact = true;              // false: the engine's planner refused the per-rank budget; bytes are its
                                  // plan with an unbounded device (what the placement would need)
  std::string refused;            // the planner's message when it refused
  uint64_t largest_gathered = 0;  // elements (padded) of the largest module stage 3 gathers; 0: none
  StepCost cost;
  // With more than one micro-batch a step: the predicted step of each schedule (cost is the one of
  // the inputs' zoe.schedule); 0 otherwise.
  double step_s_micro_batch = 0, step_s_layer_major = 0;
};

struct PlanResult {
  uint64_t params = 0;
  zero::TierBytes per_rank;   // capacities a rank gets
  std::vector<PlanRow> rows;  // fitting rows first, then by predicted step time
  bool any_fits() const;
};

// Every placement of the matrix, in a fixed order (stage, params, optimizer, ratio, states).
// Every row; base_states: the config's zoe.optimizer_states (int8/int4 rows keep it, fp32/bf16
// rows try both, but optimizer_type "Muon" and "AdamMini" keep no bf16 states).
std::vector<RowPlacement> all_placements(const std::string& base_states = "fp32",
                                         const std::string& optimizer_type = "AdamW");
// The engine's config for a row: `base` with the row's stage, offload devices, ratio and state
// dtype (nvme_path: `nvme_path` where a device is nvme and base has none).
config::Config config_for(const config::Config& base, const RowPlacement& p,
                          const std::string& nvme_path = "");
// Activations of one micro-batch kept for the backward pass (an estimate; 0 when the model's
// dimensions are unknown). See docs/cost-model.md.
uint64_t activation_bytes(const ModelDesc& m, const Workload& w, size_t compute_bytes);
// The activations of one micro-batch with or without checkpointing. zoe's GPT: its kernels'
// exact buffers (fp32, model::activation_bytes_estimate); another model: activation_bytes()'s
// estimate, and with checkpointing one block's share of it plus the head, and block inputs of
// micro-batch x seq x d_model in the compute dtype. With w.layer_major and G = w.grad_accum > 1,
// the activations of all G micro-batches (G x the blocks' share, or G x the block inputs).
ActivationSizes activation_sizes(const ModelDesc& m, const Workload& w, size_t compute_bytes,
                                 bool checkpointing);
// Where the activation store keeps the checkpoints (device, host, nvme) with `device_room` and
// `host_room` bytes free for them: the last tensor (keep_last) and tensors below min_bytes stay
// on the device; the tensors saved last stay nearest; without offload everything stays. With an
// NVMe tier, its buffers (nvme_host_buffers) come out of the host's room first.
zero::TierBytes split_checkpoints(const ActivationSizes& a, const ActivationOptions& o, uint64_t device_room,
                                  uint64_t host_room);
// The pinned host bytes the activation store's NVMe tier holds beside the host tier.
// host_budget: the store's (the run size follows it); read-ahead blocks are 4 KiB multiples.
uint64_t nvme_host_buffers(const ActivationSizes& a, const ActivationOptions& o, uint64_t host_budget);

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
