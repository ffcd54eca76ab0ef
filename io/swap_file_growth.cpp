// SwapFile, growth and guard pages: how much the files grow (a step when the disks hold it, else
// what an allocation needs, never past max_bytes), fallocate with roll-back on failure, and the
// guard page at each file's end, rewritten at every growth after its old tag is checked.
#include "io/swap_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "core/units.h"
#include "io/buffer.h"

namespace zoe::io {

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

}  // namespace zoe::io
