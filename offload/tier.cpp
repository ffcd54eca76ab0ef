// Names of the tiers and links; TierStats' named link fields by Link.
#include "offload/tier.h"

namespace zoe::offload {

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
  }
  return "?";
}

const char* link_name(Link l) {
  switch (l) {
    case Link::kNvmeToHost:
      return "nvme->host";
    case Link::kHostToNvme:
      return "host->nvme";
    case Link::kHostToDevice:
      return "host->device";
    case Link::kDeviceToHost:
      return "device->host";
    case Link::kNvmeToDevice:
      return "nvme->device";
    case Link::kDeviceToNvme:
      return "device->nvme";
  }
  return "?";
}

LinkStats& TierStats::link(Link l) {
  return const_cast<LinkStats&>(static_cast<const TierStats*>(this)->link(l));
}

const LinkStats& TierStats::link(Link l) const {
  switch (l) {
    case Link::kNvmeToHost:
      return nvme_to_host;
    case Link::kHostToNvme:
      return host_to_nvme;
    case Link::kHostToDevice:
      return host_to_device;
    case Link::kDeviceToHost:
      return device_to_host;
    case Link::kNvmeToDevice:
      return nvme_to_device;
    case Link::kDeviceToNvme:
      return device_to_nvme;
  }
  return nvme_to_host;  // unreachable: every Link is listed
}

}  // namespace zoe::offload
