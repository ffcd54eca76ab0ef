// ExportDir: a directory of exported files, written whole or not at all.
#pragma once

#include <string>

#include "zoe/status.h"

namespace zoe::ckpt {

// The file that marks a directory as one of zoe's exports: only such a directory (or an empty
// one, or none) is ever replaced by a later export.
inline constexpr const char* kExportMarker = ".zoe-export.json";

// An export directory being written. open() checks the target: nothing there, an empty directory,
// or an earlier export of zoe's (it holds kExportMarker); anything else (a non-empty directory zoe
// did not write, a file) is refused naming `what` and the path, before anything is written. The
// files go into a fresh temporary directory beside the target (path()); commit() writes the marker
// and puts the directory in place of the target with a rename (an earlier export it replaces is
// removed after). Destroyed without commit(), the temporary directory and what it holds are removed
// and the target is untouched.
class ExportDir {
 public:
  static Result<ExportDir> open(const std::string& target, const std::string& what,
                                const std::string& format);
  ExportDir(ExportDir&& o) noexcept;
  ExportDir& operator=(ExportDir&&) = delete;
  ExportDir(const ExportDir&) = delete;
  ~ExportDir();

  const std::string& path() const { return temp_; }
  Status commit();

 private:
  ExportDir() = default;
  std::string target_, temp_, what_, format_;
  bool pending_ = false;
};

}  // namespace zoe::ckpt
