// Where a config sends bytes off the accelerator: the user's words for zero_optimization's
// offload_optimizer.device / offload_param.device and zoe.activation_offload. One enum for all
// three (the engine's own word for where bytes are is a tier: device, host or NVMe).
#pragma once

#include <cstdint>

namespace zoe {

enum class Offload : uint8_t { kNone, kCpu, kNvme };
const char* offload_name(Offload o);  // "none", "cpu", "nvme"

}  // namespace zoe
