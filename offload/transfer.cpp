// Transfers: hops on every link, the staged piece pipeline for NVMe <-> device, synchronous NVMe.
#include "offload/transfer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>

#include "core/log.h"

namespace zoe::offload {
namespace {

// Counts the pieces of a staged move; the last one to finish runs `done` with the first error.
struct Pieces {
  std::atomic<size_t> left;
  std::mutex mu;
  Status first;
  Transfers::Done done;
  Pieces(size_t n, Transfers::Done d) : left(n), done(std::move(d)) {}
  void finish(const Status& s) {
    if (!s.is_ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first.is_ok()) first = s;
    }
    if (left.fetch_sub(1) == 1) done(first);
  }
};

}  // namespace

Result<std::unique_ptr<Transfers>> Transfers::create(Poster& poster, device::Device* device, SwapStore* nvme,
                                                     size_t staging_bytes, size_t staging_count,
                                                     io::PinMode pin) {
  std::unique_ptr<Transfers> t(new Transfers(poster, nvme));
  if (device) {
    ZOE_ASSIGN_OR_RETURN(t->h2d_, device->create_stream());
    ZOE_ASSIGN_OR_RETURN(t->d2h_, device->create_stream());
  }
  if (nvme) {
    ZOE_ASSIGN_OR_RETURN(t->staging_, StagingPool::create(staging_bytes, staging_count, pin));
    iovec v{t->staging_->base(), t->staging_->total_bytes()};
    (void)nvme->engine().register_buffers({&v, 1});  // optional speed-up
  }
  return t;
}

void Transfers::hop(Link link, const StateKey& key, uint64_t offset, char* host, char* device, size_t len,
                    Done done) {
  auto io_done = [this, done](io::IoCompletion& c) { poster_.post([done, s = c.status()] { done(s); }); };
  device::Stream* stream = nullptr;
  Status s;
  switch (link) {
    case Link::kNvmeToHost:
      nvme_->read(key, offset, host, len, std::move(io_done));
      return;
    case Link::kHostToNvme:
      nvme_->write(key, offset, host, len, std::move(io_done));
      return;
    case Link::kHostToDevice:
      stream = h2d_.get();
      s = stream->copy_h2d(device, host, len);
      break;
    case Link::kDeviceToHost:
      stream = d2h_.get();
      s = stream->copy_d2h(host, device, len);
      break;
    case Link::kNvmeToDevice:
    case Link::kDeviceToNvme:
      ZOE_CHECK_MSG(false, "%s is not one hop", link_name(link));
  }
  if (s.is_ok()) s = poster_.after(*stream, [done] { done(Status::ok()); });
  if (!s.is_ok()) poster_.post([done, s] { done(s); });
}

void Transfers::start_staged(Link first, Link second, const Places& at, uint64_t bytes, Done done) {
  const size_t piece = staging_->buffer_bytes();
  const size_t n = static_cast<size_t>((bytes + piece - 1) / piece);
  auto pieces = std::make_shared<Pieces>(n, std::move(done));
  for (size_t k = 0; k < n; ++k) {
    const uint64_t off = k * piece;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(piece, bytes - off));
    char* dev = at.device + off;
    staging_->with_buffer([this, first, second, key = at.key, off, len, dev, pieces](char* buf) {
      hop(first, key, off, buf, dev, len, [this, second, key, off, len, dev, buf, pieces](Status s) {
        if (!s.is_ok()) {
          staging_->release(buf);
          pieces->finish(s);
          return;
        }
        hop(second, key, off, buf, dev, len, [this, buf, pieces](Status s2) {
          staging_->release(buf);
          pieces->finish(s2);
        });
      });
    });
  }
}

void Transfers::start(Link link, const Places& at, uint64_t bytes, Done done) {
  switch (link) {
    case Link::kNvmeToDevice:
      start_staged(Link::kNvmeToHost, Link::kHostToDevice, at, bytes, std::move(done));
      return;
    case Link::kDeviceToNvme:
      start_staged(Link::kDeviceToHost, Link::kHostToNvme, at, bytes, std::move(done));
      return;
    default:
      hop(link, at.key, 0, at.host, at.device, static_cast<size_t>(bytes), std::move(done));
  }
}

Status Transfers::write_direct(const StateKey& key, const char* data, uint64_t first, uint64_t len) {
  const size_t piece = staging_->buffer_bytes();
  std::deque<io::IoHandle> inflight;
  Status s;
  for (uint64_t off = first; off < first + len; off += piece) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(piece, first + len - off));
    if (inflight.size() == kDirectWritesInFlight) {
      Status w = inflight.front()->wait();
      if (s.is_ok()) s = std::move(w);
      inflight.pop_front();
    }
    if (!s.is_ok()) break;
    inflight.push_back(nvme_->write(key, off, data + (off - first), n));
  }
  for (const io::IoHandle& h : inflight) {  // the disk reads `data` until each is done
    Status w = h->wait();
    if (s.is_ok()) s = std::move(w);
  }
  return s;
}

Status Transfers::copy_sync(const StateKey& key, uint64_t alloc, char* data, bool write, uint64_t first,
                            uint64_t len) {
  // A write of whole blocks from 4096-byte aligned memory goes to the disk from `data` itself,
  // several pieces at once; only a partial last block goes through the staging buffer below.
  if (write && reinterpret_cast<uintptr_t>(data) % 4096 == 0 && first % 4096 == 0 && len >= 4096) {
    const uint64_t whole = len & ~uint64_t{4095};
    ZOE_RETURN_IF_ERROR(write_direct(key, data, first, whole));
    if (whole == len) return Status::ok();
    data += whole;
    first += whole;
    len -= whole;
  }
  StagingPool::SyncLease buf = staging_->lease_sync_buffer();
  char* got = buf.data;
  Status s;
  const size_t piece = staging_->buffer_bytes();
  const uint64_t last = first + len;  // bytes [first, last) of the item; the disk sees whole blocks
  const uint64_t span_end = std::min<uint64_t>(alloc, (last + 4095) & ~uint64_t{4095});
  for (uint64_t off = first; off < span_end && s.is_ok(); off += piece) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(piece, span_end - off));
    size_t data_len = off < last ? static_cast<size_t>(std::min<uint64_t>(n, last - off)) : 0;
    if (write) {
      memcpy(got, data + (off - first), data_len);
      memset(got + data_len, 0, n - data_len);
      s = nvme_->write(key, off, got, n)->wait();
    } else {
      s = nvme_->read(key, off, got, n)->wait();
      if (s.is_ok()) memcpy(data + (off - first), got, data_len);
    }
  }
  return s;
}

void Transfers::synchronize() {
  if (h2d_) (void)h2d_->synchronize();
  if (d2h_) (void)d2h_->synchronize();
}

}  // namespace zoe::offload
