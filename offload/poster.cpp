// Poster: one thread that runs posted completion work in order.
#include "offload/poster.h"

namespace zoe::offload {

Poster::Poster() : thread_([this] { run(); }) {}

Poster::~Poster() { stop(); }

void Poster::post(std::function<void()> fn) {
  // Notified under the lock: once fn may run, this thread no longer touches the poster. fn may be
  // the move whose end lets the owner stop and destroy the poster (a completion on the reaper
  // thread, say); notifying after unlocking raced with that destruction.
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(fn));
  cv_.notify_one();
}

Status Poster::after(device::Stream& s, std::function<void()> fn) {
  return s.enqueue_host([this, fn = std::move(fn)]() mutable { post(std::move(fn)); });
}

void Poster::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Poster::run() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace zoe::offload
