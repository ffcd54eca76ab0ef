// One writer per save directory: SaveDirLock (flock(2) on D/.zoe-lock) and the process's held locks.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "core/log.h"

namespace zoe::ckpt {

namespace {

std::string holder_text() {
  char host[256] = "?";
  if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "?");
  host[sizeof(host) - 1] = 0;
  char when[64] = "?";
  time_t now = time(nullptr);
  struct tm tm;
  if (localtime_r(&now, &tm)) strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
  return "pid " + std::to_string(getpid()) + " host " + host + " since " + when + "\n";
}

}  // namespace

Result<std::unique_ptr<SaveDirLock>> SaveDirLock::acquire(const std::string& save_dir) {
  const std::string path = save_dir + "/" + kLockName;
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return sys_error("open lock file", path, errno);
  detail::FdGuard g(fd);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      char buf[512];
      ssize_t n = pread(fd, buf, sizeof(buf), 0);
      std::string who(buf, n > 0 ? static_cast<size_t>(n) : 0);
      while (!who.empty() && who.back() == '\n') who.pop_back();
      return Status(StatusCode::kAlreadyExists,
                    "save directory " + save_dir + " is in use by another writer (" +
                        (who.empty() ? std::string("its pid and host are not known yet")
                                     : detail::printable(who, 200)) +
                        " holds " + path +
                        "): two jobs must not save into one directory; wait for the other to end or choose "
                        "another save directory");
    }
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
      return Status(StatusCode::kUnsupported,
                    "cannot lock " + path + ": the file system has no flock(2) locks (" + strerror(err) + ")",
                    err);
    }
    return sys_error("flock", path, err);
  }
  // Ours now: say who holds it, for the message a second writer gets.
  const std::string who = holder_text();
  if (ftruncate(fd, 0) != 0) return sys_error("truncate lock file", path, errno);
  ZOE_RETURN_IF_ERROR(detail::pwrite_all(fd, path, who.data(), who.size(), 0));
  return std::unique_ptr<SaveDirLock>(new SaveDirLock(path, g.release()));
}

SaveDirLock::~SaveDirLock() {
  if (fd_ >= 0) close(fd_);  // releases the flock
}

bool SaveDirLock::still_held() const {
  struct stat a, b;
  if (fstat(fd_, &a) != 0 || stat(path_.c_str(), &b) != 0) return false;
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// ---- the locks this process holds, one per save directory ----

namespace {

struct HeldLocks {
  std::mutex mu;
  // By the directory's real path; nullptr: its file system has no locks (warned once).
  std::map<std::string, std::unique_ptr<SaveDirLock>> by_dir;
};

HeldLocks& held() {
  static auto* h = new HeldLocks;  // never destroyed: the locks last as long as the process
  return *h;
}

std::string dir_key(const std::string& save_dir) {
  char buf[PATH_MAX];
  if (realpath(save_dir.c_str(), buf)) return buf;
  return save_dir;
}

}  // namespace

Status hold_save_dir(const std::string& save_dir) {
  HeldLocks& h = held();
  const std::string key = dir_key(save_dir);
  std::lock_guard<std::mutex> lk(h.mu);
  auto it = h.by_dir.find(key);
  if (it != h.by_dir.end()) {
    if (!it->second) return unsupported("save directory %s has no locks", save_dir.c_str());
    if (it->second->still_held()) return Status::ok();
    h.by_dir.erase(it);  // the directory was removed or replaced since: lock the new one
  }
  auto lock = SaveDirLock::acquire(save_dir);
  if (!lock.is_ok()) {
    if (lock.status().code() == StatusCode::kUnsupported) {
      ZOE_LOG_WARN(
          "%s; saving into %s without a lock: make sure no other job saves there (leftover "
          "temporary directories are not removed)",
          lock.status().message().c_str(), save_dir.c_str());
      h.by_dir.emplace(key, nullptr);
    }
    return lock.status();
  }
  h.by_dir.emplace(key, std::move(lock).value());
  return Status::ok();
}

void release_save_dir(const std::string& save_dir) {
  HeldLocks& h = held();
  std::lock_guard<std::mutex> lk(h.mu);
  h.by_dir.erase(dir_key(save_dir));
}

}  // namespace zoe::ckpt
