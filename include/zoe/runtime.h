// zoe::Runtime: the process's place among the ranks (MPI under mpirun/srun, else one local rank)
// and the host collectives a training loop needs (a loss averaged over the ranks, a broadcast).
//
// Contracts:
//   * Create one Runtime per process, before any Engine, and destroy it after every Engine.
//   * Collectives are called by every rank, in the same order, from one thread at a time (the
//     thread that drives the engines); they block until every rank has joined.
//   * A collective that fails (a rank died, MPI reported an error) leaves the Runtime only
//     destructible: the ranks no longer agree on what ran.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zoe/status.h"

namespace zoe {

class Runtime {
 public:
  // Under mpirun/srun: the ranks from MPI; otherwise one rank. force_local ignores the launcher.
  static Result<std::unique_ptr<Runtime>> init(bool force_local = false);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const;
  int world_size() const;
  int local_rank() const;  // among the ranks of this host

  // The mean of `value` over the ranks (every rank gets it). One rank: value itself.
  Result<double> average(double value);
  // Element-wise sums over the ranks, in place.
  Status sum(double* values, size_t n);
  Status sum(std::vector<double>* values) { return sum(values->data(), values->size()); }
  // `bytes` bytes at `data` from rank `root` to every rank (host memory).
  Status broadcast(void* data, size_t bytes, int root = 0);
  Status barrier();

  struct Impl;  // internal (src/comm/runtime_impl.h)

 private:
  Runtime();
  friend struct RuntimeAccess;
  std::unique_ptr<Impl> impl_;
};

// The launcher's environment, checked before MPI starts (Runtime::init checks it too): torchrun's
// variables (RANK, LOCAL_RANK, TORCHELASTIC_*) with WORLD_SIZE > 1 and no MPI launcher are refused,
// since zoe's ranks come from MPI and each process would train alone; the message says to launch
// with mpirun or srun. Rank, local rank and size come from the MPI launcher's variables, with
// Slurm's (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS) where it sets none; an srun step of several
// tasks starts MPI. OK otherwise.
Status check_launcher();

// Host memory the system reports as available now (bytes; 0 when unknown).
uint64_t host_memory_available();
// A monotonic clock in nanoseconds: the one Engine::record_compute's spans are measured on.
uint64_t clock_ns();
// "1.5 GiB", "512 KiB", "17 B".
std::string format_bytes(uint64_t bytes);
// "256MiB", "4G", "1e9", plain integers: K/M/G/T/P/E and *iB are powers of 1024, KB/MB/GB/TB/PB/EB
// of 1000; below 16 EiB (64 bits).
Result<uint64_t> parse_bytes(std::string_view text);

// Removes the swap files this process has open on NVMe paths now, for a process about to exit
// abnormally (a lost peer rank, a signal whose step never ends): nothing is left behind, and the
// files stay usable until the engine closes them. Returns how many were removed. Thread-safe; not
// for a signal handler (call it from a thread).
size_t remove_swap_files_now();

// How this process's program ends, told to the other ranks: its exit status (128 + a signal for a
// stop by SIGINT or SIGTERM). Its heartbeat goodbye carries it, and a rank left waiting for this one
// in a collective names it with that status. Call it just before returning from main; no effect
// without a heartbeat (one rank, no MPI).
void set_exit_status(int status);

}  // namespace zoe
