// CpuPool: the threads the CPU optimizer runs its fixed-size chunks on (oneTBB or std::thread).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "zoe/status.h"

namespace zoe::optim {

class CpuPool {
 public:
  enum class Backend { kAuto, kTbb, kStdThread };
  struct Options {
    // Threads that work on one call, the caller included. 0: every PU of `numa_node`, or of
    // the host when no node is given.
    int threads = 0;
    // OS index of a NUMA node whose cores the threads are bound to while they work; -1: none.
    // The calling thread is bound while it takes part and gets its old affinity back after.
    int numa_node = -1;
    // kAuto: oneTBB when zoe was built with it, else std::thread.
    Backend backend = Backend::kAuto;
  };

  // Fails for a NUMA node that does not exist, threads < 0, or kTbb in a build without oneTBB.
  static Result<std::unique_ptr<CpuPool>> create(const Options& options);
  virtual ~CpuPool() = default;

  virtual int threads() const = 0;
  // "tbb" or "std::thread".
  virtual const char* backend_name() const = 0;

  // Calls fn(i) exactly once for every i in [0, n) across threads() threads and returns when all
  // calls have returned. Which thread runs which i is unspecified, so fn must make results
  // depend on i only (that is what makes the optimizer deterministic whatever the thread count).
  // Not reentrant: one call at a time per pool. fn must not throw.
  virtual void for_each(size_t n, const std::function<void(size_t)>& fn) = 0;
};

}  // namespace zoe::optim
