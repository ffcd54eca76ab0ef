// SwapFile: extent allocation (first fit, coalescing), growth with fallocate, stripe mapping.
#include "io/swap_file.h"

#include <unistd.h>

#include <algorithm>

#include "core/log.h"
#include "core/units.h"

namespace zoe::io {

SwapFile::~SwapFile() {
  if (opts_.keep) return;
  for (const auto& f : files_) unlink(f->path().c_str());
}

Result<std::unique_ptr<SwapFile>> SwapFile::create(const SwapFileOptions& opts) {
  if (opts.dirs.empty()) return invalid_argument("swap file: no directory given (nvme_path is empty)");
  if (opts.stripe_bytes == 0 || opts.stripe_bytes % 4096 != 0) {
    return invalid_argument("swap file: stripe size %llu is not a positive multiple of 4096",
                            static_cast<unsigned long long>(opts.stripe_bytes));
  }
  if (opts.reuse && !opts.keep) return invalid_argument("swap file: reuse needs keep");
  std::unique_ptr<SwapFile> sf(new SwapFile(opts));
  for (size_t i = 0; i < opts.dirs.size(); ++i) {
    std::string path = opts.dirs[i] + "/" + opts.name + "." + std::to_string(i) + ".swap";
    OpenOptions oo;
    oo.create = true;
    oo.write = true;
    oo.truncate = !opts.reuse;
    oo.direct = opts.direct;
    auto f = File::open(path, oo);
    if (!f.is_ok()) {
      if (f.status().code() == StatusCode::kNotFound) {
        return not_found("swap directory %s does not exist (create it, or fix nvme_path)", opts.dirs[i].c_str());
      }
      return f.status().with_context("creating swap file " + path);
    }
    sf->files_.push_back(std::move(f).value());
  }
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
    sf->capacity_ = existing;
    if (existing) sf->add_free_locked(0, existing);
  }
  if (opts.initial_bytes > existing) {
    std::lock_guard<std::mutex> lock(sf->mu_);
    ZOE_RETURN_IF_ERROR(sf->grow_locked(opts.initial_bytes));
  }
  return sf;
}

Status SwapFile::grow_locked(uint64_t min_capacity) {
  uint64_t unit = opts_.stripe_bytes * files_.size();
  uint64_t target = std::max(min_capacity, capacity_ + opts_.grow_bytes);
  target = (target + unit - 1) / unit * unit;
  if (opts_.max_bytes && target > opts_.max_bytes) {
    target = opts_.max_bytes / unit * unit;
    if (target < min_capacity) {
      return no_space("swap space limit reached: %llu bytes needed, limit %llu bytes (%s) over %zu file(s)",
                      static_cast<unsigned long long>(min_capacity), static_cast<unsigned long long>(opts_.max_bytes),
                      format_bytes(opts_.max_bytes).c_str(), files_.size());
    }
  }
  uint64_t per_file = target / files_.size();
  for (const auto& f : files_) {
    Status s = f->preallocate(per_file);
    if (!s.is_ok()) {
      return std::move(s).with_context("growing the swap space to " + format_bytes(target) + " over " +
                                       std::to_string(files_.size()) + " file(s)");
    }
  }
  uint64_t old = capacity_;
  capacity_ = target;
  add_free_locked(old, target - old);
  return Status::ok();
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

Result<Extent> SwapFile::allocate(uint64_t bytes) {
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
      return e;
    }
    // Nothing fits: grow so that the free tail (if any) plus new space holds `need`.
    uint64_t tail_free = 0;
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == capacity_) tail_free = last->second;
    }
    ZOE_RETURN_IF_ERROR(grow_locked(capacity_ + need - tail_free));
  }
  return internal_error("swap file: allocation of %llu bytes failed after growing", static_cast<unsigned long long>(need));
}

void SwapFile::free(const Extent& e) {
  if (e.bytes == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  ZOE_CHECK_MSG(e.offset + e.bytes <= capacity_, "swap extent out of range");
  used_ -= e.bytes;
  add_free_locked(e.offset, e.bytes);
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
        out->back().offset + out->back().len == foff && static_cast<char*>(out->back().buf) + out->back().len == p) {
      out->back().len += take;
    } else {
      out->push_back(IoRequest{op, f, foff, p, take});
    }
    offset += take;
    p += take;
    len -= take;
  }
}

IoHandle SwapFile::read(IoEngine& eng, const Extent& e, void* buf, size_t len, uint64_t at, IoCallback cb) const {
  ZOE_CHECK_MSG(at + len <= e.bytes, "read beyond the swap extent");
  std::vector<IoRequest> reqs;
  map(IoOp::kRead, e.offset + at, buf, len, &reqs);
  return eng.submit(reqs, std::move(cb));
}

IoHandle SwapFile::write(IoEngine& eng, const Extent& e, const void* buf, size_t len, uint64_t at,
                         IoCallback cb) const {
  ZOE_CHECK_MSG(at + len <= e.bytes, "write beyond the swap extent");
  std::vector<IoRequest> reqs;
  map(IoOp::kWrite, e.offset + at, const_cast<void*>(buf), len, &reqs);
  return eng.submit(reqs, std::move(cb));
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
