// SwapFile, the stripe map: logical swap offsets to requests on the striped files, and the
// transfers through it (read, write, transfer), which attach the checks of swap_file_integrity.cpp
// to their completion.
#include "io/swap_file.h"

#include <cstring>
#include <utility>

#include "core/log.h"

namespace zoe::io {

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

bool SwapFile::direct() const {
  for (const auto& f : files_) {
    if (!f->direct()) return false;
  }
  return true;
}

}  // namespace zoe::io
