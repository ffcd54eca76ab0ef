// Communicator: the collectives ZeRO needs (all_gather, reduce_scatter, all_reduce, broadcast,
// barrier), asynchronous to the caller and run in submission order on the communicator's own
// stream (a worker thread for LocalComm and MpiComm, a CUDA stream for NcclComm).
//
// Buffers: LocalComm and MpiComm take host memory (CpuDevice memory is host memory); NcclComm
// takes device memory. Every buffer must stay valid until the handle is ready.
// Counts are in elements. For all_gather and reduce_scatter, `count` is the per-rank part:
//   all_gather:     send[count]             -> recv[count * size]   (rank r's part at r*count)
//   reduce_scatter: send[count * size]      -> recv[count]          (rank r gets part r)
// Sums of bf16/fp16 are accumulated in fp32 and rounded once (round to nearest even).
// Results are deterministic for a given world size: the same inputs give the same bits.
// (LocalComm and MpiComm reduce every element in rank order 0..size-1, see comm/reduce.h; NcclComm
// uses NCCL's own arithmetic: half-precision sums round at each step of NCCL's ring/tree, and the
// bits depend on the algorithm NCCL picks, which is fixed for a given size, topology and NCCL_ALGO.)
// In place: all_reduce with send == recv; all_gather with send == recv + rank * count;
// reduce_scatter with recv == send + rank * count. Other overlaps are undefined.
// Ordering: a handle is ready only after every collective queued before it on the same
// communicator is ready. Arguments that cannot be right (null buffer with count > 0, root out of
// range) give a handle that is already failed with kInvalidArgument and queue nothing.
// After a collective fails, the ones queued after it fail with kCancelled (the ranks may be out of
// step); the communicator should be dropped.
// Thread safety: every method may be called from any thread; the submission order on one
// communicator is the order of the calls (callers on several threads must agree on it across ranks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "zoe/status.h"

namespace zoe::comm {

enum class CommType : uint8_t { kF32, kF16, kBF16, kF64, kU8, kI64 };
enum class ReduceOp : uint8_t { kSum, kMax };
size_t comm_type_size(CommType t);
const char* comm_type_name(CommType t);
// The collective's element type of a tensor dtype.
constexpr CommType to_comm(DType d) {
  return d == DType::kF32 ? CommType::kF32 : d == DType::kBF16 ? CommType::kBF16 : CommType::kF16;
}

// Completion of one collective. Copyable; wait() may be called from any thread, many times.
class CommHandle {
 public:
  struct State;
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<State> s) : s_(std::move(s)) {}
  Status wait() const;  // an empty handle is ready and OK
  bool ready() const;
  const std::shared_ptr<State>& state() const { return s_; }

 private:
  std::shared_ptr<State> s_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;  // waits for queued collectives
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;       // rank among the processes of this node (GPU choice)
  virtual const char* backend() const = 0;  // "local", "mpi", "gloo", "nccl"

  virtual CommHandle all_gather(const void* send, void* recv, size_t count, CommType type) = 0;
  virtual CommHandle reduce_scatter(const void* send, void* recv, size_t count, CommType type,
                                    ReduceOp op) = 0;
  virtual CommHandle all_reduce(const void* send, void* recv, size_t count, CommType type, ReduceOp op) = 0;
  virtual CommHandle broadcast(void* buf, size_t count, CommType type, int root) = 0;
  // Blocking; also waits for everything queued before it on this communicator.
  virtual Status barrier() = 0;

  // Optional: runs `fn` on the communicator's stream after everything queued before it (bucket
  // packing and unpacking use it). Host streams (LocalComm, MpiComm) run it on their worker thread;
  // the default answers a failed handle with kUnsupported (NcclComm).
  virtual CommHandle enqueue_host_task(std::function<Status()> fn);
};

// Options of an MpiComm. chunk_bytes bounds the scratch the reductions use per round (two buffers of
// chunk_bytes); all_gather also goes through chunks when its per-rank part is larger. 0: default
// (8 MiB). Tests set it small to run the chunked paths.
struct MpiCommOptions {
  size_t chunk_bytes = 0;
};

// One rank: copies (send -> recv) where the collective needs it; in place is allowed.
std::unique_ptr<Communicator> create_local_comm();
// Rank and size from MPI (mpirun / srun). Initialises MPI if nobody has; finalises it at exit
// if it did. Fails with kUnsupported when zoe was built without MPI.
// Each MpiComm works on its own duplicate of MPI_COMM_WORLD. Several may live at once where MPI gives
// MPI_THREAD_MULTIPLE (zoe asks for it); otherwise a second one fails with kUnsupported.
Result<std::unique_ptr<Communicator>> create_mpi_comm();
Result<std::unique_ptr<Communicator>> create_mpi_comm(const MpiCommOptions& options);
// NCCL over device buffers on CUDA device `device_ordinal`; the unique id travels over `bootstrap`
// (an MpiComm, or a LocalComm for one rank). device_ordinal < 0 picks bootstrap.local_rank() modulo
// the number of visible GPUs. Collective over the bootstrap: every rank must call it; if any rank
// has no usable GPU, every rank gets kUnsupported. Fails with kUnsupported without CUDA/NCCL.
// stream: a cudaStream_t the caller's device created (device::Stream::native_handle()), which
// must outlive the communicator; the collectives are ordered on it. nullptr: the communicator
// creates its own (tests of the communicator alone).
Result<std::unique_ptr<Communicator>> create_nccl_comm(Communicator& bootstrap, int device_ordinal,
                                                       void* stream = nullptr);
// A key-value store the ranks meet through: torch's TCPStore under torchrun, an in-process one in
// tests. get() waits up to timeout_ms for the key to be set (kIoError naming the key past it).
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual Status set(const std::string& key, const std::string& value) = 0;
  virtual Result<std::string> get(const std::string& key, int64_t timeout_ms) = 0;
};
// A client of torch's TCPStore (torch.distributed.TCPStore; torchrun's agent serves one at
// MASTER_ADDR:MASTER_PORT). Retries the connection until timeout_s (the store may start later);
// kIoError naming host:port past it. local_address: the address this host reached the store from
// (the interface the other ranks can reach it at), when not null.
Result<std::shared_ptr<KeyValueStore>> connect_tcp_store(const std::string& host, int port, double timeout_s,
                                                         std::string* local_address = nullptr);
// Options of a GlooComm: this process's place, the store, where the others reach it.
struct GlooCommOptions {
  int rank = 0, size = 1, local_rank = 0;
  std::shared_ptr<KeyValueStore> store;
  std::string prefix = "zoe";       // its keys in the store start with this (one prefix a communicator)
  std::string hostname;             // the name or address the other ranks reach this one at ("": gethostname)
  double timeout_s = 300;           // connecting, and each collective's wait for a peer unless...
  double collective_timeout_s = 0;  // ...this is set (> 0): then each collective's wait
  size_t chunk_bytes = 0;           // as MpiCommOptions::chunk_bytes (0: 8 MiB)
};
// Host collectives over gloo's TCP transport: the same fixed-order reductions, so the same bits,
// as MpiComm (ordered.h). Collective over the store: every rank of the world must call it with the
// same size and prefix. Fails with kUnsupported when zoe was built without gloo, kIoError when the
// ranks do not all meet within timeout_s (naming this rank and its host).
Result<std::unique_ptr<Communicator>> create_gloo_comm(const GlooCommOptions& options);
// Where the launcher put this process, read from its environment before MPI starts. Each field is
// the first of its variables that holds an integer (-1: none does): the MPI launchers' first, Slurm's
// as the fallback where no MPI launcher set one (srun without PMI, or a variable PMI leaves out):
//   rank:       OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, MV2_COMM_WORLD_RANK, SLURM_PROCID
//   local_rank: OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, MV2_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID
//   size:       OMPI_COMM_WORLD_SIZE, PMI_SIZE, MV2_COMM_WORLD_SIZE, SLURM_NTASKS
struct LaunchEnv {
  int rank = -1, local_rank = -1, size = -1;
  bool mpi = false;    // an MPI launcher's variables (mpirun, mpiexec, srun with PMI or PMIx)
  bool slurm = false;  // a task of a Slurm job step (srun): SLURM_STEP_ID and SLURM_PROCID
  // torchrun / torch.distributed.launch: WORLD_SIZE where RANK, LOCAL_RANK or a TORCHELASTIC_*
  // variable is set beside it (-1: none).
  int torch_world = -1;
  int torch_rank = -1, torch_local_rank = -1;  // RANK and LOCAL_RANK beside it (-1: not set)
  const char* size_from = "";                  // the variable `size` came from ("" when none)
};
using GetEnv = std::function<const char*(const char* name)>;
LaunchEnv resolve_launch_env(const GetEnv& getenv);
LaunchEnv launch_env();  // this process's environment
// True when this process runs under a launcher of several processes that zoe joins through MPI: an
// MPI launcher's variables (OMPI_COMM_WORLD_SIZE, PMI_SIZE, ...), or a Slurm job step of more than
// one task (srun; MPI then finds its ranks through Slurm's PMI).
bool launched_by_mpi();
bool launched_by_mpi(const LaunchEnv& env);
// The launcher's size against MPI's world: a launcher that started `env.size` > 1 processes whose
// MPI each see a world of one (an MPI not wired to Slurm's PMI, or processes started by hand with
// copied variables) would train alone on the same data. kInvalidArgument saying how to launch.
Status check_world_matches_launcher(const LaunchEnv& env, int mpi_world);
// torchrun's variables with WORLD_SIZE > 1 and no MPI launcher, in a zoe built without gloo: each
// process would be a world of one. kInvalidArgument saying how to get gloo or launch with mpirun or
// srun; OK otherwise (with gloo, create_launcher_comm joins torchrun's world).
Status check_not_torchrun(const LaunchEnv& env);
// True when torchrun (or torch.distributed.launch) started this process among several and no MPI
// launcher did: WORLD_SIZE > 1 with RANK, LOCAL_RANK or TORCHELASTIC_* beside it.
bool launched_by_torchrun(const LaunchEnv& env);
// The world torchrun started: RANK, LOCAL_RANK and WORLD_SIZE; the ranks meet through torch's
// TCPStore at MASTER_ADDR:MASTER_PORT (torchrun's agent serves it) and talk over gloo from the
// address this host reaches the store from. Every rank must call it, as often and in the same order
// (each call is one communicator, its keys under its own prefix). kInvalidArgument naming a missing
// or wrong variable; kIoError when the store or a rank is not reached within timeout_s. The first
// one starts the process heartbeat (start_process_heartbeat), which ends the job on a lost rank as
// under MPI; so a collective itself waits as long as a step may take (a day), as MPI's do.
Result<std::unique_ptr<Communicator>> create_torchrun_comm(const LaunchEnv& env, double timeout_s);
// The communicator of this process's launcher: MpiComm under mpirun/srun, GlooComm under torchrun,
// else one local rank.
Result<std::unique_ptr<Communicator>> create_launcher_comm();

}  // namespace zoe::comm
