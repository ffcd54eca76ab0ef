// check_paths: the nvme_path directories of a Config, examined on the file system.
#include "config/paths.h"

#include <string>

#include "core/dir_check.h"

namespace zoe::config {

namespace {

Status check_dirs(const OffloadConfig& o, const char* block) {
  if (o.device != OffloadDevice::kNvme) return Status::ok();
  const std::string key = std::string("zero_optimization.") + block + ".nvme_path";
  if (o.nvme_path.empty()) {
    return invalid_argument(
        "zero_optimization.%s.device: \"nvme\" needs %s (a directory on the NVMe drive, "
        "or a list of them)",
        block, key.c_str());
  }
  for (const auto& d : o.nvme_path) ZOE_RETURN_IF_ERROR(check_dir_holds_files(key, d));
  return Status::ok();
}

}  // namespace

Status check_paths(const Config& c) {
  ZOE_RETURN_IF_ERROR(check_dirs(c.zero.offload_optimizer, "offload_optimizer"));
  return check_dirs(c.zero.offload_param, "offload_param");
}

}  // namespace zoe::config
