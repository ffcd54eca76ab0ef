// CommBucket: packing layout and the pack -> collective -> unpack chain (see bucket.h).
#include "comm/bucket.h"

#include <cstring>

#include "core/log.h"

namespace zoe::comm {

CommBucket::CommBucket(Communicator& comm, BucketOp op, CommType type, ReduceOp reduce, size_t capacity)
    : comm_(comm), op_(op), type_(type), reduce_(reduce), capacity_(capacity) {}

bool CommBucket::add(const void* send, void* recv, size_t count) {
  ZOE_CHECK_MSG(count == 0 || (send != nullptr && recv != nullptr), "CommBucket::add: null buffer, count %zu",
                count);
  const size_t mult = op_ == BucketOp::kAllReduce ? 1 : static_cast<size_t>(comm_.size());
  if (!tensors_.empty() && (elements_ + count) * mult > capacity_) return false;
  tensors_.push_back(Tensor{send, recv, count, elements_});
  elements_ += count;
  return true;
}

CommHandle CommBucket::flush() {
  if (tensors_.empty()) return CommHandle();
  const size_t es = comm_type_size(type_);
  const size_t n = elements_;  // one rank's row of the packed buffer
  const int size = comm_.size(), rank = comm_.rank();
  const size_t total = op_ == BucketOp::kAllReduce ? n : n * size;
  // Sized here, before any task of this flush can touch it; a buffer still held by a flush in flight
  // is left to it.
  if (!spare_ || spare_.use_count() > 1 || spare_->bytes < total * es) {
    spare_ = std::make_shared<Buffer>();
    spare_->bytes = total * es;
    spare_->data.reset(new unsigned char[spare_->bytes]);  // no zero fill: every byte is packed
  }
  auto buf = spare_;
  auto tensors = std::make_shared<std::vector<Tensor>>(std::move(tensors_));
  tensors_.clear();
  elements_ = 0;
  const BucketOp op = op_;

  CommHandle packed = comm_.enqueue_host_task([buf, tensors, n, es, size, rank, op]() -> Status {
    unsigned char* b = buf->data.get();
    for (const Tensor& t : *tensors) {
      if (t.count == 0) continue;
      if (op == BucketOp::kReduceScatter) {
        for (int r = 0; r < size; ++r)
          std::memcpy(b + (r * n + t.offset) * es,
                      static_cast<const unsigned char*>(t.send) + r * t.count * es, t.count * es);
      } else {
        size_t row = op == BucketOp::kAllGather ? rank * n : 0;
        std::memcpy(b + (row + t.offset) * es, t.send, t.count * es);
      }
    }
    return Status::ok();
  });
  if (packed.ready() && !packed.wait().is_ok()) return packed;  // no host stream (NcclComm)

  unsigned char* b = buf->data.get();
  CommHandle coll;
  switch (op_) {
    case BucketOp::kAllReduce:
      coll = comm_.all_reduce(b, b, n, type_, reduce_);
      break;
    case BucketOp::kReduceScatter:
      coll = comm_.reduce_scatter(b, b + rank * n * es, n, type_, reduce_);
      break;
    case BucketOp::kAllGather:
      coll = comm_.all_gather(b + rank * n * es, b, n, type_);
      break;
  }
  return comm_.enqueue_host_task([buf, tensors, coll, n, es, size, rank, op]() -> Status {
    ZOE_RETURN_IF_ERROR(coll.wait());  // already complete: it ran before this task
    const unsigned char* src = buf->data.get();
    for (const Tensor& t : *tensors) {
      if (t.count == 0) continue;
      if (op == BucketOp::kAllGather) {
        for (int r = 0; r < size; ++r)
          std::memcpy(static_cast<unsigned char*>(t.recv) + r * t.count * es, src + (r * n + t.offset) * es,
                      t.count * es);
      } else {
        size_t row = op == BucketOp::kReduceScatter ? rank * n : 0;
        std::memcpy(t.recv, src + (row + t.offset) * es, t.count * es);
      }
    }
    return Status::ok();
  });
}

}  // namespace zoe::comm
