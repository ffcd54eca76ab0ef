// Whether a directory a user named (an NVMe path, a benchmark's --path) can hold zoe's files.
#pragma once

#include <string>

#include "zoe/status.h"

namespace zoe {

// Checks that `dir` exists (kNotFound otherwise), is a directory (kInvalidArgument), is writable
// and searchable by this process (kPermissionDenied), is not on a kernel pseudo file system such
// as procfs or sysfs (kInvalidArgument), and that a file can be created there: a probe file,
// removed at once (the error gives the kernel's reason). Every error begins with `what` (the flag
// or the config key that named the directory) and the directory, e.g.
// "--nvme-path: '/proc' is on procfs, a kernel pseudo file system that cannot hold files".
Status check_dir_holds_files(const std::string& what, const std::string& dir);

}  // namespace zoe
