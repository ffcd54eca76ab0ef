// HostQueue and HostState: the worker-thread stream behind LocalComm and MpiComm.
#include <pthread.h>

#include "comm/comm_internal.h"

namespace zoe::comm {

Status HostState::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return status_;
}

bool HostState::ready() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void HostState::complete(Status s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(s);
    done_ = true;
  }
  cv_.notify_all();
}

CommHandle completed_handle(Status s) {
  auto st = std::make_shared<HostState>();
  st->complete(std::move(s));
  return CommHandle(std::move(st));
}

HostQueue::HostQueue(const char* thread_name) : name_(thread_name) {
  thread_ = std::thread([this] { run(); });
}

HostQueue::~HostQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

CommHandle HostQueue::push(std::function<Status()> fn) {
  auto st = std::make_shared<HostState>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(Item{std::move(fn), st});
  }
  cv_.notify_one();
  return CommHandle(st);
}

void HostQueue::run() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  Status first_error;
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !items_.empty(); });
      if (items_.empty()) return;  // stopping and drained
      item = std::move(items_.front());
      items_.pop_front();
    }
    Status s;
    if (!first_error.is_ok()) {
      s = Status(StatusCode::kCancelled,
                 "not run: an earlier collective on this communicator failed: " + first_error.to_string());
    } else {
      s = item.fn();
      if (!s.is_ok()) first_error = s;
    }
    item.state->complete(std::move(s));
  }
}

}  // namespace zoe::comm
