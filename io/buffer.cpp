// AlignedBuffer and BufferPool: huge-page friendly, pinned host memory for the I/O engine.
#include "io/buffer.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/cpu.h"
#include "core/host_pinner.h"
#include "core/log.h"
#include "core/units.h"
#include "zoe/features.h"

namespace zoe::io {
namespace {

constexpr size_t kHuge = 2u << 20;

Status memlock_error(size_t bytes, int err) {
  HostMemory hm = host_memory();
  std::string limit =
      hm.memlock_limit_bytes == UINT64_MAX ? "unlimited" : format_bytes(hm.memlock_limit_bytes);
  return Status(StatusCode::kPermissionDenied,
                "While pinning " + std::to_string(bytes) + " bytes (" + format_bytes(bytes) +
                    ") of host memory with mlock: " + strerror(err) +
                    ". The locked-memory limit (ulimit -l, RLIMIT_MEMLOCK) is " + limit +
                    ". Raise it (a 'memlock' line in /etc/security/limits.conf, LimitMEMLOCK= for "
                    "systemd, or --ulimit memlock=-1 for containers), run with CAP_IPC_LOCK, or turn "
                    "pinning off (pin_memory: false).",
                err);
}

}  // namespace

AlignedBuffer::~AlignedBuffer() { release(); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(o.data_), size_(o.size_), mapped_(o.mapped_), pinned_(o.pinned_) {
  o.data_ = nullptr;
  o.size_ = o.mapped_ = 0;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    size_ = o.size_;
    mapped_ = o.mapped_;
    pinned_ = o.pinned_;
    o.data_ = nullptr;
    o.size_ = o.mapped_ = 0;
  }
  return *this;
}

void AlignedBuffer::release() {
  if (!data_) return;
  if (pinned_ == PinMode::kDevice) host_pinner()->unpin(data_);
  if (mapped_) {
    munmap(data_, mapped_);  // also drops any mlock
  } else {
    if (pinned_ == PinMode::kLock) munlock(data_, size_);
    free(data_);
  }
  data_ = nullptr;
  size_ = mapped_ = 0;
  pinned_ = PinMode::kNone;
}

Result<AlignedBuffer> AlignedBuffer::allocate(size_t bytes, PinMode pin) {
  AlignedBuffer b;
  if (bytes == 0) return b;
  size_t rounded = (bytes + 4095) & ~size_t{4095};
  if (rounded >= kHuge) {
    // Over-map by 2 MiB and trim so the start is 2 MiB aligned: transparent huge pages then
    // back the buffer with physically contiguous 2 MiB pages.
    size_t len = (rounded + kHuge - 1) & ~(kHuge - 1);
    void* raw = mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
      return Status(StatusCode::kOutOfBudget,
                    "While allocating " + format_bytes(bytes) + " of host memory: " + strerror(errno), errno);
    }
    auto addr = reinterpret_cast<uintptr_t>(raw);
    uintptr_t aligned = (addr + kHuge - 1) & ~(kHuge - 1);
    if (aligned > addr) munmap(raw, aligned - addr);
    uintptr_t end = addr + len + kHuge;
    if (end > aligned + len) munmap(reinterpret_cast<void*>(aligned + len), end - (aligned + len));
    b.data_ = reinterpret_cast<void*>(aligned);
    b.mapped_ = len;
    madvise(b.data_, len, MADV_HUGEPAGE);
  } else {
    b.data_ = aligned_alloc(4096, rounded);
    if (!b.data_)
      return Status(StatusCode::kOutOfBudget,
                    "While allocating " + format_bytes(bytes) + " of host memory: out of memory");
  }
  b.size_ = bytes;
  if (pin == PinMode::kNone) return b;
  // Pinned for the device's DMA by the device layer's pinner (CUDA: cudaHostRegister) once a
  // device that needs it exists; otherwise, or when that fails, the pages are locked.
  if (pin == PinMode::kDevice && host_pinner() &&
      host_pinner()->pin(b.data_, b.mapped_ ? b.mapped_ : rounded).is_ok()) {
    b.pinned_ = PinMode::kDevice;
    return b;
  }
  size_t lock_len = b.mapped_ ? b.mapped_ : rounded;
  if (mlock(b.data_, lock_len) != 0) {
    int err = errno;
    return memlock_error(lock_len, err);
  }
  b.pinned_ = PinMode::kLock;
  return b;
}

Result<std::unique_ptr<BufferPool>> BufferPool::create(size_t buffer_bytes, size_t count, PinMode pin) {
  if (buffer_bytes == 0 || buffer_bytes % 4096 != 0) {
    return invalid_argument("buffer pool: buffer size %zu must be a positive multiple of 4096", buffer_bytes);
  }
  if (count == 0) return invalid_argument("buffer pool: need at least one buffer");
  std::unique_ptr<BufferPool> p(new BufferPool());
  ZOE_ASSIGN_OR_RETURN(p->storage_, AlignedBuffer::allocate(buffer_bytes * count, pin));
  p->buffer_bytes_ = buffer_bytes;
  p->count_ = count;
  for (size_t i = count; i-- > 0;) p->free_.push_back(p->buffer(i));
  return p;
}

char* BufferPool::acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !free_.empty(); });
  char* b = free_.back();
  free_.pop_back();
  return b;
}

char* BufferPool::try_acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return nullptr;
  char* b = free_.back();
  free_.pop_back();
  return b;
}

void BufferPool::release(char* buf) {
  ZOE_CHECK_MSG(buf >= buffer(0) && buf < buffer(0) + count_ * buffer_bytes_ &&
                    (buf - buffer(0)) % static_cast<ptrdiff_t>(buffer_bytes_) == 0,
                "buffer %p does not belong to this pool", static_cast<void*>(buf));
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(buf);
  }
  cv_.notify_one();
}

size_t BufferPool::free_count() {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

}  // namespace zoe::io
