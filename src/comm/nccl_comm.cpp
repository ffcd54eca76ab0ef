// NcclComm: collectives over device buffers with NCCL, ordered on a dedicated CUDA stream.
// Completion is a CUDA event recorded after each collective, queried or synchronised by the handle
// (no CUDA calls happen in host callbacks).
#include "zoe/features.h"

#include <cstring>
#include <mutex>

#include "comm/comm_internal.h"
#include "core/log.h"

#if ZOE_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "core/cuda_util.h"
#endif

namespace zoe::comm {

#if ZOE_HAVE_NCCL
namespace {

Status nccl_error(const char* call, ncclResult_t r, ncclComm_t comm) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  return make_status(StatusCode::kIoError, "%s: %s%s%s", call, ncclGetErrorString(r),
                     last != nullptr && *last ? ": " : "", last != nullptr ? last : "");
}

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::kF32:
      return ncclFloat32;
    case CommType::kF16:
      return ncclFloat16;
    case CommType::kBF16:
      return ncclBfloat16;
    case CommType::kF64:
      return ncclFloat64;
    case CommType::kU8:
      return ncclUint8;
    case CommType::kI64:
      return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

// The NCCL communicator and its stream; shared with handles so that a late wait() can still ask
// NCCL for an asynchronous error.
struct NcclCore {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  bool own_stream = false;  // created here (no stream given); else the caller's device owns it
  void* scratch = nullptr;  // 8 bytes of device memory for barrier()
  ~NcclCore() {
    CurrentDevice cur(device);
    if (stream != nullptr) (void)cudaStreamSynchronize(stream);
    if (comm != nullptr) (void)ncclCommDestroy(comm);
    if (scratch != nullptr) (void)cudaFree(scratch);
    if (stream != nullptr && own_stream) (void)cudaStreamDestroy(stream);
  }
};

class EventState final : public CommHandle::State {
 public:
  EventState(std::shared_ptr<NcclCore> core, cudaEvent_t ev) : core_(std::move(core)), ev_(ev) {}
  ~EventState() override {
    CurrentDevice cur(core_->device);
    (void)cudaEventDestroy(ev_);
  }
  Status wait() override {
    CurrentDevice cur(core_->device);
    ZOE_CUDA_TRY(cudaEventSynchronize(ev_));
    return async_error();
  }
  bool ready() override {
    CurrentDevice cur(core_->device);
    cudaError_t err = cudaEventQuery(ev_);
    return err != cudaErrorNotReady;  // an error counts as ready: wait() reports it
  }

 private:
  Status async_error() {
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(core_->comm, &async);
    if (r != ncclSuccess) return nccl_error("ncclCommGetAsyncError", r, core_->comm);
    if (async != ncclSuccess) return nccl_error("NCCL collective (asynchronous error)", async, core_->comm);
    return Status::ok();
  }

  std::shared_ptr<NcclCore> core_;
  cudaEvent_t ev_;
};

class NcclComm final : public Communicator {
 public:
  NcclComm(std::shared_ptr<NcclCore> core, int rank, int size, int local_rank)
      : core_(std::move(core)), rank_(rank), size_(size), local_rank_(local_rank) {}
  ~NcclComm() override = default;  // NcclCore's destructor synchronises the stream

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  const char* backend() const override { return "nccl"; }

  CommHandle all_gather(const void* send, void* recv, size_t count, CommType type) override {
    Status s = check_buffers("all_gather", send, recv, count);
    if (!s.is_ok()) return completed_handle(std::move(s));
    return launch([&]() -> Status {
      ncclResult_t r = ncclAllGather(send, recv, count, nccl_type(type), core_->comm, core_->stream);
      return r == ncclSuccess ? Status::ok() : nccl_error("ncclAllGather", r, core_->comm);
    });
  }
  CommHandle reduce_scatter(const void* send, void* recv, size_t count, CommType type, ReduceOp op) override {
    Status s = check_buffers("reduce_scatter", send, recv, count);
    if (!s.is_ok()) return completed_handle(std::move(s));
    return launch([&]() -> Status {
      ncclResult_t r =
          ncclReduceScatter(send, recv, count, nccl_type(type), nccl_op(op), core_->comm, core_->stream);
      return r == ncclSuccess ? Status::ok() : nccl_error("ncclReduceScatter", r, core_->comm);
    });
  }
  CommHandle all_reduce(const void* send, void* recv, size_t count, CommType type, ReduceOp op) override {
    Status s = check_buffers("all_reduce", send, recv, count);
    if (!s.is_ok()) return completed_handle(std::move(s));
    return launch([&]() -> Status {
      ncclResult_t r =
          ncclAllReduce(send, recv, count, nccl_type(type), nccl_op(op), core_->comm, core_->stream);
      return r == ncclSuccess ? Status::ok() : nccl_error("ncclAllReduce", r, core_->comm);
    });
  }
  CommHandle broadcast(void* buf, size_t count, CommType type, int root) override {
    Status s = check_buffers("broadcast", buf, buf, count);
    if (s.is_ok()) s = check_root("broadcast", root, size_);
    if (!s.is_ok()) return completed_handle(std::move(s));
    return launch([&]() -> Status {
      ncclResult_t r = ncclBroadcast(buf, buf, count, nccl_type(type), root, core_->comm, core_->stream);
      return r == ncclSuccess ? Status::ok() : nccl_error("ncclBroadcast", r, core_->comm);
    });
  }
  // NCCL has no barrier: a one-element all_reduce on the stream, waited for.
  Status barrier() override {
    return launch([&]() -> Status {
             ncclResult_t r = ncclAllReduce(core_->scratch, core_->scratch, 1, ncclInt64, ncclSum,
                                            core_->comm, core_->stream);
             return r == ncclSuccess ? Status::ok() : nccl_error("ncclAllReduce (barrier)", r, core_->comm);
           })
        .wait();
  }

 private:
  // Issues one collective on the stream and records the event its handle waits for. NCCL calls on
  // one communicator must not race, hence the mutex.
  template <typename Fn>
  CommHandle launch(Fn&& issue) {
    std::lock_guard<std::mutex> lock(mu_);
    CurrentDevice cur(core_->device);
    Status s = issue();
    if (!s.is_ok()) return completed_handle(std::move(s));
    cudaEvent_t ev = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (err != cudaSuccess) return completed_handle(cuda_error("cudaEventCreateWithFlags", err));
    err = cudaEventRecord(ev, core_->stream);
    if (err != cudaSuccess) {
      (void)cudaEventDestroy(ev);
      return completed_handle(cuda_error("cudaEventRecord", err));
    }
    return CommHandle(std::make_shared<EventState>(core_, ev));
  }

  std::mutex mu_;
  std::shared_ptr<NcclCore> core_;
  const int rank_, size_, local_rank_;
};

// Whether this rank can run NCCL on a GPU: picks the ordinal, or says why not.
Status pick_device(int requested, int local_rank, int* ordinal) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess)
    return unsupported("no CUDA device: cudaGetDeviceCount: %s (%s)", cudaGetErrorName(err),
                       cudaGetErrorString(err));
  if (n == 0) return unsupported("no CUDA device visible");
  if (requested >= n) return invalid_argument("create_nccl_comm: device %d, but %d visible", requested, n);
  *ordinal = requested >= 0 ? requested : local_rank % n;
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Communicator>> create_nccl_comm(Communicator& bootstrap, int device_ordinal,
                                                       void* stream) {
  const int rank = bootstrap.rank(), size = bootstrap.size();
  int ordinal = 0;
  Status local = pick_device(device_ordinal, bootstrap.local_rank(), &ordinal);
  // Every rank learns whether any rank failed, so that none is left waiting in ncclCommInitRank.
  int64_t failed = local.is_ok() ? 0 : 1;
  ZOE_RETURN_IF_ERROR_CTX(bootstrap.all_reduce(&failed, &failed, 1, CommType::kI64, ReduceOp::kMax).wait(),
                          "while agreeing on GPUs for NCCL");
  if (!local.is_ok()) return local;
  if (failed != 0) return unsupported("create_nccl_comm: another rank has no usable GPU");

  auto core = std::make_shared<NcclCore>();
  core->device = ordinal;
  CurrentDevice cur(ordinal);
  // Rank 0 makes the id; it travels with a flag so that a failure there reaches every rank.
  struct {
    int64_t ok;
    ncclUniqueId id;
  } boot{};
  if (rank == 0) boot.ok = ncclGetUniqueId(&boot.id) == ncclSuccess ? 1 : 0;
  ZOE_RETURN_IF_ERROR_CTX(bootstrap.broadcast(&boot, sizeof(boot), CommType::kU8, 0).wait(),
                          "while broadcasting the NCCL unique id");
  if (boot.ok == 0) return Status(StatusCode::kIoError, "create_nccl_comm: ncclGetUniqueId failed on rank 0");
  if (stream != nullptr) {
    core->stream = static_cast<cudaStream_t>(stream);
  } else {
    ZOE_CUDA_TRY(cudaStreamCreateWithFlags(&core->stream, cudaStreamNonBlocking));
    core->own_stream = true;
  }
  ZOE_CUDA_TRY(cudaMalloc(&core->scratch, 8));
  ncclResult_t r = ncclCommInitRank(&core->comm, size, boot.id, rank);
  if (r != ncclSuccess) {
    core->comm = nullptr;
    return nccl_error("ncclCommInitRank", r, nullptr);
  }
  return std::unique_ptr<Communicator>(
      std::make_unique<NcclComm>(std::move(core), rank, size, bootstrap.local_rank()));
}

#else  // !ZOE_HAVE_NCCL

Result<std::unique_ptr<Communicator>> create_nccl_comm(Communicator& /*bootstrap*/, int /*device_ordinal*/,
                                                       void* /*stream*/) {
  return unsupported("create_nccl_comm: zoe was built without CUDA/NCCL");
}

#endif

}  // namespace zoe::comm
