// IoEngine: request splitting, short-transfer continuation, retries, completion bookkeeping.
#include "io/io_engine.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/clock.h"
#include "core/cpu.h"
#include "core/log.h"
#include "io/backends.h"
#include "io/fault_injector.h"
#include "zoe/features.h"

namespace zoe::io {
namespace {
constexpr uint32_t kMaxRetries = 64;
}

const char* io_backend_name(IoBackend b) {
  switch (b) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kUring:
      return "uring";
    case IoBackend::kThreads:
      return "threads";
  }
  return "?";
}

Result<IoBackend> parse_io_backend(const std::string& name) {
  if (name == "auto") return IoBackend::kAuto;
  if (name == "uring" || name == "io_uring") return IoBackend::kUring;
  if (name == "threads" || name == "thread" || name == "psync") return IoBackend::kThreads;
  return invalid_argument("unknown I/O engine '%s' (expected uring, threads or auto)", name.c_str());
}

Status IoCompletion::wait() {
  if (!ready()) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ready(); });
  }
  return status_;
}

IoEngine::IoEngine(const IoEngineOptions& opts) : opts_(opts), read_ioprio_(opts.read_ioprio) {}

IoEngine::~IoEngine() {
  // The backend's shutdown_and_wait() saw every submission complete, hooks included.
  {
    std::lock_guard<std::mutex> lock(hook_mu_);
    hook_stop_ = true;
  }
  hook_cv_.notify_all();
  for (auto& t : hook_threads_) t.join();
}

Result<std::unique_ptr<IoEngine>> IoEngine::create(const IoEngineOptions& opts) {
  if (opts.queue_depth == 0 || opts.queue_depth > 4096) {
    return invalid_argument("I/O queue depth %u is out of range (1..4096)", opts.queue_depth);
  }
  if (opts.block_size < 4096 || opts.block_size % 4096 != 0 || opts.block_size > (1u << 30)) {
    return invalid_argument("I/O block size %zu must be a multiple of 4096 between 4 KiB and 1 GiB",
                            opts.block_size);
  }
  switch (opts.backend) {
    case IoBackend::kThreads:
      return make_thread_engine(opts);
    case IoBackend::kUring:
      return make_uring_engine(opts);
    case IoBackend::kAuto: {
      auto e = make_uring_engine(opts);
      if (e.is_ok()) return e;
      ZOE_LOG_INFO("io_uring unavailable (%s); using the thread-pool I/O engine",
                   e.status().message().c_str());
      return make_thread_engine(opts);
    }
  }
  return internal_error("unknown backend");
}

Status IoEngine::validate(const IoRequest& r) const {
  if (!r.file) return invalid_argument("I/O request without a file");
  if (r.len == 0) return Status::ok();
  if (!r.buf)
    return invalid_argument("%s of %zu bytes at offset %llu of %s: null buffer", io_op_name(r.op), r.len,
                            static_cast<unsigned long long>(r.offset), r.file->path().c_str());
  if (r.file->direct()) {
    auto addr = reinterpret_cast<uintptr_t>(r.buf);
    uint32_t ma = r.file->mem_align(), oa = r.file->offset_align();
    if (addr % ma != 0 || r.offset % oa != 0 || r.len % oa != 0) {
      return invalid_argument(
          "O_DIRECT %s of %zu bytes at offset %llu of %s into buffer %p is not aligned: O_DIRECT "
          "needs the buffer address aligned to %u bytes and the offset and length to %u bytes. "
          "Use zoe's aligned buffers, or open the file without O_DIRECT.",
          io_op_name(r.op), r.len, static_cast<unsigned long long>(r.offset), r.file->path().c_str(), r.buf,
          ma, oa);
    }
  }
  return Status::ok();
}

IoHandle IoEngine::submit(std::span<const IoRequest> reqs, IoCallback cb) {
  return submit(reqs, std::move(cb), IoFinish{});
}

IoHandle IoEngine::submit(std::span<const IoRequest> reqs, IoCallback cb, IoFinish finish,
                          bool finish_inline) {
  auto g = std::make_shared<IoCompletion>();
  g->callback_ = std::move(cb);
  g->finish_ = std::move(finish);
  g->finish_inline_ = finish_inline;
  g->submit_ns_ = now_ns();
  outstanding_.fetch_add(1);
  auto fail_now = [&](Status s) {
    g->status_ = std::move(s);
    finish_group(g);
    return g;
  };
  if (!accepting_.load()) return fail_now(Status(StatusCode::kCancelled, "the I/O engine is shutting down"));
  size_t nchunks = 0;
  for (const IoRequest& r : reqs) {
    Status s = validate(r);
    if (!s.is_ok()) return fail_now(std::move(s));
    nchunks += (r.len + opts_.block_size - 1) / opts_.block_size;
  }
  if (nchunks == 0) return fail_now(Status::ok());
  std::vector<Chunk*> chunks;
  chunks.reserve(nchunks);
  for (const IoRequest& r : reqs) {
    if (r.op == IoOp::kRead) {
      counters_.read_requests.fetch_add(1, std::memory_order_relaxed);
    } else {
      counters_.write_requests.fetch_add(1, std::memory_order_relaxed);
    }
    for (size_t off = 0; off < r.len; off += opts_.block_size) {
      size_t n = std::min(opts_.block_size, r.len - off);
      chunks.push_back(new Chunk{r.op, r.file, r.offset + off, static_cast<char*>(r.buf) + off,
                                 static_cast<uint32_t>(n), 0, 0, g});
    }
  }
  g->pending_.store(static_cast<uint32_t>(chunks.size()), std::memory_order_relaxed);
  counters_.chunks.fetch_add(chunks.size(), std::memory_order_relaxed);
  enqueue(chunks);
  return g;
}

void IoEngine::complete_chunk(Chunk* c, int res) {
  if (opts_.faults) {
    opts_.faults->before_completion(c->op);
    res = opts_.faults->apply(c->op, c->buf, c->len, c->file->offset_align(), res);
  }
  IoCompletion* g = c->group.get();
  const char* opname = c->op == IoOp::kRead ? "pread" : "pwrite";
  Status err;
  // A priority the kernel does not allow this process: the read goes again without it.
  if (res == -EPERM && c->ioprio != 0) {
    if (read_ioprio_.exchange(0) != 0) {
      ZOE_LOG_WARN(
          "io: the kernel refused I/O priority class %d level %d for reads (%s); they go on at the "
          "process's priority",
          c->ioprio >> 13, c->ioprio & 7, strerror(EPERM));
    }
    c->ioprio = 0;
    std::vector<Chunk*> again{c};
    enqueue(again);
    return;
  }
  // ECANCELED: io_uring cancels the requests a thread pushed to its async workers when that thread
  // exits (a short-lived submitter that also flushed other threads' queued requests); nothing was
  // transferred, and the retry is submitted by the engine's own completion thread.
  if ((res == -EINTR || res == -EAGAIN || res == -ECANCELED) && c->retries < kMaxRetries) {
    c->retries++;
    counters_.retries.fetch_add(1, std::memory_order_relaxed);
    std::vector<Chunk*> again{c};
    enqueue(again);
    return;
  }
  if (res < 0) {
    err = sys_error(opname, c->file->path(), c->offset, c->len, -res);
  } else if (res == 0) {
    if (c->op == IoOp::kRead) {
      err = io_error(
          "Short read: end of file at offset %llu of %s with %u bytes still to read "
          "(the file is shorter than expected; truncated?)",
          static_cast<unsigned long long>(c->offset), c->file->path().c_str(), c->len);
    } else {
      err = io_error("While pwrite %u bytes at offset %llu of %s: the kernel wrote nothing", c->len,
                     static_cast<unsigned long long>(c->offset), c->file->path().c_str());
    }
  } else {
    auto n = static_cast<uint32_t>(res);
    g->bytes_.fetch_add(n, std::memory_order_relaxed);
    if (c->op == IoOp::kRead) {
      counters_.read_bytes.fetch_add(n, std::memory_order_relaxed);
    } else {
      counters_.write_bytes.fetch_add(n, std::memory_order_relaxed);
    }
    if (n < c->len) {
      if (c->file->direct() && n % c->file->offset_align() != 0) {
        // O_DIRECT transfers stop short of a block boundary only at end of file.
        err = io_error(
            "Short read: end of file at offset %llu of %s with %u bytes still to read "
            "(the file is shorter than expected; truncated?)",
            static_cast<unsigned long long>(c->offset + n), c->file->path().c_str(), c->len - n);
      } else {
        c->offset += n;
        c->buf += n;
        c->len -= n;
        counters_.resubmits.fetch_add(1, std::memory_order_relaxed);
        std::vector<Chunk*> again{c};
        enqueue(again);
        return;
      }
    }
  }
  if (!err.is_ok()) {
    std::lock_guard<std::mutex> lock(g->mu_);
    if (g->status_.is_ok()) g->status_ = std::move(err);
  }
  IoHandle keep = std::move(c->group);
  delete c;
  if (g->pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) finish_group(keep);
}

void IoEngine::finish_group(const IoHandle& g) {
  if (g->finish_) {
    if (g->status_.is_ok() && g->finish_inline_) {
      // Every chunk is done: nothing else touches status_ now.
      IoFinish finish = std::move(g->finish_);
      g->status_ = finish();
    } else if (g->status_.is_ok()) {
      std::lock_guard<std::mutex> lock(hook_mu_);
      if (hook_threads_.empty()) {
        unsigned n = std::clamp(static_cast<unsigned>(usable_cores()) / 4, 1u, 4u);
        for (unsigned i = 0; i < n; ++i) hook_threads_.emplace_back([this] { hook_loop(); });
      }
      hook_queue_.push_back(g);
      hook_cv_.notify_one();
      return;
    }
    g->finish_ = nullptr;  // the transfer failed: nothing to check
  }
  complete_group(g.get());
}

void IoEngine::hook_loop() {
  for (;;) {
    IoHandle g;
    {
      std::unique_lock<std::mutex> lock(hook_mu_);
      hook_cv_.wait(lock, [&] { return hook_stop_ || !hook_queue_.empty(); });
      if (hook_queue_.empty()) return;
      g = std::move(hook_queue_.front());
      hook_queue_.pop_front();
    }
    // Every chunk is done: nothing else touches status_ now.
    IoFinish finish = std::move(g->finish_);
    g->status_ = finish();
    complete_group(g.get());
  }
}

void IoEngine::complete_group(IoCompletion* g) {
  g->complete_ns_ = now_ns();
  {
    std::lock_guard<std::mutex> lock(g->mu_);
    g->done_.store(true, std::memory_order_release);
  }
  g->cv_.notify_all();
  if (!g->status_.is_ok()) {
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(drain_mu_);
    if (first_error_.is_ok()) first_error_ = g->status_;
  }
  if (g->callback_) {
    IoCallback cb = std::move(g->callback_);
    cb(*g);
  }
  if (outstanding_.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> lock(drain_mu_);
    drain_cv_.notify_all();
  }
}

Status IoEngine::drain() {
  std::unique_lock<std::mutex> lock(drain_mu_);
  drain_cv_.wait(lock, [&] { return outstanding_.load() == 0; });
  Status s = std::move(first_error_);
  first_error_ = Status::ok();
  return s;
}

void IoEngine::shutdown_and_wait() {
  accepting_.store(false);
  std::unique_lock<std::mutex> lock(drain_mu_);
  drain_cv_.wait(lock, [&] { return outstanding_.load() == 0; });
}

Status IoEngine::read(const File& f, uint64_t offset, void* buf, size_t len) {
  return submit(IoRequest{IoOp::kRead, &f, offset, buf, len})->wait();
}

Status IoEngine::write(const File& f, uint64_t offset, const void* buf, size_t len) {
  return submit(IoRequest{IoOp::kWrite, &f, offset, const_cast<void*>(buf), len})->wait();
}

IoStatsSnapshot IoEngine::stats() const {
  IoStatsSnapshot s;
  s.read_requests = counters_.read_requests.load();
  s.write_requests = counters_.write_requests.load();
  s.read_bytes = counters_.read_bytes.load();
  s.write_bytes = counters_.write_bytes.load();
  s.chunks = counters_.chunks.load();
  s.resubmits = counters_.resubmits.load();
  s.retries = counters_.retries.load();
  s.errors = counters_.errors.load();
  return s;
}

}  // namespace zoe::io
