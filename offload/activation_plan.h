// The activation store's plan: which tier each saved tensor of a micro-batch lives in, made from
// the tensors' sizes against the budgets. Pure (no I/O, no state), so it is tested by itself.
//
// The rules, in order:
//   1. Everything stays on the device while the micro-batch's tensors fit the device share
//      (device_budget), and always with offload none.
//   2. The most recently saved tensor (keep_last) and every tensor under min_offload_bytes (and of
//      0 bytes) stay on the device, whatever the budgets.
//   3. Otherwise the earliest saved tensors (the last ones the backward needs) leave the device,
//      earliest first, until the rest fits the device share.
//   4. Of those, the latest go to pinned host memory while the host capacity lasts; the earlier
//      ones go to NVMe (offload nvme). With offload cpu, what does not fit the host is an error.
// A plan that cannot meet the budgets is kOutOfBudget naming the bytes and the budget it misses.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "offload/tier.h"
#include "zoe/activations.h"
#include "zoe/status.h"

namespace zoe::offload {

struct ActivationBudgets {
  ActivationOffload offload = ActivationOffload::kNone;
  uint64_t device_budget = 0;      // the device's activation share (bytes of saved tensors)
  uint64_t host_capacity = 0;      // bytes of saved tensors the host tier may hold
  uint64_t min_offload_bytes = 0;  // smaller tensors stay on the device
};

// One tier per size, in save order.
Result<std::vector<Tier>> plan_activations(std::span<const uint64_t> sizes, const ActivationBudgets& b);

}  // namespace zoe::offload
