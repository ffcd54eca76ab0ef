// The io_uring backend: one ring, submitters serialized on the SQ, one reaper thread on the CQ.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>

#include "core/log.h"
#include "io/backends.h"
#include "zoe/features.h"

#if ZOE_HAVE_URING
#include <liburing.h>
#endif

namespace zoe::io {

#if ZOE_HAVE_URING
namespace {

constexpr uint64_t kWakeTag = 1;  // user_data of the NOP that wakes the reaper at shutdown
constexpr unsigned kFileSlots = 256;
thread_local bool tl_in_reaper = false;

Status uring_error(const char* what, int neg_errno) {
  int err = -neg_errno;
  std::string hint;
  if (err == EPERM || err == ENOSYS)
    hint = " (io_uring disabled: seccomp, container policy or kernel.io_uring_disabled)";
  if (err == ENOMEM) hint = " (locked-memory limit too low for the ring? see ulimit -l)";
  return Status(err == ENOSYS || err == EPERM ? StatusCode::kUnsupported : StatusCode::kIoError,
                std::string(what) + ": " + strerror(err) + hint, err);
}

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const IoEngineOptions& opts) : IoEngine(opts) {}

  Status init() {
    io_uring_params p;
    memset(&p, 0, sizeof(p));
    if (opts_.sqpoll) {
      p.flags |= IORING_SETUP_SQPOLL;
      p.sq_thread_idle = opts_.sqpoll_idle_ms;
    }
    unsigned entries = 1;
    while (entries < opts_.queue_depth) entries <<= 1;
    p.flags |= IORING_SETUP_CQSIZE;
    p.cq_entries = entries * 2 + 2;
    int rc = io_uring_queue_init_params(entries, &ring_, &p);
    if (rc < 0) return uring_error("io_uring_queue_init", rc);
    ring_ok_ = true;
    rc = io_uring_register_files_sparse(&ring_, kFileSlots);
    if (rc == 0) {
      slots_free_.reserve(kFileSlots);
      for (unsigned i = kFileSlots; i-- > 0;) slots_free_.push_back(static_cast<int>(i));
    } else {
      ZOE_LOG_DEBUG("io_uring: no fixed file table (%s)", strerror(-rc));
    }
    reaper_ = std::thread([this] { reap_loop(); });
    return Status::ok();
  }

  ~UringEngine() override {
    shutdown_and_wait();
    if (reaper_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        ZOE_CHECK(sqe != nullptr);
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, kWakeTag);
        submit_locked();
      }
      reaper_.join();
    }
    if (ring_ok_) io_uring_queue_exit(&ring_);
  }

  const char* name() const override { return "uring"; }

  Status register_buffers(std::span<const iovec> bufs) override {
    (void)drain();
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Registered> all = registered_;
    for (const iovec& v : bufs) {
      // The kernel takes at most 1 GiB per fixed buffer: register big regions in pieces.
      auto* base = static_cast<char*>(v.iov_base);
      for (size_t off = 0; off < v.iov_len; off += (1u << 30)) {
        all.push_back(Registered{base + off, std::min<size_t>(1u << 30, v.iov_len - off), 0});
      }
    }
    std::sort(all.begin(), all.end(),
              [](const Registered& a, const Registered& b) { return a.base < b.base; });
    std::vector<iovec> iov;
    for (size_t i = 0; i < all.size(); ++i) {
      all[i].index = static_cast<int>(i);
      iov.push_back(iovec{all[i].base, all[i].len});
    }
    if (!registered_.empty()) io_uring_unregister_buffers(&ring_);
    int rc = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
    if (rc < 0) {
      registered_.clear();
      return uring_error("io_uring_register_buffers", rc);
    }
    registered_ = std::move(all);
    return Status::ok();
  }

  Status register_file(const File& f) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (file_slots_.count(f.id())) return Status::ok();
    if (slots_free_.empty()) return Status::ok();  // plain fds still work
    int slot = slots_free_.back();
    int fd = f.fd();
    int rc = io_uring_register_files_update(&ring_, static_cast<unsigned>(slot), &fd, 1);
    if (rc < 0) return uring_error("io_uring_register_files_update", rc);
    slots_free_.pop_back();
    file_slots_[f.id()] = slot;
    return Status::ok();
  }

  void unregister_file(const File& f) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = file_slots_.find(f.id());
    if (it == file_slots_.end()) return;
    int fd = -1;
    io_uring_register_files_update(&ring_, static_cast<unsigned>(it->second), &fd, 1);
    slots_free_.push_back(it->second);
    file_slots_.erase(it);
  }

 protected:
  void enqueue(std::vector<Chunk*>& chunks) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (Chunk* c : chunks) pending_.push_back(c);
    fill_locked();
    // The reaper submits once after a whole batch of completions; others submit now.
    if (!tl_in_reaper) submit_locked();
  }

 private:
  struct Registered {
    char* base;
    size_t len;
    int index;
  };

  int find_registered(const char* buf, size_t len) const {
    if (registered_.empty()) return -1;
    auto it = std::upper_bound(registered_.begin(), registered_.end(), buf,
                               [](const char* b, const Registered& r) { return b < r.base; });
    if (it == registered_.begin()) return -1;
    --it;
    if (buf + len <= it->base + it->len) return it->index;
    return -1;
  }

  void fill_locked() {
    while (inflight_ < opts_.queue_depth && !pending_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) {
        submit_locked();
        sqe = io_uring_get_sqe(&ring_);
        if (!sqe) break;
      }
      Chunk* c = pending_.front();
      pending_.pop_front();
      int fd = c->file->fd();
      bool fixed_file = false;
      if (!file_slots_.empty()) {
        auto it = file_slots_.find(c->file->id());
        if (it != file_slots_.end()) {
          fd = it->second;
          fixed_file = true;
        }
      }
      int bi = find_registered(c->buf, c->len);
      if (c->op == IoOp::kRead) {
        if (bi >= 0)
          io_uring_prep_read_fixed(sqe, fd, c->buf, c->len, c->offset, bi);
        else
          io_uring_prep_read(sqe, fd, c->buf, c->len, c->offset);
      } else {
        if (bi >= 0)
          io_uring_prep_write_fixed(sqe, fd, c->buf, c->len, c->offset, bi);
        else
          io_uring_prep_write(sqe, fd, c->buf, c->len, c->offset);
      }
      if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
      c->ioprio = c->op == IoOp::kRead ? read_ioprio_.load(std::memory_order_relaxed) : 0;
      sqe->ioprio = c->ioprio;
      io_uring_sqe_set_data(sqe, c);
      inflight_++;
    }
  }

  void submit_locked() {
    for (;;) {
      int rc = io_uring_submit(&ring_);
      if (rc >= 0 || (rc != -EINTR && rc != -EAGAIN)) {
        if (rc < 0 && rc != -EBUSY) ZOE_LOG_ERROR("io_uring_submit: %s", strerror(-rc));
        return;  // EBUSY: the CQ is full; the reaper submits again after draining it
      }
    }
  }

  void reap_loop() {
    tl_in_reaper = true;
    std::vector<std::pair<Chunk*, int>> done;
    io_uring_cqe* cqes[128];
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR || rc == -EAGAIN) continue;
      if (rc < 0) {
        ZOE_LOG_ERROR("io_uring_wait_cqe: %s", strerror(-rc));
        std::this_thread::yield();
        continue;
      }
      unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, 128);
      bool wake = false;
      done.clear();
      for (unsigned i = 0; i < n; ++i) {
        if (io_uring_cqe_get_data64(cqes[i]) == kWakeTag) {
          wake = true;
          continue;
        }
        done.emplace_back(static_cast<Chunk*>(io_uring_cqe_get_data(cqes[i])), cqes[i]->res);
      }
      io_uring_cq_advance(&ring_, n);
      {
        std::lock_guard<std::mutex> lock(mu_);
        inflight_ -= static_cast<uint32_t>(done.size());
      }
      for (auto& [c, res] : done) complete_chunk(c, res);
      {
        std::lock_guard<std::mutex> lock(mu_);
        fill_locked();
        if (io_uring_sq_ready(&ring_) > 0) submit_locked();
        if (wake && stopping_) return;
      }
    }
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  std::thread reaper_;
  std::mutex mu_;  // guards the SQ, pending_, inflight_, file_slots_, registered_
  std::deque<Chunk*> pending_;
  uint32_t inflight_ = 0;
  bool stopping_ = false;
  std::vector<Registered> registered_;
  std::unordered_map<uint64_t, int> file_slots_;
  std::vector<int> slots_free_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> make_uring_engine(const IoEngineOptions& opts) {
  auto e = std::make_unique<UringEngine>(opts);
  ZOE_RETURN_IF_ERROR(e->init());
  return std::unique_ptr<IoEngine>(std::move(e));
}

std::string probe_uring() {
  io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) return uring_error("io_uring_queue_init", rc).message();
  std::string why;
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  if (!probe) {
    why = "io_uring_get_probe failed (kernel older than 5.6)";
  } else {
    if (!io_uring_opcode_supported(probe, IORING_OP_READ) ||
        !io_uring_opcode_supported(probe, IORING_OP_WRITE)) {
      why = "the kernel's io_uring lacks IORING_OP_READ/WRITE (older than 5.6)";
    }
    io_uring_free_probe(probe);
  }
  if (why.empty()) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_nop(sqe);
    rc = io_uring_submit(&ring);
    io_uring_cqe* cqe = nullptr;
    if (rc < 0) {
      why = uring_error("io_uring_submit", rc).message();
    } else if ((rc = io_uring_wait_cqe(&ring, &cqe)) < 0) {
      why = uring_error("io_uring_wait_cqe", rc).message();
    } else {
      io_uring_cqe_seen(&ring, cqe);
    }
  }
  io_uring_queue_exit(&ring);
  return why;
}

#else  // !ZOE_HAVE_URING

Result<std::unique_ptr<IoEngine>> make_uring_engine(const IoEngineOptions&) {
  return unsupported("zoe was built without liburing (install liburing-dev and rebuild)");
}

std::string probe_uring() { return "zoe was built without liburing"; }

#endif

}  // namespace zoe::io
