// The names of the offload settings (zoe/offload.h, zoe/activations.h).
#include "zoe/activations.h"

namespace zoe {

const char* offload_name(Offload o) {
  switch (o) {
    case Offload::kNone:
      return "none";
    case Offload::kCpu:
      return "cpu";
    case Offload::kNvme:
      return "nvme";
  }
  return "?";
}

const char* activation_offload_name(ActivationOffload o) { return offload_name(o); }

Result<ActivationOffload> parse_activation_offload(const std::string& name) {
  if (name == "none") return ActivationOffload::kNone;
  if (name == "cpu") return ActivationOffload::kCpu;
  if (name == "nvme") return ActivationOffload::kNvme;
  return invalid_argument("activation offload \"%s\": expected none, cpu or nvme", name.c_str());
}

}  // namespace zoe
