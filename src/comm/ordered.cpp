// The fixed-order host collectives over a ByteTransport (ordered.h).
#include "comm/ordered.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "comm/comm_internal.h"
#include "comm/heartbeat.h"
#include "comm/reduce.h"

namespace zoe::comm {

OrderedCollectives::OrderedCollectives(ByteTransport& t, int rank, int size, size_t chunk_bytes,
                                       size_t direct_limit)
    : t_(t), rank_(rank), size_(size), chunk_bytes_(chunk_bytes), direct_limit_(direct_limit) {}

// Elements per peer and round: two scratch buffers of size_ rows of that many elements.
size_t OrderedCollectives::chunk_elems(size_t esize) const {
  size_t per_peer = chunk_bytes_ / (static_cast<size_t>(size_) * esize);
  per_peer = std::max<size_t>(per_peer, 1);
  return std::min(per_peer, static_cast<size_t>(INT_MAX) / esize);
}

void OrderedCollectives::ensure_scratch(size_t bytes) {
  if (scratch_a_.size() < bytes) {
    scratch_a_.resize(bytes);
    scratch_b_.resize(bytes);
  }
}

Status OrderedCollectives::all_gather(const void* send, void* recv, size_t count, CommType type) {
  const size_t es = comm_type_size(type);
  const size_t nb = count * es;
  if (nb == 0) return Status::ok();
  auto* out = static_cast<unsigned char*>(recv);
  const bool in_place = send == out + rank_ * nb;
  if (size_ == 1) {
    if (!in_place) std::memmove(recv, send, nb);
    return Status::ok();
  }
  if (nb <= direct_limit_) return t_.all_gather(send, recv, nb);
  // Rounds: each rank's [off, off + c) of its part, gathered into scratch rows, then spread out.
  const size_t per = chunk_elems(es);
  ensure_scratch(per * es * size_);
  for (size_t off = 0; off < count; off += per) {
    size_t c = std::min(per, count - off);
    size_t cb = c * es;
    std::memcpy(scratch_a_.data() + rank_ * cb, static_cast<const unsigned char*>(send) + off * es, cb);
    ZOE_RETURN_IF_ERROR(t_.all_gather(scratch_a_.data() + rank_ * cb, scratch_a_.data(), cb));
    for (int j = 0; j < size_; ++j) std::memcpy(out + (j * count + off) * es, scratch_a_.data() + j * cb, cb);
  }
  return Status::ok();
}

Status OrderedCollectives::reduce_scatter(const void* send, void* recv, size_t count, CommType type,
                                          ReduceOp op) {
  const size_t es = comm_type_size(type);
  if (count == 0) return Status::ok();
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  if (size_ == 1) {
    if (send != recv) std::memmove(recv, send, count * es);
    return Status::ok();
  }
  const size_t per = chunk_elems(es);
  ensure_scratch(per * es * size_);
  std::vector<const void*> rows(size_);
  for (size_t off = 0; off < count; off += per) {
    size_t c = std::min(per, count - off);
    size_t cb = c * es;
    for (int j = 0; j < size_; ++j) std::memcpy(scratch_a_.data() + j * cb, in + (j * count + off) * es, cb);
    ZOE_RETURN_IF_ERROR(t_.all_to_all(scratch_a_.data(), scratch_b_.data(), cb));
    for (int i = 0; i < size_; ++i) rows[i] = scratch_b_.data() + i * cb;
    reduce_rows(rows.data(), size_, c, out + off * es, type, op);
  }
  return Status::ok();
}

Status OrderedCollectives::all_reduce(const void* send, void* recv, size_t count, CommType type,
                                      ReduceOp op) {
  const size_t es = comm_type_size(type);
  if (count == 0) return Status::ok();
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  if (size_ == 1) {
    if (send != recv) std::memmove(recv, send, count * es);
    return Status::ok();
  }
  // Rank j owns block j = [j*B, min(count, (j+1)*B)); the last blocks may be short or empty.
  const size_t block = (count + size_ - 1) / size_;
  auto block_len = [&](int j) {
    size_t begin = std::min(count, j * block);
    return std::min(count, begin + block) - begin;
  };
  const size_t per = chunk_elems(es);
  ensure_scratch(per * es * size_);
  std::vector<const void*> rows(size_);
  for (size_t off = 0; off < block; off += per) {
    size_t c = std::min(per, block - off);
    size_t cb = c * es;
    auto valid = [&](int j) {
      size_t len = block_len(j);
      return len > off ? std::min(c, len - off) : 0;
    };
    for (int j = 0; j < size_; ++j)
      std::memcpy(scratch_a_.data() + j * cb, in + (j * block + off) * es, valid(j) * es);
    ZOE_RETURN_IF_ERROR(t_.all_to_all(scratch_a_.data(), scratch_b_.data(), cb));
    for (int i = 0; i < size_; ++i) rows[i] = scratch_b_.data() + i * cb;
    reduce_rows(rows.data(), size_, valid(rank_), scratch_a_.data() + rank_ * cb, type, op);
    ZOE_RETURN_IF_ERROR(t_.all_gather(scratch_a_.data() + rank_ * cb, scratch_a_.data(), cb));
    for (int j = 0; j < size_; ++j)
      std::memcpy(out + (j * block + off) * es, scratch_a_.data() + j * cb, valid(j) * es);
  }
  return Status::ok();
}

Status OrderedCollectives::broadcast(void* buf, size_t count, CommType type, int root) {
  const size_t nb = count * comm_type_size(type);
  auto* p = static_cast<unsigned char*>(buf);
  const size_t kMax = 1u << 30;
  for (size_t off = 0; off < nb; off += kMax)
    ZOE_RETURN_IF_ERROR(t_.broadcast(p + off, std::min(kMax, nb - off), root));
  return Status::ok();
}

OrderedHostComm::OrderedHostComm(std::unique_ptr<ByteTransport> transport, int rank, int size, int local_rank,
                                 size_t chunk_bytes, size_t direct_limit, const char* backend,
                                 const char* thread_name)
    : rank_(rank),
      size_(size),
      local_rank_(local_rank),
      backend_(backend),
      transport_(std::move(transport)),
      ordered_(*transport_, rank, size, chunk_bytes, direct_limit),
      queue_(std::make_unique<HostQueue>(thread_name)) {}

OrderedHostComm::~OrderedHostComm() { drain(); }

void OrderedHostComm::drain() { queue_.reset(); }

CommHandle OrderedHostComm::push_collective(std::function<Status()> fn) {
  if (!queue_)
    return completed_handle(make_status(StatusCode::kCancelled, "the %s communicator is closed", backend_));
  return queue_->push([fn = std::move(fn)] {
    WaitingInCollective waiting;
    return fn();
  });
}

CommHandle OrderedHostComm::all_gather(const void* send, void* recv, size_t count, CommType type) {
  Status s = check_buffers("all_gather", send, recv, count);
  if (!s.is_ok()) return completed_handle(std::move(s));
  return push_collective([=, this] { return ordered_.all_gather(send, recv, count, type); });
}

CommHandle OrderedHostComm::reduce_scatter(const void* send, void* recv, size_t count, CommType type,
                                           ReduceOp op) {
  Status s = check_buffers("reduce_scatter", send, recv, count);
  if (!s.is_ok()) return completed_handle(std::move(s));
  return push_collective([=, this] { return ordered_.reduce_scatter(send, recv, count, type, op); });
}

CommHandle OrderedHostComm::all_reduce(const void* send, void* recv, size_t count, CommType type,
                                       ReduceOp op) {
  Status s = check_buffers("all_reduce", send, recv, count);
  if (!s.is_ok()) return completed_handle(std::move(s));
  return push_collective([=, this] { return ordered_.all_reduce(send, recv, count, type, op); });
}

CommHandle OrderedHostComm::broadcast(void* buf, size_t count, CommType type, int root) {
  Status s = check_buffers("broadcast", buf, buf, count);
  if (s.is_ok()) s = check_root("broadcast", root, size_);
  if (!s.is_ok()) return completed_handle(std::move(s));
  return push_collective([=, this] { return ordered_.broadcast(buf, count, type, root); });
}

Status OrderedHostComm::barrier() {
  return push_collective([this] { return transport_->barrier(); }).wait();
}

CommHandle OrderedHostComm::enqueue_host_task(std::function<Status()> fn) {
  if (!queue_)
    return completed_handle(make_status(StatusCode::kCancelled, "the %s communicator is closed", backend_));
  return queue_->push(std::move(fn));
}

}  // namespace zoe::comm
