// FaultInjector: rule matching and result rewriting.
#include "io/fault_injector.h"

#include <cerrno>

namespace zoe::io {

void FaultInjector::add(FaultKind kind, uint64_t nth, uint64_t count, std::optional<IoOp> only) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back(Rule{kind, nth, count, only});
}

void FaultInjector::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
  seen_[0] = seen_[1] = seen_any_ = 0;
}

void FaultInjector::set_completion_hook(std::function<void(IoOp)> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  hook_ = std::move(hook);
}

void FaultInjector::before_completion(IoOp op) {
  std::function<void(IoOp)> hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hook = hook_;
  }
  if (hook) hook(op);
}

int FaultInjector::apply(IoOp op, char* buf, uint32_t len, uint32_t align, int res) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n_op = ++seen_[static_cast<int>(op)];
  uint64_t n_any = ++seen_any_;
  for (const Rule& r : rules_) {
    // Corrupt-read rules count reads only, whatever their filter says.
    std::optional<IoOp> only = r.kind == FaultKind::kCorruptRead ? std::optional<IoOp>(IoOp::kRead) : r.only;
    uint64_t n = only ? (*only == op ? n_op : 0) : n_any;
    if (n == 0 || n < r.nth || n - r.nth >= r.count) continue;
    switch (r.kind) {
      case FaultKind::kEio:
        injected_++;
        return -EIO;
      case FaultKind::kEnospc:
        injected_++;
        return -ENOSPC;
      case FaultKind::kEagain:
        injected_++;
        return -EAGAIN;
      case FaultKind::kCorruptRead: {
        if (res <= 0) return res;
        buf[static_cast<uint32_t>(res) / 2] ^= 0x20;  // one flipped bit in the middle of the bytes read
        injected_++;
        return res;
      }
      case FaultKind::kShort: {
        if (res <= 0) return res;
        uint32_t a = align ? align : 1;
        uint32_t half = (static_cast<uint32_t>(res) / 2) / a * a;
        if (half == 0 || half >= static_cast<uint32_t>(res)) return res;
        injected_++;
        return static_cast<int>(half);
      }
    }
  }
  (void)len;
  return res;
}

}  // namespace zoe::io
