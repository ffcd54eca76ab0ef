// The gate between an overlapped optimizer update and the caller's next forward: which modules'
// updates are done. The update's thread marks each module once its new compute parameters are
// home (and every module at its end, also on an error); fetch(m) waits for module m only.
// Thread-safe; no lock is held while anyone waits for I/O.
#pragma once

#include <condition_variable>
#include <mutex>
#include <vector>

#include "zero/module_table.h"
#include "zoe/status.h"

namespace zoe::zero {

class UpdateGate {
 public:
  // An update of n modules starts: none is done.
  void open(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    done_.assign(n, 0);
    status_ = Status::ok();
  }
  // Module m's update is done (no-op when no update is open).
  void mark(ModuleId m) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_.empty()) return;
      done_[m.index] = 1;
    }
    cv_.notify_all();
  }
  // The update ended with status s: every module counts as done, so every waiter wakes.
  void finish(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(s);
      std::fill(done_.begin(), done_.end(), 1);
    }
    cv_.notify_all();
  }
  // Whether module m's update (if one runs) is done; never blocks on the update.
  bool done(ModuleId m) const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_.empty() || done_[m.index] != 0;
  }
  // Blocks until it is; the update's error if it failed.
  Status wait(ModuleId m) const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_.empty() || done_[m.index] != 0; });
    return status_;
  }
  // After the update's thread is joined: no update is open; returns its status.
  Status close() {
    std::lock_guard<std::mutex> lock(mu_);
    done_.clear();
    Status s = std::move(status_);
    status_ = Status::ok();
    return s;
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<uint8_t> done_;  // per module, while an update is open
  Status status_;
};

}  // namespace zoe::zero
