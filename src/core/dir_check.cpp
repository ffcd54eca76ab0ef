// check_dir_holds_files: stat, access, statfs and a probe file, each failure said as it is.
#include "core/dir_check.h"

#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace zoe {

namespace {

// The name of a kernel pseudo file system (procfs, sysfs...), which holds no files of ours;
// nullptr for any other.
const char* pseudo_fs_name(const struct statfs& fs) {
  switch (static_cast<unsigned long>(fs.f_type)) {
    case PROC_SUPER_MAGIC:
      return "procfs";
    case SYSFS_MAGIC:
      return "sysfs";
    case DEBUGFS_MAGIC:
      return "debugfs";
    case TRACEFS_MAGIC:
      return "tracefs";
    case CGROUP_SUPER_MAGIC:
      return "cgroupfs";
    case CGROUP2_SUPER_MAGIC:
      return "cgroup2fs";
    case DEVPTS_SUPER_MAGIC:
      return "devpts";
    case SECURITYFS_MAGIC:
      return "securityfs";
    case BPF_FS_MAGIC:
      return "bpffs";
    case PSTOREFS_MAGIC:
      return "pstore";
    case EFIVARFS_MAGIC:
      return "efivarfs";
    default:
      return nullptr;
  }
}

Status dir_error(StatusCode code, const std::string& what, const std::string& dir, const std::string& why,
                 int err = 0) {
  return Status(code, what + ": '" + dir + "' " + why, err);
}

}  // namespace

Status check_dir_holds_files(const std::string& what, const std::string& dir) {
  if (dir.find('\0') != std::string::npos) {
    return dir_error(StatusCode::kInvalidArgument, what, dir, "contains a NUL byte (not a usable path)");
  }
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return dir_error(StatusCode::kNotFound, what, dir, "does not exist", err);
    return dir_error(StatusCode::kInvalidArgument, what, dir,
                     std::string("cannot be examined: ") + strerror(err), err);
  }
  if (!S_ISDIR(st.st_mode)) return dir_error(StatusCode::kInvalidArgument, what, dir, "is not a directory");
  struct statfs fs {};
  if (statfs(dir.c_str(), &fs) == 0) {
    if (const char* name = pseudo_fs_name(fs)) {
      return dir_error(
          StatusCode::kInvalidArgument, what, dir,
          std::string("is on ") + name +
              ", a kernel pseudo file system that cannot hold files; choose a directory on a drive");
    }
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    return dir_error(StatusCode::kPermissionDenied, what, dir,
                     std::string("is not writable: ") + strerror(err), err);
  }
  std::string probe = dir + "/.zoe-probe-XXXXXX";
  const int fd = mkstemp(probe.data());
  if (fd < 0) {
    const int err = errno;
    const bool denied = err == EACCES || err == EPERM || err == EROFS;
    return dir_error(denied ? StatusCode::kPermissionDenied : StatusCode::kInvalidArgument, what, dir,
                     std::string("cannot hold files: creating one there fails: ") + strerror(err), err);
  }
  close(fd);
  unlink(probe.c_str());
  return Status::ok();
}

}  // namespace zoe
