// CudaDevice: a GPU behind the Device interface, on the CUDA runtime API (no kernels, no nvcc).
#include "zoe/features.h"

#include <atomic>
#include <exception>
#include <mutex>

#include "core/host_pinner.h"
#include "core/log.h"
#include "core/units.h"
#include "device/device.h"
#include "device/memory_ledger.h"

#if ZOE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_util.h"
#endif

namespace zoe::device {

#if ZOE_HAVE_CUDA
namespace {

class CudaEvent final : public Event {
 public:
  CudaEvent(int ordinal, cudaEvent_t ev) : ordinal_(ordinal), ev_(ev) {}
  ~CudaEvent() override {
    CurrentDevice cur(ordinal_);
    (void)cudaEventDestroy(ev_);
  }
  bool query() override {
    CurrentDevice cur(ordinal_);
    cudaError_t err = cudaEventQuery(ev_);
    if (err == cudaErrorNotReady) return false;
    if (err != cudaSuccess)
      ZOE_LOG_WARN("cudaEventQuery: %s (%s)", cudaGetErrorName(err), cudaGetErrorString(err));
    return true;
  }
  Status synchronize() override {
    CurrentDevice cur(ordinal_);
    ZOE_CUDA_TRY(cudaEventSynchronize(ev_));
    return Status::ok();
  }
  cudaEvent_t handle() const { return ev_; }

 private:
  const int ordinal_;
  const cudaEvent_t ev_;
};

class CudaDevice;

class CudaStream final : public Stream {
 public:
  CudaStream(CudaDevice* dev, int ordinal, cudaStream_t s);
  ~CudaStream() override;

  Status copy_h2d(void* dst_device, const void* src_host, size_t bytes) override {
    return copy("cudaMemcpyAsync (host to device)", dst_device, src_host, bytes, cudaMemcpyHostToDevice);
  }
  Status copy_d2h(void* dst_host, const void* src_device, size_t bytes) override {
    return copy("cudaMemcpyAsync (device to host)", dst_host, src_device, bytes, cudaMemcpyDeviceToHost);
  }
  Status copy_d2d(void* dst_device, const void* src_device, size_t bytes) override {
    return copy("cudaMemcpyAsync (device to device)", dst_device, src_device, bytes,
                cudaMemcpyDeviceToDevice);
  }
  Status enqueue_host(std::function<void()> fn) override;
  Status record(Event& e) override;
  Status wait_event(Event& e) override;
  Status synchronize() override;

  CudaDevice* device() const { return dev_; }
  cudaStream_t handle() const { return s_; }
  void* native_handle() const override { return s_; }
  // Runs fn (which must not call CUDA) on CUDA's host-callback thread at this point of the
  // stream; an exception escaping it is kept for synchronize().
  Status launch_host(std::function<void()> fn);

 private:
  struct HostCall {
    std::function<void()> fn;
    CudaStream* stream;
  };
  static void CUDART_CB trampoline(void* arg);
  Status copy(const char* call, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);

  CudaDevice* const dev_;
  const int ordinal_;
  const cudaStream_t s_;
  std::mutex mu_;
  Status error_;  // first exception of a host function since the last synchronize()
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, uint64_t budget, std::string name)
      : ordinal_(ordinal), name_(std::move(name)), ledger_("device " + name_, budget) {}

  // Creates the internal stream and the memory pool.
  Status init() {
    CurrentDevice cur(ordinal_);
    ZOE_CUDA_TRY(cudaStreamCreateWithFlags(&internal_, cudaStreamNonBlocking));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = ordinal_;
    ZOE_CUDA_TRY(cudaMemPoolCreate(&pool_, &props));
    // Keep freed memory in the pool up to the budget instead of returning it at each sync.
    uint64_t threshold = ledger_.budget();
    ZOE_CUDA_TRY(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
    return Status::ok();
  }

  ~CudaDevice() override {
    int streams = live_streams_.load();
    ZOE_CHECK_MSG(streams == 0, "%s destroyed while %d of its streams are alive", name_.c_str(), streams);
    CurrentDevice cur(ordinal_);
    if (internal_ != nullptr) {
      auto left = ledger_.take_all();
      if (!left.empty()) {
        uint64_t bytes = 0;
        for (auto& [p, n] : left) {
          bytes += n;
          (void)cudaFreeAsync(p, internal_);
        }
        ZOE_LOG_WARN("%s destroyed with %zu allocations (%s) not freed; releasing them", name_.c_str(),
                     left.size(), format_bytes(bytes).c_str());
      }
      (void)cudaStreamSynchronize(internal_);
      (void)cudaStreamDestroy(internal_);
    }
    if (pool_ != nullptr) (void)cudaMemPoolDestroy(pool_);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }

  Result<void*> allocate(size_t bytes) override {
    if (bytes == 0) return invalid_argument("%s: allocate(0)", ledger_.tier().c_str());
    ZOE_RETURN_IF_ERROR(ledger_.reserve(bytes));
    Result<void*> p = allocate_reserved(bytes);
    if (!p.is_ok()) {
      ledger_.release(bytes);
      return p.status().with_context("allocating " + std::to_string(bytes) + " bytes (" +
                                     format_bytes(bytes) + ") on device " + name_ + " with " +
                                     std::to_string(ledger_.used()) + " of " +
                                     std::to_string(ledger_.budget()) + " budget bytes in use");
    }
    ledger_.insert(*p, bytes);
    return p;
  }

  void free(void* p) override {
    if (p == nullptr) return;
    std::optional<uint64_t> bytes = ledger_.erase(p);
    ZOE_CHECK_MSG(bytes.has_value(), "%s: free(%p) of memory it did not allocate", name_.c_str(), p);
    CurrentDevice cur(ordinal_);
    cudaError_t err = cudaFreeAsync(p, internal_);
    if (err != cudaSuccess)
      ZOE_LOG_WARN("%s: cudaFreeAsync: %s (%s)", name_.c_str(), cudaGetErrorName(err),
                   cudaGetErrorString(err));
    ledger_.release(*bytes);
  }

  Status free_after(Stream& s, void* p) override;

  uint64_t budget_bytes() const override { return ledger_.budget(); }
  uint64_t used_bytes() const override { return ledger_.used(); }
  uint64_t high_water_bytes() const override { return ledger_.high_water(); }

  Result<std::unique_ptr<Stream>> create_stream() override {
    CurrentDevice cur(ordinal_);
    cudaStream_t s = nullptr;
    ZOE_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return std::unique_ptr<Stream>(new CudaStream(this, ordinal_, s));
  }
  Result<std::unique_ptr<Event>> create_event() override {
    CurrentDevice cur(ordinal_);
    cudaEvent_t e = nullptr;
    ZOE_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return std::unique_ptr<Event>(new CudaEvent(ordinal_, e));
  }

  Status copy_to_device(void* dst_device, const void* src_host, size_t bytes) override {
    return copy_sync(dst_device, src_host, bytes, cudaMemcpyHostToDevice);
  }
  Status copy_to_host(void* dst_host, const void* src_device, size_t bytes) override {
    return copy_sync(dst_host, src_device, bytes, cudaMemcpyDeviceToHost);
  }

  void stream_created() { live_streams_.fetch_add(1); }
  void stream_destroyed() { live_streams_.fetch_sub(1); }
  MemoryLedger& ledger() { return ledger_; }

 private:
  // Allocates from the pool on the internal stream and waits, so that the memory is usable from
  // every stream once allocate() returns.
  Result<void*> allocate_reserved(size_t bytes) {
    CurrentDevice cur(ordinal_);
    void* p = nullptr;
    cudaError_t err = cudaMallocFromPoolAsync(&p, bytes, pool_, internal_);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // an exhausted pool is not a sticky error; don't leave it behind
      return cuda_error("cudaMallocFromPoolAsync", err);
    }
    ZOE_CUDA_TRY(cudaStreamSynchronize(internal_));
    return p;
  }

  Status copy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return Status::ok();
    CurrentDevice cur(ordinal_);
    ZOE_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, internal_));
    ZOE_CUDA_TRY(cudaStreamSynchronize(internal_));
    return Status::ok();
  }

  const int ordinal_;
  const std::string name_;
  MemoryLedger ledger_;
  cudaStream_t internal_ = nullptr;  // allocations, frees and the synchronous copies
  cudaMemPool_t pool_ = nullptr;
  std::atomic<int> live_streams_{0};
};

CudaStream::CudaStream(CudaDevice* dev, int ordinal, cudaStream_t s) : dev_(dev), ordinal_(ordinal), s_(s) {
  dev_->stream_created();
}

CudaStream::~CudaStream() {
  {
    CurrentDevice cur(ordinal_);
    cudaError_t err = cudaStreamSynchronize(s_);
    if (err != cudaSuccess)
      ZOE_LOG_WARN("cuda stream destroyed after an error: cudaStreamSynchronize: %s (%s)",
                   cudaGetErrorName(err), cudaGetErrorString(err));
    (void)cudaStreamDestroy(s_);
  }
  if (!error_.is_ok())
    ZOE_LOG_WARN("cuda stream destroyed with an unreported error: %s", error_.to_string().c_str());
  dev_->stream_destroyed();
}

Status CudaStream::copy(const char* call, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return Status::ok();
  CurrentDevice cur(ordinal_);
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, s_);
  if (err != cudaSuccess)
    return cuda_error(call, err).with_context("copying " + std::to_string(bytes) + " bytes");
  return Status::ok();
}

void CUDART_CB CudaStream::trampoline(void* arg) {
  auto* call = static_cast<HostCall*>(arg);
  Status failure;
  try {
    call->fn();
  } catch (const std::exception& ex) {
    failure = internal_error("cuda stream: a host function threw: %s", ex.what());
  } catch (...) {
    failure = internal_error("cuda stream: a host function threw a non-std exception");
  }
  if (!failure.is_ok()) {
    std::lock_guard<std::mutex> lock(call->stream->mu_);
    if (call->stream->error_.is_ok()) call->stream->error_ = std::move(failure);
  }
  delete call;
}

Status CudaStream::launch_host(std::function<void()> fn) {
  auto* call = new HostCall{std::move(fn), this};
  CurrentDevice cur(ordinal_);
  cudaError_t err = cudaLaunchHostFunc(s_, &CudaStream::trampoline, call);
  if (err != cudaSuccess) {
    delete call;
    return cuda_error("cudaLaunchHostFunc", err);
  }
  return Status::ok();
}

Status CudaStream::enqueue_host(std::function<void()> fn) {
  if (!fn) return invalid_argument("cuda stream: enqueue_host of an empty function");
  return launch_host(std::move(fn));
}

Status CudaStream::record(Event& e) {
  auto* ce = dynamic_cast<CudaEvent*>(&e);
  if (ce == nullptr) return invalid_argument("cuda stream: record of an event from another kind of device");
  CurrentDevice cur(ordinal_);
  ZOE_CUDA_TRY(cudaEventRecord(ce->handle(), s_));
  return Status::ok();
}

Status CudaStream::wait_event(Event& e) {
  auto* ce = dynamic_cast<CudaEvent*>(&e);
  if (ce == nullptr)
    return invalid_argument("cuda stream: wait_event on an event from another kind of device");
  CurrentDevice cur(ordinal_);
  ZOE_CUDA_TRY(cudaStreamWaitEvent(s_, ce->handle(), 0));
  return Status::ok();
}

Status CudaStream::synchronize() {
  Status sync;
  {
    CurrentDevice cur(ordinal_);
    cudaError_t err = cudaStreamSynchronize(s_);
    if (err != cudaSuccess) sync = cuda_error("cudaStreamSynchronize", err);
  }
  std::lock_guard<std::mutex> lock(mu_);
  Status host = std::move(error_);
  error_ = Status::ok();
  return sync.is_ok() ? host : sync;
}

// The free is ordered on s (the pool may reuse the block once s passes it); the budget gets the
// bytes back from a host callback right after, so used_bytes() never under-counts.
Status CudaDevice::free_after(Stream& s, void* p) {
  if (p == nullptr) return Status::ok();
  auto* cs = dynamic_cast<CudaStream*>(&s);
  if (cs == nullptr || cs->device() != this) {
    return invalid_argument("%s: free_after on a stream of another device", name_.c_str());
  }
  std::optional<uint64_t> bytes = ledger_.erase(p);
  ZOE_CHECK_MSG(bytes.has_value(), "%s: free_after(%p) of memory it did not allocate", name_.c_str(), p);
  {
    CurrentDevice cur(ordinal_);
    cudaError_t err = cudaFreeAsync(p, cs->handle());
    if (err != cudaSuccess) {
      ledger_.release(*bytes);  // the block is lost to the pool either way; keep the books usable
      return cuda_error("cudaFreeAsync", err);
    }
  }
  Status st = cs->launch_host([this, n = *bytes] { ledger_.release(n); });
  if (!st.is_ok()) ledger_.release(*bytes);
  return st;
}

}  // namespace

int cuda_device_count(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why)
      *why =
          std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    (void)cudaGetLastError();
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA runtime reports no devices";
  return n;
}

// Pins host buffers for DMA (io's PinMode::kDevice) once a CUDA device exists.
class CudaHostPinner final : public HostPinner {
 public:
  Status pin(void* p, size_t bytes) override {
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e == cudaSuccess) return Status::ok();
    cudaGetLastError();  // clear it: the caller locks the pages instead
    return cuda_error("cudaHostRegister", e);
  }
  void unpin(void* p) override { (void)cudaHostUnregister(p); }
};

Result<std::unique_ptr<Device>> create_cuda_device(int ordinal, uint64_t budget_bytes) {
  std::string why;
  int n = cuda_device_count(&why);
  if (n == 0) return unsupported("no CUDA device: %s", why.c_str());
  if (ordinal < 0 || ordinal >= n) {
    return invalid_argument("CUDA device %d does not exist (%d present)", ordinal, n);
  }
  if (budget_bytes == 0) return invalid_argument("cuda device: the budget must be above 0 bytes");
  int pools = 0;
  ZOE_CUDA_TRY(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, ordinal));
  if (!pools) return unsupported("CUDA device %d does not support stream-ordered memory pools", ordinal);
  cudaDeviceProp prop{};
  ZOE_CUDA_TRY(cudaGetDeviceProperties(&prop, ordinal));
  std::string name = "cuda:" + std::to_string(ordinal) + " (" + prop.name + ")";
  if (budget_bytes > prop.totalGlobalMem) {
    ZOE_LOG_WARN("%s: budget %s is above the device's %s; allocations will fail when memory runs out",
                 name.c_str(), format_bytes(budget_bytes).c_str(), format_bytes(prop.totalGlobalMem).c_str());
  }
  auto dev = std::make_unique<CudaDevice>(ordinal, budget_bytes, std::move(name));
  ZOE_RETURN_IF_ERROR_CTX(dev->init(), "creating the CUDA device");
  static CudaHostPinner pinner;  // lives as long as the process: buffers unpin through it
  set_host_pinner(&pinner);
  return std::unique_ptr<Device>(std::move(dev));
}

#else  // !ZOE_HAVE_CUDA

int cuda_device_count(std::string* why) {
  if (why) *why = "zoe was built without CUDA";
  return 0;
}

Result<std::unique_ptr<Device>> create_cuda_device(int ordinal, uint64_t budget_bytes) {
  (void)ordinal;
  (void)budget_bytes;
  return unsupported("CUDA device %d: zoe was built without CUDA", ordinal);
}

#endif  // ZOE_HAVE_CUDA

}  // namespace zoe::device
