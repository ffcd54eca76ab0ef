// Small POSIX helpers the checkpoint code shares: whole writes/reads with errno-naming errors,
// directory fsync, xxh64 in hex. Private to src/checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "zoe/status.h"

namespace zoe::ckpt::detail {

// Writes all `bytes` at `offset` (retrying short writes and EINTR). ENOSPC -> kNoSpace naming
// the path, the offset and the byte count.
Status pwrite_all(int fd, const std::string& path, const void* data, size_t bytes, uint64_t offset);
// Reads exactly `bytes` at `offset`; a short read (the file ended early) is kCorruption.
Status pread_all(int fd, const std::string& path, void* data, size_t bytes, uint64_t offset);
Status fsync_fd(int fd, const std::string& path);
// Opens `dir` and fsyncs it, so that a rename or a new entry inside it is durable.
Status fsync_dir(const std::string& dir);
// Writes `text` to `path` through `path`.tmp-<pid>: write, fsync, rename, fsync the parent.
Status write_file_atomic(const std::string& path, const std::string& text);
Result<std::string> read_small_file(const std::string& path);
std::string hex64(uint64_t v);  // 16 lower-case hex digits
std::string parent_dir(const std::string& path);

// Closes the descriptor on scope exit.
struct FdGuard {
  int fd = -1;
  explicit FdGuard(int f) : fd(f) {}
  ~FdGuard();
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int release() {
    int f = fd;
    fd = -1;
    return f;
  }
};

}  // namespace zoe::ckpt::detail
