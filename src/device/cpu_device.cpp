// CpuDevice: host RAM posing as device memory under a hard budget, with worker-thread streams.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#include "core/log.h"
#include "core/units.h"
#include "device/device.h"
#include "device/memory_ledger.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ZOE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define ZOE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define ZOE_POISON(p, n) ((void)(p), (void)(n))
#define ZOE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace zoe::device {
namespace {

std::mutex g_fault_mu;
std::atomic<bool> g_fault_set{false};  // the allocation path takes the mutex only when a hook is set
std::atomic<uint64_t> g_leaked_bytes{0};
std::function<bool(size_t)>& fault_hook() {
  static std::function<bool(size_t)> f;
  return f;
}

bool injected_allocation_failure(size_t bytes) {
  if (!g_fault_set.load(std::memory_order_acquire)) return false;
  std::function<bool(size_t)> f;
  {
    std::lock_guard<std::mutex> lock(g_fault_mu);
    f = fault_hook();
  }
  return f && f(bytes);
}

// Device memory is 4 KiB aligned so NVMe reads can land in it with O_DIRECT.
constexpr size_t kCpuAlignment = 4096;

// Freed blocks of at least kCacheMinBytes, kept for the next allocation of the same rounded
// size: the engine allocates and frees the same few sizes every micro-batch (a module's
// gathered parameters, its gradient buffer), and a fresh multi-megabyte block from the C
// library comes as new pages from the kernel, whose faults cost several times the copy that
// fills it (measured: 24 MiB fetched in 73 ms against 15 ms from reused memory). Live plus
// cached bytes stay within the device budget: an allocation that would pass it drops cached
// blocks first, so the cache never makes the process hold more than the budget. Its own lock,
// held only for the map (never across a wait); stream threads free into it too.
class BlockCache {
 public:
  static constexpr size_t kCacheMinBytes = size_t{1} << 20;
  ~BlockCache() { trim(0); }

  // A cached block of exactly `rounded` bytes, or null.
  void* take(size_t rounded) {
    if (rounded < kCacheMinBytes) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(rounded);
    if (it == blocks_.end()) return nullptr;
    void* p = it->second;
    blocks_.erase(it);
    bytes_ -= rounded;
    ZOE_UNPOISON(p, rounded);
    return p;
  }
  // Keeps p (`rounded` bytes) when live + cached bytes stay within the budget; else frees it.
  void give(void* p, size_t rounded, uint64_t live, uint64_t budget) {
    if (rounded >= kCacheMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      if (live + bytes_ + rounded <= budget) {
        ZOE_POISON(p, rounded);
        blocks_.emplace(rounded, p);
        bytes_ += rounded;
        return;
      }
    }
    std::free(p);
  }
  // Frees cached blocks until at most `keep` bytes are cached.
  void trim(uint64_t keep) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = blocks_.begin(); it != blocks_.end() && bytes_ > keep;) {
      bytes_ -= it->first;
      ZOE_UNPOISON(it->second, it->first);
      std::free(it->second);
      it = blocks_.erase(it);
    }
  }
  uint64_t bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  mutable std::mutex mu_;
  std::multimap<size_t, void*> blocks_;
  uint64_t bytes_ = 0;
};

size_t round_up(size_t bytes) { return (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment; }

// The pages wholly inside [p, p + n): their start and length (0 when there is none). The head and
// tail pages an allocation may share with the C library's heap are left out.
std::pair<void*, size_t> whole_pages(void* p, uint64_t n) {
  static const auto kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + kPage - 1) / kPage * kPage, last = (begin + n) / kPage * kPage;
  if (last <= first) return {nullptr, 0};
  return {reinterpret_cast<void*>(first), last - first};  // NOLINT(performance-no-int-to-ptr)
}

// One record of an event: set when the stream that recorded it runs past that point.
class Marker {
 public:
  void set() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }
  bool is_set() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

class CpuEvent final : public Event {
 public:
  bool query() override {
    std::shared_ptr<Marker> m = latest();
    return !m || m->is_set();
  }
  Status synchronize() override {
    if (std::shared_ptr<Marker> m = latest()) m->wait();
    return Status::ok();
  }

  // Starts a new record; the caller's stream sets the marker when it gets there.
  std::shared_ptr<Marker> new_record() {
    auto m = std::make_shared<Marker>();
    std::lock_guard<std::mutex> lock(mu_);
    latest_ = m;
    return m;
  }
  std::shared_ptr<Marker> latest() {
    std::lock_guard<std::mutex> lock(mu_);
    return latest_;
  }

 private:
  std::mutex mu_;
  std::shared_ptr<Marker> latest_;  // null until the first record
};

class CpuDevice;

class CpuStream final : public Stream {
 public:
  explicit CpuStream(CpuDevice* dev);
  ~CpuStream() override;

  Status copy_h2d(void* dst_device, const void* src_host, size_t bytes) override;
  Status copy_d2h(void* dst_host, const void* src_device, size_t bytes) override;
  Status copy_d2d(void* dst_device, const void* src_device, size_t bytes) override;
  Status enqueue_host(std::function<void()> fn) override;
  Status record(Event& e) override;
  Status wait_event(Event& e) override;
  Status synchronize() override;

  CpuDevice* device() const { return dev_; }
  // Enqueues work that is part of the stream's machinery (not a user function).
  void push(std::function<void()> fn);

 private:
  Status copy(const char* op, void* dst, const void* src, size_t bytes, bool dst_on_device,
              bool src_on_device);
  void run();

  CpuDevice* const dev_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // the worker waits here for work or stop
  std::condition_variable done_cv_;  // synchronize() waits here for finished_
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0;
  uint64_t finished_ = 0;
  bool stopping_ = false;
  Status error_;        // first error of enqueued work since the last synchronize()
  std::thread worker_;  // last: starts once everything above exists
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(uint64_t budget) : ledger_("device cpu", budget) {}
  ~CpuDevice() override {
    int streams = live_streams_.load();
    ZOE_CHECK_MSG(streams == 0, "cpu device destroyed while %d of its streams are alive", streams);
    auto left = ledger_.take_all();
    if (!left.empty()) {
      uint64_t bytes = 0;
      for (auto& [p, n] : left) {
        bytes += n;
        std::free(p);
      }
      ZOE_LOG_WARN("cpu device destroyed with %zu allocations (%s) not freed; releasing them", left.size(),
                   format_bytes(bytes).c_str());
      g_leaked_bytes.fetch_add(bytes);
    }
  }

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu"; }

  Result<void*> allocate(size_t bytes) override {
    if (bytes == 0) return invalid_argument("%s: allocate(0)", ledger_.tier().c_str());
    if (suspended_.load()) return invalid_argument("%s: allocate() while suspended", ledger_.tier().c_str());
    if (injected_allocation_failure(bytes)) {
      return out_of_budget("%s: injected allocation failure of %zu bytes", ledger_.tier().c_str(), bytes);
    }
    ZOE_RETURN_IF_ERROR(ledger_.reserve(bytes));
    const size_t rounded = round_up(bytes);
    void* p = cache_.take(rounded);
    if (p == nullptr) {
      // Room within the budget for a new block: cached blocks of other sizes go first.
      const uint64_t live = ledger_.used(), budget = ledger_.budget();
      cache_.trim(budget > live ? budget - live : 0);
      p = std::aligned_alloc(kCpuAlignment, rounded);
      if (p == nullptr) {
        cache_.trim(0);
        p = std::aligned_alloc(kCpuAlignment, rounded);
      }
    }
    if (p == nullptr) {
      ledger_.release(bytes);
      return out_of_budget("%s: host memory exhausted allocating %zu bytes (%s) below the budget",
                           ledger_.tier().c_str(), bytes, format_bytes(bytes).c_str());
    }
    ledger_.insert(p, bytes);
    return p;
  }

  void free(void* p) override {
    if (p == nullptr) return;
    std::optional<uint64_t> bytes = ledger_.erase(p);
    ZOE_CHECK_MSG(bytes.has_value(), "cpu device: free(%p) of memory it did not allocate", p);
    ledger_.release(*bytes);
    cache_.give(p, round_up(*bytes), ledger_.used(), ledger_.budget());
  }

  Status free_after(Stream& s, void* p) override {
    if (p == nullptr) return Status::ok();
    auto* cs = dynamic_cast<CpuStream*>(&s);
    if (cs == nullptr || cs->device() != this) {
      return invalid_argument("cpu device: free_after on a stream of another device");
    }
    std::optional<uint64_t> bytes = ledger_.erase(p);
    ZOE_CHECK_MSG(bytes.has_value(), "cpu device: free_after(%p) of memory it did not allocate", p);
    cs->push([this, p, n = *bytes] {
      ledger_.release(n);
      cache_.give(p, round_up(n), ledger_.used(), ledger_.budget());
    });
    return Status::ok();
  }

  uint64_t budget_bytes() const override { return ledger_.budget(); }
  uint64_t used_bytes() const override { return suspended_.load() ? 0 : ledger_.used(); }

  std::vector<std::pair<void*, uint64_t>> live_allocations() const override { return ledger_.live(); }
  // The pages wholly inside each live allocation go back to the kernel (MADV_DONTNEED: the
  // mapping stays, the next touch maps a zero page), with the cached blocks freed.
  Status suspend() override {
    if (suspended_.load()) return invalid_argument("%s: suspend() while suspended", ledger_.tier().c_str());
    cache_.trim(0);
    for (const auto& [p, n] : ledger_.live()) {
      const auto [range, len] = whole_pages(p, n);
      if (len > 0 && madvise(range, len, MADV_DONTNEED) != 0)
        return sys_error("madvise(MADV_DONTNEED)", ledger_.tier(), errno);
    }
    suspended_.store(true);
    return Status::ok();
  }
  // The pages come back populated in one call per allocation (MADV_POPULATE_WRITE; huge pages
  // where the kernel gives them): a fault per 4 KiB page in the caller's copy back would cost
  // several times the copy. Where the kernel has neither, the copy's faults map them instead.
  Status resume() override {
    if (!suspended_.load())
      return invalid_argument("%s: resume() while not suspended", ledger_.tier().c_str());
    for (const auto& [p, n] : ledger_.live()) {
      const auto [range, len] = whole_pages(p, n);
      if (len == 0) continue;
      (void)madvise(range, len, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
      (void)madvise(range, len, MADV_POPULATE_WRITE);
#endif
    }
    suspended_.store(false);
    return Status::ok();
  }
  uint64_t high_water_bytes() const override { return ledger_.high_water(); }

  Result<std::unique_ptr<Stream>> create_stream() override {
    try {
      return std::unique_ptr<Stream>(new CpuStream(this));
    } catch (const std::system_error& e) {
      return out_of_budget(
          "cpu device: cannot start a stream's worker thread: %s (errno %d; out of memory or "
          "address space: the process's address space (ulimit -v) or thread count (ulimit -u) is "
          "at its limit)",
          e.what(), e.code().value());
    } catch (const std::bad_alloc&) {
      return out_of_budget("cpu device: out of memory creating a stream");
    }
  }
  Result<std::unique_ptr<Event>> create_event() override { return std::unique_ptr<Event>(new CpuEvent()); }

  Status copy_to_device(void* dst_device, const void* src_host, size_t bytes) override {
    if (bytes == 0) return Status::ok();
    ZOE_RETURN_IF_ERROR(check_device_range("copy_to_device destination", dst_device, bytes));
    ZOE_RETURN_IF_ERROR(check_host_pointer("copy_to_device source", src_host, bytes));
    std::memcpy(dst_device, src_host, bytes);
    return Status::ok();
  }
  Status copy_to_host(void* dst_host, const void* src_device, size_t bytes) override {
    if (bytes == 0) return Status::ok();
    ZOE_RETURN_IF_ERROR(check_host_pointer("copy_to_host destination", dst_host, bytes));
    ZOE_RETURN_IF_ERROR(check_device_range("copy_to_host source", src_device, bytes));
    std::memcpy(dst_host, src_device, bytes);
    return Status::ok();
  }

  // kInvalidArgument unless [p, p + bytes) lies inside one live allocation: catches host
  // pointers passed as device pointers and copies running off the end, as a GPU would.
  Status check_device_range(const char* what, const void* p, size_t bytes) const {
    if (ledger_.contains(p, bytes)) return Status::ok();
    return invalid_argument(
        "cpu device: %s [%p, +%zu bytes) is not inside a live allocation of "
        "this device",
        what, p, bytes);
  }
  static Status check_host_pointer(const char* what, const void* p, size_t bytes) {
    if (p != nullptr) return Status::ok();
    return invalid_argument("cpu device: %s is null (%zu bytes)", what, bytes);
  }

  void stream_created() { live_streams_.fetch_add(1); }
  void stream_destroyed() { live_streams_.fetch_sub(1); }

 private:
  MemoryLedger ledger_;
  BlockCache cache_;  // after the ledger: destroyed first
  std::atomic<bool> suspended_{false};
  std::atomic<int> live_streams_{0};
};

// Counted once its worker runs: a thread that cannot start (std::system_error, e.g. under a tight
// `ulimit -v` or `ulimit -u`) leaves no stream behind for the device to wait for.
CpuStream::CpuStream(CpuDevice* dev) : dev_(dev) {
  worker_ = std::thread([this] { run(); });
  dev_->stream_created();
}

CpuStream::~CpuStream() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return finished_ == enqueued_; });
    stopping_ = true;
  }
  work_cv_.notify_one();
  worker_.join();
  if (!error_.is_ok())
    ZOE_LOG_WARN("cpu stream destroyed with an unreported error: %s", error_.to_string().c_str());
  dev_->stream_destroyed();
}

void CpuStream::push(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
    ++enqueued_;
  }
  work_cv_.notify_one();
}

void CpuStream::run() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    Status failure;
    try {
      fn();
    } catch (const std::exception& ex) {
      failure = internal_error("cpu stream: a host function threw: %s", ex.what());
    } catch (...) {
      failure = internal_error("cpu stream: a host function threw a non-std exception");
    }
    fn = nullptr;  // destroy captures before the work counts as finished
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure.is_ok() && error_.is_ok()) error_ = std::move(failure);
      ++finished_;
    }
    done_cv_.notify_all();
  }
}

Status CpuStream::copy(const char* op, void* dst, const void* src, size_t bytes, bool dst_on_device,
                       bool src_on_device) {
  if (bytes == 0) return Status::ok();
  ZOE_RETURN_IF_ERROR_CTX(dst_on_device ? dev_->check_device_range("destination", dst, bytes)
                                        : CpuDevice::check_host_pointer("destination", dst, bytes),
                          op);
  ZOE_RETURN_IF_ERROR_CTX(src_on_device ? dev_->check_device_range("source", src, bytes)
                                        : CpuDevice::check_host_pointer("source", src, bytes),
                          op);
  push([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  return Status::ok();
}

Status CpuStream::copy_h2d(void* dst_device, const void* src_host, size_t bytes) {
  return copy("copy_h2d", dst_device, src_host, bytes, true, false);
}
Status CpuStream::copy_d2h(void* dst_host, const void* src_device, size_t bytes) {
  return copy("copy_d2h", dst_host, src_device, bytes, false, true);
}
Status CpuStream::copy_d2d(void* dst_device, const void* src_device, size_t bytes) {
  return copy("copy_d2d", dst_device, src_device, bytes, true, true);
}

Status CpuStream::enqueue_host(std::function<void()> fn) {
  if (!fn) return invalid_argument("cpu stream: enqueue_host of an empty function");
  push(std::move(fn));
  return Status::ok();
}

Status CpuStream::record(Event& e) {
  auto* ce = dynamic_cast<CpuEvent*>(&e);
  if (ce == nullptr) return invalid_argument("cpu stream: record of an event from another kind of device");
  push([m = ce->new_record()] { m->set(); });
  return Status::ok();
}

Status CpuStream::wait_event(Event& e) {
  auto* ce = dynamic_cast<CpuEvent*>(&e);
  if (ce == nullptr)
    return invalid_argument("cpu stream: wait_event on an event from another kind of device");
  std::shared_ptr<Marker> m = ce->latest();
  if (!m || m->is_set()) return Status::ok();
  push([m = std::move(m)] { m->wait(); });
  return Status::ok();
}

Status CpuStream::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t ticket = enqueued_;
  done_cv_.wait(lock, [&] { return finished_ >= ticket; });
  Status s = std::move(error_);
  error_ = Status::ok();
  return s;
}

}  // namespace

uint64_t cpu_device_leaked_bytes() { return g_leaked_bytes.load(); }

void set_cpu_allocation_fault(std::function<bool(size_t bytes)> fail) {
  std::lock_guard<std::mutex> lock(g_fault_mu);
  g_fault_set.store(static_cast<bool>(fail), std::memory_order_release);
  fault_hook() = std::move(fail);
}

Result<std::unique_ptr<Device>> create_cpu_device(uint64_t budget_bytes) {
  if (budget_bytes == 0) return invalid_argument("cpu device: the budget must be above 0 bytes");
  return std::unique_ptr<Device>(new CpuDevice(budget_bytes));
}

}  // namespace zoe::device
