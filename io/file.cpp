// File: open with the O_DIRECT policy, alignment discovery, preallocation; file-system probes.
#include "io/file.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/log.h"
#include "core/units.h"

namespace zoe::io {
namespace {

std::atomic<uint64_t> g_next_file_id{1};

void dio_alignment(int fd, uint32_t* mem_align, uint32_t* offset_align) {
  *mem_align = 4096;
  *offset_align = 512;
#ifdef STATX_DIOALIGN
  struct statx stx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) &&
      stx.stx_dio_offset_align != 0) {
    *mem_align = stx.stx_dio_mem_align ? stx.stx_dio_mem_align : 4096;
    *offset_align = stx.stx_dio_offset_align;
  }
#endif
}

const char* fs_name(unsigned long magic) {
  switch (magic) {
    case EXT4_SUPER_MAGIC:
      return "ext4";  // also ext2/ext3
    case 0x58465342:
      return "xfs";
    case BTRFS_SUPER_MAGIC:
      return "btrfs";
    case TMPFS_MAGIC:
      return "tmpfs";
    case NFS_SUPER_MAGIC:
      return "nfs";
    case OVERLAYFS_SUPER_MAGIC:
      return "overlay";
    case 0x2fc12fc1:
      return "zfs";
    case 0x65735546:
      return "fuse";
    case 0xFF534D42:
      return "cifs";
    case 0xF2F52010:
      return "f2fs";
    default:
      return nullptr;
  }
}

}  // namespace

const char* direct_mode_name(DirectMode m) {
  switch (m) {
    case DirectMode::kOff:
      return "off";
    case DirectMode::kRequire:
      return "require";
    case DirectMode::kPrefer:
      return "prefer";
  }
  return "?";
}

File::File(int fd, std::string path, bool direct, uint32_t mem_align, uint32_t offset_align)
    : fd_(fd),
      path_(std::move(path)),
      id_(g_next_file_id.fetch_add(1)),
      direct_(direct),
      mem_align_(mem_align),
      offset_align_(offset_align) {}

File::~File() {
  if (lock_fd_ >= 0) close(lock_fd_);
  if (fd_ >= 0) close(fd_);
}

Result<std::unique_ptr<File>> File::open(const std::string& path, const OpenOptions& opts) {
  int flags = O_CLOEXEC;
  flags |= (opts.write || opts.create) ? O_RDWR : O_RDONLY;
  if (opts.create) flags |= O_CREAT;
  if (opts.truncate) flags |= O_TRUNC;
  if (opts.create && opts.exclusive) flags |= O_EXCL;
  bool want_direct = opts.direct != DirectMode::kOff;
  int fd = ::open(path.c_str(), flags | (want_direct ? O_DIRECT : 0), 0644);
  bool direct = want_direct;
  if (fd < 0 && want_direct && errno == EINVAL) {
    // EINVAL on open with O_DIRECT: the file system does not support it. The kernel checks this
    // after creating the file, so with O_EXCL (which passed) the file is new and ours.
    if (flags & O_EXCL) {
      flags &= ~O_EXCL;
      if (opts.direct == DirectMode::kRequire) unlink(path.c_str());
    }
    if (opts.direct == DirectMode::kRequire) {
      return unsupported(
          "%s: this file system does not support O_DIRECT (open returned EINVAL). Put swap files "
          "on a local disk file system (ext4, xfs), or set direct I/O off to use the page cache.",
          path.c_str());
    }
    ZOE_LOG_WARN(
        "%s: O_DIRECT is not supported here; using buffered I/O through the page cache "
        "(slower, and uses host RAM for caching)",
        path.c_str());
    direct = false;
    fd = ::open(path.c_str(), flags, 0644);
  }
  if (fd < 0 && errno == EEXIST && (flags & O_EXCL)) {
    return Status(StatusCode::kAlreadyExists, path + " already exists (open with O_CREAT | O_EXCL)", EEXIST);
  }
  if (fd < 0) return sys_error("open", path, errno);
  uint32_t mem_align = 1, offset_align = 1;
  if (direct) dio_alignment(fd, &mem_align, &offset_align);
  return std::unique_ptr<File>(new File(fd, path, direct, mem_align, offset_align));
}

Result<uint64_t> File::size() const {
  struct stat st;
  if (fstat(fd_, &st) != 0) return sys_error("fstat", path_, errno);
  return static_cast<uint64_t>(st.st_size);
}

Status File::preallocate(uint64_t bytes) {
  if (bytes == 0) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(uint64_t old_size, size());
  // Measured first: a failed fallocate may hold blocks until it is undone below, and the free
  // space it leaves says nothing about what the request met.
  auto fb = free_bytes_at(path_);
  int rc = posix_fallocate(fd_, 0, static_cast<off_t>(bytes));
  if (rc == 0) return Status::ok();
  // Some file systems (ext4) keep the blocks a failed fallocate reserved past the old end of file.
  if (bytes > old_size && ftruncate(fd_, static_cast<off_t>(old_size)) == 0) {
    (void)fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(old_size),
                    static_cast<off_t>(bytes - old_size));
  }
  if (rc == ENOSPC || rc == EFBIG || rc == EDQUOT) {
    std::string free_s = fb.is_ok() ? std::to_string(fb.value()) + " bytes (" + format_bytes(fb.value()) + ")"
                                    : "an unknown number of bytes (" + fb.status().message() + ")";
    return Status(
        StatusCode::kNoSpace,
        "While preallocating " + std::to_string(bytes) + " bytes (" + format_bytes(bytes) + ") for " + path_ +
            " (growing it from " + std::to_string(old_size) + " bytes, " +
            std::to_string(bytes - std::min(bytes, old_size)) + " more): " + strerror(rc) + " (errno " +
            std::to_string(rc) + "); " +
            (rc == EFBIG ? std::string("the process's file-size limit (ulimit -f) is below that size")
                         : free_s + " were free there before the attempt"),
        rc);
  }
  return sys_error("fallocate", path_, 0, bytes, rc);
}

Status File::try_lock() {
  if (lock_fd_ < 0) {
    lock_fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (lock_fd_ < 0) return sys_error("open (for its lock)", path_, errno);
  }
  while (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      return Status(StatusCode::kAlreadyExists,
                    path_ + " is locked by another open file (flock LOCK_EX): another job is using it",
                    errno);
    }
    return sys_error("flock LOCK_EX", path_, errno);
  }
  return Status::ok();
}

Status File::truncate(uint64_t bytes) {
  if (ftruncate(fd_, static_cast<off_t>(bytes)) != 0) return sys_error("ftruncate", path_, 0, bytes, errno);
  return Status::ok();
}

Status File::sync() {
  if (fdatasync(fd_) != 0) return sys_error("fdatasync", path_, errno);
  return Status::ok();
}

Result<uint64_t> File::free_bytes() const {
  struct statvfs vfs;
  if (fstatvfs(fd_, &vfs) != 0) return sys_error("fstatvfs", path_, errno);
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

Result<uint64_t> File::device() const {
  struct stat st;
  if (fstat(fd_, &st) != 0) return sys_error("fstat", path_, errno);
  return static_cast<uint64_t>(st.st_dev);
}

Result<uint64_t> free_bytes_at(const std::string& path) {
  struct statvfs vfs;
  if (statvfs(path.c_str(), &vfs) != 0) return sys_error("statvfs", path, errno);
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

Result<FsInfo> probe_fs(const std::string& dir) {
  FsInfo info;
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return sys_error("stat", dir, errno);
  if (!S_ISDIR(st.st_mode)) return invalid_argument("%s is not a directory", dir.c_str());
  struct statfs sfs;
  if (statfs(dir.c_str(), &sfs) != 0) return sys_error("statfs", dir, errno);
  const char* name = fs_name(static_cast<unsigned long>(sfs.f_type));
  if (name) {
    info.fs_type = name;
  } else {
    char buf[32];
    snprintf(buf, sizeof(buf), "0x%lx", static_cast<unsigned long>(sfs.f_type));
    info.fs_type = buf;
  }
  struct statvfs vfs;
  if (statvfs(dir.c_str(), &vfs) != 0) return sys_error("statvfs", dir, errno);
  info.total_bytes = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  info.free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;

  // O_DIRECT probe: write one aligned block, read it back, compare.
  std::string tmpl = dir + "/.zoe-dio-probe-XXXXXX";
  std::string path = tmpl;
  int fd = mkstemp(path.data());
  if (fd < 0) {
    info.direct_io_error = sys_error("create probe file in", dir, errno).message();
    return info;
  }
  close(fd);
  fd = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    info.direct_io_error = errno == EINVAL ? "open with O_DIRECT returned EINVAL (not supported)"
                                           : sys_error("open O_DIRECT", path, errno).message();
    unlink(path.c_str());
    return info;
  }
  uint32_t mem_align = 0, off_align = 0;
  dio_alignment(fd, &mem_align, &off_align);
#ifdef STATX_DIOALIGN
  struct statx stx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN)) {
    info.dio_mem_align = stx.stx_dio_mem_align;
    info.dio_offset_align = stx.stx_dio_offset_align;
  }
#endif
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, 8192) != 0) {
    close(fd);
    unlink(path.c_str());
    return internal_error("out of memory");
  }
  auto* b = static_cast<unsigned char*>(buf);
  for (int i = 0; i < 4096; ++i) b[i] = static_cast<unsigned char>(i * 7 + 3);
  ssize_t w = pwrite(fd, b, 4096, 0);
  if (w != 4096) {
    info.direct_io_error =
        w < 0 ? sys_error("pwrite O_DIRECT", path, 0, 4096, errno).message() : "short O_DIRECT write";
  } else {
    memset(b + 4096, 0, 4096);
    ssize_t r = pread(fd, b + 4096, 4096, 0);
    if (r != 4096) {
      info.direct_io_error =
          r < 0 ? sys_error("pread O_DIRECT", path, 0, 4096, errno).message() : "short O_DIRECT read";
    } else if (memcmp(b, b + 4096, 4096) != 0) {
      info.direct_io_error = "O_DIRECT read returned different bytes than were written";
    } else {
      info.direct_io = true;
    }
  }
  free(buf);
  close(fd);
  unlink(path.c_str());
  return info;
}

}  // namespace zoe::io
