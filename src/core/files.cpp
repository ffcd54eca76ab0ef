// The files a user names (zoe/files.h): outputs through a temporary beside the target, never over
// anything but a regular file nor inside a checkpoint; inputs opened without blocking, regular
// files only, read up to a cap.
#include "zoe/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdlib>

#include "core/checkpoint_names.h"
#include "core/units.h"

namespace zoe {
namespace {

const char* kind_of(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

std::string dir_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool exists_l(const std::string& p) {
  struct stat st;
  return lstat(p.c_str(), &st) == 0;
}

// A save directory: zoe's lock file, or a `latest` naming a checkpoint beside it.
bool is_save_dir(const std::string& d) {
  if (exists_l(d + "/" + ckpt::kLockName)) return true;
  auto latest = read_input_file(d + "/" + ckpt::kLatestName, "latest", 4096);
  if (!latest.is_ok()) return false;
  std::string tag = latest.value();
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ' || tag.back() == '\r')) tag.pop_back();
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos) return false;
  return exists_l(d + "/" + tag + "/" + ckpt::kManifestName);
}

bool is_checkpoint(const std::string& d) {
  return exists_l(d + "/" + ckpt::kManifestName) &&
         (exists_l(d + "/" + ckpt::kManifestChecksumName) || exists_l(d + "/" + ckpt::kFirstRankFileName));
}

constexpr char kReadsOnly[] = "zoe reads only regular files";
constexpr char kWritesOnly[] =
    "zoe writes its outputs only to regular files, which it replaces once complete";

Status not_regular(const std::string& what, const std::string& path, mode_t mode, const char* why) {
  return Status(StatusCode::kInvalidArgument,
                what + " " + path + " is " + kind_of(mode) + ", not a regular file: " + why);
}

// The output's target is a regular file or nothing, in a directory outside every checkpoint.
Status check_target(const std::string& target, const std::string& shown, const std::string& what) {
  struct stat st;
  if (lstat(target.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return not_regular(what, shown, st.st_mode, kWritesOnly);
  } else if (errno != ENOENT) {
    return sys_error("stat " + what, target, errno);
  }
  const std::string dir = dir_of(target);
  if (stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return Status(StatusCode::kNotFound, what + " " + shown + ": its directory " + dir + " does not exist",
                    ENOENT);
    }
    return sys_error("stat the directory of " + what, dir, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return invalid_argument("%s %s: %s is %s, not a directory", what.c_str(), shown.c_str(), dir.c_str(),
                            kind_of(st.st_mode));
  }
  const std::string ck = checkpoint_dir_containing(dir);
  if (!ck.empty()) {
    return invalid_argument(
        "%s %s lies inside the checkpoint save directory %s: zoe writes nothing else there (it could "
        "replace a checkpoint's files or its `latest` pointer); choose a path outside it",
        what.c_str(), shown.c_str(), ck.c_str());
  }
  return Status::ok();
}

// The file an output at `path` replaces: `path`, or where its symbolic links lead.
Result<std::string> output_target(const std::string& path, const std::string& what) {
  if (path.empty()) return invalid_argument("%s: an empty path", what.c_str());
  struct stat st;
  if (lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) != nullptr) return std::string(buf);
  if (errno != ENOENT) return sys_error("resolve the symbolic link " + what, path, errno);
  // A dangling link: the file it names is created (its directory resolved).
  char target[PATH_MAX];
  ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return sys_error("readlink " + what, path, errno);
  std::string t(target, static_cast<size_t>(n));
  if (t[0] != '/') t = dir_of(path) + "/" + t;
  if (realpath(dir_of(t).c_str(), buf) == nullptr) {
    return Status(StatusCode::kNotFound,
                  what + " " + path + " is a symbolic link to " + t + ", whose directory does not exist",
                  ENOENT);
  }
  return std::string(buf) + "/" + base_of(t);
}

}  // namespace

std::string checkpoint_dir_containing(const std::string& dir) {
  char buf[PATH_MAX];
  if (realpath(dir.c_str(), buf) == nullptr) return "";
  std::string checkpoint;
  for (std::string d = buf;; d = dir_of(d)) {
    if (is_save_dir(d)) return d;
    if (checkpoint.empty() && is_checkpoint(d)) checkpoint = d;
    if (d == "/") break;
  }
  return checkpoint;
}

Status check_output_path(const std::string& path, const std::string& what) {
  ZOE_ASSIGN_OR_RETURN(std::string target, output_target(path, what));
  return check_target(target, path, what);
}

Status check_output_dir(const std::string& dir, const std::string& what) {
  if (dir.empty()) return invalid_argument("%s: an empty path", what.c_str());
  struct stat st;
  const bool exists = stat(dir.c_str(), &st) == 0;
  if (exists && !S_ISDIR(st.st_mode)) {
    return invalid_argument("%s %s is %s, not a directory", what.c_str(), dir.c_str(), kind_of(st.st_mode));
  }
  const std::string ck = checkpoint_dir_containing(exists ? dir : dir_of(dir));
  if (!ck.empty()) {
    return invalid_argument(
        "%s %s lies inside the checkpoint save directory %s: zoe writes nothing else there; choose a "
        "directory outside it",
        what.c_str(), dir.c_str(), ck.c_str());
  }
  return Status::ok();
}

Result<OutputFile> OutputFile::create(const std::string& path, const std::string& what) {
  ZOE_ASSIGN_OR_RETURN(std::string target, output_target(path, what));
  ZOE_RETURN_IF_ERROR(check_target(target, path, what));
  static std::atomic<uint64_t> counter{0};
  OutputFile f;
  f.path_ = target;
  f.what_ = what;
  // Hidden, beside the target (a rename never crosses file systems), the name cut to fit NAME_MAX.
  const std::string base = base_of(target).substr(0, 200);
  for (int tries = 0; f.fd_ < 0; ++tries) {
    f.temp_ = dir_of(target) + "/." + base + ".tmp-" + std::to_string(getpid()) + "-" +
              std::to_string(counter.fetch_add(1));
    f.fd_ = open(f.temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f.fd_ < 0 && (errno != EEXIST || tries > 100)) {
      return sys_error("create the temporary file of " + what + " " + path, f.temp_, errno);
    }
  }
  f.pending_ = true;
  struct stat st;
  if (stat(target.c_str(), &st) == 0 && S_ISREG(st.st_mode)) fchmod(f.fd_, st.st_mode & 07777);
  return f;
}

OutputFile::OutputFile(OutputFile&& o) noexcept
    : fd_(o.fd_),
      path_(std::move(o.path_)),
      temp_(std::move(o.temp_)),
      what_(std::move(o.what_)),
      pending_(o.pending_) {
  o.fd_ = -1;
  o.pending_ = false;
}

OutputFile& OutputFile::operator=(OutputFile&& o) noexcept {
  if (this != &o) {
    discard();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    temp_ = std::move(o.temp_);
    what_ = std::move(o.what_);
    pending_ = o.pending_;
    o.fd_ = -1;
    o.pending_ = false;
  }
  return *this;
}

OutputFile::~OutputFile() { discard(); }

void OutputFile::discard() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  if (pending_) unlink(temp_.c_str());
  pending_ = false;
}

Status OutputFile::write(const void* data, size_t bytes) {
  if (fd_ < 0) return internal_error("write to %s %s after commit", what_.c_str(), path_.c_str());
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < bytes;) {
    ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return sys_error("write " + what_ + " " + path_ + " (its temporary)", temp_, done, bytes - done,
                       n < 0 ? errno : ENOSPC);
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status OutputFile::close_temp() {
  if (fd_ < 0) return Status::ok();
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) return sys_error("close " + what_ + " " + path_ + " (its temporary)", temp_, errno);
  return Status::ok();
}

Status OutputFile::commit() {
  if (!pending_) return internal_error("commit of %s %s: nothing written", what_.c_str(), path_.c_str());
  Status s;
  if (fd_ >= 0 && fsync(fd_) != 0) s = sys_error("fsync " + what_ + " (its temporary)", temp_, errno);
  if (s.is_ok()) s = close_temp();
  // Something may have appeared at the path since create(): it is checked again.
  if (s.is_ok()) s = check_target(path_, path_, what_);
  if (s.is_ok() && rename(temp_.c_str(), path_.c_str()) != 0) {
    s = sys_error("rename the temporary of " + what_ + " to " + path_, temp_, errno);
  }
  if (!s.is_ok()) {
    discard();
    return s;
  }
  pending_ = false;
  const std::string dir = dir_of(path_);
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // best effort: some file systems refuse fsync on a directory
    fsync(dfd);
    close(dfd);
  }
  return Status::ok();
}

Status write_output_file(const std::string& path, const std::string& bytes, const std::string& what) {
  ZOE_ASSIGN_OR_RETURN(OutputFile f, OutputFile::create(path, what));
  ZOE_RETURN_IF_ERROR(f.write(bytes));
  return f.commit();
}

Result<int> open_input_file(const std::string& path, const std::string& what) {
  struct stat st;
  // stat first: opening a device can have effects of its own, whatever is read.
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status(StatusCode::kNotFound, what + " " + path + " does not exist", ENOENT);
    return sys_error("stat " + what, path, errno);
  }
  if (!S_ISREG(st.st_mode)) return not_regular(what, path, st.st_mode, kReadsOnly);
  // O_NONBLOCK: should a FIFO have taken the file's place since, the open does not wait for a writer.
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return sys_error("open " + what, path, errno);
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    close(fd);
    if (!S_ISREG(st.st_mode)) return not_regular(what, path, st.st_mode, kReadsOnly);
    return sys_error("fstat " + what, path, err);
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    close(fd);
    return sys_error("fcntl " + what, path, err);
  }
  return fd;
}

Result<std::string> read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  ZOE_ASSIGN_OR_RETURN(int fd, open_input_file(path, what));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) return sys_error("fstat " + what, path, errno);
  auto too_big = [&](const std::string& size) {
    return invalid_argument("%s %s holds %smore than the %" PRIu64 " bytes (%s) zoe reads from it",
                            what.c_str(), path.c_str(), size.c_str(), max_bytes,
                            format_bytes(max_bytes).c_str());
  };
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) return too_big(std::to_string(size) + " bytes (" + format_bytes(size) + "): ");
  std::string out;
  out.reserve(size);
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("read " + what, path, out.size(), sizeof buf, errno);
    }
    if (n == 0) break;
    if (out.size() + static_cast<uint64_t>(n) > max_bytes) return too_big("");  // grew while read
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace zoe
