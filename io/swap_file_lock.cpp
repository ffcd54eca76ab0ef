// SwapFile, locking and reclaim: the files' names (unique per job, or kept and stable), their
// flocks, the per-directory lock that orders creation against other jobs' scans, the reclaim of
// the stale swap files of dead processes, the live-file list removed on an abnormal exit (also as
// zoe/runtime.h's remove_swap_files_now()), and create(), which takes these locks before it sizes
// the files (swap_file_growth.cpp).
#include "io/swap_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "core/log.h"
#include "core/units.h"
#include "zoe/runtime.h"

namespace zoe::io {

namespace {
// The paths of this process's live swap files that are removed at close.
std::mutex g_live_mu;
std::vector<std::string>& live_paths() {
  static std::vector<std::string> v;
  return v;
}
void forget_live(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  auto& v = live_paths();
  v.erase(std::remove(v.begin(), v.end(), path), v.end());
}
}  // namespace

namespace {

constexpr int kNameAttempts = 16;

uint64_t default_random() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

std::string hex16(uint64_t v) {
  char b[17];
  snprintf(b, sizeof(b), "%016" PRIx64, v);
  return b;
}

constexpr uint64_t kLockWaitSayS = 3;
constexpr uint64_t kLockWaitRepeatS = 60;

uint64_t now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec);
}

// Who holds the flock on the file (dev, ino), from /proc/locks: "PID N (name)", or what is known.
std::string lock_holder(dev_t dev, ino_t ino) {
  std::ifstream in("/proc/locks");
  char want[64];
  snprintf(want, sizeof want, "%02x:%02x:%llu", major(dev), minor(dev), static_cast<unsigned long long>(ino));
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string n, kind, mode, rw, pid, where;
    if (!(f >> n >> kind) || kind == "->" || !(f >> mode >> rw >> pid >> where)) continue;
    if (kind != "FLOCK" || where != want) continue;
    std::ifstream c("/proc/" + pid + "/comm");
    std::string comm;
    std::getline(c, comm);
    return "PID " + pid + (comm.empty() ? "" : " (" + comm + ")");
  }
  return "another process (not found in /proc/locks)";
}

// flock(LOCK_EX) on a directory, held while create() scans it and creates and locks its own files,
// so that a scan never meets a file between its creation and its lock. Not every file system
// supports it (some network ones); then locked() is false and nothing is reclaimed there.
class DirLock {
 public:
  DirLock() = default;
  DirLock(DirLock&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), locked_(o.locked_), dev_(o.dev_), ino_(o.ino_) {}
  DirLock& operator=(DirLock&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(locked_, o.locked_);
    std::swap(dev_, o.dev_);
    std::swap(ino_, o.ino_);
    return *this;
  }
  ~DirLock() {
    if (fd_ >= 0) close(fd_);  // releases the lock
  }

  // Opens dir; lock() takes the lock (separately, so that callers can skip a directory they hold).
  static Result<DirLock> open(const std::string& dir) {
    DirLock l;
    l.fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (l.fd_ < 0) {
      int err = errno;
      if (err == ENOENT) {
        return not_found("swap directory %s does not exist (create it, or fix nvme_path)", dir.c_str());
      }
      if (err == ENOTDIR)
        return invalid_argument("swap directory %s is not a directory (nvme_path)", dir.c_str());
      return sys_error("open swap directory", dir, err);
    }
    struct stat st;
    if (fstat(l.fd_, &st) != 0) return sys_error("fstat", dir, errno);
    l.dev_ = st.st_dev;
    l.ino_ = st.st_ino;
    return l;
  }
  static Result<DirLock> take(const std::string& dir) {
    ZOE_ASSIGN_OR_RETURN(DirLock l, open(dir));
    l.lock(dir);
    return l;
  }
  // Waits for the lock. Another job holds it while it creates its swap files or removes stale ones
  // (minutes for large files on some file systems): after kLockWaitSayS seconds the wait is said
  // once, with the directory and the holder's PID, and again every kLockWaitRepeatS seconds.
  void lock(const std::string& dir) {
    int rc;
    const uint64_t t0 = now_s();
    uint64_t said = 0;
    while ((rc = flock(fd_, LOCK_EX | LOCK_NB)) != 0 && (errno == EINTR || errno == EWOULDBLOCK)) {
      const uint64_t waited = now_s() - t0;
      if (waited >= kLockWaitSayS && (said == 0 || waited >= said + kLockWaitRepeatS)) {
        said = waited;
        ZOE_LOG_WARN(
            "waiting %llu s for the lock on swap directory %s, held by %s (a zoe job creating its "
            "swap files there or removing stale ones of dead processes, which takes long for large "
            "files); this job goes on once it is released",
            static_cast<unsigned long long>(waited), dir.c_str(), lock_holder(dev_, ino_).c_str());
      }
      usleep(20000);
    }
    locked_ = rc == 0;
    if (!locked_) {
      ZOE_LOG_DEBUG("%s: flock on the directory failed (%s); stale swap files are not reclaimed here",
                    dir.c_str(), strerror(errno));
    }
  }

  int fd() const { return fd_; }
  bool locked() const { return locked_; }
  bool same_dir(const DirLock& o) const { return dev_ == o.dev_ && ino_ == o.ino_; }
  bool before(const DirLock& o) const { return dev_ != o.dev_ ? dev_ < o.dev_ : ino_ < o.ino_; }

 private:
  int fd_ = -1;
  bool locked_ = false;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// Removes the stale swap files of a directory whose DirLock is held.
ReclaimStats reclaim_locked(const std::string& dir, const DirLock& lock) {
  ReclaimStats r;
  if (!lock.locked()) return r;
  int dfd = dup(lock.fd());
  if (dfd < 0) return r;
  DIR* d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return r;
  }
  while (dirent* de = readdir(d)) {
    std::string name = de->d_name;
    if (!is_unique_swap_file_name(name)) continue;
    if (de->d_type != DT_REG && de->d_type != DT_UNKNOWN) continue;
    int fd = openat(lock.fd(), name.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      if (errno != ENOENT)
        ZOE_LOG_DEBUG("%s/%s: cannot open to check its lock: %s", dir.c_str(), name.c_str(), strerror(errno));
      continue;
    }
    struct stat st;
    // Lock taken: no live process holds the file; its owner died without removing it.
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0) {
      if (unlinkat(lock.fd(), name.c_str(), 0) == 0) {
        r.files++;
        r.bytes += static_cast<uint64_t>(st.st_blocks) * 512;
      } else {
        ZOE_LOG_WARN("%s/%s is a stale swap file (no process holds its lock) but cannot be removed: %s",
                     dir.c_str(), name.c_str(), strerror(errno));
      }
    }
    close(fd);
  }
  closedir(d);
  return r;
}

void log_reclaimed(const std::vector<std::string>& dirs, const ReclaimStats& r) {
  if (r.files == 0) return;
  std::string where;
  for (const auto& d : dirs) where += (where.empty() ? "" : ", ") + d;
  ZOE_LOG_WARN("removed %zu stale swap file(s) of dead processes from %s, reclaiming %" PRIu64 " bytes (%s)",
               r.files, where.c_str(), r.bytes, format_bytes(r.bytes).c_str());
}

}  // namespace

bool is_unique_swap_file_name(const std::string& name) {
  // <prefix>-<16 hex>.<digits>.swap
  constexpr std::string_view kExt = ".swap";
  if (name.size() < kExt.size() || name.compare(name.size() - kExt.size(), kExt.size(), kExt) != 0)
    return false;
  size_t end = name.size() - kExt.size();
  if (end == 0) return false;
  size_t dot = name.rfind('.', end - 1);
  if (dot == std::string::npos || dot + 1 >= end) return false;
  for (size_t i = dot + 1; i < end; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  if (dot < 18 || name[dot - 17] != '-') return false;
  for (size_t i = dot - 16; i < dot; ++i) {
    char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Result<ReclaimStats> reclaim_stale_swap_files(const std::string& dir) {
  ZOE_ASSIGN_OR_RETURN(DirLock lock, DirLock::take(dir));
  ReclaimStats r = reclaim_locked(dir, lock);
  log_reclaimed({dir}, r);
  return r;
}

size_t unlink_live_swap_files() {
  std::lock_guard<std::mutex> lock(g_live_mu);
  size_t n = 0;
  for (const auto& p : live_paths()) n += unlink(p.c_str()) == 0 ? 1 : 0;
  live_paths().clear();
  return n;
}

SwapFile::~SwapFile() {
  if (opts_.keep) return;
  // Removed while still locked; the descriptors (and locks) go with files_.
  for (const auto& f : files_) {
    forget_live(f->path());
    unlink(f->path().c_str());
  }
}

Result<std::unique_ptr<SwapFile>> SwapFile::create(const SwapFileOptions& opts) {
  if (opts.dirs.empty()) return invalid_argument("swap file: no directory given (nvme_path is empty)");
  if (opts.stripe_bytes == 0 || opts.stripe_bytes % 4096 != 0) {
    return invalid_argument("swap file: stripe size %llu is not a positive multiple of 4096",
                            static_cast<unsigned long long>(opts.stripe_bytes));
  }
  if (opts.reuse && !opts.keep) return invalid_argument("swap file: reuse needs keep");
  std::unique_ptr<SwapFile> sf(new SwapFile(opts));
  sf->guard_nonce_ = default_random();  // not random_source: that one only names files
  {
    // One lock per distinct directory (a second flock on a directory this process already locked
    // through another descriptor would wait forever), taken in (device, inode) order so that two
    // jobs naming the same directories in different orders cannot deadlock.
    std::vector<std::pair<DirLock, const std::string*>> locks;
    for (const auto& d : opts.dirs) {
      ZOE_ASSIGN_OR_RETURN(DirLock l, DirLock::open(d));
      bool held = false;
      for (const auto& h : locks) held = held || h.first.same_dir(l);
      if (!held) locks.emplace_back(std::move(l), &d);
    }
    std::sort(locks.begin(), locks.end(),
              [](const auto& a, const auto& b) { return a.first.before(b.first); });
    for (auto& [l, d] : locks) {
      l.lock(*d);
      if (!opts.reclaim_stale) continue;
      ReclaimStats r = reclaim_locked(*d, l);
      sf->reclaimed_.files += r.files;
      sf->reclaimed_.bytes += r.bytes;
    }
    log_reclaimed(opts.dirs, sf->reclaimed_);
    ZOE_RETURN_IF_ERROR(sf->open_files());
  }
  sf->dense_ = std::make_unique<std::atomic<bool>[]>(sf->files_.size());
  uint64_t existing = 0;
  if (opts.reuse) {
    // Reused files: the capacity every file already holds.
    uint64_t per_file = UINT64_MAX;
    for (const auto& f : sf->files_) {
      ZOE_ASSIGN_OR_RETURN(uint64_t sz, f->size());
      per_file = std::min(per_file, sz);
    }
    per_file = per_file / opts.stripe_bytes * opts.stripe_bytes;
    existing = per_file * sf->files_.size();
    std::lock_guard<std::mutex> lock(sf->mu_);
    sf->capacity_ = existing;
    if (existing) sf->add_free_locked(0, existing);
    if (existing) ZOE_RETURN_IF_ERROR(sf->write_guards_locked(0, per_file));
  }
  if (opts.initial_bytes > existing) {
    std::lock_guard<std::mutex> lock(sf->mu_);
    ZOE_RETURN_IF_ERROR(sf->grow_locked(opts.initial_bytes, /*allow_step=*/false));
  }
  return sf;
}

Status SwapFile::open_files() {
  OpenOptions oo;
  oo.create = true;
  oo.write = true;
  oo.direct = opts_.direct;
  if (opts_.keep) {
    // Stable names, found again by reuse; the lock refuses a second live user.
    oo.truncate = !opts_.reuse;
    for (size_t i = 0; i < opts_.dirs.size(); ++i) {
      std::string path = opts_.dirs[i] + "/" + opts_.name + "." + std::to_string(i) + ".swap";
      auto f = File::open(path, oo);
      if (!f.is_ok()) return f.status().with_context("creating swap file " + path);
      Status s = f.value()->try_lock();
      if (!s.is_ok()) {
        return std::move(s).with_context("opening kept swap file " + path +
                                         " (another job uses this name and path; choose another)");
      }
      files_.push_back(std::move(f).value());
    }
    return Status::ok();
  }
  oo.exclusive = true;
  uint64_t (*rnd)() = opts_.random_source ? opts_.random_source : default_random;
  std::string tried;
  for (int attempt = 0; attempt < kNameAttempts; ++attempt) {
    std::string suffix = hex16(rnd());
    bool taken = false;
    for (size_t i = 0; i < opts_.dirs.size() && !taken; ++i) {
      std::string path = opts_.dirs[i] + "/" + opts_.name + "-" + suffix + "." + std::to_string(i) + ".swap";
      auto f = File::open(path, oo);
      if (!f.is_ok() && f.status().code() == StatusCode::kAlreadyExists) {
        taken = true;
        tried = path;
        break;
      }
      Status s = f.is_ok() ? f.value()->try_lock() : f.status();
      if (!s.is_ok()) {
        if (f.is_ok()) files_.push_back(std::move(f).value());  // removed by the destructor
        return std::move(s).with_context("creating swap file " + path);
      }
      files_.push_back(std::move(f).value());
    }
    if (!taken) {
      std::lock_guard<std::mutex> lock(g_live_mu);
      for (const auto& f : files_) live_paths().push_back(f->path());
      return Status::ok();
    }
    for (const auto& f : files_) unlink(f->path().c_str());
    files_.clear();
  }
  return Status(StatusCode::kAlreadyExists, "swap file: " + std::to_string(kNameAttempts) +
                                                " random names in a row already existed (last " + tried +
                                                "); is the random source broken?");
}

}  // namespace zoe::io

namespace zoe {

// The public face of unlink_live_swap_files() (zoe/runtime.h); the Runtime also makes it the
// cleanup of a rank that learns another was lost.
size_t remove_swap_files_now() { return io::unlink_live_swap_files(); }

}  // namespace zoe
