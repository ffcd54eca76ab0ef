// zoe/files.h: the files a user names (a flag's path, a path given to the API), written and read
// safely.
//
// Outputs never replace anything but a regular file (a device node, a FIFO, a socket or a
// directory at the path is refused, and left as it was), never land inside a checkpoint save
// directory or a checkpoint (where they could replace its `latest` pointer or its files), and
// appear whole or not at all: the bytes go to a temporary file in the target's own directory,
// which is renamed over the target only once complete (a failure leaves the old file, and no
// temporary). A symbolic link at the path is followed: the file it leads to is replaced.
//
// Inputs are opened without blocking (a FIFO with no writer would hang a plain open), must be
// regular files, and are read up to a cap.
//
// `what` names the file in messages: a flag ("--trace", "--out") or a description ("config file").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "zoe/status.h"

namespace zoe {

// Whether `path` may be written as the output `what`. Errors, each naming `what` and the path:
// kInvalidArgument when it exists and is not a regular file (what it is is said), when it lies
// inside a checkpoint save directory or a checkpoint (which is named), or when its directory is
// not a directory; kNotFound when its directory does not exist.
Status check_output_path(const std::string& path, const std::string& what);

// Whether `dir` may be made (or used) as an output directory `what` that files are written into:
// it is a directory or nothing, and neither it nor its parent lies inside a checkpoint save
// directory or a checkpoint. kInvalidArgument naming `what` and the path otherwise.
Status check_output_dir(const std::string& dir, const std::string& what);

// The checkpoint save directory (a directory holding zoe's lock file, or a `latest` that names a
// checkpoint in it) that `dir` is or lies inside, else the checkpoint (a directory holding
// manifest.json with manifest.xxh64 or rank-00000.bin) that it is or lies inside; "" when none.
// Symbolic links in `dir` are resolved first.
std::string checkpoint_dir_containing(const std::string& dir);

// An output being written: create() checks the path (check_output_path) and creates the
// temporary; write() appends to it (or pwrite(2) on fd()); commit() fsyncs it, checks the target
// again and renames the temporary over it. Destroyed without commit(), the temporary is removed
// and the target is untouched.
class OutputFile {
 public:
  static Result<OutputFile> create(const std::string& path, const std::string& what);
  OutputFile(OutputFile&& o) noexcept;
  OutputFile& operator=(OutputFile&& o) noexcept;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();

  const std::string& path() const { return path_; }       // the target (a symbolic link followed)
  const std::string& temp_path() const { return temp_; }  // where the bytes are until commit()
  int fd() const { return fd_; }                          // -1 once committed or discarded
  Status write(const void* data, size_t bytes);
  Status write(const std::string& text) { return write(text.data(), text.size()); }
  // For a file another program writes (temp_path()): closes the temporary, keeps it.
  Status close_temp();
  Status commit();
  void discard();  // removes the temporary now

 private:
  OutputFile() = default;
  int fd_ = -1;
  std::string path_, temp_, what_;
  bool pending_ = false;  // the temporary exists and is not renamed yet
};

// The whole of `bytes` as the output `what` at `path`, through OutputFile.
Status write_output_file(const std::string& path, const std::string& bytes, const std::string& what);

// Opens `path` for reading as the input `what`: a regular file only (a FIFO, a device, a socket or
// a directory is refused with kInvalidArgument saying what it is; a missing file is kNotFound), opened
// with O_NONBLOCK so that nothing can block, then set blocking again. The caller closes the
// descriptor.
Result<int> open_input_file(const std::string& path, const std::string& what);

// The whole regular file `path` (open_input_file), at most max_bytes: a larger one is refused with
// kInvalidArgument naming its size and the cap, before anything is read.
Result<std::string> read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes);

}  // namespace zoe
