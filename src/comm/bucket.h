// CommBucket: coalesces many small tensors into one collective (gradient buckets of
// reduce_bucket_size elements): pack into one contiguous buffer, one collective, unpack.
//
// The result equals running the collective on each tensor by itself, bit for bit on LocalComm and
// MpiComm (their reductions are element-wise in rank order), with one collective's latency.
// Host memory only: packing and unpacking run as host tasks on the communicator's stream
// (Communicator::enqueue_host_task), so flush() does not block; on NcclComm flush() fails with
// kUnsupported (a device bucket packs with device copies).
// Not thread-safe: one bucket is filled and flushed by one thread at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace zoe::comm {

enum class BucketOp : uint8_t { kAllReduce, kReduceScatter, kAllGather };

class CommBucket {
 public:
  // capacity: elements of the packed buffer (all_reduce: sum of counts; reduce_scatter and all_gather:
  // sum of counts times comm.size()). `reduce` is ignored for all_gather.
  CommBucket(Communicator& comm, BucketOp op, CommType type, ReduceOp reduce, size_t capacity);

  // Adds one tensor with the meaning of `count` the collective has (all_reduce send[count] ->
  // recv[count]; reduce_scatter send[count*size] -> recv[count]; all_gather send[count] ->
  // recv[count*size]); in place as the collective allows. Returns false, adding nothing, when the
  // bucket holds something and the tensor would overflow the capacity: flush() and add again. A
  // tensor larger than the capacity is taken alone by an empty bucket. Null buffers with count > 0
  // are a programming error (ZOE_CHECK).
  bool add(const void* send, void* recv, size_t count);

  // Queues pack -> collective -> unpack and empties the bucket. The handle is ready once the recv
  // buffers hold the result; every added buffer must stay valid until then. Empty bucket: an empty
  // (ready) handle.
  CommHandle flush();

  size_t tensors() const { return tensors_.size(); }
  size_t elements() const { return elements_; }  // per-rank counts summed
  bool empty() const { return tensors_.empty(); }

 private:
  struct Tensor {
    const void* send;
    void* recv;
    size_t count;
    size_t offset;  // in elements, within one rank's row of the packed buffer (all_reduce: the buffer)
  };

  struct Buffer {
    std::unique_ptr<unsigned char[]> data;
    size_t bytes = 0;
  };

  Communicator& comm_;
  const BucketOp op_;
  const CommType type_;
  const ReduceOp reduce_;
  const size_t capacity_;
  std::vector<Tensor> tensors_;
  size_t elements_ = 0;
  std::shared_ptr<Buffer> spare_;  // reused when no flush in flight holds it
};

}  // namespace zoe::comm
