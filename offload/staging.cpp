// StagingPool: shared staging buffers with a FIFO of waiting jobs, and the synchronous buffer.
#include "offload/staging.h"

namespace zoe::offload {

Result<std::unique_ptr<StagingPool>> StagingPool::create(size_t bytes, size_t count, io::PinMode pin) {
  std::unique_ptr<StagingPool> p(new StagingPool());
  ZOE_ASSIGN_OR_RETURN(p->pool_, io::BufferPool::create(bytes, count + 1, pin));
  for (size_t i = 0; i < count; ++i) p->free_.push_back(p->pool_->buffer(i));
  p->sync_ = p->pool_->buffer(count);
  return p;
}

void StagingPool::with_buffer(std::function<void(char*)> job) {
  char* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) {
      wait_.push_back(std::move(job));
      return;
    }
    b = free_.back();
    free_.pop_back();
  }
  job(b);
}

void StagingPool::release(char* buf) {
  std::function<void(char*)> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (wait_.empty()) {
      free_.push_back(buf);
      return;
    }
    next = std::move(wait_.front());
    wait_.pop_front();
  }
  next(buf);
}

StagingPool::SyncLease StagingPool::lease_sync_buffer() {
  return SyncLease{std::unique_lock<std::mutex>(sync_mu_), sync_};
}

}  // namespace zoe::offload
