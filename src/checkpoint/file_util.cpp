// POSIX helpers for the checkpoint code: whole writes/reads, fsyncs, atomic small files.
#include "checkpoint/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>

namespace zoe::ckpt::detail {

FdGuard::~FdGuard() {
  if (fd >= 0) close(fd);
}

Status pwrite_all(int fd, const std::string& path, const void* data, size_t bytes, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = pwrite(fd, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("pwrite", path, offset + done, bytes - done, errno);
    }
    if (n == 0) return sys_error("pwrite", path, offset + done, bytes - done, ENOSPC);
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status pread_all(int fd, const std::string& path, void* data, size_t bytes, uint64_t offset) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = pread(fd, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("pread", path, offset + done, bytes - done, errno);
    }
    if (n == 0) {
      return corruption("short read of %s: %zu bytes at offset %" PRIu64 " asked, the file ends at %" PRIu64
                        " (truncated?)",
                        path.c_str(), bytes, offset, offset + done);
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status fsync_fd(int fd, const std::string& path) {
  if (fsync(fd) != 0) return sys_error("fsync", path, errno);
  return Status::ok();
}

Status fsync_dir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return sys_error("open directory", dir, errno);
  FdGuard g(fd);
  // Some file systems refuse fsync on a directory (EINVAL); nothing more can be done there.
  if (fsync(fd) != 0 && errno != EINVAL) return sys_error("fsync directory", dir, errno);
  return Status::ok();
}

Status write_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp-" + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return sys_error("create", tmp, errno);
  Status s;
  {
    FdGuard g(fd);
    s = pwrite_all(fd, tmp, text.data(), text.size(), 0);
    if (s.is_ok()) s = fsync_fd(fd, tmp);
    if (s.is_ok() && close(g.release()) != 0) s = sys_error("close", tmp, errno);
  }
  if (s.is_ok() && rename(tmp.c_str(), path.c_str()) != 0) s = sys_error("rename to " + path, tmp, errno);
  if (!s.is_ok()) {
    unlink(tmp.c_str());
    return s;
  }
  return fsync_dir(parent_dir(path));
}

Result<std::string> read_small_file(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return sys_error("open", path, errno);
  FdGuard g(fd);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("read", path, out.size(), sizeof(buf), errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string hex64(uint64_t v) {
  char buf[17];
  snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace zoe::ckpt::detail
