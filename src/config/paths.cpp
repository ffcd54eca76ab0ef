// check_paths: the nvme_path directories of a Config, examined on the file system; expand_paths:
// their placeholders.
#include "config/paths.h"

#include <sys/statfs.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "core/dir_check.h"
#include "core/log.h"

namespace zoe::config {

namespace {

// The first of the variables that is set, as a rank; 0 when none is.
int env_int(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = getenv(n);
    if (v != nullptr && *v != '\0') return atoi(v);
  }
  return 0;
}

// Warns once per directory (every check of the same path would say it again).
void warn_if_network_fs(const std::string& key, const std::string& dir) {
  struct statfs fs {};
  if (statfs(dir.c_str(), &fs) != 0) return;
  const char* name = network_fs_name(static_cast<long>(fs.f_type));
  if (name == nullptr) return;
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  if (!warned.insert(dir).second) return;
  ZOE_LOG_WARN(
      "%s: '%s' is on %s, a network file system: swap files belong on a drive of this node (every swap "
      "goes over the network, and the nodes share the file system's bandwidth); a node-local path such "
      "as $SLURM_TMPDIR or /local/{host} is faster",
      key.c_str(), dir.c_str(), name);
}

// What names a directory in a check's error: the key or flag, and the text given where the
// expansion changed it ("--nvme-path '$TMPDIR/zoe'", then the directory itself).
std::string dir_what(const std::string& key, const std::string& given, const std::string& dir) {
  return given == dir ? key : key + " '" + given + "'";
}

// dirs[i] (expanded) was given as given[i] (when the lists match; else as itself).
Status check_dir_list(const std::string& key, const std::vector<std::string>& dirs,
                      const std::vector<std::string>& given) {
  for (size_t i = 0; i < dirs.size(); ++i) {
    const std::string& g = given.size() == dirs.size() ? given[i] : dirs[i];
    ZOE_RETURN_IF_ERROR(check_dir_holds_files(dir_what(key, g, dirs[i]), dirs[i]));
    warn_if_network_fs(key, dirs[i]);
  }
  return Status::ok();
}

Status check_dirs(const OffloadConfig& o, const OffloadConfig& given, const char* block) {
  if (o.device != Offload::kNvme) return Status::ok();
  const std::string key = std::string("zero_optimization.") + block + ".nvme_path";
  if (o.nvme_path.empty()) {
    return invalid_argument(
        "zero_optimization.%s.device: \"nvme\" needs %s (a directory on the NVMe drive, "
        "or a list of them)",
        block, key.c_str());
  }
  return check_dir_list(key, o.nvme_path, given.nvme_path);
}

Status path_error(const std::string& what, const std::string& path, const std::string& why) {
  return Status(StatusCode::kInvalidArgument, what + ": '" + path + "': " + why);
}

bool name_char(char c, bool first) {
  return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (!first && c >= '0' && c <= '9');
}

// "$NAME" or "${NAME}" at path[i] ('$'); appends the value and returns the index after it.
Result<size_t> expand_var(const std::string& what, const std::string& path, size_t i, const PathVars& pv,
                          std::string* out) {
  std::string name;
  size_t end;
  if (i + 1 < path.size() && path[i + 1] == '{') {
    const size_t close = path.find('}', i + 2);
    if (close == std::string::npos) return path_error(what, path, "\"${\" without its \"}\"");
    name = path.substr(i + 2, close - i - 2);
    end = close + 1;
  } else {
    end = i + 1;
    while (end < path.size() && name_char(path[end], end == i + 1)) ++end;
    name = path.substr(i + 1, end - i - 1);
  }
  if (name.empty() || !name_char(name[0], true)) {
    return path_error(what, path,
                      "a \"$\" must begin an environment variable ($NAME or ${NAME}; \"$$\" for a \"$\")");
  }
  const char* v = getenv(name.c_str());
  if (v == nullptr || *v == '\0') {
    return path_error(
        what, path,
        "the environment variable " + name + " is " + (v ? "empty" : "not set") + " on host " + pv.host);
  }
  out->append(v);
  return end;
}

// {host} names one directory inside the path: a host name that is empty, "." or "..", or holds a
// "/", would move the swap files elsewhere (gethostname gives what the administrator set).
Status check_host(const std::string& what, const std::string& path, const std::string& host) {
  if (!host.empty() && host != "." && host != ".." && host.find('/') == std::string::npos)
    return Status::ok();
  return path_error(what, path,
                    "{host} would expand to '" + host + "', this host's name (gethostname), which " +
                        (host.empty()                          ? "is empty"
                         : host.find('/') != std::string::npos ? "holds a '/'"
                                                               : "is a '.' or '..'") +
                        ": the swap files would not be in a directory of their own; use {rank} or $VAR "
                        "instead, or give this host a name");
}

}  // namespace

PathVars process_path_vars() {
  PathVars v;
  v.rank = env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"});
  v.local_rank = env_int(
      {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"});
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) v.host = name;
  return v;
}

Result<std::string> expand_path(const std::string& what, const std::string& path, const PathVars& v) {
  std::string out;
  for (size_t i = 0; i < path.size();) {
    const char c = path[i];
    if (c == '$' && i + 1 < path.size() && path[i + 1] == '$') {
      out.push_back('$');
      i += 2;
    } else if (c == '$') {
      ZOE_ASSIGN_OR_RETURN(i, expand_var(what, path, i, v, &out));
    } else if (c == '{') {
      const size_t close = path.find('}', i);
      if (close == std::string::npos) return path_error(what, path, "\"{\" without its \"}\"");
      const std::string name = path.substr(i + 1, close - i - 1);
      if (name == "rank") {
        out += std::to_string(v.rank);
      } else if (name == "local_rank") {
        out += std::to_string(v.local_rank);
      } else if (name == "host") {
        ZOE_RETURN_IF_ERROR(check_host(what, path, v.host));
        out += v.host;
      } else {
        return path_error(what, path,
                          "unknown placeholder {" + name + "} on host " + v.host +
                              " (known: {rank}, {local_rank}, {host}, $VAR)");
      }
      i = close + 1;
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
}

Status expand_paths(Config* c, const PathVars& v) {
  for (auto [o, block] : {std::pair{&c->zero.offload_optimizer, "offload_optimizer"},
                          std::pair{&c->zero.offload_param, "offload_param"}}) {
    const std::string key = std::string("zero_optimization.") + block + ".nvme_path";
    for (auto& d : o->nvme_path) {
      ZOE_ASSIGN_OR_RETURN(d, expand_path(key, d, v));
    }
  }
  for (auto& d : c->zoe.activation_nvme_path) {
    ZOE_ASSIGN_OR_RETURN(d, expand_path("zoe.activation_nvme_path", d, v));
  }
  return Status::ok();
}

std::vector<std::string> activation_nvme_dirs(const Config& c) {
  if (!c.zoe.activation_nvme_path.empty()) return c.zoe.activation_nvme_path;
  if (!c.zero.offload_param.nvme_path.empty()) return c.zero.offload_param.nvme_path;
  return c.zero.offload_optimizer.nvme_path;
}

Status check_paths(const Config& c) { return check_paths(c, c); }

Status check_paths(const Config& c, const Config& given) {
  ZOE_RETURN_IF_ERROR(
      check_dirs(c.zero.offload_optimizer, given.zero.offload_optimizer, "offload_optimizer"));
  ZOE_RETURN_IF_ERROR(check_dirs(c.zero.offload_param, given.zero.offload_param, "offload_param"));
  if (c.zoe.activation_offload != "nvme") return Status::ok();
  const std::string key = c.zoe.activation_nvme_path.empty()
                              ? "zoe.activation_nvme_path (the offload's nvme_path)"
                              : "zoe.activation_nvme_path";
  std::vector<std::string> dirs = activation_nvme_dirs(c);
  if (dirs.empty())
    return invalid_argument("zoe.activation_offload: \"nvme\" needs zoe.activation_nvme_path");
  return check_dir_list(key, dirs, activation_nvme_dirs(given));
}

Result<std::string> check_flag_dir(const std::string& flag, const std::string& given, const PathVars& v) {
  ZOE_ASSIGN_OR_RETURN(std::string dir, expand_path(flag, given, v));
  ZOE_RETURN_IF_ERROR(check_dir_holds_files(dir_what(flag, given, dir), dir));
  warn_if_network_fs(flag, dir);
  return dir;
}

const char* network_fs_name(long f_type) {
  switch (static_cast<unsigned long>(f_type) & 0xffffffffUL) {
    case 0x6969UL:
      return "NFS";
    case 0x0BD00BD0UL:
      return "Lustre";
    case 0x47504653UL:
      return "GPFS";
    case 0xFF534D42UL:
      return "CIFS";
    case 0xFE534D42UL:
      return "SMB2";
    case 0x19830326UL:
      return "BeeGFS";
    case 0x00C36400UL:
      return "CephFS";
    default:
      return nullptr;
  }
}

}  // namespace zoe::config
