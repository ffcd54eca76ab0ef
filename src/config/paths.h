// File-system checks of a parsed Config, kept out of Config::parse (which reads text only) and
// asked where the engine is created: do the NVMe directories exist, and may zoe write there?
#pragma once

#include "config/config.h"
#include "zoe/status.h"

namespace zoe::config {

// Checks every nvme_path directory of an offload block whose device is "nvme"
// (zero_optimization.offload_optimizer, then offload_param): it must exist (kNotFound
// otherwise), be a directory and be writable and searchable by this process
// (kPermissionDenied), not be on a kernel pseudo file system such as procfs or sysfs, and a file
// must be creatable there (a probe file, removed at once; the error gives the reason the kernel
// gave). Each error names the key's JSON path and the directory, e.g.
// "zero_optimization.offload_param.nvme_path: '/mnt/nvme' does not exist". Blocks not on nvme
// are not examined.
[[nodiscard]] Status check_paths(const Config& c);

}  // namespace zoe::config
