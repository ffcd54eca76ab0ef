// FaultInjector: makes an IoEngine fail, shorten or corrupt chosen transfers, for tests of error paths.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "io/io_engine.h"

namespace zoe::io {

enum class FaultKind : uint8_t {
  kEio,          // the transfer fails with EIO
  kEnospc,       // the transfer fails with ENOSPC
  kShort,        // the transfer moves only part of its bytes (the engine must continue it)
  kEagain,       // the kernel asks to try again (the engine must retry)
  kCorruptRead,  // a read succeeds but one byte of its buffer is flipped (counts only reads)
};

// Rules count kernel answers (chunks) that match their op filter, from 1. A rule fires on the
// nth..nth+count-1 matching answers. Thread-safe.
class FaultInjector {
 public:
  void add(FaultKind kind, uint64_t nth, uint64_t count = 1, std::optional<IoOp> only = std::nullopt);
  void clear();
  uint64_t injected() const { return injected_.load(); }

  // Runs `hook` on the engine's completion thread before each kernel answer is processed, so a
  // test can hold a completion back and force an interleaving. Empty: none.
  void set_completion_hook(std::function<void(IoOp)> hook);
  // Called by the engine for every kernel answer, before apply().
  void before_completion(IoOp op);
  // Called by the engine for every kernel answer about the len bytes at buf: returns the result
  // the engine should see (and may change the bytes a read brought in).
  int apply(IoOp op, char* buf, uint32_t len, uint32_t align, int res);

 private:
  struct Rule {
    FaultKind kind;
    uint64_t nth, count;
    std::optional<IoOp> only;
  };
  std::mutex mu_;
  std::vector<Rule> rules_;
  uint64_t seen_[2] = {0, 0};  // per op
  uint64_t seen_any_ = 0;
  std::atomic<uint64_t> injected_{0};
  std::function<void(IoOp)> hook_;
};

}  // namespace zoe::io
