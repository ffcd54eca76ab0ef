// SwapFile, integrity: the written ranges (reads of never-written bytes fail or read zeros), the
// per-piece checksums recorded at writes and verified at reads, and the read-time size and hole
// checks against the guard page's end and the blocks fallocate gave each file.
#include "io/swap_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <iterator>

#include "core/log.h"
#include "io/checksum.h"

namespace zoe::io {

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

bool SwapFile::zero_fill_locked(uint64_t offset) const {
  auto it = zero_fill_.upper_bound(offset);
  return it != zero_fill_.begin() && std::prev(it)->second > offset;
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

}  // namespace zoe::io
