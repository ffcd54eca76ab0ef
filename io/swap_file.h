// SwapFile: many tensors at aligned extents of one logical file, striped over several paths.
// Implemented by concept: swap_file_lock.cpp (names, locks, stale-file reclaim, create()),
// swap_file_extents.cpp (allocation), swap_file_growth.cpp (growth and guard pages),
// swap_file_stripes.cpp (the stripe map and the transfers through it) and swap_file_integrity.cpp
// (written ranges, checksums, size and hole checks).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "io/file.h"
#include "io/io_engine.h"
#include "zoe/status.h"

namespace zoe::io {

// A byte range of the logical swap space: offset and size are multiples of 4096.
struct Extent {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Names and locks. Without keep, the files of one SwapFile are <dir>/<name>-<suffix>.<i>.swap
// (i = position in dirs, suffix = 16 random hex digits, the same in every dir), created with
// O_CREAT | O_EXCL (a new suffix on EEXIST), so jobs sharing a directory never share a file, even
// from different PID namespaces. Every file is flock'ed (LOCK_EX) for the SwapFile's lifetime.
// With keep, the names are the stable <dir>/<name>.<i>.swap, to be found again (reuse); a second
// live user of them is refused.
//
// Stale files: create() first removes, in each of its dirs, every file named like a non-kept swap
// file whose lock it can take: no live process holds it, so its owner died (kill -9, OOM) before
// it could remove it. It logs one line with the count and the bytes reclaimed. Kept files are
// never removed. A per-directory lock (flock on the directory) orders this scan against other
// jobs' create(), so a file is never seen between its creation and its lock.
struct SwapFileOptions {
  std::vector<std::string> dirs;     // one directory per drive; extents are striped over them
  std::string name = "zoe-swap";     // file name prefix (see above)
  uint64_t stripe_bytes = 1u << 20;  // striping unit, a multiple of 4096
  uint64_t initial_bytes = 0;        // capacity preallocated at creation
  // Capacity added when an allocation does not fit: this step when the disks have room for it,
  // else only what the allocation needs (so a nearly full disk still serves what fits).
  uint64_t grow_bytes = 256u << 20;
  uint64_t max_bytes = 0;  // capacity limit (0: only the disks limit it)
  DirectMode direct = DirectMode::kPrefer;
  bool keep = false;          // keep the files at close (default: removed)
  bool reuse = false;         // open existing files instead of truncating them (needs keep)
  bool reclaim_stale = true;  // remove the swap files of dead processes in dirs at create()
  // Swap-data integrity: every write through read()/write()/transfer() records an xxh3_64 per
  // piece (see kChecksumPieceBytes) and every read verifies the recorded pieces it covers whole;
  // a mismatch is kCorruption naming the file, offset, length and the item (never wrong data).
  // Off by default: it cost 9-21% of `zoe bench swap`'s step on 2 cores (above the 3% bar);
  // zoe.swap_checksum turns it on for the engine, --checksum for the benchmark.
  bool checksum = false;
  // Hole checks (on by default, no I/O of their own): each read's fstat, made anyway for the
  // guard page below, also checks that every file it read from still has the disk blocks that
  // fallocate gave it (st_blocks), so a hole punched into a live file, whose bytes would read
  // back as zeros, is kCorruption naming the file instead of data. zoe.swap_hole_check.
  bool hole_check = true;
  uint64_t (*random_source)() = nullptr;  // tests: the name suffixes (default: std::random_device)
};

// Checksum granularity. A write [a, b) of an extent starting at E records one checksum per piece
// of [a, b) cut at E + k * kChecksumPieceBytes, replacing every record it overlaps (a record it
// overlaps only in part is dropped: that part is no longer verified). A read verifies each record
// lying entirely inside it; records it covers in part are not verified. So reads verify fully
// when they have the shape of the writes, or are unions of them, or cut writes at multiples of
// kChecksumPieceBytes from the extent start (the optimizer swapper and the tier manager's
// staging pieces do). Freeing an extent forgets its records. Records live in host memory only
// (about 64 bytes per piece: 2.4 MB for 37 GB of swap) and are lost with the process.
constexpr uint64_t kChecksumPieceBytes = 1u << 20;

// What a read of bytes of an extent that no write through write()/transfer() has covered since
// the extent was allocated (never written, or freed and allocated again) gets: such bytes hold
// whatever the disk had there, often zeros, sometimes a freed extent's old data.
enum class Unwritten : uint8_t {
  kError,  // kCorruption naming the item, the swap file and its offset
  kZeros,  // zeros, as a fresh host buffer would hold (the caller's contract: memory starts zeroed)
};

// Always-on checks, checksums or not (reads through read()/transfer() only; map() bypasses them):
// - Reads of never-written bytes: see Unwritten (allocate() chooses, per extent).
// - Guard page: every file is kSwapGuardBytes longer than its share of the capacity, and swap
//   writes never touch that last page, which holds a tag. A truncation of the file (by anything
//   other than zoe) therefore leaves it shorter than expected for good: later swap writes can
//   extend it again, but never to the guard's end. Each read checks, once its data is in, that
//   every file it read from is still that long (fstat), so truncated-then-extended files, whose
//   holes read back as zeros with a full count, are kCorruption naming the file, never data.
//   Growth rewrites the guard at the new end and checks that the old one still holds its tag;
//   if it does not, that growth and every later read fail.
// - Holes: with hole_check, each read's fstat also compares the file's allocated blocks
//   (st_blocks) with its length. Growth allocates every block of a file (fallocate), so a file
//   with fewer blocks than bytes has lost some of them since: a hole punched into it
//   (fallocate --punch-hole, a cleanup or deduplicating tool). Such a read is kCorruption naming
//   the file, even where its own bytes were not in the hole (the data of the file is damaged;
//   a later read would get zeros). A file system that does not allocate what fallocate asks for
//   (compressing or copy-on-write ones may report fewer blocks) is found at growth: its files are
//   left unchecked, said once in the log. Holes smaller than the file system's extent metadata,
//   and bit flips, are caught by the checksums only.
constexpr uint64_t kSwapGuardBytes = 4096;

// One transfer of SwapFile::transfer(): len bytes at [extent.offset + at, ...) to/from buf.
struct SwapIo {
  IoOp op = IoOp::kRead;
  Extent extent;
  uint64_t at = 0;
  void* buf = nullptr;
  size_t len = 0;
};
// Names transfer i of a submission in error messages ("item 3 state adam_m").
using SwapIoNamer = std::function<std::string(size_t i)>;

struct ReclaimStats {
  size_t files = 0;
  uint64_t bytes = 0;  // disk space given back (allocated blocks)
};
// Removes the stale swap files in dir (see above) under the directory lock. Files it cannot
// remove (another user's, in a sticky directory) are skipped with a warning.
Result<ReclaimStats> reclaim_stale_swap_files(const std::string& dir);
// Whether a file name (no directory) has the shape of a non-kept swap file.
bool is_unique_swap_file_name(const std::string& name);

// Thread-safe. Logical offset L lives in file (L / stripe) % n at offset
// (L / stripe / n) * stripe + L % stripe, so consecutive stripes go to different drives.
// Removes the directory entries of every swap file this process has open and would remove at
// close (not `keep` ones), now: for a process about to exit abnormally (a lost peer rank, a
// signal), so nothing is left behind. The files stay usable until closed. Returns how many.
// Thread-safe; not async-signal-safe (call it from a thread, not a signal handler).
size_t unlink_live_swap_files();

class SwapFile {
 public:
  ~SwapFile();
  static Result<std::unique_ptr<SwapFile>> create(const SwapFileOptions& opts);

  // First fit; grows the files (fallocate) when nothing fits. ENOSPC names the path, the bytes
  // asked for and the bytes free there before the attempt.
  Result<Extent> allocate(uint64_t bytes, Unwritten unwritten = Unwritten::kError);
  // Gives the extent back and forgets its checksums.
  void free(const Extent& e);

  // The raw requests that move len bytes at logical offset `offset` to/from buf, split at stripe
  // boundaries. Appends to *out. They bypass the checksums: do not mix raw writes with checked
  // reads of the same bytes.
  void map(IoOp op, uint64_t offset, void* buf, size_t len, std::vector<IoRequest>* out) const;
  // Moves [e.offset + at, e.offset + at + len) to/from buf as one completion (checked).
  IoHandle read(IoEngine& eng, const Extent& e, void* buf, size_t len, uint64_t at = 0, IoCallback cb = {},
                SwapIoNamer name = {}) const;
  IoHandle write(IoEngine& eng, const Extent& e, const void* buf, size_t len, uint64_t at = 0,
                 IoCallback cb = {}, SwapIoNamer name = {}) const;
  // Several transfers as one submission and one completion, with checksums recorded (writes) and
  // verified (reads) before the completion is ready. Hashing runs on the engine's threads.
  IoHandle transfer(IoEngine& eng, std::span<const SwapIo> ios, IoCallback cb = {},
                    SwapIoNamer name = {}) const;

  // Registers the files as io_uring fixed files (optional; speeds up submission).
  Status register_files(IoEngine& eng) const;
  void unregister_files(IoEngine& eng) const;

  uint64_t capacity() const;
  uint64_t used_bytes() const;
  uint64_t stripe_bytes() const { return opts_.stripe_bytes; }
  bool direct() const;
  const std::vector<std::unique_ptr<File>>& files() const { return files_; }
  bool checksum() const { return opts_.checksum; }
  // Bytes whose checksum reads verified, and what create() reclaimed from dead processes.
  uint64_t verified_bytes() const { return verified_bytes_.load(std::memory_order_relaxed); }
  const ReclaimStats& reclaimed() const { return reclaimed_; }

 private:
  struct Piece {
    uint64_t offset;  // logical
    uint64_t len;
    uint64_t hash;
    uint64_t extent;  // logical offset of the extent, for messages
    char* buf;
    size_t io;  // index in the submission
  };
  struct Sum {
    uint64_t len;
    uint64_t hash;
  };

  explicit SwapFile(const SwapFileOptions& opts) : opts_(opts) {}
  Status open_files();
  // allow_step: grow by grow_bytes when the disks have room (allocations), else exactly to
  // min_capacity (initial_bytes).
  Status grow_locked(uint64_t min_capacity, bool allow_step);
  Result<uint64_t> headroom_per_file() const;
  void add_free_locked(uint64_t offset, uint64_t bytes);
  void forget_sums_locked(uint64_t begin, uint64_t end) const;
  // Written ranges (under sum_mu_): [begin, end) rounded out to 4096 at the end.
  void mark_written_locked(uint64_t begin, uint64_t end) const;
  void forget_written_locked(uint64_t begin, uint64_t end) const;
  bool zero_fill_locked(uint64_t offset) const;
  uint64_t first_unwritten_locked(uint64_t begin, uint64_t end) const;
  Status unwritten_error(const SwapIo& io, size_t i, uint64_t at, const SwapIoNamer& name) const;
  // Writes the guard page of every file at per_file (its share of the capacity), after checking
  // that the guards at old_per_file (0: none yet) still hold their tags.
  Status write_guards_locked(uint64_t old_per_file, uint64_t per_file);
  // After a growth: which files hold a block for each of their bytes (see hole_check).
  void note_dense_locked(uint64_t file_bytes);
  // fstat of the files the read requests touched: each at least guard_end_ long.
  Status check_sizes(const std::vector<IoRequest>& reqs) const;
  Status verify(const std::vector<Piece>& expect, const SwapIoNamer& name) const;
  void record(std::vector<Piece>& pieces) const;

  SwapFileOptions opts_;
  std::vector<std::unique_ptr<File>> files_;
  mutable std::mutex mu_;
  uint64_t capacity_ = 0;  // logical bytes, a multiple of stripe * files
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes, coalesced
  ReclaimStats reclaimed_;
  mutable std::mutex sum_mu_;
  mutable std::map<uint64_t, Sum> sums_;  // logical offset -> recorded piece; never overlapping
  mutable std::atomic<uint64_t> verified_bytes_{0};
  mutable std::map<uint64_t, uint64_t> written_;  // begin -> end, coalesced (under sum_mu_)
  std::map<uint64_t, uint64_t> zero_fill_;        // extents allocated with kZeros: offset -> end
  std::atomic<uint64_t> guard_end_{0};            // the length every file must have (0: no guard yet)
  std::atomic<int> lost_guard_{-1};               // a file found truncated at a growth (-1: none)
  // Per file: whether its blocks were all allocated at the last growth (hole checks apply).
  std::unique_ptr<std::atomic<bool>[]> dense_;
  bool told_sparse_ = false;  // the log line for a file system that allocates less (under mu_)
  uint64_t guard_nonce_ = 0;  // in the guard tags: this SwapFile's own
};

}  // namespace zoe::io
