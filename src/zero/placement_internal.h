// The placement planner's internals shared by its files (placement.cpp: the modules, resident
// states, swapper, own buffers and peaks; placement_tiers.cpp: stage 3's tier manager and gather
// window). Not part of the planner's interface (zero/placement.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "config/config.h"
#include "zero/placement.h"

namespace zoe::zero::detail {

inline uint64_t u64(size_t v) { return static_cast<uint64_t>(v); }

// What the rules after the modules' layout need to know of it.
struct Extent {
  size_t biggest = 0;            // the largest padded module (elements)
  size_t biggest_part_nvme = 0;  // the largest NVMe-homed partition (elements)
  bool any_partitioned = false, any_opt_nvme = false;
  bool nvme_tier = false;  // optimizer states or parameters offloaded to NVMe
  // Device memory kept free for a gathered module, its gradients and their reduction.
  uint64_t reserve = 0;
  // The cost per element of a gathered module queued ahead of use (the module and a copy of the
  // partition).
  uint64_t per_elem = 0;
  uint64_t tm_budget = 0;  // the tier manager's device budget, as it caps it
};

// A partitioned module whose gathered bytes are its partition's own (world size 1): fetch serves
// the partition in place, pinned in the tier manager's device share, with no gathered copy.
inline bool served_in_place(const ModulePlacement& m) { return m.partitioned_params && m.part == m.padded; }

// Host bytes of every NVMe-homed partition's host copy (placement_tiers.cpp).
uint64_t nvme_part_bytes(const Placement& pl);

// Device bytes one module in use moves at once (placement.cpp).
uint64_t moving_device_bytes(const Placement& pl);

// 4. Stage-3 partitions: the tier manager's budgets and buffers, and the gather window
//    (placement_tiers.cpp).
void plan_tier_manager(const config::Config& cfg, const PlanTarget& target, Extent* x, Placement* pl);

}  // namespace zoe::zero::detail
