// MoveHandle: waiting on the completion of a move.
#include "offload/move_handle.h"

namespace zoe::offload {

void MoveHandle::State::complete(Status s, void* p) {
  {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    ptr = p;
    done = true;
  }
  cv.notify_all();
}

MoveHandle MoveHandle::completed(Status s, void* p) {
  MoveHandle h(std::make_shared<State>());
  h.s_->complete(std::move(s), p);
  return h;
}

Result<void*> MoveHandle::wait() const {
  if (!s_) return internal_error("wait on an empty MoveHandle");
  std::unique_lock<std::mutex> lock(s_->mu);
  s_->cv.wait(lock, [&] { return s_->done; });
  if (!s_->status.is_ok()) return s_->status;
  return s_->ptr;
}

bool MoveHandle::ready() const {
  if (!s_) return true;
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->done;
}

}  // namespace zoe::offload
