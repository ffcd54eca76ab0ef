// CommHandle, the CommType table, argument checks and launcher detection.
#include <cstdlib>

#include "comm/comm_internal.h"

namespace zoe::comm {

size_t comm_type_size(CommType t) {
  switch (t) {
    case CommType::kF32:
      return 4;
    case CommType::kF16:
      return 2;
    case CommType::kBF16:
      return 2;
    case CommType::kF64:
      return 8;
    case CommType::kU8:
      return 1;
    case CommType::kI64:
      return 8;
  }
  return 0;
}

const char* comm_type_name(CommType t) {
  switch (t) {
    case CommType::kF32:
      return "f32";
    case CommType::kF16:
      return "f16";
    case CommType::kBF16:
      return "bf16";
    case CommType::kF64:
      return "f64";
    case CommType::kU8:
      return "u8";
    case CommType::kI64:
      return "i64";
  }
  return "?";
}

Status CommHandle::wait() const { return s_ ? s_->wait() : Status::ok(); }
bool CommHandle::ready() const { return s_ ? s_->ready() : true; }

CommHandle Communicator::enqueue_host_task(std::function<Status()> /*fn*/) {
  return completed_handle(
      unsupported("enqueue_host_task: the %s communicator has no host stream", backend()));
}

Status check_buffers(const char* op, const void* send, const void* recv, size_t count) {
  if (count > 0 && (send == nullptr || recv == nullptr))
    return invalid_argument("%s: null %s buffer with count %zu", op, send == nullptr ? "send" : "recv",
                            count);
  return Status::ok();
}

Status check_root(const char* op, int root, int size) {
  if (root < 0 || root >= size) return invalid_argument("%s: root %d out of range [0, %d)", op, root, size);
  return Status::ok();
}

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "MPI_LOCALNRANKS",
                          "MV2_COMM_WORLD_SIZE", "I_MPI_RANK"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

}  // namespace zoe::comm
