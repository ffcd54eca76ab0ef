// LocalComm: the one-rank communicator; collectives are copies run in order on a worker thread.
#include <cstring>

#include "comm/comm_internal.h"

namespace zoe::comm {
namespace {

class LocalComm final : public Communicator {
 public:
  LocalComm() : queue_("zoe-comm-local") {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  const char* backend() const override { return "local"; }

  CommHandle all_gather(const void* send, void* recv, size_t count, CommType type) override {
    return copy("all_gather", send, recv, count, type);
  }
  CommHandle reduce_scatter(const void* send, void* recv, size_t count, CommType type,
                            ReduceOp /*op*/) override {
    return copy("reduce_scatter", send, recv, count, type);
  }
  CommHandle all_reduce(const void* send, void* recv, size_t count, CommType type, ReduceOp /*op*/) override {
    return copy("all_reduce", send, recv, count, type);
  }
  CommHandle broadcast(void* buf, size_t count, CommType /*type*/, int root) override {
    Status s = check_buffers("broadcast", buf, buf, count);
    if (s.is_ok()) s = check_root("broadcast", root, 1);
    if (!s.is_ok()) return completed_handle(std::move(s));
    return queue_.push([] { return Status::ok(); });  // queued anyway: its handle orders like any other
  }
  Status barrier() override {
    return queue_.push([] { return Status::ok(); }).wait();
  }
  CommHandle enqueue_host_task(std::function<Status()> fn) override { return queue_.push(std::move(fn)); }

 private:
  CommHandle copy(const char* op, const void* send, void* recv, size_t count, CommType type) {
    Status s = check_buffers(op, send, recv, count);
    if (!s.is_ok()) return completed_handle(std::move(s));
    size_t bytes = count * comm_type_size(type);
    return queue_.push([send, recv, bytes] {
      if (bytes > 0 && send != recv) std::memmove(recv, send, bytes);
      return Status::ok();
    });
  }

  HostQueue queue_;
};

}  // namespace

std::unique_ptr<Communicator> create_local_comm() { return std::make_unique<LocalComm>(); }

}  // namespace zoe::comm
