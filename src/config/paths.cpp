// check_paths: the nvme_path directories of a Config, examined on the file system.
#include "config/paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

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
  for (const auto& d : o.nvme_path) {
    if (d.find('\0') != std::string::npos) {
      return invalid_argument("%s: '%s' contains a NUL byte (not a usable path)", key.c_str(), d.c_str());
    }
    struct stat st {};
    if (stat(d.c_str(), &st) != 0) {
      const int err = errno;
      return Status(
          err == ENOENT ? StatusCode::kNotFound : StatusCode::kInvalidArgument,
          key + ": '" + d + "' " +
              (err == ENOENT ? "does not exist" : "cannot be examined: " + std::string(strerror(err))),
          err);
    }
    if (!S_ISDIR(st.st_mode)) return invalid_argument("%s: '%s' is not a directory", key.c_str(), d.c_str());
    if (access(d.c_str(), W_OK | X_OK) != 0) {
      const int err = errno;
      return Status(StatusCode::kPermissionDenied, key + ": '" + d + "' is not writable: " + strerror(err),
                    err);
    }
  }
  return Status::ok();
}

}  // namespace

Status check_paths(const Config& c) {
  ZOE_RETURN_IF_ERROR(check_dirs(c.zero.offload_optimizer, "offload_optimizer"));
  return check_dirs(c.zero.offload_param, "offload_param");
}

}  // namespace zoe::config
