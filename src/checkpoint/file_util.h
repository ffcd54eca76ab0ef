// Small helpers the checkpoint code shares: whole writes/reads with errno-naming errors,
// directory fsync, xxh64 in hex, safe display of untrusted bytes, dtype conversion. Private to
// src/checkpoint.
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
// The whole file; one larger than max_bytes is kCorruption (naming its size and the cap) and is
// not read. Anything but a regular file (a FIFO, a device, a directory) is refused without
// blocking (zoe/files.h's open_input_file).
Result<std::string> read_small_file(const std::string& path, uint64_t max_bytes);
std::string hex64(uint64_t v);        // 16 lower-case hex digits
bool is_hex64(const std::string& s);  // 16 lower-case hex digits?
std::string parent_dir(const std::string& path);
// Untrusted bytes for a message: quoted, at most max_bytes shown, every byte outside printable
// ASCII (and '"', '\\') escaped as \xNN, the length added when it was cut: "ab\x00c" or
// "abc..." (1000 bytes).
std::string printable(const std::string& bytes, size_t max_bytes = 64);
// Converts n elements between "f32", "bf16", "f16" (exact when widening, RNE when narrowing).
void convert_elements(const std::string& from, const void* src, const std::string& to, void* dst, size_t n);

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
