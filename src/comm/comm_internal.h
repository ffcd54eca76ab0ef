// Pieces the communicator backends share: handle states, argument checks, the host worker queue.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/communicator.h"

namespace zoe::comm {

// What a handle points at; backends derive from it (a host completion, a CUDA event).
struct CommHandle::State {
  virtual ~State() = default;
  virtual Status wait() = 0;
  virtual bool ready() = 0;
};

// Completed by a host thread: a flag and a Status behind a mutex.
class HostState final : public CommHandle::State {
 public:
  Status wait() override;
  bool ready() override;
  void complete(Status s);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

// A handle that is already complete with `s` (argument errors, nothing to do).
CommHandle completed_handle(Status s);

// Argument checks shared by every backend: kInvalidArgument naming the collective, or OK.
Status check_buffers(const char* op, const void* send, const void* recv, size_t count);
Status check_root(const char* op, int root, int size);

// One worker thread running queued tasks in order: the "stream" of a host communicator. After a
// task fails, later ones are not run and fail with kCancelled naming the first failure.
class HostQueue {
 public:
  explicit HostQueue(const char* thread_name);
  ~HostQueue();  // runs what is queued, then joins
  HostQueue(const HostQueue&) = delete;
  HostQueue& operator=(const HostQueue&) = delete;

  CommHandle push(std::function<Status()> fn);

 private:
  struct Item {
    std::function<Status()> fn;
    std::shared_ptr<HostState> state;
  };
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool stopping_ = false;
  std::string name_;
  std::thread thread_;
};

}  // namespace zoe::comm
