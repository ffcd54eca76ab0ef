// SwapFile: unique locked files, stale-file reclaim, extent allocation (first fit, coalescing),
// growth with fallocate, stripe mapping, per-piece checksums.
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
#include "io/buffer.h"
#include "io/checksum.h"

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

Result<uint64_t> SwapFile::headroom_per_file() const {
  // Files sharing a file system share its free space.
  std::vector<dev_t> devs(files_.size());
  for (size_t i = 0; i < files_.size(); ++i) {
    struct stat st;
    if (fstat(files_[i]->fd(), &st) != 0) return sys_error("fstat", files_[i]->path(), errno);
    devs[i] = st.st_dev;
  }
  uint64_t room = UINT64_MAX;
  for (size_t i = 0; i < files_.size(); ++i) {
    ZOE_ASSIGN_OR_RETURN(uint64_t free_b, free_bytes_at(files_[i]->path()));
    uint64_t sharing = static_cast<uint64_t>(std::count(devs.begin(), devs.end(), devs[i]));
    room = std::min(room, free_b / sharing);
  }
  return room;
}

Status SwapFile::grow_locked(uint64_t min_capacity, bool allow_step) {
  const uint64_t n = files_.size();
  const uint64_t unit = opts_.stripe_bytes * n;
  auto round_up = [unit](uint64_t v) { return (v + unit - 1) / unit * unit; };
  const uint64_t limit = opts_.max_bytes ? opts_.max_bytes / unit * unit : UINT64_MAX;
  const uint64_t need = round_up(std::max(min_capacity, capacity_));
  if (need > limit) {
    return no_space("swap space limit reached: %llu bytes needed, limit %llu bytes (%s) over %zu file(s)",
                    static_cast<unsigned long long>(min_capacity),
                    static_cast<unsigned long long>(opts_.max_bytes), format_bytes(opts_.max_bytes).c_str(),
                    files_.size());
  }
  uint64_t target = need;
  if (allow_step && opts_.grow_bytes) {
    // The whole step only where the disks hold it with an eighth of their free space to spare
    // (metadata, other users); else just what this allocation needs.
    uint64_t step = std::min(limit, round_up(capacity_ + opts_.grow_bytes));
    auto room = headroom_per_file();
    if (step > need && room.is_ok() && (step - capacity_) / n <= room.value() - room.value() / 8)
      target = step;
  }
  std::vector<uint64_t> old_size(n);
  for (size_t i = 0; i < n; ++i) {
    ZOE_ASSIGN_OR_RETURN(old_size[i], files_[i]->size());
  }
  for (;;) {
    Status s;
    for (size_t i = 0; i < n && s.is_ok(); ++i) {
      s = files_[i]->preallocate(target / n + kSwapGuardBytes);
      // Give back what the files grown so far took beyond the old capacity.
      if (!s.is_ok()) {
        for (size_t j = 0; j < i; ++j) (void)files_[j]->truncate(old_size[j]);
      }
    }
    if (s.is_ok()) break;
    // The step did not fit after all (another job took the space): try just what is needed.
    if (s.code() == StatusCode::kNoSpace && target > need) {
      target = need;
      continue;
    }
    return std::move(s).with_context("growing the swap space from " + format_bytes(capacity_) + " to " +
                                     format_bytes(target) + " over " + std::to_string(n) + " file(s) (" +
                                     std::to_string(need - capacity_) + " more bytes needed)");
  }
  ZOE_RETURN_IF_ERROR(write_guards_locked(capacity_ / n, target / n));
  uint64_t old = capacity_;
  capacity_ = target;
  add_free_locked(old, target - old);
  return Status::ok();
}

namespace {
void fill_guard(char* page, uint64_t nonce, size_t file, uint64_t per_file) {
  memset(page, 0, kSwapGuardBytes);
  int n = snprintf(page, kSwapGuardBytes, "zoe swap guard %016" PRIx64 " file %zu at %" PRIu64 "\n", nonce,
                   file, per_file);
  memset(page + n, '.', kSwapGuardBytes - static_cast<size_t>(n));
}
}  // namespace

Status SwapFile::write_guards_locked(uint64_t old_per_file, uint64_t per_file) {
  auto page = AlignedBuffer::allocate(2 * kSwapGuardBytes);
  if (!page.is_ok()) return page.status();
  char* want = page.value().bytes();
  char* got = want + kSwapGuardBytes;
  for (size_t i = 0; i < files_.size(); ++i) {
    const File& f = *files_[i];
    fill_guard(want, guard_nonce_, i, per_file);
    ssize_t w = pwrite(f.fd(), want, kSwapGuardBytes, static_cast<off_t>(per_file));
    if (w != static_cast<ssize_t>(kSwapGuardBytes)) {
      return sys_error("writing the guard page of swap file", f.path(), per_file, kSwapGuardBytes,
                       w < 0 ? errno : EIO);
    }
    if (old_per_file == 0 || old_per_file == per_file) continue;
    // The old guard is data space now; until this call, it was the file's last page.
    fill_guard(want, guard_nonce_, i, old_per_file);
    ssize_t r = pread(f.fd(), got, kSwapGuardBytes, static_cast<off_t>(old_per_file));
    if (r != static_cast<ssize_t>(kSwapGuardBytes) || memcmp(want, got, kSwapGuardBytes) != 0) {
      // The growth made the file long again: from now on every read fails (check_sizes).
      lost_guard_.store(static_cast<int>(i), std::memory_order_release);
      return corruption("swap file %s lost its guard page at offset %" PRIu64
                        ": it was truncated by something other than zoe while in use, and the data "
                        "in it is lost (do not let cleanup tools touch the swap directory of a running job)",
                        f.path().c_str(), old_per_file);
    }
  }
  note_dense_locked(per_file + kSwapGuardBytes);
  guard_end_.store(per_file + kSwapGuardBytes, std::memory_order_release);
  return Status::ok();
}

void SwapFile::note_dense_locked(uint64_t file_bytes) {
  if (!opts_.hole_check) return;
  for (size_t i = 0; i < files_.size(); ++i) {
    struct stat st;
    const bool dense =
        fstat(files_[i]->fd(), &st) == 0 && static_cast<uint64_t>(st.st_blocks) * 512 >= file_bytes;
    dense_[i].store(dense, std::memory_order_release);
    if (dense || told_sparse_) continue;
    told_sparse_ = true;
    ZOE_LOG_INFO("swap file %s holds %llu bytes of disk blocks for its %" PRIu64
                 " bytes after fallocate (a compressing or copy-on-write file system): holes punched into "
                 "it are not detected; zoe.swap_checksum: true detects damaged data",
                 files_[i]->path().c_str(), static_cast<unsigned long long>(st.st_blocks) * 512ull,
                 file_bytes);
  }
}

void SwapFile::add_free_locked(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return;
  auto next = free_.lower_bound(offset);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    ZOE_CHECK_MSG(prev->first + prev->second <= offset, "double free of swap extent at %llu",
                  static_cast<unsigned long long>(offset));
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end()) {
    ZOE_CHECK_MSG(offset + bytes <= next->first, "double free of swap extent at %llu",
                  static_cast<unsigned long long>(offset));
    if (offset + bytes == next->first) {
      bytes += next->second;
      free_.erase(next);
    }
  }
  free_[offset] = bytes;
}

Result<Extent> SwapFile::allocate(uint64_t bytes, Unwritten unwritten) {
  if (bytes == 0) return Extent{0, 0};
  uint64_t need = (bytes + 4095) & ~uint64_t{4095};
  std::lock_guard<std::mutex> lock(mu_);
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < need) continue;
      Extent e{it->first, need};
      uint64_t rest = it->second - need;
      free_.erase(it);
      if (rest) free_[e.offset + need] = rest;
      used_ += need;
      if (unwritten == Unwritten::kZeros) {
        std::lock_guard<std::mutex> sums(sum_mu_);
        zero_fill_.emplace(e.offset, e.offset + need);
      }
      return e;
    }
    // Nothing fits: grow so that the free tail (if any) plus new space holds `need`.
    uint64_t tail_free = 0;
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == capacity_) tail_free = last->second;
    }
    ZOE_RETURN_IF_ERROR(grow_locked(capacity_ + need - tail_free, /*allow_step=*/true));
  }
  return internal_error("swap file: allocation of %llu bytes failed after growing",
                        static_cast<unsigned long long>(need));
}

void SwapFile::free(const Extent& e) {
  if (e.bytes == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ZOE_CHECK_MSG(e.offset + e.bytes <= capacity_, "swap extent out of range");
    used_ -= e.bytes;
    add_free_locked(e.offset, e.bytes);
  }
  std::lock_guard<std::mutex> lock(sum_mu_);
  forget_sums_locked(e.offset, e.offset + e.bytes);
  forget_written_locked(e.offset, e.offset + e.bytes);
  zero_fill_.erase(e.offset);
}

bool SwapFile::zero_fill_locked(uint64_t offset) const {
  auto it = zero_fill_.upper_bound(offset);
  return it != zero_fill_.begin() && std::prev(it)->second > offset;
}

void SwapFile::map(IoOp op, uint64_t offset, void* buf, size_t len, std::vector<IoRequest>* out) const {
  const uint64_t stripe = opts_.stripe_bytes;
  const uint64_t n = files_.size();
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    uint64_t s = offset / stripe;
    uint64_t in = offset % stripe;
    size_t take = static_cast<size_t>(std::min<uint64_t>(len, stripe - in));
    const File* f = files_[s % n].get();
    uint64_t foff = (s / n) * stripe + in;
    // Merge with the previous request when it continues in the same file (n == 1).
    if (!out->empty() && out->back().file == f && out->back().op == op &&
        out->back().offset + out->back().len == foff &&
        static_cast<char*>(out->back().buf) + out->back().len == p) {
      out->back().len += take;
    } else {
      out->push_back(IoRequest{op, f, foff, p, take});
    }
    offset += take;
    p += take;
    len -= take;
  }
}

void SwapFile::forget_sums_locked(uint64_t begin, uint64_t end) const {
  auto it = sums_.lower_bound(begin);
  if (it != sums_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.len > begin) it = prev;
  }
  while (it != sums_.end() && it->first < end) it = sums_.erase(it);
}

void SwapFile::mark_written_locked(uint64_t begin, uint64_t end) const {
  end = (end + 4095) & ~uint64_t{4095};  // O_DIRECT reads round up to whole pages
  auto it = written_.upper_bound(begin);
  if (it != written_.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= begin) {
      begin = prev->first;
      end = std::max(end, prev->second);
      it = prev;
    }
  }
  while (it != written_.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = written_.erase(it);
  }
  written_.emplace(begin, end);
}

void SwapFile::forget_written_locked(uint64_t begin, uint64_t end) const {
  auto it = written_.upper_bound(begin);
  if (it != written_.begin() && std::prev(it)->second > begin) --it;
  while (it != written_.end() && it->first < end) {
    const uint64_t b = it->first, e = it->second;
    it = written_.erase(it);
    if (b < begin) written_.emplace(b, begin);
    if (e > end) written_.emplace(end, e);
  }
}

uint64_t SwapFile::first_unwritten_locked(uint64_t begin, uint64_t end) const {
  auto it = written_.upper_bound(begin);
  if (it == written_.begin()) return begin;
  --it;
  return it->second > begin ? std::min(end, it->second) : begin;
}

Status SwapFile::unwritten_error(const SwapIo& io, size_t i, uint64_t at, const SwapIoNamer& name) const {
  std::vector<IoRequest> where;
  map(IoOp::kRead, at, io.buf, 1, &where);
  std::string what = name ? name(i) : "the extent at logical swap offset " + std::to_string(io.extent.offset);
  return corruption("swap read of %s: byte %" PRIu64 " of its extent (offset %" PRIu64
                    " of %s) was never written since the extent was allocated; its contents are not "
                    "data (a bug in zoe: please report it)",
                    what.c_str(), at - io.extent.offset, where[0].offset, where[0].file->path().c_str());
}

Status SwapFile::check_sizes(const std::vector<IoRequest>& reqs) const {
  const int lost = lost_guard_.load(std::memory_order_acquire);
  if (lost >= 0) {
    return corruption(
        "swap file %s lost its guard page when the swap space grew: it was truncated by "
        "something other than zoe while in use, and the data in it is lost",
        files_[static_cast<size_t>(lost)]->path().c_str());
  }
  const uint64_t want = guard_end_.load(std::memory_order_acquire);
  if (want == 0) return Status::ok();
  const File* last = nullptr;
  for (const IoRequest& r : reqs) {
    if (r.op != IoOp::kRead || r.file == last) continue;
    last = r.file;
    struct stat st;
    if (fstat(r.file->fd(), &st) != 0) return sys_error("fstat", r.file->path(), errno);
    if (static_cast<uint64_t>(st.st_size) >= want) {
      const size_t i = static_cast<size_t>(
          std::find_if(files_.begin(), files_.end(), [&](const auto& f) { return f.get() == r.file; }) -
          files_.begin());
      const uint64_t held = static_cast<uint64_t>(st.st_blocks) * 512;
      if (!opts_.hole_check || i == files_.size() || !dense_[i].load(std::memory_order_acquire) ||
          held >= want)
        continue;
      return corruption("swap file %s has holes: %" PRIu64 " of its %" PRIu64
                        " bytes have disk blocks (all had when zoe grew it): something other "
                        "than zoe deallocated part of it while in use (fallocate --punch-hole, a cleanup or "
                        "deduplicating tool, a thin-provisioned volume), so the data read at offset %" PRIu64
                        " of it may be zeros; it is not used (keep such tools off the swap directory of a "
                        "running job)",
                        r.file->path().c_str(), held, want, r.offset);
    }
    return corruption("swap file %s is %lld bytes long, %" PRIu64
                      " expected: it was truncated by something other than zoe while in use, so the "
                      "data read at offset %" PRIu64
                      " of it is lost (do not let cleanup tools touch "
                      "the swap directory of a running job)",
                      r.file->path().c_str(), static_cast<long long>(st.st_size), want, r.offset);
  }
  return Status::ok();
}

IoHandle SwapFile::transfer(IoEngine& eng, std::span<const SwapIo> ios, IoCallback cb,
                            SwapIoNamer name) const {
  std::vector<IoRequest> reqs;
  bool reads = false;
  for (const SwapIo& io : ios) {
    ZOE_CHECK_MSG(io.at + io.len <= io.extent.bytes, "%s beyond the swap extent", io_op_name(io.op));
    map(io.op, io.extent.offset + io.at, io.buf, io.len, &reqs);
    reads = reads || io.op == IoOp::kRead;
  }
  // Writes mark their range written and forget what their range held at once (a failed write
  // leaves it unverified, never verified against older data) and record their pieces once the
  // data is on disk. Reads check that their range was written, take the records of the pieces
  // they cover whole now and check them once the data is in.
  Status unwritten;
  std::vector<Piece> expect, fresh;
  std::vector<std::pair<char*, uint64_t>> zeros;  // never-written bytes of kZeros extents
  {
    std::lock_guard<std::mutex> lock(sum_mu_);
    for (size_t i = 0; i < ios.size(); ++i) {
      const SwapIo& io = ios[i];
      const uint64_t begin = io.extent.offset + io.at, end = begin + io.len;
      char* buf = static_cast<char*>(io.buf);
      if (io.op == IoOp::kWrite) {
        mark_written_locked(begin, end);
        if (!opts_.checksum) continue;
        forget_sums_locked(begin, end);
        for (uint64_t p = begin; p < end;) {
          uint64_t cut =
              io.extent.offset + ((p - io.extent.offset) / kChecksumPieceBytes + 1) * kChecksumPieceBytes;
          uint64_t q = std::min(end, cut);
          fresh.push_back(Piece{p, q - p, 0, io.extent.offset, buf + (p - begin), i});
          p = q;
        }
        continue;
      }
      for (uint64_t p = begin; p < end && unwritten.is_ok();) {
        uint64_t q = first_unwritten_locked(p, end);
        if (q > p) {
          p = q;
          continue;
        }
        if (!zero_fill_locked(p)) {
          unwritten = unwritten_error(io, i, p, name);
          break;
        }
        auto next = written_.upper_bound(p);  // the next written range, if any
        q = next == written_.end() ? end : std::min(end, next->first);
        zeros.emplace_back(buf + (p - begin), q - p);
        p = q;
      }
      if (!opts_.checksum) continue;
      for (auto it = sums_.lower_bound(begin); it != sums_.end() && it->first < end; ++it) {
        if (it->first + it->second.len > end) break;
        expect.push_back(Piece{it->first, it->second.len, it->second.hash, io.extent.offset,
                               buf + (it->first - begin), i});
      }
    }
  }
  if (!reads && fresh.empty()) return eng.submit(reqs, std::move(cb));
  // Only the size check (an fstat per file): on the completing thread, not a hook thread.
  const bool light = expect.empty() && fresh.empty() && zeros.empty();
  IoFinish finish = [this, unwritten = std::move(unwritten), expect = std::move(expect),
                     fresh = std::move(fresh), zeros = std::move(zeros),
                     sized = reads ? reqs : std::vector<IoRequest>(), name = std::move(name)]() mutable {
    if (!unwritten.is_ok()) return unwritten;
    Status s = check_sizes(sized);
    if (s.is_ok()) s = verify(expect, name);
    if (s.is_ok()) record(fresh);
    for (const auto& [at, len] : zeros) memset(at, 0, len);
    return s;
  };
  return eng.submit(reqs, std::move(cb), std::move(finish), light);
}

Status SwapFile::verify(const std::vector<Piece>& expect, const SwapIoNamer& name) const {
  uint64_t verified = 0;
  for (const Piece& p : expect) {
    uint64_t got = swap_checksum(p.buf, p.len);
    if (got == p.hash) {
      verified += p.len;
      continue;
    }
    std::vector<IoRequest> where;
    map(IoOp::kRead, p.offset, p.buf, p.len, &where);
    std::string in;
    for (const IoRequest& r : where) {
      in += (in.empty() ? "" : " and ") + std::to_string(r.len) + " bytes at offset " +
            std::to_string(r.offset) + " of " + r.file->path();
    }
    std::string what = name ? name(p.io) : "the extent at logical swap offset " + std::to_string(p.extent);
    verified_bytes_.fetch_add(verified, std::memory_order_relaxed);
    return corruption("swap data checksum mismatch reading %s: %" PRIu64 " bytes at byte %" PRIu64
                      " of its extent (%s): %s 0x%016" PRIx64 " when written, 0x%016" PRIx64
                      " as read. The data changed on disk or in transit after it was written; it is not used "
                      "(check the drive: dmesg, smartctl)",
                      what.c_str(), p.len, p.offset - p.extent, in.c_str(), swap_checksum_name(), p.hash,
                      got);
  }
  verified_bytes_.fetch_add(verified, std::memory_order_relaxed);
  return Status::ok();
}

void SwapFile::record(std::vector<Piece>& pieces) const {
  for (Piece& p : pieces) p.hash = swap_checksum(p.buf, p.len);
  std::lock_guard<std::mutex> lock(sum_mu_);
  for (const Piece& p : pieces) {
    forget_sums_locked(p.offset, p.offset + p.len);
    sums_.emplace(p.offset, Sum{p.len, p.hash});
  }
}

IoHandle SwapFile::read(IoEngine& eng, const Extent& e, void* buf, size_t len, uint64_t at, IoCallback cb,
                        SwapIoNamer name) const {
  ZOE_CHECK_MSG(at + len <= e.bytes, "read beyond the swap extent");
  SwapIo io{IoOp::kRead, e, at, buf, len};
  return transfer(eng, {&io, 1}, std::move(cb), std::move(name));
}

IoHandle SwapFile::write(IoEngine& eng, const Extent& e, const void* buf, size_t len, uint64_t at,
                         IoCallback cb, SwapIoNamer name) const {
  ZOE_CHECK_MSG(at + len <= e.bytes, "write beyond the swap extent");
  SwapIo io{IoOp::kWrite, e, at, const_cast<void*>(buf), len};
  return transfer(eng, {&io, 1}, std::move(cb), std::move(name));
}

Status SwapFile::register_files(IoEngine& eng) const {
  for (const auto& f : files_) ZOE_RETURN_IF_ERROR(eng.register_file(*f));
  return Status::ok();
}

void SwapFile::unregister_files(IoEngine& eng) const {
  for (const auto& f : files_) eng.unregister_file(*f);
}

uint64_t SwapFile::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_;
}

uint64_t SwapFile::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

bool SwapFile::direct() const {
  for (const auto& f : files_) {
    if (!f->direct()) return false;
  }
  return true;
}

}  // namespace zoe::io
