// The activation plan: keep, then offload the earliest saved, nearest tier first from the latest.
#include "offload/activation_plan.h"

#include "core/units.h"

namespace zoe::offload {

namespace {

bool must_stay(std::span<const uint64_t> sizes, size_t i, const ActivationBudgets& b) {
  return i + 1 == sizes.size() || sizes[i] < b.min_offload_bytes || sizes[i] == 0;
}

// Marks the earliest offloadable tensors as leaving (kHost for now) until the rest fits the device
// share; returns the bytes still on the device.
uint64_t choose_leaving(std::span<const uint64_t> sizes, const ActivationBudgets& b, std::vector<Tier>* out) {
  uint64_t on_device = 0;
  for (uint64_t s : sizes) on_device += s;
  for (size_t i = 0; i < sizes.size() && on_device > b.device_budget; ++i) {
    if (must_stay(sizes, i, b)) continue;
    (*out)[i] = Tier::kHost;
    on_device -= sizes[i];
  }
  return on_device;
}

// The latest leaving tensors take the host while it lasts; the earlier ones go to NVMe. Returns
// the bytes that found no tier (offload cpu only).
uint64_t assign_far(std::span<const uint64_t> sizes, const ActivationBudgets& b, std::vector<Tier>* out) {
  uint64_t host = 0, homeless = 0;
  for (size_t k = sizes.size(); k-- > 0;) {
    if ((*out)[k] == Tier::kDevice) continue;
    if (host + sizes[k] <= b.host_capacity) {
      host += sizes[k];
      continue;
    }
    if (b.offload == ActivationOffload::kNvme) {
      (*out)[k] = Tier::kNvme;
    } else {
      homeless += sizes[k];
    }
  }
  return homeless;
}

}  // namespace

Result<std::vector<Tier>> plan_activations(std::span<const uint64_t> sizes, const ActivationBudgets& b) {
  std::vector<Tier> out(sizes.size(), Tier::kDevice);
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  if (total <= b.device_budget) return out;
  if (b.offload == ActivationOffload::kNone) {
    return out_of_budget(
        "activations: the micro-batch saves %llu bytes (%s), over the device's activation share "
        "of %llu bytes (zoe.activation_device_budget) and zoe.activation_offload is none",
        static_cast<unsigned long long>(total), format_bytes(total).c_str(),
        static_cast<unsigned long long>(b.device_budget));
  }
  uint64_t on_device = choose_leaving(sizes, b, &out);
  if (on_device > b.device_budget) {
    return out_of_budget(
        "activations: %llu bytes must stay on the device (the last saved tensor and those under "
        "zoe.activation_min_bytes = %llu), over the device's activation share of %llu bytes "
        "(zoe.activation_device_budget)",
        static_cast<unsigned long long>(on_device), static_cast<unsigned long long>(b.min_offload_bytes),
        static_cast<unsigned long long>(b.device_budget));
  }
  uint64_t homeless = assign_far(sizes, b, &out);
  if (homeless > 0) {
    return out_of_budget(
        "activations: %llu bytes do not fit the host's activation capacity of %llu bytes "
        "(zoe.activation_host_budget) with zoe.activation_offload cpu; raise it or use nvme",
        static_cast<unsigned long long>(homeless), static_cast<unsigned long long>(b.host_capacity));
  }
  return out;
}

}  // namespace zoe::offload
