// Helpers for the checkpoint code: whole writes/reads, fsyncs, atomic small files, conversions.
#include "checkpoint/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "checkpoint/checkpoint.h"
#include "core/dtype.h"
#include "zoe/files.h"

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

Result<std::string> read_small_file(const std::string& path, uint64_t max_bytes) {
  // A FIFO in the file's place would block a plain open forever: refused, as a device is.
  ZOE_ASSIGN_OR_RETURN(int fd, open_input_file(path, "checkpoint file"));
  FdGuard g(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) return sys_error("fstat", path, errno);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return corruption("%s has %" PRIu64 " bytes, more than the %" PRIu64 " such a file may have (corrupted?)",
                      path.c_str(), static_cast<uint64_t>(st.st_size), max_bytes);
  }
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
    if (out.size() > max_bytes) {  // grew while being read
      return corruption("%s has more than the %" PRIu64 " bytes such a file may have (corrupted?)",
                        path.c_str(), max_bytes);
    }
  }
  return out;
}

bool is_hex64(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string printable(const std::string& bytes, size_t max_bytes) {
  std::string out = "\"";
  const size_t n = std::min(bytes.size(), max_bytes);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char esc[8];
      snprintf(esc, sizeof(esc), "\\x%02x", c);
      out += esc;
    }
  }
  out += n < bytes.size() ? "...\"" : "\"";
  if (n < bytes.size()) out += " (" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

void convert_elements(const std::string& from, const void* src, const std::string& to, void* dst, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * dtype_bytes(from));
    return;
  }
  auto load = [&](size_t i) -> float {
    if (from == "f32") {
      float f;
      std::memcpy(&f, static_cast<const char*>(src) + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(src) + 2 * i, 2);
    return from == "bf16" ? bf16_to_f32(h) : f16_to_f32(h);
  };
  if (to == "f32") {
    auto* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = load(i);
  } else if (to == "bf16") {
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(load(i));
  } else {
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(load(i));
  }
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
