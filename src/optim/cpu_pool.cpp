// CpuPool backends: a oneTBB task_arena, and a small std::thread pool for builds without oneTBB.
#include "optim/cpu_pool.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "core/cpu.h"
#include "core/log.h"
#include "core/topology.h"
#include "zoe/features.h"

#if ZOE_HAVE_TBB
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>
#endif

namespace zoe::optim {
namespace {

// Binds the calling thread to a NUMA node for its lifetime and then restores its old affinity.
class ScopedNumaBinding {
 public:
  explicit ScopedNumaBinding(int node) {
    if (node < 0) return;
    if (pthread_getaffinity_np(pthread_self(), sizeof(saved_), &saved_) != 0) return;
    Status s = bind_current_thread_to_numa_node(node);
    if (!s.is_ok()) {
      ZOE_LOG_WARN("optimizer thread: %s", s.to_string().c_str());
      return;
    }
    bound_ = true;
  }
  ~ScopedNumaBinding() {
    if (bound_) pthread_setaffinity_np(pthread_self(), sizeof(saved_), &saved_);
  }
  ScopedNumaBinding(const ScopedNumaBinding&) = delete;
  ScopedNumaBinding& operator=(const ScopedNumaBinding&) = delete;

 private:
  cpu_set_t saved_{};
  bool bound_ = false;
};

class StdThreadPool final : public CpuPool {
 public:
  // A worker that cannot start (std::system_error: the process is at its address-space or thread
  // limit) stops the ones that did before the error leaves: a joinable thread must not be destroyed.
  StdThreadPool(int threads, int numa_node) : threads_(threads), numa_node_(numa_node) {
    try {
      for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker(); });
    } catch (...) {
      stop_workers();
      throw;
    }
  }
  ~StdThreadPool() override { stop_workers(); }
  int threads() const override { return threads_; }
  const char* backend_name() const override { return "std::thread"; }

  void for_each(size_t n, const std::function<void(size_t)>& fn) override {
    if (workers_.empty() || n <= 1) {
      ScopedNumaBinding bind(numa_node_);
      for (size_t i = 0; i < n; ++i) fn(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      next_.store(0, std::memory_order_relaxed);
      pending_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    start_cv_.notify_all();
    {
      ScopedNumaBinding bind(numa_node_);
      run_items();
    }
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  void run_items() {
    for (size_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) (*fn_)(i);
  }
  void worker() {
    if (numa_node_ >= 0) {
      Status s = bind_current_thread_to_numa_node(numa_node_);
      if (!s.is_ok()) ZOE_LOG_WARN("optimizer worker: %s", s.to_string().c_str());
    }
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      run_items();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  const int threads_;
  const int numa_node_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

#if ZOE_HAVE_TBB
// Binds every thread that enters the arena (workers and the caller) to the node while inside.
class NumaObserver final : public tbb::task_scheduler_observer {
 public:
  NumaObserver(tbb::task_arena& arena, int node) : tbb::task_scheduler_observer(arena), node_(node) {
    observe(true);
  }
  ~NumaObserver() override { observe(false); }
  void on_scheduler_entry(bool) override {
    binding().emplace_back(std::make_unique<ScopedNumaBinding>(node_));
  }
  void on_scheduler_exit(bool) override {
    if (!binding().empty()) binding().pop_back();
  }

 private:
  static std::vector<std::unique_ptr<ScopedNumaBinding>>& binding() {
    thread_local std::vector<std::unique_ptr<ScopedNumaBinding>> b;
    return b;
  }
  int node_;
};

class TbbPool final : public CpuPool {
 public:
  TbbPool(int threads, int numa_node) : threads_(threads), arena_(threads) {
    arena_.initialize();
    if (numa_node >= 0) observer_ = std::make_unique<NumaObserver>(arena_, numa_node);
  }
  ~TbbPool() override { observer_.reset(); }
  int threads() const override { return threads_; }
  const char* backend_name() const override { return "tbb"; }
  void for_each(size_t n, const std::function<void(size_t)>& fn) override {
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<size_t>(0, n, 1), [&](const tbb::blocked_range<size_t>& r) {
        for (size_t i = r.begin(); i != r.end(); ++i) fn(i);
      });
    });
  }

 private:
  int threads_;
  tbb::task_arena arena_;
  std::unique_ptr<NumaObserver> observer_;
};
#endif

}  // namespace

Result<std::unique_ptr<CpuPool>> CpuPool::create(const Options& o) {
  if (o.threads < 0) return invalid_argument("CpuPool: threads must be >= 0 (got %d)", o.threads);
  const Topology& topo = topology();
  int threads = o.threads;
  if (o.numa_node >= 0) {
    const NumaNode* node = nullptr;
    for (const auto& n : topo.numa_nodes) {
      if (n.os_index == o.numa_node) node = &n;
    }
    if (node == nullptr) {
      return invalid_argument("CpuPool: NUMA node %d does not exist (this host has %zu)", o.numa_node,
                              topo.numa_nodes.size());
    }
    if (threads == 0) threads = static_cast<int>(node->cpus.size());
  }
  // 0: the cores this process may use (affinity, cgroup quota), within the NUMA node asked for.
  if (threads == 0)
    threads = usable_cores();
  else if (o.threads == 0)
    threads = std::min(threads, usable_cores());
  if (threads <= 0) threads = 1;
  switch (o.backend) {
    case Backend::kTbb:
#if ZOE_HAVE_TBB
      return std::unique_ptr<CpuPool>(new TbbPool(threads, o.numa_node));
#else
      return unsupported("CpuPool: zoe was built without oneTBB");
#endif
    case Backend::kAuto:
#if ZOE_HAVE_TBB
      return std::unique_ptr<CpuPool>(new TbbPool(threads, o.numa_node));
#endif
      [[fallthrough]];
    case Backend::kStdThread:
      try {
        return std::unique_ptr<CpuPool>(new StdThreadPool(threads, o.numa_node));
      } catch (const std::system_error& e) {
        return out_of_budget(
            "CpuPool: cannot start %d worker threads: %s (errno %d; out of memory or address "
            "space: the process's address space (ulimit -v) or thread count (ulimit -u) is at "
            "its limit)",
            threads - 1, e.what(), e.code().value());
      }
  }
  return invalid_argument("CpuPool: unknown backend");
}

}  // namespace zoe::optim
