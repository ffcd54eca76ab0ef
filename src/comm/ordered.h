// The fixed-order host collectives, over any transport that moves bytes (MPI, gloo).
//
// Reductions: each rank owns one slice of the result; an all-to-all brings every rank's copy of
// that slice to its owner, which sums them in rank order 0..size-1 (reduce_rows) and, for
// all_reduce, an all-gather spreads the owners' slices. Only data movement goes through the
// transport, so the bits never depend on arrival order or on the transport's algorithm: every
// backend built on this gives the bits of reduce_rows over all ranks' inputs, MPI's and gloo's
// alike. bf16/fp16 are summed in fp32 and rounded once. The traffic per rank is that of a ring:
// (size-1)/size of the buffer for reduce_scatter, twice that for all_reduce. Large collectives run
// in rounds bounded by chunk_bytes.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace zoe::comm {

// What a transport offers: blocking collectives over bytes among `size` ranks, called in the same
// order on every rank (the communicator's worker thread). Each call moves at most INT_MAX bytes
// per rank and row.
class ByteTransport {
 public:
  virtual ~ByteTransport() = default;
  // Every rank's `bytes` at send into row r of recv (size rows of `bytes`); send ==
  // recv + rank * bytes is in place.
  virtual Status all_gather(const void* send, void* recv, size_t bytes) = 0;
  // Row j of send (size rows of `bytes`) goes to rank j; row i of recv comes from rank i.
  virtual Status all_to_all(const void* send, void* recv, size_t bytes) = 0;
  virtual Status broadcast(void* buf, size_t bytes, int root) = 0;
  virtual Status barrier() = 0;
};

class OrderedCollectives {
 public:
  // direct_limit: all_gather parts up to this many bytes go to the transport in one call.
  OrderedCollectives(ByteTransport& t, int rank, int size, size_t chunk_bytes, size_t direct_limit);
  Status all_gather(const void* send, void* recv, size_t count, CommType type);
  Status reduce_scatter(const void* send, void* recv, size_t count, CommType type, ReduceOp op);
  Status all_reduce(const void* send, void* recv, size_t count, CommType type, ReduceOp op);
  Status broadcast(void* buf, size_t count, CommType type, int root);

 private:
  size_t chunk_elems(size_t esize) const;
  void ensure_scratch(size_t bytes);

  ByteTransport& t_;
  const int rank_, size_;
  const size_t chunk_bytes_, direct_limit_;
  std::vector<unsigned char> scratch_a_, scratch_b_;
};

class HostQueue;

// A host communicator over a transport: ordered.h's collectives, run in submission order on one
// worker thread (HostQueue), each counted as a wait in a collective for the heartbeat. MpiComm and
// GlooComm are this with their transport; a subclass whose transport needs tearing down after the
// last collective calls drain() first in its destructor.
class OrderedHostComm : public Communicator {
 public:
  OrderedHostComm(std::unique_ptr<ByteTransport> transport, int rank, int size, int local_rank,
                  size_t chunk_bytes, size_t direct_limit, const char* backend, const char* thread_name);
  ~OrderedHostComm() override;  // drain()

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  const char* backend() const override { return backend_; }
  CommHandle all_gather(const void* send, void* recv, size_t count, CommType type) override;
  CommHandle reduce_scatter(const void* send, void* recv, size_t count, CommType type, ReduceOp op) override;
  CommHandle all_reduce(const void* send, void* recv, size_t count, CommType type, ReduceOp op) override;
  CommHandle broadcast(void* buf, size_t count, CommType type, int root) override;
  Status barrier() override;
  CommHandle enqueue_host_task(std::function<Status()> fn) override;

 protected:
  void drain();  // runs what is queued and joins the worker; later calls fail

 private:
  CommHandle push_collective(std::function<Status()> fn);

  const int rank_, size_, local_rank_;
  const char* const backend_;
  std::unique_ptr<ByteTransport> transport_;
  OrderedCollectives ordered_;        // worker thread only
  std::unique_ptr<HostQueue> queue_;  // last: its worker uses the members above
};

}  // namespace zoe::comm
