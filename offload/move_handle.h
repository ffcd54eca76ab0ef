// MoveHandle: the completion of one fetch or eviction, shared by the caller and the manager.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>

#include "zoe/status.h"

namespace zoe::offload {

// Thread-safe, copyable. A default-constructed handle is ready; wait() on it is an error.
class MoveHandle {
 public:
  // What the handle waits on; the copy being moved holds it too. Completed exactly once.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
    void* ptr = nullptr;
    void complete(Status s, void* p);
  };

  MoveHandle() = default;
  explicit MoveHandle(std::shared_ptr<State> s) : s_(std::move(s)) {}
  // A handle that is complete already.
  static MoveHandle completed(Status s, void* p);

  // The copy's address (device or host) once the move is done, or the error.
  Result<void*> wait() const;
  bool ready() const;

 private:
  std::shared_ptr<State> s_;
};

}  // namespace zoe::offload
