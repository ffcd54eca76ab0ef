// CommHandle, the CommType table, argument checks and launcher detection.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>

#include "comm/comm_internal.h"
#include "zoe/features.h"
#include "zoe/runtime.h"

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

namespace {

// The first of `vars` that holds a non-negative integer, and its name; -1 when none does.
int first_int(const GetEnv& getenv, std::initializer_list<const char*> vars, const char** from = nullptr) {
  for (const char* var : vars) {
    const char* v = getenv(var);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(v, &end, 10);
    if (errno != 0 || *end != '\0' || x < 0 || x > INT32_MAX) continue;
    if (from != nullptr) *from = var;
    return static_cast<int>(x);
  }
  return -1;
}

bool any_set(const GetEnv& getenv, std::initializer_list<const char*> vars) {
  for (const char* var : vars) {
    const char* v = getenv(var);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

}  // namespace

LaunchEnv resolve_launch_env(const GetEnv& getenv) {
  LaunchEnv e;
  e.rank = first_int(
      getenv, {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"});
  e.local_rank = first_int(getenv, {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                    "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"});
  e.size = first_int(getenv, {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS"},
                     &e.size_from);
  e.mpi = any_set(getenv, {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "MPI_LOCALNRANKS",
                           "MV2_COMM_WORLD_SIZE", "I_MPI_RANK"});
  e.slurm = any_set(getenv, {"SLURM_STEP_ID", "SLURM_STEPID"}) && any_set(getenv, {"SLURM_PROCID"});
  if (any_set(getenv, {"RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                       "TORCHELASTIC_MAX_RESTARTS", "GROUP_RANK"})) {
    e.torch_world = first_int(getenv, {"WORLD_SIZE"});
    e.torch_rank = first_int(getenv, {"RANK"});
    e.torch_local_rank = first_int(getenv, {"LOCAL_RANK"});
  }
  return e;
}

LaunchEnv launch_env() {
  return resolve_launch_env([](const char* name) { return std::getenv(name); });
}

bool launched_by_mpi(const LaunchEnv& env) { return env.mpi || (env.slurm && env.size > 1); }
bool launched_by_mpi() { return launched_by_mpi(launch_env()); }

Status check_world_matches_launcher(const LaunchEnv& env, int mpi_world) {
  if (env.size <= 1 || mpi_world != 1) return Status::ok();
  return invalid_argument(
      "%s=%d: the launcher started %d processes, but MPI sees a world of 1 in each (each would train "
      "alone): this MPI is not connected to the launcher. Under Slurm, launch with srun --mpi=pmix (or "
      "another plugin that `srun --mpi=list` shows and this MPI supports), or with mpirun inside the "
      "allocation",
      env.size_from, env.size, env.size);
}

bool launched_by_torchrun(const LaunchEnv& env) { return env.torch_world > 1 && !launched_by_mpi(env); }

Status check_not_torchrun(const LaunchEnv& env) {
  if (!launched_by_torchrun(env) || ZOE_HAVE_GLOO) return Status::ok();
  return invalid_argument(
      "WORLD_SIZE=%d is set with torchrun's variables (RANK, LOCAL_RANK, TORCHELASTIC_*), but this zoe was "
      "built without gloo, which zoe's ranks use under torchrun: each process would train alone. Install "
      "libgloo-dev and rebuild zoe, or launch with mpirun -np %d (or srun -n %d --mpi=pmix), one process "
      "per device",
      env.torch_world, env.torch_world, env.torch_world);
}

Result<std::unique_ptr<Communicator>> create_launcher_comm() {
  const LaunchEnv env = launch_env();
  if (launched_by_mpi(env)) return create_mpi_comm();
  if (launched_by_torchrun(env)) {
    ZOE_RETURN_IF_ERROR(check_not_torchrun(env));
    // How long the ranks may take to meet: ZOE_COMM_TIMEOUT_S where it is set (> 0), else 300 s.
    const char* t = std::getenv("ZOE_COMM_TIMEOUT_S");
    const double timeout = t != nullptr && std::atof(t) > 0 ? std::atof(t) : 300.0;
    return create_torchrun_comm(env, timeout);
  }
  return create_local_comm();
}

}  // namespace zoe::comm
