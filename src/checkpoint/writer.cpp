// Writing checkpoints: RankWriter (streamed, checksummed rank files) and the atomic save protocol.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "checkpoint/xxh64.h"
#include "core/log.h"
#include "core/units.h"

namespace zoe::ckpt {

using detail::FdGuard;

namespace {

constexpr size_t kWriteBuffer = 1u << 20;  // small appends are gathered into writes of this size

std::string rank_file_name(int rank) {
  char buf[32];
  snprintf(buf, sizeof(buf), "rank-%05d.bin", rank);
  return buf;
}

}  // namespace

struct RankWriter::Impl {
  std::string path;
  int rank = 0;
  int fd = -1;
  detail::Xxh64 hash;         // of the whole file
  detail::Xxh64 tensor_hash;  // of the open tensor's bytes
  std::vector<char> buf;      // bytes not yet written, at file offset `flushed`
  uint64_t flushed = 0;       // bytes written to the file
  uint64_t size = 0;          // bytes emitted: flushed + buf.size()
  bool in_tensor = false;
  bool finished = false;
  TensorRecord cur;
  uint64_t cur_got = 0;
  std::vector<TensorRecord> records;
  Status error;  // sticky: after a failed write every call returns it

  ~Impl() {
    if (fd >= 0) close(fd);
    // A file that was never finished is useless; give its space back now (the caller removes the
    // temporary directory with abort_checkpoint).
    if (!finished && !path.empty()) unlink(path.c_str());
  }

  Status flush() {
    if (buf.empty()) return Status::ok();
    Status s = detail::pwrite_all(fd, path, buf.data(), buf.size(), flushed);
    if (!s.is_ok()) return fail(std::move(s));
    flushed += buf.size();
    buf.clear();
    return Status::ok();
  }

  Status emit(const void* data, size_t n) {
    hash.update(data, n);
    size += n;
    if (buf.size() + n <= kWriteBuffer) {
      buf.insert(buf.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
      return Status::ok();
    }
    ZOE_RETURN_IF_ERROR(flush());
    if (n >= kWriteBuffer) {
      Status s = detail::pwrite_all(fd, path, data, n, flushed);
      if (!s.is_ok()) return fail(std::move(s));
      flushed += n;
      return Status::ok();
    }
    buf.assign(static_cast<const char*>(data), static_cast<const char*>(data) + n);
    return Status::ok();
  }

  Status pad_to(uint64_t align) {
    static const char kZeros[kTensorAlign] = {};
    uint64_t pad = (align - size % align) % align;
    return emit(kZeros, pad);
  }

  Status fail(Status s) {
    if (s.code() == StatusCode::kNoSpace) {
      // EFBIG is the process's file-size limit, not a full disk.
      const char* why =
          s.sys_errno() == EFBIG ? "the file-size limit (ulimit -f) is reached" : "the disk is full";
      s = std::move(s).with_context("writing rank " + std::to_string(rank) + "'s checkpoint file (" +
                                    format_bytes(size) + " so far): " + why);
    }
    error = s;
    return s;
  }
};

RankWriter::RankWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RankWriter::~RankWriter() = default;

Result<std::unique_ptr<RankWriter>> RankWriter::create(const std::string& dir, int rank) {
  if (rank < 0) return invalid_argument("RankWriter: rank %d is negative", rank);
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  std::string path = dir + "/" + rank_file_name(rank);
  impl->fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (impl->fd < 0) return sys_error("create checkpoint file", path, errno);
  impl->path = path;
  impl->buf.reserve(kWriteBuffer);
  return std::unique_ptr<RankWriter>(new RankWriter(std::move(impl)));
}

Status RankWriter::begin_tensor(uint32_t module, const std::string& kind, const std::string& dtype,
                                uint64_t begin, uint64_t count) {
  Impl& w = *impl_;
  if (!w.error.is_ok()) return w.error;
  if (w.finished) return invalid_argument("RankWriter %s: begin_tensor after finish", w.path.c_str());
  if (w.in_tensor) {
    return invalid_argument(
        "RankWriter %s: begin_tensor while module %u '%s' is still open (call end_tensor)", w.path.c_str(),
        w.cur.module, w.cur.kind.c_str());
  }
  if (kind.empty()) return invalid_argument("RankWriter: empty tensor kind");
  const std::string problem = record_dtype_problem(kind, dtype, begin);
  if (!problem.empty()) {
    return invalid_argument("RankWriter %s: module %u '%s' [%" PRIu64 ", +%" PRIu64 "): %s", w.path.c_str(),
                            module, kind.c_str(), begin, count, problem.c_str());
  }
  ZOE_RETURN_IF_ERROR(w.pad_to(kTensorAlign));
  w.cur = TensorRecord{};
  w.cur.rank = w.rank;
  w.cur.module = module;
  w.cur.kind = kind;
  w.cur.dtype = dtype;
  w.cur.begin = begin;
  w.cur.count = count;
  w.cur.offset = w.size;
  w.cur.bytes = tensor_bytes(dtype, count);
  w.cur_got = 0;
  w.tensor_hash.reset();
  w.in_tensor = true;
  return Status::ok();
}

Status RankWriter::append(const void* data, size_t bytes) {
  Impl& w = *impl_;
  if (!w.error.is_ok()) return w.error;
  if (!w.in_tensor)
    return invalid_argument("RankWriter %s: append outside begin_tensor/end_tensor", w.path.c_str());
  if (w.cur_got + bytes > w.cur.bytes) {
    return invalid_argument("RankWriter %s: module %u '%s' [%" PRIu64 ", +%" PRIu64 "): %" PRIu64
                            " bytes appended, more than the %" PRIu64 " expected",
                            w.path.c_str(), w.cur.module, w.cur.kind.c_str(), w.cur.begin, w.cur.count,
                            w.cur_got + bytes, w.cur.bytes);
  }
  ZOE_RETURN_IF_ERROR(w.emit(data, bytes));
  w.tensor_hash.update(data, bytes);
  w.cur_got += bytes;
  return Status::ok();
}

Status RankWriter::end_tensor() {
  Impl& w = *impl_;
  if (!w.error.is_ok()) return w.error;
  if (!w.in_tensor) return invalid_argument("RankWriter %s: end_tensor without begin_tensor", w.path.c_str());
  if (w.cur_got != w.cur.bytes) {
    return invalid_argument("RankWriter %s: module %u '%s' [%" PRIu64 ", +%" PRIu64 "): %" PRIu64
                            " bytes appended, %" PRIu64 " expected (%s)",
                            w.path.c_str(), w.cur.module, w.cur.kind.c_str(), w.cur.begin, w.cur.count,
                            w.cur_got, w.cur.bytes, w.cur.dtype.c_str());
  }
  w.cur.xxh64 = detail::hex64(w.tensor_hash.digest());
  w.records.push_back(w.cur);
  w.in_tensor = false;
  return Status::ok();
}

Status RankWriter::finish(std::vector<TensorRecord>* records, FileInfo* file) {
  Impl& w = *impl_;
  if (!w.error.is_ok()) return w.error;
  if (w.finished) return invalid_argument("RankWriter %s: finish called twice", w.path.c_str());
  if (w.in_tensor) return invalid_argument("RankWriter %s: finish while a tensor is open", w.path.c_str());
  ZOE_RETURN_IF_ERROR(w.flush());
  // Delayed-allocation file systems (and NFS) may report ENOSPC/EIO only here.
  Status s = detail::fsync_fd(w.fd, w.path);
  if (!s.is_ok()) return w.fail(std::move(s));
  int fd = w.fd;
  w.fd = -1;
  if (close(fd) != 0) return w.fail(sys_error("close", w.path, errno));
  w.finished = true;
  if (records) records->insert(records->end(), w.records.begin(), w.records.end());
  if (file) {
    file->name = rank_file_name(w.rank);
    file->bytes = w.size;
    file->xxh64 = detail::hex64(w.hash.digest());
  }
  return Status::ok();
}

// ---- the save protocol ----

namespace {

Status check_save_dir(const std::string& save_dir) {
  struct stat st;
  if (stat(save_dir.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return not_found("save directory %s does not exist (create it first)", save_dir.c_str());
    return sys_error("stat save directory", save_dir, errno);
  }
  if (!S_ISDIR(st.st_mode)) return invalid_argument("save directory %s is not a directory", save_dir.c_str());
  if (access(save_dir.c_str(), W_OK | X_OK) != 0) {
    return sys_error("check write access to save directory", save_dir, errno);
  }
  return Status::ok();
}

Status check_tag(const std::string& tag) {
  bool ok = !tag.empty() && tag != "." && tag != ".." && tag != "latest" && tag != kLockName &&
            tag.find('/') == std::string::npos && tag.find(".tmp-") == std::string::npos;
  for (char c : tag) ok = ok && static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
  if (!ok) {
    return invalid_argument(
        "checkpoint tag %s: expected a plain name (no '/', no control characters, not 'latest' nor '%s', "
        "no '.tmp-')",
        detail::printable(tag).c_str(), kLockName);
  }
  return Status::ok();
}

// Leftovers of saves that crashed: "<tag>.tmp-XXXXXX" directories and "latest.tmp-<pid>" files.
// Only called holding save_dir's lock: whoever wrote them is gone.
void remove_stale_temporaries(const std::string& save_dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(save_dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.find(".tmp-") == std::string::npos) continue;
    ZOE_LOG_WARN("removing %s, left by a checkpoint save that did not finish", e.path().c_str());
    std::error_code ec2;
    std::filesystem::remove_all(e.path(), ec2);
  }
}

}  // namespace

Result<std::string> begin_checkpoint(const std::string& save_dir, const std::string& tag) {
  ZOE_RETURN_IF_ERROR(check_tag(tag));
  ZOE_RETURN_IF_ERROR(check_save_dir(save_dir));
  Status lock = hold_save_dir(save_dir);
  if (lock.code() == StatusCode::kUnsupported) {
    // hold_save_dir warned once; without a lock, a leftover may be another job's live save.
  } else if (!lock.is_ok()) {
    return lock;
  } else {
    remove_stale_temporaries(save_dir);
  }
  std::string tmpl = save_dir + "/" + tag + ".tmp-XXXXXX";
  if (!mkdtemp(tmpl.data())) return sys_error("create temporary checkpoint directory", tmpl, errno);
  return tmpl;
}

void abort_checkpoint(const std::string& tmp_dir) {
  // Only ever a temporary directory: never a finished checkpoint, whatever the caller passes.
  if (tmp_dir.find(".tmp-") == std::string::npos) return;
  std::error_code ec;
  std::filesystem::remove_all(tmp_dir, ec);
}

namespace {

Status commit_inner(const std::string& save_dir, const std::string& tag, const std::string& tmp_dir,
                    const Manifest& manifest) {
  std::string manifest_path = tmp_dir + "/manifest.json";
  // The manifest must read back: the same checks a Reader makes, so a caller's bug fails the save
  // rather than the load.
  nlohmann::json j = manifest.to_json();
  ZOE_ASSIGN_OR_RETURN(Manifest check, Manifest::from_json(j, manifest_path));
  if (check.format_version != kFormatVersion) {
    return invalid_argument("commit_checkpoint: format_version %d, this zoe writes %d", check.format_version,
                            kFormatVersion);
  }
  for (const auto& f : manifest.files) {
    std::string p = tmp_dir + "/" + f.name;
    struct stat st;
    if (stat(p.c_str(), &st) != 0) return sys_error("stat checkpoint file", p, errno);
    if (static_cast<uint64_t>(st.st_size) != f.bytes) {
      return invalid_argument("commit_checkpoint: %s has %" PRIu64 " bytes, the manifest says %" PRIu64,
                              p.c_str(), static_cast<uint64_t>(st.st_size), f.bytes);
    }
  }
  // The manifest's own checksum, of its exact bytes, beside it: both become visible together with
  // the rename of tmp_dir below.
  const std::string text = j.dump(1) + "\n";
  detail::Xxh64 h;
  h.update(text.data(), text.size());
  ZOE_RETURN_IF_ERROR(detail::write_file_atomic(manifest_path, text));
  ZOE_RETURN_IF_ERROR(detail::write_file_atomic(tmp_dir + "/" + kManifestChecksumName,
                                                detail::hex64(h.digest()) + "  " + kManifestName + "\n"));
  ZOE_RETURN_IF_ERROR(detail::fsync_dir(tmp_dir));
  return Status::ok();
}

}  // namespace

Status commit_checkpoint(const std::string& save_dir, const std::string& tag, const std::string& tmp_dir,
                         const Manifest& manifest) {
  ZOE_RETURN_IF_ERROR(check_tag(tag));
  Status s = commit_inner(save_dir, tag, tmp_dir, manifest);
  if (!s.is_ok()) {
    abort_checkpoint(tmp_dir);
    return std::move(s).with_context("committing checkpoint " + save_dir + "/" + tag);
  }
  std::string final_dir = save_dir + "/" + tag;
  struct stat st;
  if (stat(final_dir.c_str(), &st) == 0) {
    // Saving a tag again: swap the directories atomically (`latest` may name this tag), then drop
    // the old one, now under the temporary name.
    if (renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
      Status e = sys_error("exchange with " + final_dir, tmp_dir, errno);
      abort_checkpoint(tmp_dir);
      return e;
    }
    abort_checkpoint(tmp_dir);
  } else if (rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
    Status e = sys_error("rename to " + final_dir, tmp_dir, errno);
    abort_checkpoint(tmp_dir);
    return e;
  }
  ZOE_RETURN_IF_ERROR(detail::fsync_dir(save_dir));
  // `latest` last: until here, readers of save_dir still load the previous checkpoint.
  return detail::write_file_atomic(save_dir + "/latest", tag + "\n");
}

}  // namespace zoe::ckpt
