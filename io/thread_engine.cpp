// The thread-pool backend: workers doing pread/pwrite, for systems where io_uring is unavailable.
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <thread>

#include "io/backends.h"

namespace zoe::io {
namespace {

class ThreadEngine final : public IoEngine {
 public:
  explicit ThreadEngine(const IoEngineOptions& opts) : IoEngine(opts) {
    uint32_t n = opts.threads ? opts.threads : opts.queue_depth;
    n = std::max<uint32_t>(1, std::min<uint32_t>(n, 128));
    for (uint32_t i = 0; i < n; ++i) workers_.emplace_back([this] { work(); });
  }

  ~ThreadEngine() override {
    shutdown_and_wait();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
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
  return std::unique_ptr<IoEngine>(new ThreadEngine(opts));
}

}  // namespace zoe::io
