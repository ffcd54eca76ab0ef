// IoEngine: asynchronous read/write of (file, offset, buffer, length) with waitable completions.
//
// Backends: io_uring (liburing; O_DIRECT, fixed buffers and files, batched submission, optional
// SQPOLL) and a pread/pwrite thread pool, chosen automatically when io_uring cannot be set up.
// Both share the logic here: requests larger than block_size are split into chunks kept in
// flight up to queue_depth; short transfers are resubmitted for the remainder; EINTR/EAGAIN are
// retried; every error names the operation, path, offset, length and errno.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "io/file.h"
#include "zoe/status.h"

namespace zoe::io {

enum class IoOp : uint8_t { kRead, kWrite };
inline const char* io_op_name(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

// One transfer. The buffer must stay valid until the completion is ready. With an O_DIRECT
// file, buf must be aligned to file->mem_align() and offset/len to file->offset_align().
struct IoRequest {
  IoOp op = IoOp::kRead;
  const File* file = nullptr;
  uint64_t offset = 0;
  void* buf = nullptr;
  size_t len = 0;
};

class IoCompletion;
using IoHandle = std::shared_ptr<IoCompletion>;
// Runs on an engine thread once the whole submission is done. Keep it short; it may submit.
using IoCallback = std::function<void(IoCompletion&)>;
// Runs once every request of a submission succeeded, before the completion is marked ready, so
// a waiter sees its result (swap checksums: recording a write, verifying a read). A non-OK
// return becomes the completion's status. Runs on the engine's hook threads (up to 4, started at
// the first hook), never on the thread that reaps completions, so long hooks (hashing MiBs) hold
// up no other transfer; the submission's callback then runs on the same hook thread. Submitted
// with finish_inline, it runs instead on the thread that completed the last request (for hooks of
// microseconds, such as an fstat, that a hand-over to a hook thread would only delay).
using IoFinish = std::function<Status()>;

// The completion of one submit() call (one or several requests). Thread-safe.
class IoCompletion {
 public:
  bool ready() const { return done_.load(std::memory_order_acquire); }
  // Blocks until every request of the submission finished; returns the first error.
  Status wait();
  // The result; meaningful once ready().
  const Status& status() const { return status_; }
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  // From submit() to the last chunk's completion.
  uint64_t latency_ns() const { return complete_ns_ - submit_ns_; }
  uint64_t submit_ns() const { return submit_ns_; }

 private:
  friend class IoEngine;
  std::atomic<bool> done_{false};
  std::atomic<uint32_t> pending_{0};
  std::atomic<uint64_t> bytes_{0};
  uint64_t submit_ns_ = 0;
  uint64_t complete_ns_ = 0;
  std::mutex mu_;  // guards status_ while chunks are running, and the wait
  std::condition_variable cv_;
  Status status_;
  IoCallback callback_;
  IoFinish finish_;
  bool finish_inline_ = false;
};

enum class IoBackend : uint8_t { kAuto, kUring, kThreads };
const char* io_backend_name(IoBackend b);
Result<IoBackend> parse_io_backend(const std::string& name);

class FaultInjector;

struct IoEngineOptions {
  IoBackend backend = IoBackend::kAuto;
  uint32_t queue_depth = 32;     // chunks in flight at once
  size_t block_size = 1u << 20;  // largest single transfer; bigger requests are split
  bool sqpoll = false;           // io_uring kernel submission thread
  uint32_t sqpoll_idle_ms = 100;
  uint32_t threads = 0;             // thread backend: workers (0 = queue_depth, at most 128)
  FaultInjector* faults = nullptr;  // tests: inject errors and short transfers (not owned)
  // io_uring: the I/O priority of this engine's reads (an ioprio value, io_read_priority()); 0:
  // the process's. The kernel's scheduler (mq-deadline, bfq) serves a higher class first where
  // requests queue; "none" ignores it. Where the kernel refuses it (EPERM: the real-time class
  // needs CAP_SYS_ADMIN), that read is submitted again without it, and so are all later ones
  // (warned once). The thread backend ignores it.
  uint16_t read_ioprio = 0;
};

// An ioprio value: class 1 real-time, 2 best-effort, 3 idle; level 0 (highest) to 7.
constexpr uint16_t io_read_priority(int io_class, int level) {
  return static_cast<uint16_t>((io_class << 13) | level);
}
inline constexpr int kIoPrioClassRealtime = 1;

struct IoStatsSnapshot {
  uint64_t read_requests = 0, write_requests = 0;
  uint64_t read_bytes = 0, write_bytes = 0;
  uint64_t chunks = 0;     // transfers issued to the kernel (after splitting)
  uint64_t resubmits = 0;  // short transfers continued
  uint64_t retries = 0;    // EINTR/EAGAIN
  uint64_t errors = 0;     // submissions that ended in an error
};

class IoEngine {
 public:
  static Result<std::unique_ptr<IoEngine>> create(const IoEngineOptions& opts);
  // Stops accepting work, waits for everything in flight, then stops its threads.
  virtual ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Submits one or several requests as one unit of completion; batched into one syscall where
  // the backend can. Thread-safe. Never blocks on I/O (it may wait for the submission queue).
  // Bad requests (null file, unaligned O_DIRECT buffer) complete at once with a clear error.
  IoHandle submit(std::span<const IoRequest> reqs, IoCallback cb = {});
  // The same, with a hook that runs after a successful transfer and before the completion.
  IoHandle submit(std::span<const IoRequest> reqs, IoCallback cb, IoFinish finish,
                  bool finish_inline = false);
  IoHandle submit(const IoRequest& req, IoCallback cb = {}) { return submit({&req, 1}, std::move(cb)); }
  // Synchronous helpers.
  Status read(const File& f, uint64_t offset, void* buf, size_t len);
  Status write(const File& f, uint64_t offset, const void* buf, size_t len);

  // Waits until nothing is outstanding; returns the first error completed since the last drain.
  Status drain();
  uint64_t outstanding() const { return outstanding_.load(); }

  // Optional: register buffers (io_uring fixed buffers) and files (fixed files). The thread
  // backend accepts and ignores them. Registration waits for the engine to be idle.
  virtual Status register_buffers(std::span<const iovec> bufs) { return Status::ok(); }
  virtual Status register_file(const File& f) { return Status::ok(); }
  virtual void unregister_file(const File& f) {}

  virtual const char* name() const = 0;
  const IoEngineOptions& options() const { return opts_; }
  // The priority reads are submitted with now: options().read_ioprio, or 0 once the kernel refused it.
  uint16_t read_ioprio() const { return read_ioprio_.load(std::memory_order_relaxed); }
  IoStatsSnapshot stats() const;

 protected:
  explicit IoEngine(const IoEngineOptions& opts);

  // One kernel-sized piece of a request.
  struct Chunk {
    IoOp op;
    const File* file;
    uint64_t offset;  // current (advances on short transfers)
    char* buf;        // current
    uint32_t len;     // remaining
    uint32_t retries = 0;
    uint16_t ioprio = 0;  // the priority it was submitted with (the backend sets it)
    IoHandle group;
  };

  // Backends queue chunks and call complete_chunk() for each when the kernel answers.
  // enqueue may be called from any thread, including the backend's own completion thread.
  virtual void enqueue(std::vector<Chunk*>& chunks) = 0;
  // res: bytes transferred, or -errno.
  void complete_chunk(Chunk* c, int res);
  // Called by the destructor of the concrete backend before it tears its threads down.
  void shutdown_and_wait();

  IoEngineOptions opts_;
  // opts_.read_ioprio until the kernel refuses it, then 0.
  std::atomic<uint16_t> read_ioprio_{0};

 private:
  void finish_group(const IoHandle& g);
  void complete_group(IoCompletion* g);
  void hook_loop();
  Status validate(const IoRequest& r) const;

  std::mutex hook_mu_;
  std::condition_variable hook_cv_;
  std::deque<IoHandle> hook_queue_;  // completions whose finish hook is still to run
  std::vector<std::thread> hook_threads_;
  bool hook_stop_ = false;

  std::atomic<bool> accepting_{true};
  std::atomic<uint64_t> outstanding_{0};  // submissions not yet complete
  std::mutex drain_mu_;
  std::condition_variable drain_cv_;
  Status first_error_;  // guarded by drain_mu_

  struct Counters {
    std::atomic<uint64_t> read_requests{0}, write_requests{0}, read_bytes{0}, write_bytes{0}, chunks{0},
        resubmits{0}, retries{0}, errors{0};
  } counters_;
};

// Probes io_uring on this kernel (a ring, a NOP, and the READ/WRITE opcodes). Empty when it
// works, else why not ("io_uring_queue_init: Operation not permitted (seccomp?)").
std::string probe_uring();

}  // namespace zoe::io
