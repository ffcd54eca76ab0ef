// The thread-pool backend: workers doing pread/pwrite, for systems where io_uring is unavailable.
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <system_error>
#include <thread>

#include "io/backends.h"

namespace zoe::io {
namespace {

class ThreadEngine final : public IoEngine {
 public:
  explicit ThreadEngine(const IoEngineOptions& opts) : IoEngine(opts) {
    uint32_t n = opts.threads ? opts.threads : opts.queue_depth;
    n = std::max<uint32_t>(1, std::min<uint32_t>(n, 128));
    // A worker that cannot start (std::system_error at the address-space or thread limit) stops
    // the ones that did before the error leaves: a joinable thread must not be destroyed.
    try {
      for (uint32_t i = 0; i < n; ++i) workers_.emplace_back([this] { work(); });
    } catch (...) {
      stop_workers();
      throw;
    }
  }

  ~ThreadEngine() override {
    shutdown_and_wait();
    stop_workers();
  }

  const char* name() const override { return "threads"; }

 protected:
  void enqueue(std::vector<Chunk*>& chunks) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Chunk* c : chunks) queue_.push_back(c);
    }
    if (chunks.size() == 1)
      cv_.notify_one();
    else
      cv_.notify_all();
  }

 private:
  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void work() {
    for (;;) {
      Chunk* c;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        c = queue_.front();
        queue_.pop_front();
      }
      ssize_t n = c->op == IoOp::kRead ? pread(c->file->fd(), c->buf, c->len, static_cast<off_t>(c->offset))
                                       : pwrite(c->file->fd(), c->buf, c->len, static_cast<off_t>(c->offset));
      complete_chunk(c, n >= 0 ? static_cast<int>(n) : -errno);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk*> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> make_thread_engine(const IoEngineOptions& opts) {
  try {
    return std::unique_ptr<IoEngine>(new ThreadEngine(opts));
  } catch (const std::system_error& e) {
    return out_of_budget(
        "I/O engine: cannot start its worker threads: %s (errno %d; out of memory or address "
        "space: the process's address space (ulimit -v) or thread count (ulimit -u) is at its "
        "limit)",
        e.what(), e.code().value());
  }
}

}  // namespace zoe::io
