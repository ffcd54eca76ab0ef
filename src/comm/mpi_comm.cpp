// MpiComm: host collectives over MPI, run in order by one worker thread per communicator.
//
// The collectives are ordered.h's fixed-order ones, MPI moving the bytes (MPI_Alltoall,
// MPI_Allgather, MPI_Bcast): the bits never depend on arrival order or on MPI's algorithm choice,
// and equal GlooComm's for the same inputs.
#include "zoe/features.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/comm_internal.h"
#include "comm/heartbeat.h"
#include "comm/ordered.h"
#include "core/log.h"

#if ZOE_HAVE_MPI
#include <mpi.h>
#endif

namespace zoe::comm {

#if ZOE_HAVE_MPI
namespace {

constexpr size_t kDefaultChunkBytes = 8u << 20;

// "MPI_Alltoall: MPI_ERR_TRUNCATE: message truncated (error 15)".
Status mpi_error(const char* call, int err) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) len = 0;
  text[len] = '\0';
  return make_status(StatusCode::kIoError, "%s: %s (MPI error %d)", call, len > 0 ? text : "unknown error",
                     err);
}

#define ZOE_MPI_TRY(call)                                                   \
  do {                                                                      \
    int zoe_mpi_err_ = (call);                                              \
    if (zoe_mpi_err_ != MPI_SUCCESS) return mpi_error(#call, zoe_mpi_err_); \
  } while (0)

// Process-wide MPI state: whether zoe initialised MPI (and so finalises it at exit), the thread level
// and how many MpiComms are alive.
struct MpiProcess {
  std::mutex mu;
  bool we_initialised = false;
  int thread_level = MPI_THREAD_SINGLE;
  int live_comms = 0;
};

MpiProcess& mpi_process() {
  static MpiProcess* p = new MpiProcess();  // never destroyed: used from atexit and late destructors
  return *p;
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown thread level";
}

// Initialises MPI when nobody has, and admits one more communicator. Called with mu held.
Status ensure_mpi_locked(MpiProcess& p) {
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  if (finalized) return unsupported("create_mpi_comm: MPI has already been finalised in this process");
  if (!initialised) {
    int provided = MPI_THREAD_SINGLE;
    ZOE_MPI_TRY(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    p.we_initialised = true;
    p.thread_level = provided;
    std::atexit(finalize_at_exit);
  } else if (!p.we_initialised) {
    ZOE_MPI_TRY(MPI_Query_thread(&p.thread_level));
  }
  // Our worker threads call MPI, never the thread that initialised it: FUNNELED is not enough.
  if (p.thread_level < MPI_THREAD_SERIALIZED)
    return unsupported(
        "create_mpi_comm: MPI runs at %s; zoe's communicator thread needs MPI_THREAD_SERIALIZED",
        thread_level_name(p.thread_level));
  if (p.thread_level < MPI_THREAD_MULTIPLE && p.live_comms > 0)
    return unsupported("create_mpi_comm: MPI runs at %s, so only one MpiComm may live at a time",
                       thread_level_name(p.thread_level));
  return Status::ok();
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// The bytes MPI moves for the ordered collectives (ordered.h).
class MpiTransport final : public ByteTransport {
 public:
  MpiTransport(MPI_Comm comm, int rank) : comm_(comm), rank_(rank) {}
  Status all_gather(const void* send, void* recv, size_t bytes) override {
    const bool in_place = send == static_cast<const unsigned char*>(recv) + rank_ * bytes;
    ZOE_MPI_TRY(MPI_Allgather(in_place ? MPI_IN_PLACE : send, in_place ? 0 : static_cast<int>(bytes),
                              in_place ? MPI_DATATYPE_NULL : MPI_BYTE, recv, static_cast<int>(bytes),
                              MPI_BYTE, comm_));
    return Status::ok();
  }
  Status all_to_all(const void* send, void* recv, size_t bytes) override {
    ZOE_MPI_TRY(MPI_Alltoall(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                             comm_));
    return Status::ok();
  }
  Status broadcast(void* buf, size_t bytes, int root) override {
    ZOE_MPI_TRY(MPI_Bcast(buf, static_cast<int>(bytes), MPI_BYTE, root, comm_));
    return Status::ok();
  }
  Status barrier() override {
    ZOE_MPI_TRY(MPI_Barrier(comm_));
    return Status::ok();
  }

 private:
  MPI_Comm comm_;
  const int rank_;
};

// ordered.h's host communicator over MPI; its duplicate of MPI_COMM_WORLD is freed after the last
// collective.
class MpiComm final : public OrderedHostComm {
 public:
  MpiComm(MPI_Comm comm, int rank, int size, int local_rank, size_t chunk_bytes)
      : OrderedHostComm(std::make_unique<MpiTransport>(comm, rank), rank, size, local_rank, chunk_bytes,
                        chunk_bytes == kDefaultChunkBytes ? static_cast<size_t>(INT_MAX) : chunk_bytes, "mpi",
                        "zoe-comm-mpi"),
        comm_(comm) {}

  ~MpiComm() override {
    drain();  // the queued collectives run, and the worker is joined, before the comm goes
    MpiProcess& p = mpi_process();
    std::lock_guard<std::mutex> lock(p.mu);
    if (!mpi_finalized()) MPI_Comm_free(&comm_);
    --p.live_comms;
  }

 private:
  MPI_Comm comm_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> create_mpi_comm(const MpiCommOptions& options) {
  MpiProcess& p = mpi_process();
  std::lock_guard<std::mutex> lock(p.mu);
  ZOE_RETURN_IF_ERROR(ensure_mpi_locked(p));
  MPI_Comm comm = MPI_COMM_NULL;
  ZOE_MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  Status s = [&]() -> Status {
    ZOE_MPI_TRY(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    return Status::ok();
  }();
  int rank = 0, size = 1, local_rank = 0;
  MPI_Comm node = MPI_COMM_NULL;
  const LaunchEnv env = launch_env();
  if (s.is_ok())
    s = [&]() -> Status {
      ZOE_MPI_TRY(MPI_Comm_rank(comm, &rank));
      ZOE_MPI_TRY(MPI_Comm_size(comm, &size));
      // The rank among this node's processes; where MPI cannot tell (an error), the launcher's
      // (OMPI_COMM_WORLD_LOCAL_RANK, ..., SLURM_LOCALID).
      const Status split = [&]() -> Status {
        ZOE_MPI_TRY(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
        ZOE_MPI_TRY(MPI_Comm_rank(node, &local_rank));
        return Status::ok();
      }();
      if (!split.is_ok()) {
        if (env.local_rank < 0) return split;
        local_rank = env.local_rank;
      }
      return check_world_matches_launcher(env, size);
    }();
  if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
  if (!s.is_ok()) {
    MPI_Comm_free(&comm);
    return s.with_context("creating an MPI communicator");
  }
  {
    MpiTransport t(comm, rank);  // the setup's exchanges, before the communicator's worker starts
    start_process_heartbeat(t, rank, size);
  }
  ++p.live_comms;
  size_t chunk = options.chunk_bytes > 0 ? options.chunk_bytes : kDefaultChunkBytes;
  return std::unique_ptr<Communicator>(std::make_unique<MpiComm>(comm, rank, size, local_rank, chunk));
}

#else  // !ZOE_HAVE_MPI

Result<std::unique_ptr<Communicator>> create_mpi_comm(const MpiCommOptions& /*options*/) {
  return unsupported("create_mpi_comm: zoe was built without MPI (configure with -DZOE_MPI=ON)");
}

#endif

Result<std::unique_ptr<Communicator>> create_mpi_comm() { return create_mpi_comm(MpiCommOptions{}); }

}  // namespace zoe::comm
