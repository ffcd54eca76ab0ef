// The activation store's NVMe path: coalesced runs written behind, reads ahead in reverse order.
#include <algorithm>
#include <cstring>

#include "core/clock.h"
#include "offload/activation_store_impl.h"

namespace zoe::offload {

namespace {
enum CopyKind { kD2H = 1, kH2D = 2, kH2H = 3 };
}  // namespace

Status TieredActivationStore::init_nvme() {
  if (o_.nvme_dirs.empty())
    return invalid_argument(
        "activation store: offload nvme needs a directory "
        "(zoe.activation_nvme_path)");
  uint64_t staging = uint64_t{o_.write_buffers} * o_.run_bytes;
  if (o_.write_buffers == 0 || o_.host_budget < staging)
    return invalid_argument(
        "zoe.activation_host_budget: %llu bytes, below the %u NVMe write buffers of %llu "
        "bytes the activation store needs with offload nvme",
        static_cast<unsigned long long>(o_.host_budget), o_.write_buffers,
        static_cast<unsigned long long>(o_.run_bytes));
  ZOE_ASSIGN_OR_RETURN(io_, io::IoEngine::create(o_.io));
  io::SwapFileOptions so;
  so.dirs = o_.nvme_dirs;
  so.name = "zoe-activations";
  so.max_bytes = o_.nvme_budget;
  so.grow_bytes = std::max<uint64_t>(64u << 20, 4 * o_.run_bytes);
  so.checksum = o_.checksum;
  so.hole_check = o_.hole_check;
  ZOE_ASSIGN_OR_RETURN(swap_, io::SwapFile::create(so));
  (void)swap_->register_files(*io_);  // optional: speeds up submission where io_uring takes it
  for (uint32_t k = 0; k < o_.write_buffers; ++k) {
    ZOE_ASSIGN_OR_RETURN(char* p, host_.take(o_.run_bytes));
    wbuf_.push_back(WriteBuf{p, nullptr, 0, false});
  }
  return Status::ok();
}

std::string TieredActivationStore::swap_paths() const {
  std::string s;
  for (const auto& f : swap_->files()) s += (s.empty() ? "" : ", ") + f->path();
  return s;
}

// Collects finished writes; a failed one marks its run. With report, returns (once) the first
// failure not reported yet.
Status TieredActivationStore::poll_writes(bool report) {
  for (WriteBuf& w : wbuf_) {
    if (!w.pending || !w.pending->ready()) continue;
    Status s = w.pending->status();
    w.pending = nullptr;
    if (s.is_ok() || !runs_[w.run].error.is_ok()) continue;
    runs_[w.run].error = s;
    if (pending_error_.is_ok()) {
      std::string names;
      for (size_t i : runs_[w.run].tensors) names += (names.empty() ? "" : ", ") + std::to_string(i);
      pending_error_ = Status(s.code(), "activation store: writing tensor(s) " + names + " to " +
                                            swap_paths() + " failed: " + s.message());
    }
  }
  if (!report || pending_error_.is_ok()) return Status::ok();
  Status s = std::move(pending_error_);
  pending_error_ = Status::ok();
  return s;
}

Result<size_t> TieredActivationStore::free_write_buf() {
  for (;;) {
    (void)poll_writes(false);
    size_t oldest = wbuf_.size();
    for (size_t b = 0; b < wbuf_.size(); ++b) {
      if (wbuf_[b].filling) continue;
      if (!wbuf_[b].pending) return b;
      if (oldest == wbuf_.size() || wbuf_[b].pending->submit_ns() < wbuf_[oldest].pending->submit_ns())
        oldest = b;
    }
    if (oldest == wbuf_.size()) return internal_error("activation store: every write buffer is being filled");
    (void)wbuf_[oldest].pending->wait();  // write-behind is full: wait for the oldest (no lock held)
  }
}

Status TieredActivationStore::submit_run_write(size_t run, size_t b, uint64_t at, uint64_t len) {
  io::IoHandle h = swap_->write(*io_, runs_[run].extent, wbuf_[b].p, len, at);
  wbuf_[b].pending = h;
  wbuf_[b].run = run;
  runs_[run].writes.push_back(std::move(h));
  stats_.bytes_nvme_write += len;
  return Status::ok();
}

Status TieredActivationStore::flush_open_run() {
  if (open_run_ < 0) return Status::ok();
  size_t r = static_cast<size_t>(open_run_);
  Run& run = runs_[r];
  size_t b = run.buf;
  open_run_ = -1;
  run.open = false;
  wbuf_[b].filling = false;
  auto e = swap_->allocate(run.fill);
  if (!e.is_ok()) {
    std::string names;
    for (size_t i : run.tensors) names += (names.empty() ? "" : ", ") + std::to_string(i);
    run.error = Status(e.status().code(),
                       "activation store: no NVMe room for tensor(s) " + names + ": " + e.status().message());
    return run.error;
  }
  run.extent = e.value();
  run.has_extent = true;
  nvme_used_ += run.extent.bytes;
  return submit_run_write(r, b, 0, run.fill);
}

Status TieredActivationStore::place_nvme(size_t i, const void* src, bool from_device) {
  Tensor& t = t_[i];
  uint64_t rb = round_up_4k(t.bytes);
  if (rb > o_.run_bytes) return place_large(i, src, from_device);
  if (open_run_ >= 0 && runs_[open_run_].fill + rb > o_.run_bytes) ZOE_RETURN_IF_ERROR(flush_open_run());
  if (open_run_ < 0) {
    ZOE_ASSIGN_OR_RETURN(size_t b, free_write_buf());
    runs_.push_back(Run{});
    runs_.back().open = true;
    runs_.back().buf = b;
    wbuf_[b].filling = true;
    open_run_ = static_cast<int64_t>(runs_.size() - 1);
  }
  Run& run = runs_[open_run_];
  ZOE_RETURN_IF_ERROR(copy(wbuf_[run.buf].p + run.fill, src, t.bytes, from_device ? kD2H : kH2H));
  t.tier = Tier::kNvme;
  t.run = static_cast<size_t>(open_run_);
  t.at = run.fill;
  t.live = true;
  run.fill += rb;
  run.tensors.push_back(i);
  run.live++;
  note_tier(Tier::kNvme, static_cast<int64_t>(t.bytes));
  return Status::ok();
}

// A tensor larger than a write buffer: its own extent, written in run_bytes pieces.
Status TieredActivationStore::place_large(size_t i, const void* src, bool from_device) {
  ZOE_RETURN_IF_ERROR(flush_open_run());
  Tensor& t = t_[i];
  ZOE_ASSIGN_OR_RETURN(io::Extent e, swap_->allocate(round_up_4k(t.bytes)));
  runs_.push_back(Run{});
  size_t r = runs_.size() - 1;
  runs_[r].extent = e;
  runs_[r].has_extent = true;
  runs_[r].tensors.push_back(i);
  nvme_used_ += e.bytes;
  t.tier = Tier::kNvme;
  t.run = r;
  t.at = 0;
  t.live = true;
  runs_[r].live = 1;
  note_tier(Tier::kNvme, static_cast<int64_t>(t.bytes));
  for (uint64_t off = 0; off < t.bytes; off += o_.run_bytes) {
    uint64_t len = std::min<uint64_t>(o_.run_bytes, t.bytes - off);
    ZOE_ASSIGN_OR_RETURN(size_t b, free_write_buf());
    ZOE_RETURN_IF_ERROR(
        copy(wbuf_[b].p, static_cast<const char*>(src) + off, len, from_device ? kD2H : kH2H));
    ZOE_RETURN_IF_ERROR(submit_run_write(r, b, off, round_up_4k(len)));
  }
  return Status::ok();
}

Status TieredActivationStore::run_error(size_t run, size_t i) const {
  const Status& e = runs_[run].error;
  return Status(e.code(), "activation store: tensor " + std::to_string(i) + " was not stored (" +
                              swap_paths() + "): " + e.message());
}

Status TieredActivationStore::wait_run_writes(size_t run) {
  for (io::IoHandle& h : runs_[run].writes) {
    Status s = h->wait();  // no lock held
    if (!s.is_ok() && runs_[run].error.is_ok()) runs_[run].error = s;
  }
  (void)poll_writes(false);
  return runs_[run].error;
}

Status TieredActivationStore::start_read(size_t i) {
  Tensor& t = t_[i];
  uint64_t rb = round_up_4k(t.bytes);
  ZOE_ASSIGN_OR_RETURN(char* p, host_.take(rb));
  stats_.high_water_host = std::max(stats_.high_water_host, host_.high_water());
  t.host = p;
  t.read = swap_->read(*io_, runs_[t.run].extent, p, rb, t.at);
  stats_.bytes_nvme_read += rb;
  return Status::ok();
}

// Starts the reads of tensor i and the next `prefetch` held tensors in reverse save order, where
// their runs are written and the host has room.
void TieredActivationStore::prefetch_from(size_t i) {
  uint32_t ahead = 0;
  for (size_t j = i + 1; j-- > 0 && ahead <= o_.prefetch;) {
    Tensor& t = t_[j];
    if (!t.live) continue;
    ++ahead;
    if (t.tier != Tier::kNvme || t.read) continue;
    const Run& run = runs_[t.run];
    if (run.open || !run.error.is_ok() || !host_.can_take(round_up_4k(t.bytes))) continue;
    bool written =
        std::all_of(run.writes.begin(), run.writes.end(), [](const io::IoHandle& h) { return h->ready(); });
    if (written) (void)start_read(j);
  }
}

Status TieredActivationStore::load_nvme(size_t i, void* dst) {
  Tensor& t = t_[i];
  size_t r = t.run;
  if (runs_[r].open) return copy(dst, wbuf_[runs_[r].buf].p + t.at, t.bytes, kH2D);  // still in the buffer
  uint64_t t0 = now_ns();
  if (!t.read) {
    if (!wait_run_writes(r).is_ok()) return run_error(r, i);
    Status s = start_read(i);
    if (s.code() == StatusCode::kOutOfBudget) {
      drop_reads_ahead(i);  // the host is full of read-ahead (a larger tensor than planned): this one first
      s = start_read(i);
    }
    if (s.code() == StatusCode::kOutOfBudget) {
      s = load_in_pieces(i, dst);  // no block of its size fits beside the host tier: the write buffers
      stats_.t_stall += static_cast<double>(now_ns() - t0) * 1e-9;
      return s;
    }
    if (!s.is_ok()) return s;
  }
  Status s = t.read->wait();  // no lock held
  stats_.t_stall += static_cast<double>(now_ns() - t0) * 1e-9;
  if (!runs_[r].error.is_ok()) return run_error(r, i);
  if (!s.is_ok()) {
    host_.give(t.host);  // the tensor stays held on NVMe: a later load() reads it again
    t.host = nullptr;
    t.read = nullptr;
    return Status(s.code(), "activation store: reading tensor " + std::to_string(i) + " from " +
                                swap_paths() + " failed: " + s.message());
  }
  return copy(dst, t.host, t.bytes, kH2D);
}

// Reads tensor i through the write buffers, one piece of run_bytes at a time, into dst.
Status TieredActivationStore::load_in_pieces(size_t i, void* dst) {
  const Tensor& t = t_[i];
  for (uint64_t off = 0; off < t.bytes; off += o_.run_bytes) {
    const uint64_t len = std::min<uint64_t>(o_.run_bytes, t.bytes - off);
    ZOE_ASSIGN_OR_RETURN(size_t b, free_write_buf());
    io::IoHandle h = swap_->read(*io_, runs_[t.run].extent, wbuf_[b].p, round_up_4k(len), t.at + off);
    stats_.bytes_nvme_read += round_up_4k(len);
    Status s = h->wait();  // no lock held
    if (!s.is_ok())
      return Status(s.code(), "activation store: reading tensor " + std::to_string(i) + " from " +
                                  swap_paths() + " failed: " + s.message());
    ZOE_RETURN_IF_ERROR(copy(static_cast<char*>(dst) + off, wbuf_[b].p, len, kH2D));
  }
  return Status::ok();
}

void TieredActivationStore::drop_reads_ahead(size_t i) {
  for (size_t j = 0; j < t_.size(); ++j) {
    Tensor& t = t_[j];
    if (j == i || !t.live || t.tier != Tier::kNvme || !t.read) continue;
    (void)t.read->wait();  // no lock held
    host_.give(t.host);
    t.host = nullptr;
    t.read = nullptr;
  }
}

void TieredActivationStore::free_run(size_t r) {
  Run& run = runs_[r];
  for (io::IoHandle& h : run.writes) (void)h->wait();  // done by now, except after a failure
  run.writes.clear();
  if (!run.has_extent) return;
  swap_->free(run.extent);
  nvme_used_ -= run.extent.bytes;
  run.has_extent = false;
}

void TieredActivationStore::drain_writes() {
  for (WriteBuf& w : wbuf_) {
    if (w.pending) (void)w.pending->wait();  // no lock held
  }
}

size_t TieredActivationStore::held() const {
  size_t n = 0;
  for (const Tensor& t : t_) n += t.live ? 1 : 0;
  return n;
}

size_t activation_tensors_held(const ActivationStore& store) {
  auto* s = dynamic_cast<const TieredActivationStore*>(&store);
  return s ? s->held() : 0;
}

void drain_activation_writes(ActivationStore& store) {
  if (auto* s = dynamic_cast<TieredActivationStore*>(&store)) s->drain_writes();
}

}  // namespace zoe::offload
