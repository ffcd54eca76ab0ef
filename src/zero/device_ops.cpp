// The CPU DeviceOps (CpuDevice: device memory is host memory), and the CUDA ones when built.
#include "zero/device_ops.h"

#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "zoe/features.h"

#if ZOE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_util.h"
#include "optim/adam_cuda.h"
#endif

namespace zoe::zero {

Status DeviceOps::lion_step(const optim::LionArgs&) {
  return unsupported(
      "optimizer.type \"Lion\": its update runs on the CPU only (offload the optimizer states)");
}
Status DeviceOps::adagrad_step(const optim::AdagradArgs&) {
  return unsupported(
      "optimizer.type \"Adagrad\": its update runs on the CPU only (offload the optimizer states)");
}

namespace {

class CpuOps final : public DeviceOps {
 public:
  CpuOps(optim::CpuPool* pool, bool deferred) : deferred_(deferred) { exec_.pool = pool; }
  ~CpuOps() override { (void)synchronize(); }  // as a stream: queued work runs before it goes
  bool host_addressable() const override { return true; }
  Status zero(void* dev, size_t bytes) override {
    return run([=] {
      memset(dev, 0, bytes);
      return Status::ok();
    });
  }
  Status to_device(void* dev, const void* host, size_t bytes) override { return copy(dev, host, bytes); }
  Status to_host(void* host, const void* dev, size_t bytes) override { return copy(host, dev, bytes); }
  Status copy(void* dst, const void* src, size_t bytes) override {
    return run([=] {
      memcpy(dst, src, bytes);
      return Status::ok();
    });
  }
  Status accumulate_with_norm(float* acc, const void* g, DType gd, size_t n, bool first,
                              double* partials) override {
    return run([=, this] { return optim::accumulate_with_norm(acc, g, gd, n, first, partials, exec_); });
  }
  Status adam_step(const optim::AdamArgs& args) override {
    return run([=, this] { return optim::adam_step(args, exec_); });
  }
  Status lion_step(const optim::LionArgs& args) override {
    return run([=, this] { return optim::lion_step(args, exec_); });
  }
  Status adagrad_step(const optim::AdagradArgs& args) override {
    return run([=, this] { return optim::adagrad_step(args, exec_); });
  }
  Status synchronize() override {
    Status first;
    for (auto& op : queue_) {
      Status s = op();
      if (first.is_ok() && !s.is_ok()) first = std::move(s);
    }
    queue_.clear();
    return first;
  }

 private:
  // Runs `op` now (its error is the call's: the CPU kernels' errors are argument checks), or at the
  // next synchronize() in the deferred mode (its error is then synchronize()'s).
  template <typename F>
  Status run(F op) {
    if (!deferred_) return op();
    queue_.emplace_back(std::move(op));
    return Status::ok();
  }

  bool deferred_;
  optim::Exec exec_;
  std::vector<std::function<Status()>> queue_;
};

#if ZOE_HAVE_CUDA
class CudaOps final : public DeviceOps {
 public:
  static Result<std::unique_ptr<DeviceOps>> create(device::Device& dev, int ordinal) {
    auto ops = std::unique_ptr<CudaOps>(new CudaOps());
    ops->ordinal_ = ordinal;
    ZOE_CUDA_TRY(cudaSetDevice(ordinal));
    ZOE_ASSIGN_OR_RETURN(ops->owner_, dev.create_stream());
    ops->stream_ = static_cast<cudaStream_t>(ops->owner_->native_handle());
    if (ops->stream_ == nullptr) {
      return invalid_argument("the engine's CUDA kernels need a CUDA device's stream; %s has none",
                              dev.name().c_str());
    }
    return std::unique_ptr<DeviceOps>(std::move(ops));
  }
  ~CudaOps() override {
    if (owner_) (void)owner_->synchronize();  // the stream itself is the device's
  }
  bool host_addressable() const override { return false; }
  Status zero(void* dev, size_t bytes) override {
    ZOE_RETURN_IF_ERROR(current());
    ZOE_CUDA_TRY(cudaMemsetAsync(dev, 0, bytes, stream_));
    return Status::ok();
  }
  Status to_device(void* dev, const void* host, size_t bytes) override {
    ZOE_RETURN_IF_ERROR(current());
    ZOE_CUDA_TRY(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_));
    return Status::ok();
  }
  Status to_host(void* host, const void* dev, size_t bytes) override {
    ZOE_RETURN_IF_ERROR(current());
    ZOE_CUDA_TRY(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_));
    return Status::ok();
  }
  Status copy(void* dst, const void* src, size_t bytes) override {
    ZOE_RETURN_IF_ERROR(current());
    ZOE_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return Status::ok();
  }
  Status accumulate_with_norm(float* acc, const void* g, DType gd, size_t n, bool first,
                              double* partials) override {
    ZOE_RETURN_IF_ERROR(current());
    ZOE_ASSIGN_OR_RETURN(optim::NormResult r,
                         optim::cuda::accumulate_with_norm(acc, g, gd, n, first, stream_));
    const size_t chunks = optim::norm_chunks(n);
    for (size_t c = 0; c < chunks; ++c) partials[c] = 0.0;
    if (chunks > 0) partials[0] = r.sum_sq;
    return Status::ok();
  }
  Status adam_step(const optim::AdamArgs& args) override {
    ZOE_RETURN_IF_ERROR(current());
    return optim::cuda::adam_step(args, stream_);  // enqueued; its own errors surface at synchronize()
  }
  Status synchronize() override {
    ZOE_RETURN_IF_ERROR(current());
    ZOE_CUDA_TRY(cudaStreamSynchronize(stream_));
    return Status::ok();
  }
  Status bind_thread() override { return current(); }

 private:
  CudaOps() = default;
  Status current() {
    ZOE_CUDA_TRY(cudaSetDevice(ordinal_));
    return Status::ok();
  }
  int ordinal_ = 0;
  std::unique_ptr<device::Stream> owner_;  // created by the device, which outlives the ops
  cudaStream_t stream_ = nullptr;          // owner_'s handle
};
#endif

}  // namespace

std::unique_ptr<DeviceOps> make_cpu_ops(optim::CpuPool* pool, bool deferred) {
  return std::make_unique<CpuOps>(pool, deferred);
}

Result<std::unique_ptr<DeviceOps>> make_cuda_ops(device::Device& dev, int ordinal) {
#if ZOE_HAVE_CUDA
  return CudaOps::create(dev, ordinal);
#else
  (void)dev;
  (void)ordinal;
  return unsupported("the engine's CUDA kernels: zoe was built without CUDA");
#endif
}

}  // namespace zoe::zero
