// A file opened for zoe's I/O engine (O_DIRECT policy, alignment rules) and file-system probes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "zoe/status.h"

namespace zoe::io {

// What to do when the file system refuses O_DIRECT (tmpfs, some network file systems).
enum class DirectMode : uint8_t {
  kOff,      // buffered I/O through the page cache
  kRequire,  // O_DIRECT or a clear error
  kPrefer,   // O_DIRECT where possible, else buffered with a warning naming the path
};
const char* direct_mode_name(DirectMode m);

struct OpenOptions {
  bool write = false;   // open read-write (else read-only)
  bool create = false;  // create if missing (implies write)
  bool truncate = false;
  bool exclusive = false;  // with create: fail with kAlreadyExists (errno EEXIST) if the path exists
  DirectMode direct = DirectMode::kPrefer;
};

// Owns one file descriptor. Thread-safe for I/O; not copyable. id() is unique per process so
// engines can key registrations on it even when the kernel reuses an fd number.
class File {
 public:
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  static Result<std::unique_ptr<File>> open(const std::string& path, const OpenOptions& opts);

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t id() const { return id_; }
  bool direct() const { return direct_; }
  // O_DIRECT rules: the buffer address must be a multiple of mem_align(); offset and length of
  // offset_align(). Both are 1 for buffered files.
  uint32_t mem_align() const { return mem_align_; }
  uint32_t offset_align() const { return offset_align_; }

  Result<uint64_t> size() const;
  // Free bytes on the file's file system, asked through the descriptor: right even once the path
  // is unlinked (a SIGINT unlinks swap files at once and the run stops at its next step).
  Result<uint64_t> free_bytes() const;
  // The file system's device (st_dev), through the descriptor.
  Result<uint64_t> device() const;
  // Reserves [0, bytes) on disk (fallocate). ENOSPC names the path, the bytes and the space that
  // was free before the attempt; a failed attempt gives back what it reserved (best effort).
  Status preallocate(uint64_t bytes);
  // Advisory whole-file lock (flock LOCK_EX | LOCK_NB), held until the file is closed. Another
  // holder: kAlreadyExists with errno EWOULDBLOCK. Locks are per open file, so a second File on
  // the same path in the same process conflicts too. The lock is taken on a second open of the
  // path that is never registered with io_uring: a registered file stays referenced by the ring
  // until the kernel's deferred cleanup after the process dies, and a lock on it with it, so a
  // later job would take a dead job's swap file for a live one.
  Status try_lock();
  Status truncate(uint64_t bytes);
  Status sync();

 private:
  File(int fd, std::string path, bool direct, uint32_t mem_align, uint32_t offset_align);

  int fd_;
  int lock_fd_ = -1;  // a second open of the path that holds the flock (see try_lock)
  std::string path_;
  uint64_t id_;
  bool direct_;
  uint32_t mem_align_;
  uint32_t offset_align_;
};

struct FsInfo {
  std::string fs_type;  // "ext4", "xfs", "tmpfs", ... or "0x<magic>"
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;      // available to this user
  bool direct_io = false;       // O_DIRECT write+read of one block worked here
  std::string direct_io_error;  // why not, when it did not
  uint32_t dio_mem_align = 0;   // from statx, 0 when the kernel does not say
  uint32_t dio_offset_align = 0;
};

// Facts about the file system holding `dir` (a directory, created if missing when create_dir).
Result<FsInfo> probe_fs(const std::string& dir);
// Free bytes on the file system holding `path` (a file or directory).
Result<uint64_t> free_bytes_at(const std::string& path);

}  // namespace zoe::io
