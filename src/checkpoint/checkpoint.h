// Checkpoints: streamed, checksummed, atomic, reshardable.
//
// Layout of a save directory D:
//   D/latest                   the tag of the newest complete checkpoint (replaced atomically, last)
//   D/<tag>/manifest.json      format version, world size, stage, step, modules, every tensor
//                              record, every file with its size and xxh64, the trainer's state
//   D/<tag>/rank-00000.bin     rank 0's tensors, concatenated at 4096-byte aligned offsets
//   D/<tag>/rank-00001.bin     ...
// A checkpoint is written into D/<tag>.tmp-<nonce>/, fsynced, renamed to D/<tag>, then `latest`
// is replaced (write to a temporary file, fsync, rename, fsync D). A crash at any moment leaves
// the previous checkpoint loadable.
//
// Tensors are ranges of a module's flat group (the concatenation of its parameters, padded):
// a record (module, kind, dtype, begin, count) says that elements [begin, begin + count) of that
// module's `kind` state are at `offset` in the rank's file. Readers assemble any range from
// whichever files hold it, so a checkpoint saved with W ranks loads into any world size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zoe/status.h"

namespace zoe::ckpt {

inline constexpr int kFormatVersion = 1;

// Element types stored: "f32", "bf16", "f16". 0 for anything else.
size_t dtype_bytes(const std::string& dtype);

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // first element in the module's flat group
  uint64_t numel = 0;
};

struct ModuleInfo {
  std::string name;
  uint64_t padded = 0;  // flat group size (elements)
  std::vector<ParamInfo> params;
};

struct TensorRecord {
  int rank = 0;
  uint32_t module = 0;
  std::string kind;   // "param" (compute dtype), "master", "exp_avg", "exp_avg_sq"
  std::string dtype;  // "f32", "bf16", "f16"
  uint64_t begin = 0, count = 0;
  uint64_t offset = 0, bytes = 0;  // in rank-<rank>.bin
};

struct FileInfo {
  std::string name;  // "rank-00000.bin"
  uint64_t bytes = 0;
  std::string xxh64;  // 16 hex digits
};

struct Manifest {
  int format_version = kFormatVersion;
  int world_size = 1;
  int stage = 0;
  int64_t step = 0;
  std::vector<ModuleInfo> modules;
  std::vector<TensorRecord> tensors;
  std::vector<FileInfo> files;
  nlohmann::json engine;   // engine state: loss scaler, step counters, precision, ...
  nlohmann::json trainer;  // the caller's state: data position, seed, config of the run, ...

  nlohmann::json to_json() const;
  // Errors: malformed manifest; format_version newer than kFormatVersion ("written by a newer zoe").
  static Result<Manifest> from_json(const nlohmann::json& j, const std::string& where);
};

// Writes one rank's file inside a checkpoint being written. Tensors are streamed in pieces, so
// nothing needs the whole tensor in memory (a 1 MiB write buffer gathers small appends); each
// tensor starts at a 4096-byte aligned offset (zero padding). Not thread-safe. After a failed
// write every call returns the same error; a writer destroyed before finish() deletes its file.
class RankWriter {
 public:
  // dir: the temporary checkpoint directory (created by the caller with begin_checkpoint).
  static Result<std::unique_ptr<RankWriter>> create(const std::string& dir, int rank);
  ~RankWriter();
  Status begin_tensor(uint32_t module, const std::string& kind, const std::string& dtype, uint64_t begin,
                      uint64_t count);
  Status append(const void* data, size_t bytes);  // the tensor's bytes, in order, in any pieces
  Status end_tensor();                            // checks the byte count matches count x dtype
  // fsyncs and closes; returns this rank's records and file info. ENOSPC names path and bytes.
  Status finish(std::vector<TensorRecord>* records, FileInfo* file);

 private:
  struct Impl;
  explicit RankWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Save protocol (every rank calls in this order; rank 0 also writes the manifest):
//   tmp = begin_checkpoint(D, tag)  (rank 0 creates it; others wait on a barrier the caller runs)
//   RankWriter per rank ...; finish()
//   rank 0: commit_checkpoint(D, tag, tmp, manifest)  after gathering every rank's records/files
// begin_checkpoint: save_dir must exist and be writable (clear not_found / permission errors);
// tag is a plain name (no '/', not "latest"). One writer per save directory: it removes the
// "*.tmp-*" leftovers of earlier saves that crashed.
// commit_checkpoint: checks the manifest reads back (Manifest::from_json) and that every listed
// file has its size, writes manifest.json, fsyncs, renames tmp_dir to save_dir/tag (an existing
// tag is swapped atomically with renameat2(RENAME_EXCHANGE) and then removed), fsyncs save_dir,
// and replaces `latest` last. A failure before the rename removes tmp_dir itself.
Result<std::string> begin_checkpoint(const std::string& save_dir, const std::string& tag);
Status commit_checkpoint(const std::string& save_dir, const std::string& tag, const std::string& tmp_dir,
                         const Manifest& manifest);
// Removes a temporary directory left by a failed save (best effort; idempotent; refuses any path
// without ".tmp-" so that it never removes a finished checkpoint).
void abort_checkpoint(const std::string& tmp_dir);

// A complete checkpoint, opened for reading. dir: a save directory (uses `latest`) or a
// checkpoint directory itself. Errors name the file: missing manifest or rank file, sizes that
// do not match (truncated), format too new. Files stay open; every const method is thread-safe
// (pread on shared descriptors, no shared buffers).
class Reader {
 public:
  static Result<std::unique_ptr<Reader>> open(const std::string& dir);
  ~Reader();
  const Manifest& manifest() const;
  const std::string& path() const;  // the checkpoint directory
  // Re-reads every file and compares its xxh64 with the manifest (streaming, bounded memory).
  Status verify() const;
  // Elements [begin, begin + count) of module's `kind` state, from whichever records cover
  // them, converted to dtype_out ("f32", "bf16", "f16"). Fails when the range is not covered.
  // Same dtype: pread straight into `out`. Converting: through a scratch of at most 1 MiB.
  Status read_range(uint32_t module, const std::string& kind, uint64_t begin, uint64_t count,
                    const std::string& dtype_out, void* out) const;
  bool has_kind(const std::string& kind) const;
  // Re-reads manifest().files[index] and compares its xxh64 (what verify() does for each file).
  Status verify_file(size_t index) const;

 private:
  struct Impl;
  explicit Reader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes a safetensors file of full, unpartitioned parameters (from "master", or "param" when
// there is no master) named "<module>.<param>", streaming one piece at a time. dtype: "fp32"/"f32",
// "bf16", "fp16"/"f16". Peak memory, whatever the model size: one output piece of piece_bytes,
// plus read_range's conversion scratch (min(2 x piece_bytes, 1 MiB), only when the stored dtype
// differs), plus the JSON header (~100 bytes per parameter). Written to out_path.tmp-<pid>,
// fsynced, renamed; on failure the temporary file is removed and out_path is untouched.
Status consolidate(const Reader& r, const std::string& out_path, const std::string& dtype,
                   size_t piece_bytes = 64u << 20);

}  // namespace zoe::ckpt
