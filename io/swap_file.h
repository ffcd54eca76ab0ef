// SwapFile: many tensors at aligned extents of one logical file, striped over several paths.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/file.h"
#include "io/io_engine.h"
#include "zoe/status.h"

namespace zoe::io {

struct SwapFileOptions {
  std::vector<std::string> dirs;     // one directory per drive; extents are striped over them
  std::string name = "zoe-swap";     // files are <dir>/<name>.<i>.swap (i = position in dirs)
  uint64_t stripe_bytes = 1u << 20;  // striping unit, a multiple of 4096
  uint64_t initial_bytes = 0;        // capacity preallocated at creation
  uint64_t grow_bytes = 256u << 20;  // capacity added when an allocation does not fit
  uint64_t max_bytes = 0;            // capacity limit (0: only the disks limit it)
  DirectMode direct = DirectMode::kPrefer;
  bool keep = false;                 // keep the files at close (default: removed)
  bool reuse = false;                // open existing files instead of truncating them (needs keep)
};

// A byte range of the logical swap space: offset and size are multiples of 4096.
struct Extent {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Thread-safe. Logical offset L lives in file (L / stripe) % n at offset
// (L / stripe / n) * stripe + L % stripe, so consecutive stripes go to different drives.
class SwapFile {
 public:
  ~SwapFile();
  static Result<std::unique_ptr<SwapFile>> create(const SwapFileOptions& opts);

  // First fit; grows the files (fallocate) when nothing fits. ENOSPC names the path, the bytes
  // asked for and the bytes free there.
  Result<Extent> allocate(uint64_t bytes);
  void free(const Extent& e);

  // The requests that move len bytes at logical offset `offset` to/from buf, split at stripe
  // boundaries. Appends to *out.
  void map(IoOp op, uint64_t offset, void* buf, size_t len, std::vector<IoRequest>* out) const;
  // Moves [e.offset + at, e.offset + at + len) to/from buf as one completion.
  IoHandle read(IoEngine& eng, const Extent& e, void* buf, size_t len, uint64_t at = 0, IoCallback cb = {}) const;
  IoHandle write(IoEngine& eng, const Extent& e, const void* buf, size_t len, uint64_t at = 0,
                 IoCallback cb = {}) const;

  // Registers the files as io_uring fixed files (optional; speeds up submission).
  Status register_files(IoEngine& eng) const;
  void unregister_files(IoEngine& eng) const;

  uint64_t capacity() const;
  uint64_t used_bytes() const;
  uint64_t stripe_bytes() const { return opts_.stripe_bytes; }
  bool direct() const;
  const std::vector<std::unique_ptr<File>>& files() const { return files_; }

 private:
  explicit SwapFile(const SwapFileOptions& opts) : opts_(opts) {}
  Status grow_locked(uint64_t min_capacity);
  void add_free_locked(uint64_t offset, uint64_t bytes);

  SwapFileOptions opts_;
  std::vector<std::unique_ptr<File>> files_;
  mutable std::mutex mu_;
  uint64_t capacity_ = 0;  // logical bytes, a multiple of stripe * files
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes, coalesced
};

}  // namespace zoe::io
