// zoe::Runtime (include/zoe/runtime.h) over the host communicator: the process's place among the
// ranks (MPI under mpirun/srun, gloo under torchrun, else one local rank, and a lost rank's swap files
// removed before it exits), the host collectives a training loop needs, and the process helpers of runtime.h
// (the clock, host memory, the exit status told to the other ranks). remove_swap_files_now() is the I/O
// layer's (io/swap_file_lock.cpp), format_bytes() and parse_bytes() the core's (core/units.cpp).
#include "zoe/runtime.h"

#include <csignal>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/heartbeat.h"
#include "comm/runtime_impl.h"
#include "core/clock.h"
#include "core/cpu.h"

namespace zoe {

// ---------------------------------------------------------------------------------------------
// The process among the ranks

Runtime::Runtime() : impl_(std::make_unique<Impl>()) {}

Result<std::unique_ptr<Runtime>> Runtime::init(bool force_local) {
  if (!force_local) ZOE_RETURN_IF_ERROR(check_launcher());  // torchrun's variables in a zoe without gloo
  std::unique_ptr<Runtime> rt(new Runtime());
  if (!force_local && comm::launched_by_mpi()) {
    ZOE_ASSIGN_OR_RETURN(rt->impl_->comm, comm::create_mpi_comm());
    // A rank that learns another was lost removes its swap files before it exits.
    comm::set_lost_rank_cleanup(&remove_swap_files_now);
  } else if (!force_local && comm::launched_by_torchrun(comm::launch_env())) {
    ZOE_ASSIGN_OR_RETURN(rt->impl_->comm, comm::create_launcher_comm());
    comm::set_lost_rank_cleanup(&remove_swap_files_now);
  } else {
    rt->impl_->comm = comm::create_local_comm();
  }
  return rt;
}

Runtime::~Runtime() = default;
int Runtime::rank() const { return impl_->comm->rank(); }
int Runtime::world_size() const { return impl_->comm->size(); }
int Runtime::local_rank() const { return impl_->comm->local_rank(); }

Status check_launcher() { return comm::check_not_torchrun(comm::launch_env()); }

// ---------------------------------------------------------------------------------------------
// Host collectives

Result<double> Runtime::average(double value) {
  double v = value;
  ZOE_RETURN_IF_ERROR_CTX(sum(&v, 1), "averaging a value over the ranks");
  return v / world_size();
}

Status Runtime::sum(double* values, size_t n) {
  if (world_size() == 1 || n == 0) return Status::ok();
  std::vector<double> out(n);
  Status s =
      impl_->comm->all_reduce(values, out.data(), n, comm::CommType::kF64, comm::ReduceOp::kSum).wait();
  if (!s.is_ok()) return s.with_context("summing " + std::to_string(n) + " values over the ranks");
  memcpy(values, out.data(), n * sizeof(double));
  return Status::ok();
}

Status Runtime::broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= world_size()) {
    return invalid_argument("broadcast: root %d is not a rank (world size %d)", root, world_size());
  }
  if (world_size() == 1 || bytes == 0) return Status::ok();
  Status s = impl_->comm->broadcast(data, bytes, comm::CommType::kU8, root).wait();
  if (!s.is_ok())
    return s.with_context("broadcasting " + std::to_string(bytes) + " bytes from rank " +
                          std::to_string(root));
  return Status::ok();
}

Status Runtime::barrier() { return impl_->comm->barrier(); }

// ---------------------------------------------------------------------------------------------
// Process helpers

uint64_t host_memory_available() { return host_memory().available_bytes; }
uint64_t clock_ns() { return now_ns(); }

void set_exit_status(int status) {
  comm::Departure d;
  d.exit_status = status & 0xff;
  if (status == 128 + SIGINT || status == 128 + SIGTERM) d.signal = status - 128;
  comm::set_departure(d);
}

}  // namespace zoe
