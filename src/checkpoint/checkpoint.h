// Checkpoints: streamed, checksummed, atomic, reshardable.
//
// Layout of a save directory D:
//   D/latest                   the tag of the newest complete checkpoint (replaced atomically, last)
//   D/.zoe-lock                flock(2)ed by the one process that saves into D (SaveDirLock)
//   D/<tag>/manifest.json      format version, world size, stage, step, modules, every tensor
//                              record (with its own xxh64), every file with its size and xxh64,
//                              the engine's and the trainer's state
//   D/<tag>/manifest.xxh64     "<xxh64 of manifest.json's exact bytes>  manifest.json\n" (the
//                              format `xxh64sum -c` reads): the manifest's own checksum
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
//
// Format versions: 2 added manifest.xxh64 and the per-tensor xxh64. Format 1 checkpoints (no
// manifest checksum) still load, with a warning that their manifest cannot be verified.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checkpoint_names.h"  // kManifestName, kLatestName, kLockName, ...
#include "optim/lowbit.h"
#include "zoe/status.h"

namespace zoe::ckpt {

inline constexpr int kFormatVersion = 2;
inline constexpr uint64_t kTensorAlign = 4096;  // every tensor starts at a multiple of this
// Guards on reading a manifest: its size, and how deeply its JSON may nest (the engine and
// trainer sections are free-form; the rest is 4 levels deep).
inline constexpr uint64_t kManifestMaxBytes = 256ull << 20;
inline constexpr int kManifestMaxDepth = 64;

// Element types stored: "f32", "bf16", "f16". 0 for anything else (packed dtypes included).
size_t dtype_bytes(const std::string& dtype);

// Packed dtypes: optim/lowbit.h's blockwise formats, for the "exp_avg" and "exp_avg_sq" states
// only. A record of count elements holds optim::state_bytes(format, count) bytes (its last block
// may be partial), and its begin is a multiple of the format's block, so that its blocks are the
// blocks of the whole state: a range of them read from several records concatenates.
inline constexpr char kInt8StateDtype[] = "int8b256";  // optim::StateFormat::kInt8, 256 a block
inline constexpr char kInt4StateDtype[] = "int4b128";  // optim::StateFormat::kInt4, 128 a block
// The dtype a state of format f is saved in: "f32", "bf16", "int8b256", "int4b128".
const char* state_dtype(optim::StateFormat f);
// Whether dtype is a packed one; *format (when given) receives its optim::StateFormat.
bool packed_dtype(const std::string& dtype, optim::StateFormat* format = nullptr);
// Elements per block of dtype: 1 ("f32", "bf16", "f16"), 256 ("int8b256"), 128 ("int4b128");
// 0 for anything else.
uint64_t dtype_block_elems(const std::string& dtype);
// Bytes of count elements of dtype: count x dtype_bytes(dtype), or state_bytes() of a packed
// format (partial last block included); 0 for an unknown dtype.
uint64_t tensor_bytes(const std::string& dtype, uint64_t count);
// "" when a record (kind, dtype, begin) may exist, else what is wrong with it, as a phrase: an
// unknown dtype, a packed dtype on a kind other than "exp_avg"/"exp_avg_sq", a packed record
// whose begin is not a multiple of its block.
std::string record_dtype_problem(const std::string& kind, const std::string& dtype, uint64_t begin);

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
  // A frozen module (never trained): its "param" and "master" (its fp32 values) only, no
  // optimizer states. Written as "frozen": true, only when set.
  bool frozen = false;
};

struct TensorRecord {
  int rank = 0;
  uint32_t module = 0;
  std::string kind;   // "param" (compute dtype), "master", "exp_avg", "exp_avg_sq"
  std::string dtype;  // "f32", "bf16", "f16"; "int8b256", "int4b128" (exp_avg, exp_avg_sq)
  uint64_t begin = 0, count = 0;
  uint64_t offset = 0, bytes = 0;  // in rank-<rank>.bin
  std::string xxh64;               // of the tensor's bytes, 16 hex digits (empty in format 1)
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
  // Every field is read with its type and range checked, and the whole is checked for
  // consistency; any failure is kCorruption naming `where` and the JSON path of the field:
  // step >= 0; engine and trainer are objects; engine.steps (when present) equals step;
  // trainer.step (when present, the caller's count of iterations, which skipped steps make
  // larger) is >= step; shapes multiply to numel; parameters lie inside their module and do not
  // overlap; one file per rank, named rank-NNNNN.bin; a tensor's bytes are tensor_bytes(dtype,
  // count), its dtype fits its kind and begin (record_dtype_problem), it starts at a multiple of
  // kTensorAlign, lie inside its rank's file and overlap no other tensor of that file. format_version newer
  // than kFormatVersion is kUnsupported ("written by a newer zoe").
  static Result<Manifest> from_json(const nlohmann::json& j, const std::string& where);
};

// A checkpoint directory's manifest, checked: its size (kManifestMaxBytes), its xxh64 against
// manifest.xxh64 (a format >= 2 manifest without one is kCorruption; a format 1 one loads with a
// warning), its nesting depth, its JSON, then Manifest::from_json. *checksum (when given)
// receives the manifest's xxh64 ("" for a format 1 checkpoint without one).
Result<Manifest> load_manifest(const std::string& checkpoint_dir, std::string* checksum = nullptr);

// Typed reads of one JSON object of a manifest, for the checks above and for the sections that
// only their writer understands (engine, trainer). Errors are kCorruption:
//   "<where>: key '<path>.<key>': expected <what>, found <the value, shortened and printable>".
// Integers must fit T exactly (no rounding, no wrap-around); doubles accept any number.
class JsonFields {
 public:
  JsonFields(const nlohmann::json& j, std::string where, std::string path)
      : j_(j), where_(std::move(where)), path_(std::move(path)) {}
  JsonFields(const nlohmann::json&& j, std::string where, std::string path) = delete;  // j_ would dangle

  Status check_object() const;
  bool has(const char* key) const { return j_.is_object() && j_.contains(key); }
  template <typename T>
  Status get(const char* key, T* out) const {  // a required key
    if (!has(key)) return missing(key);
    return convert(key, j_.at(key), out);
  }
  template <typename T>
  Status get_optional(const char* key, T* out) const {  // *out is left alone when key is absent
    if (!has(key)) return Status::ok();
    return convert(key, j_.at(key), out);
  }
  Result<const nlohmann::json*> array(const char* key) const;
  Status bad(const char* key, const std::string& expected) const;
  Status missing(const char* key) const;
  std::string full(const char* key) const;  // "path.key" ("(top level)" for the root)
  const std::string& where() const { return where_; }

 private:
  Status convert(const char* key, const nlohmann::json& v, std::string* out) const;
  Status convert(const char* key, const nlohmann::json& v, bool* out) const;
  Status convert(const char* key, const nlohmann::json& v, double* out) const;
  template <typename T>
  Status convert(const char* key, const nlohmann::json& v, T* out) const {
    static_assert(std::is_integral_v<T>, "JsonFields reads strings, bools, doubles and integers");
    constexpr auto lo = std::numeric_limits<T>::min();
    constexpr auto hi = std::numeric_limits<T>::max();
    auto range = [&] { return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"; };
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(hi)) return bad(key, range());
      *out = static_cast<T>(u);
    } else if (v.is_number_integer()) {
      const int64_t x = v.get<int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (x < 0 || static_cast<uint64_t>(x) > static_cast<uint64_t>(hi)) return bad(key, range());
      } else {
        if (x < static_cast<int64_t>(lo) || x > static_cast<int64_t>(hi)) return bad(key, range());
      }
      *out = static_cast<T>(x);
    } else {
      return bad(key, range());
    }
    return Status::ok();
  }

  const nlohmann::json& j_;
  std::string where_, path_;
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
  // A dtype that does not fit kind and begin (record_dtype_problem) is kInvalidArgument.
  Status begin_tensor(uint32_t module, const std::string& kind, const std::string& dtype, uint64_t begin,
                      uint64_t count);
  Status append(const void* data, size_t bytes);  // the tensor's bytes, in order, in any pieces
  Status end_tensor();                            // checks the byte count is tensor_bytes(dtype, count)
  // fsyncs and closes; returns this rank's records and file info. ENOSPC names path and bytes.
  Status finish(std::vector<TensorRecord>* records, FileInfo* file);

 private:
  struct Impl;
  explicit RankWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One writer per save directory: an exclusive flock(2) on D/.zoe-lock, held while the object
// lives (flock locks belong to the open file description: a fork()ed child shares its parent's,
// a second open() of the file, even in the same process, does not). The file holds the holder's
// "pid <pid> host <host> since <time>", quoted to a second writer. Thread-safe.
class SaveDirLock {
 public:
  // kAlreadyExists when another writer holds it, naming D and that holder; kUnsupported when the
  // file system has no locks (ENOLCK, EOPNOTSUPP); other failures name the syscall and path.
  static Result<std::unique_ptr<SaveDirLock>> acquire(const std::string& save_dir);
  ~SaveDirLock();  // releases the lock (the file stays: removing it would race a new holder)
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;
  const std::string& path() const { return path_; }  // D/.zoe-lock
  // Whether this object still holds the lock of `path()` (false once D was removed or replaced).
  bool still_held() const;

 private:
  SaveDirLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

// Save protocol (every rank calls in this order; rank 0 also writes the manifest):
//   tmp = begin_checkpoint(D, tag)  (rank 0 creates it; others wait on a barrier the caller runs)
//   RankWriter per rank ...; finish()
//   rank 0: commit_checkpoint(D, tag, tmp, manifest)  after gathering every rank's records/files
// begin_checkpoint: save_dir must exist and be writable (clear not_found / permission errors);
// tag is a plain name (no '/', no control characters, not "latest" nor ".zoe-lock"). One writer
// per save directory: the first begin_checkpoint of a process takes save_dir's SaveDirLock and
// keeps it until the process exits (hold_save_dir), so a second job saving into the same
// directory is refused (kAlreadyExists, naming the holder) instead of interleaving its saves.
// Holding the lock, it removes the "*.tmp-*" leftovers of earlier saves (their writers are dead).
// Where the file system has no locks it warns, saves, and leaves the leftovers alone.
// commit_checkpoint: checks the manifest reads back (Manifest::from_json) and that every listed
// file has its size, writes manifest.json and manifest.xxh64, fsyncs, renames tmp_dir to
// save_dir/tag (an existing tag is swapped atomically with renameat2(RENAME_EXCHANGE) and then
// removed), fsyncs save_dir, and replaces `latest` last. A failure before the rename removes
// tmp_dir itself.
Result<std::string> begin_checkpoint(const std::string& save_dir, const std::string& tag);
Status commit_checkpoint(const std::string& save_dir, const std::string& tag, const std::string& tmp_dir,
                         const Manifest& manifest);
// Removes a temporary directory left by a failed save (best effort; idempotent; refuses any path
// without ".tmp-" so that it never removes a finished checkpoint).
void abort_checkpoint(const std::string& tmp_dir);
// Takes save_dir's SaveDirLock for the rest of this process's life (a no-op when this process
// holds it already). Callers may call it up front, so that a second job fails at its start
// rather than at its first save. Errors as SaveDirLock::acquire.
Status hold_save_dir(const std::string& save_dir);
// Drops this process's lock on save_dir, if it holds one (for tests and long-lived processes
// that are done saving there).
void release_save_dir(const std::string& save_dir);

// A complete checkpoint, opened for reading. dir: a save directory (uses `latest`) or a
// checkpoint directory itself. Errors name the file: a corrupt `latest` (its content shown
// escaped), a manifest that fails load_manifest, missing rank files, sizes that do not match
// (truncated). Files stay open; every const method is thread-safe (pread on shared
// descriptors, no shared buffers).
class Reader {
 public:
  static Result<std::unique_ptr<Reader>> open(const std::string& dir);
  ~Reader();
  const Manifest& manifest() const;
  const std::string& path() const;  // the checkpoint directory
  // Re-reads every file and compares its xxh64, and each tensor's, with the manifest
  // (streaming, bounded memory). A mismatch names the file and the first damaged tensor.
  Status verify() const;
  // Elements [begin, begin + count) of module's `kind` state, from whichever records cover
  // them, converted to dtype_out; `out` receives tensor_bytes(dtype_out, count) bytes. Fails
  // when the range is not covered. Same dtype: pread straight into `out`. Converting: through a
  // scratch of at most ~1 MiB.
  // Packed records and outputs (exp_avg, exp_avg_sq only; else kInvalidArgument):
  //   packed out: begin must be a multiple of the block, and begin + count a multiple of it, the
  //   module's padded size, or the end of a record holding its last element (kInvalidArgument
  //   naming the range otherwise). From the same packed dtype: the stored bytes, bit for bit,
  //   from one record or several; from anything else: the values in f32, then
  //   optim::quantize_state (so an fp32-state checkpoint resumes with packed states).
  //   packed source, "f32"/"bf16"/"f16" out (any range): optim::dequantize_state, then converted.
  //   A non-finite value to quantize or a non-finite stored scale fails, naming the checkpoint,
  //   the module and the kind.
  Status read_range(uint32_t module, const std::string& kind, uint64_t begin, uint64_t count,
                    const std::string& dtype_out, void* out) const;
  bool has_kind(const std::string& kind) const;
  // The manifest's structure is whole: for every module, "param" and every other state the
  // manifest holds for any module ("master", "exp_avg", "exp_avg_sq") are covered over
  // [0, padded) by tensor records (a frozen module: "param" and "master" only). A gap (a tensor dropped from
  // the manifest, `tensors: []`) is kCorruption naming the module, the state and the first element no record
  // holds. `zoe ckpt verify` and Engine::load both ask it, so they accept and refuse the same manifests.
  Status check_complete() const;
  // Re-reads manifest().files[index] and compares its xxh64 (what verify() does for each file).
  Status verify_file(size_t index) const;
  // Streams manifest().files[index] from its start to its end in pieces of at most piece_bytes
  // (rounded up to a multiple of kTensorAlign; every piece but the last is that long), calling
  // on_piece(offset, data, bytes) for each, while checking every tensor's xxh64 as its last byte
  // goes by and the file's at the end. A consumer may use the pieces as they come but must trust
  // them only once scan_file returns OK. Memory: one buffer of min(piece_bytes, file size).
  using PieceFn = std::function<Status(uint64_t offset, const void* data, size_t bytes)>;
  Status scan_file(size_t index, size_t piece_bytes, const PieceFn& on_piece) const;
  // The manifest's xxh64 from manifest.xxh64 ("" for a format 1 checkpoint without one).
  const std::string& manifest_xxh64() const;

 private:
  struct Impl;
  explicit Reader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes a safetensors file of full, unpartitioned parameters (from "master", or "param" when
// there is no master) named "<module>.<param>". dtype: "fp32"/"f32", "bf16", "fp16"/"f16".
// Every rank file is streamed once, start to end, through Reader::scan_file: the parameters'
// bytes are written out as they pass and every byte is checksummed on the way (each tensor and
// each file, as verify() does), so a damaged checkpoint fails (kCorruption naming the file and
// the tensor) instead of producing a corrupt model. Peak memory, whatever the model size: one
// read piece of piece_bytes, plus a conversion scratch of at most 1 MiB (only when the stored
// dtype differs), plus the JSON header (~100 bytes per parameter). Written to
// out_path.tmp-<pid>, fsynced, renamed; on failure the temporary file is removed and out_path
// is untouched.
// with_moments: also the optimizer's states of every trained module, "<module>.<param>.exp_avg"
// and ".exp_avg_sq" (AdamW), ".exp_avg" (Lion) or ".sum" (Adagrad), in dtype, after each
// parameter, as engine.optimizer says (none: AdamW); a checkpoint without them is kNotFound. Packed moments
// are dequantized: a file's packed records are read again through read_range once its scan has checked them
// (1 to 0.5 bytes an element more to read, ~1.5 MiB more scratch).
inline constexpr size_t kConsolidatePiece = 64u << 20;
Status consolidate(const Reader& r, const std::string& out_path, const std::string& dtype,
                   size_t piece_bytes = kConsolidatePiece, bool with_moments = false);

}  // namespace zoe::ckpt
