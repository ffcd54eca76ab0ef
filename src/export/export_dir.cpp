// ExportDir: exports written into a temporary directory and renamed into place.
#include "export/export_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "zoe/files.h"

namespace zoe::ckpt {
namespace {

std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string parent_of(const std::string& p) {
  const auto slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

std::string name_of(const std::string& p) {
  const auto slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// What the target holds: 0 nothing or an empty directory, 1 an export of zoe's (its marker lists
// every other entry), -1 anything else (*first names an entry that is not zoe's).
int target_kind(const std::string& target, std::string* first) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(target, ec))) return 0;
  if (!std::filesystem::is_directory(std::filesystem::symlink_status(target, ec))) {
    *first = "no directory";
    return -1;
  }
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(target, ec)) names.push_back(e.path().filename());
  if (ec) return -1;
  if (names.empty()) return 0;
  std::set<std::string> ours;
  std::ifstream in(target + "/" + kExportMarker);
  const nlohmann::json marker = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (marker.is_object() && marker.contains("files") && marker["files"].is_array()) {
    for (const auto& f : marker["files"]) {
      if (f.is_string()) ours.insert(f.get<std::string>());
    }
    ours.insert(kExportMarker);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    if (ours.count(n)) continue;
    *first = n;
    return -1;
  }
  return 1;
}

void remove_tree(const std::string& p) {
  std::error_code ec;
  std::filesystem::remove_all(p, ec);
}

}  // namespace

Result<ExportDir> ExportDir::open(const std::string& target_in, const std::string& what,
                                  const std::string& format) {
  const std::string target = strip_slashes(target_in);
  ZOE_RETURN_IF_ERROR(check_output_dir(target, what));
  std::string first;
  const int kind = target_kind(target, &first);
  if (kind < 0) {
    return invalid_argument(
        "%s %s is not empty and not an export zoe wrote (it holds %s): zoe replaces only an empty directory "
        "or its own earlier export, unchanged; choose a new directory",
        what.c_str(), target_in.c_str(), first.c_str());
  }
  if (name_of(target) == "." || name_of(target) == ".." || target == "/") {
    return invalid_argument("%s %s: name a directory to create or replace, not . or .. or /", what.c_str(),
                            target_in.c_str());
  }
  static std::atomic<uint64_t> counter{0};
  ExportDir d;
  d.target_ = target;
  d.what_ = what;
  d.format_ = format;
  for (int tries = 0;; ++tries) {
    d.temp_ = parent_of(target) + "/." + name_of(target).substr(0, 200) + ".tmp-" + std::to_string(getpid()) +
              "-" + std::to_string(counter.fetch_add(1));
    if (mkdir(d.temp_.c_str(), 0755) == 0) break;
    if (errno != EEXIST || tries > 100) {
      return sys_error("create the temporary directory of " + what + " " + target_in, d.temp_, errno);
    }
  }
  d.pending_ = true;
  return d;
}

ExportDir::ExportDir(ExportDir&& o) noexcept
    : target_(std::move(o.target_)),
      temp_(std::move(o.temp_)),
      what_(std::move(o.what_)),
      format_(std::move(o.format_)),
      pending_(o.pending_) {
  o.pending_ = false;
}

ExportDir::~ExportDir() {
  if (pending_) remove_tree(temp_);
}

Status ExportDir::commit() {
  nlohmann::json files = nlohmann::json::array();
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(temp_, ec)) files.push_back(e.path().filename());
  const nlohmann::json marker = {{"format", format_}, {"files", files}};
  ZOE_RETURN_IF_ERROR(write_output_file(temp_ + "/" + kExportMarker, marker.dump(2) + "\n", "output file"));
  // Checked again: another process may have filled the target meanwhile.
  std::string first;
  const int kind = target_kind(target_, &first);
  if (kind < 0) {
    return invalid_argument(
        "%s %s was filled by another process while zoe wrote the export; nothing replaced", what_.c_str(),
        target_.c_str());
  }
  std::string aside;
  if (kind == 1) {
    // An earlier export: swapped with the new one at once, then removed.
    if (renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
      remove_tree(temp_);
      pending_ = false;
      return Status::ok();
    }
    // A file system without the exchange: the earlier export moved aside first.
    aside = temp_ + ".old";
    if (rename(target_.c_str(), aside.c_str()) != 0) {
      return sys_error("move the earlier export " + target_ + " aside", aside, errno);
    }
  }
  if (rename(temp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    if (!aside.empty()) (void)rename(aside.c_str(), target_.c_str());
    return sys_error("rename the export into place as " + target_ + " from", temp_, err);
  }
  if (!aside.empty()) remove_tree(aside);
  pending_ = false;
  return Status::ok();
}

}  // namespace zoe::ckpt
