// File-system checks of a parsed Config, kept out of Config::parse (which reads text only) and
// asked where the engine is created: do the NVMe directories exist, and may zoe write there? And
// the placeholders of nvme_path, which make one config serve every node.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "zoe/status.h"

namespace zoe::config {

// What an nvme_path's placeholders stand for in one process.
struct PathVars {
  int rank = 0;        // {rank}
  int local_rank = 0;  // {local_rank}: among the ranks of this host
  std::string host;    // {host}: this host's name (gethostname)
};

// This process's values from the launcher's environment (Open MPI's OMPI_COMM_WORLD_RANK and
// OMPI_COMM_WORLD_LOCAL_RANK, PMI_RANK / PMI_LOCAL_RANK, SLURM_PROCID / SLURM_LOCALID, torchrun's
// RANK / LOCAL_RANK; 0 without a launcher) and gethostname.
PathVars process_path_vars();

// Replaces, in every nvme_path directory of both offload blocks and zoe.activation_nvme_path, {rank},
// {local_rank} and {host} with v's values, and $NAME or ${NAME} with the environment variable NAME (e.g.
// $SLURM_TMPDIR, the job's node-local directory under Slurm). "$$" is a literal "$". Errors
// (kInvalidArgument) name the key and the path as given: an unknown {placeholder} (and the host), an
// unset or empty variable (and the host), a "{" or "${" without its "}", and a {host} that would leave
// the directory (this host's name is empty, "." or "..", or holds a "/").
[[nodiscard]] Status expand_paths(Config* c, const PathVars& v);
// The same for one path ("what" names it in errors).
[[nodiscard]] Result<std::string> expand_path(const std::string& what, const std::string& path,
                                              const PathVars& v);

// Checks every nvme_path directory of an offload block whose device is "nvme"
// (zero_optimization.offload_optimizer, then offload_param): it must exist (kNotFound
// otherwise), be a directory and be writable and searchable by this process
// (kPermissionDenied), not be on a kernel pseudo file system such as procfs or sysfs, and a file
// must be creatable there (a probe file, removed at once; the error gives the reason the kernel
// gave). Each error names the key's JSON path and the directory, e.g.
// "zero_optimization.offload_param.nvme_path: '/mnt/nvme' does not exist". Blocks not on nvme
// are not examined. A directory on a network file system (NFS, Lustre, GPFS, CIFS, BeeGFS,
// CephFS: statfs's f_type) is allowed, with one warning per directory: swap files belong on a
// node-local drive. Paths are checked as given: expand_paths first.
// With zoe.activation_offload "nvme", also the activation store's directories
// (activation_nvme_dirs), under the key zoe.activation_nvme_path.
[[nodiscard]] Status check_paths(const Config& c);
// The same for a config `c` that expand_paths made of `given`: a directory whose text the expansion
// changed is named as given too ("zero_optimization.offload_param.nvme_path '/local/{host}':
// '/local/node7' does not exist").
[[nodiscard]] Status check_paths(const Config& c, const Config& given);

// A directory a command-line flag gave (--nvme-path): expanded as nvme_path is (expand_path), then
// checked as check_paths checks one. Errors name the flag and the text as given, and the expansion
// where it differs ("--nvme-path '$SCRATCH/zoe': '/scratch/ann/zoe' does not exist"). Returns the
// expansion.
[[nodiscard]] Result<std::string> check_flag_dir(const std::string& flag, const std::string& given,
                                                 const PathVars& v);

// The activation store's swap directories: zoe.activation_nvme_path, else offload_param's
// nvme_path, else offload_optimizer's (empty: none).
std::vector<std::string> activation_nvme_dirs(const Config& c);

// "NFS", "Lustre", ... for a statfs f_type of a network file system; nullptr for any other.
const char* network_fs_name(long f_type);

}  // namespace zoe::config
