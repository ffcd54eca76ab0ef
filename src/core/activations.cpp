// The names of zoe.activation_offload's settings (zoe/activations.h).
#include "zoe/activations.h"

namespace zoe {

const char* activation_offload_name(ActivationOffload o) {
  switch (o) {
    case ActivationOffload::kNone:
      return "none";
    case ActivationOffload::kCpu:
      return "cpu";
    case ActivationOffload::kNvme:
      return "nvme";
  }
  return "?";
}

Result<ActivationOffload> parse_activation_offload(const std::string& name) {
  if (name == "none") return ActivationOffload::kNone;
  if (name == "cpu") return ActivationOffload::kCpu;
  if (name == "nvme") return ActivationOffload::kNvme;
  return invalid_argument("activation offload \"%s\": expected none, cpu or nvme", name.c_str());
}

}  // namespace zoe
