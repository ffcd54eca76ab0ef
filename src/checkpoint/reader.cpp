// Reading checkpoints: open with size checks, checksum verification, reshardable range reads.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "checkpoint/xxh64.h"
#include "core/dtype.h"
#include "zoe/files.h"

namespace zoe::ckpt {

namespace {

constexpr size_t kReadPiece = 1u << 20;    // read_range's conversion buffer, at most
constexpr size_t kVerifyPiece = 4u << 20;  // verify's read size

bool is_dir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

}  // namespace

struct Reader::Impl {
  std::string dir;
  Manifest manifest;
  std::vector<int> fds;              // per manifest.files entry
  std::vector<size_t> file_of_rank;  // rank -> index in manifest.files
  // (module, kind) -> indices of manifest.tensors, sorted by begin.
  std::map<std::pair<uint32_t, std::string>, std::vector<size_t>> index;
  std::vector<std::vector<size_t>> tensors_of_file;  // per file: indices of manifest.tensors, by offset
  std::string manifest_xxh64;

  ~Impl() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
  std::string file_path(size_t i) const { return dir + "/" + manifest.files[i].name; }
};

Reader::Reader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Reader::~Reader() = default;
const Manifest& Reader::manifest() const { return impl_->manifest; }
const std::string& Reader::path() const { return impl_->dir; }
const std::string& Reader::manifest_xxh64() const { return impl_->manifest_xxh64; }

namespace {

// dir is a checkpoint (has manifest.json) or a save directory whose `latest` names one.
Result<std::string> resolve_dir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (!exists(dir)) return not_found("checkpoint %s does not exist", dir.c_str());
  if (!is_dir(dir)) return invalid_argument("checkpoint %s is not a directory", dir.c_str());
  if (exists(dir + "/manifest.json")) return dir;
  std::string latest = dir + "/latest";
  if (!exists(latest)) {
    return not_found("%s is not a checkpoint (no manifest.json) nor a save directory (no 'latest' file)",
                     dir.c_str());
  }
  ZOE_ASSIGN_OR_RETURN(std::string raw, detail::read_small_file(latest, 4096));
  std::string tag = raw;
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ' || tag.back() == '\r')) tag.pop_back();
  bool ok = !tag.empty() && tag != "." && tag != ".." && tag.find('/') == std::string::npos;
  for (char c : tag) ok = ok && static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
  if (!ok) {
    return corruption(
        "%s is corrupt: expected the tag of a checkpoint (a name without '/' or control "
        "characters), found %s",
        latest.c_str(), detail::printable(raw).c_str());
  }
  std::string ck = dir + "/" + tag;
  if (!exists(ck + "/manifest.json")) {
    return not_found("%s names checkpoint '%s', but %s/manifest.json does not exist", latest.c_str(),
                     tag.c_str(), ck.c_str());
  }
  return ck;
}

}  // namespace

Result<std::unique_ptr<Reader>> Reader::open(const std::string& dir_arg) {
  auto impl = std::make_unique<Impl>();
  ZOE_ASSIGN_OR_RETURN(impl->dir, resolve_dir(dir_arg));
  const std::string mpath = impl->dir + "/" + kManifestName;
  ZOE_ASSIGN_OR_RETURN(impl->manifest, load_manifest(impl->dir, &impl->manifest_xxh64));
  const Manifest& m = impl->manifest;

  impl->file_of_rank.assign(static_cast<size_t>(m.world_size), SIZE_MAX);
  impl->fds.assign(m.files.size(), -1);
  for (size_t i = 0; i < m.files.size(); ++i) {
    const FileInfo& f = m.files[i];
    std::string p = impl->file_path(i);
    Result<int> opened = open_input_file(p, "checkpoint file");
    if (!opened.is_ok()) {
      if (opened.status().code() == StatusCode::kNotFound) {
        return not_found("checkpoint file %s is missing (the manifest lists it with %" PRIu64 " bytes)",
                         p.c_str(), f.bytes);
      }
      return opened.status();
    }
    const int fd = opened.value();
    impl->fds[i] = fd;
    struct stat st;
    if (fstat(fd, &st) != 0) return sys_error("fstat", p, errno);
    if (static_cast<uint64_t>(st.st_size) != f.bytes) {
      return corruption(
          "checkpoint file %s has %" PRIu64 " bytes, the manifest says %" PRIu64 " (%s)", p.c_str(),
          static_cast<uint64_t>(st.st_size), f.bytes,
          static_cast<uint64_t>(st.st_size) < f.bytes ? "truncated" : "overwritten or appended to");
    }
    int rank = -1;
    if (sscanf(f.name.c_str(), "rank-%d.bin", &rank) == 1 && rank >= 0 && rank < m.world_size) {
      impl->file_of_rank[static_cast<size_t>(rank)] = i;
    }
  }
  // load_manifest checked that every tensor lies inside its file and that they do not overlap.
  impl->tensors_of_file.resize(m.files.size());
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const TensorRecord& r = m.tensors[t];
    size_t fi = impl->file_of_rank[static_cast<size_t>(r.rank)];
    if (fi == SIZE_MAX) {
      return corruption("%s: tensors[%zu] is in rank %d's file, which 'files' does not list", mpath.c_str(),
                        t, r.rank);
    }
    impl->tensors_of_file[fi].push_back(t);
    impl->index[{r.module, r.kind}].push_back(t);
  }
  for (auto& v : impl->tensors_of_file) {
    std::stable_sort(v.begin(), v.end(),
                     [&](size_t a, size_t b) { return m.tensors[a].offset < m.tensors[b].offset; });
  }
  for (auto& [key, v] : impl->index) {
    std::stable_sort(v.begin(), v.end(),
                     [&](size_t a, size_t b) { return m.tensors[a].begin < m.tensors[b].begin; });
  }
  return std::unique_ptr<Reader>(new Reader(std::move(impl)));
}

bool Reader::has_kind(const std::string& kind) const {
  for (const auto& [key, v] : impl_->index) {
    if (key.second == kind && !v.empty()) return true;
  }
  return false;
}

Status Reader::scan_file(size_t i, size_t piece_bytes, const PieceFn& on_piece) const {
  const Manifest& m = impl_->manifest;
  if (i >= m.files.size()) return invalid_argument("scan_file: index %zu of %zu files", i, m.files.size());
  const FileInfo& f = m.files[i];
  const std::string p = impl_->file_path(i);
  const std::vector<size_t>& recs = impl_->tensors_of_file[i];
  const uint64_t piece =
      std::max<uint64_t>(kTensorAlign, (piece_bytes + kTensorAlign - 1) / kTensorAlign * kTensorAlign);
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(piece, std::max<uint64_t>(f.bytes, 1))));
  detail::Xxh64 file_hash, tensor_hash;
  size_t next = 0;  // the first tensor of recs whose checksum is not checked yet
  // Checks every tensor that ends at or before `upto`, hashing its bytes inside [lo, upto).
  auto advance = [&](const char* data, uint64_t lo, uint64_t upto) -> Status {
    for (; next < recs.size(); ++next) {
      const TensorRecord& t = m.tensors[recs[next]];
      const uint64_t b = std::max(t.offset, lo), e = std::min(t.offset + t.bytes, upto);
      if (b < e) tensor_hash.update(data + (b - lo), static_cast<size_t>(e - b));
      if (t.offset + t.bytes > upto) break;  // continues in the next piece
      const std::string got = detail::hex64(tensor_hash.digest());
      tensor_hash.reset();
      if (!t.xxh64.empty() && got != t.xxh64) {
        return corruption("checksum mismatch in %s: tensors[%zu] (module %u '%s', '%s' %s elements [%" PRIu64
                          ", %" PRIu64 ") at bytes [%" PRIu64 ", %" PRIu64
                          ")): the manifest says xxh64 %s, the file has %s (corrupted)",
                          p.c_str(), recs[next], t.module, m.modules[t.module].name.c_str(), t.kind.c_str(),
                          t.dtype.c_str(), t.begin, t.begin + t.count, t.offset, t.offset + t.bytes,
                          t.xxh64.c_str(), got.c_str());
      }
    }
    return Status::ok();
  };
  for (uint64_t off = 0; off < f.bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), f.bytes - off));
    ZOE_RETURN_IF_ERROR(detail::pread_all(impl_->fds[i], p, buf.data(), n, off));
    file_hash.update(buf.data(), n);
    ZOE_RETURN_IF_ERROR(advance(buf.data(), off, off + n));
    if (on_piece) ZOE_RETURN_IF_ERROR(on_piece(off, buf.data(), n));
    off += n;
  }
  ZOE_RETURN_IF_ERROR(advance(buf.data(), f.bytes, f.bytes));  // empty tensors at the very end
  const std::string got = detail::hex64(file_hash.digest());
  if (got != f.xxh64) {
    const bool per_tensor = m.format_version >= 2;
    return corruption("checksum mismatch in %s: the manifest says xxh64 %s, the file has %s (corrupted; %s)",
                      p.c_str(), f.xxh64.c_str(), got.c_str(),
                      per_tensor
                          ? "every tensor's own checksum matches: the damage is in the padding between them"
                          : "a format 1 checkpoint has no per-tensor checksums to say which tensor");
  }
  return Status::ok();
}

Status Reader::verify_file(size_t i) const { return scan_file(i, kVerifyPiece, nullptr); }

Status Reader::verify() const {
  for (size_t i = 0; i < impl_->manifest.files.size(); ++i) ZOE_RETURN_IF_ERROR(verify_file(i));
  return Status::ok();
}

Status Reader::check_complete() const {
  const Manifest& m = impl_->manifest;
  std::set<std::string> kinds = {"param"};
  for (const TensorRecord& t : m.tensors) kinds.insert(t.kind);
  for (uint32_t mod = 0; mod < m.modules.size(); ++mod) {
    const uint64_t padded = m.modules[mod].padded;
    for (const std::string& kind : kinds) {
      // A frozen module has its parameters and their fp32 values, and no optimizer states.
      if (m.modules[mod].frozen && kind != "param" && kind != "master") continue;
      uint64_t covered = 0;  // [0, covered) is held by the records seen
      auto it = impl_->index.find({mod, kind});
      if (it != impl_->index.end()) {
        for (size_t t : it->second) {  // by begin
          const TensorRecord& r = m.tensors[t];
          if (r.begin > covered) break;
          covered = std::max(covered, r.begin + r.count);
        }
      }
      if (covered >= padded) continue;
      return Status(StatusCode::kCorruption,
                    "checkpoint " + impl_->dir + ": " + kManifestName + " lists no tensor for element " +
                        std::to_string(covered) + " (of " + std::to_string(padded) + ") of module '" +
                        m.modules[mod].name + "' '" + kind +
                        "' state (a tensor is missing from the manifest: the checkpoint is incomplete)");
    }
  }
  return Status::ok();
}

namespace {

constexpr uint64_t kValuePiece = 64u << 10;  // elements decoded or quantized at a time (256 KiB of f32)

// A packed output starts at a block and ends at one, at the module's end, or where a record ends.
Status check_packed_range(const Manifest& m, const std::vector<size_t>* recs, uint32_t module,
                          const std::string& kind, uint64_t begin, uint64_t count, const std::string& dt) {
  const uint64_t B = dtype_block_elems(dt), end = begin + count;
  bool end_ok = count == 0 || end % B == 0 || end == m.modules[module].padded;
  for (size_t i = 0; recs && i < recs->size() && !end_ok; ++i) {
    const TensorRecord& r = m.tensors[(*recs)[i]];
    end_ok = r.begin < end && r.begin + r.count == end;
  }
  if (begin % B == 0 && end_ok) return Status::ok();
  const std::string block = "its block of " + std::to_string(B) + " elements";
  const std::string what = begin % B != 0 ? "the start is not a multiple of " + block
                                          : "the end is neither a multiple of " + block +
                                                ", nor the module's end, nor a saved tensor's end";
  return invalid_argument("read_range: elements [%" PRIu64 ", %" PRIu64
                          ") of module '%s' '%s' state as %s: %s",
                          begin, end, m.modules[module].name.c_str(), kind.c_str(), dt.c_str(), what.c_str());
}

// One read_range call: the records of one (module, kind), the files they are in, the scratch.
class RangeRead {
 public:
  struct Files {
    const Manifest& m;
    const std::string& dir;
    const std::vector<int>& fds;
    const std::vector<size_t>& file_of_rank;
  };
  RangeRead(const Files& files, const std::vector<size_t>* recs, uint32_t module, const std::string& kind,
            uint64_t begin, uint64_t end)
      : f_(files), recs_(recs), module_(module), kind_(kind), begin_(begin), end_(end) {}

  // Output in a per-element dtype ("f32", "bf16", "f16").
  Status read_plain(const std::string& dt, char* dst);
  // Output in a packed dtype: begin_ is a multiple of its block.
  Status read_packed(const std::string& dt, char* dst);

 private:
  const TensorRecord* covering(uint64_t pos) const;
  Status uncovered(uint64_t pos) const;
  std::string path_of(const TensorRecord& rec) const {
    return f_.dir + "/" + f_.m.files[f_.file_of_rank[static_cast<size_t>(rec.rank)]].name;
  }
  Status pread(const TensorRecord& rec, void* dst, uint64_t bytes, uint64_t at) const {
    const size_t fi = f_.file_of_rank[static_cast<size_t>(rec.rank)];
    return detail::pread_all(f_.fds[fi], path_of(rec), dst, static_cast<size_t>(bytes), rec.offset + at);
  }
  // An error of the values of elements [pos, pos + n): "while <doing> elements [..) of module
  // 'm' 'kind' state of checkpoint D<tail>".
  Status values_error(Status s, const char* doing, uint64_t pos, uint64_t n, const std::string& tail) const {
    return std::move(s).with_context(std::string(doing) + " elements [" + std::to_string(pos) + ", " +
                                     std::to_string(pos + n) + ") of module '" + f_.m.modules[module_].name +
                                     "' '" + kind_ + "' state of checkpoint " + f_.dir + tail);
  }
  optim::StateKind state_kind() const {
    // exp_avg (m) signed; exp_avg_sq (v) and Adagrad's sum >= 0.
    return kind_ == "exp_avg" ? optim::StateKind::kExpAvg : optim::StateKind::kExpAvgSq;
  }
  // Elements [pos, pos + n) of rec (inside it, n <= kValuePiece) as floats.
  Status decode(const TensorRecord& rec, uint64_t pos, uint64_t n, float* dst);
  // Elements [pos, pos + n) (n <= kValuePiece) as floats, from whichever records hold them.
  Status gather(uint64_t pos, uint64_t n, float* dst);
  // Elements [pos, pos + n) of a per-element record rec, converted to dt at dst.
  Status convert_plain(const TensorRecord& rec, uint64_t pos, uint64_t n, const std::string& dt, char* dst);

  Files f_;
  const std::vector<size_t>* recs_;  // by begin; null when the checkpoint has none
  uint32_t module_;
  const std::string& kind_;
  uint64_t begin_, end_;
  std::vector<char> bytes_;
  std::vector<float> values_, decoded_;
};

// The last record starting at or before pos that still covers it (records may overlap when
// ranks saved replicated state; any covering one will do).
const TensorRecord* RangeRead::covering(uint64_t pos) const {
  if (!recs_) return nullptr;
  const auto& recs = *recs_;
  auto ub = std::upper_bound(recs.begin(), recs.end(), pos,
                             [&](uint64_t p, size_t t) { return p < f_.m.tensors[t].begin; });
  for (auto r = ub; r != recs.begin();) {
    --r;
    const TensorRecord& c = f_.m.tensors[*r];
    if (c.begin + c.count > pos) return &c;
  }
  return nullptr;
}

Status RangeRead::uncovered(uint64_t pos) const {
  return not_found("checkpoint %s: element %" PRIu64
                   " of module '%s' '%s' state is in no rank's file "
                   "(the checkpoint does not cover [%" PRIu64 ", %" PRIu64 "))",
                   f_.dir.c_str(), pos, f_.m.modules[module_].name.c_str(), kind_.c_str(), begin_, end_);
}

Status RangeRead::decode(const TensorRecord& rec, uint64_t pos, uint64_t n, float* dst) {
  optim::StateFormat fmt;
  if (!packed_dtype(rec.dtype, &fmt)) {
    bytes_.resize(static_cast<size_t>(n * dtype_bytes(rec.dtype)));
    ZOE_RETURN_IF_ERROR(pread(rec, bytes_.data(), bytes_.size(), (pos - rec.begin) * dtype_bytes(rec.dtype)));
    detail::convert_elements(rec.dtype, bytes_.data(), "f32", dst, static_cast<size_t>(n));
    return Status::ok();
  }
  // Whole blocks (the record's last one may be partial): [first, last) of the record.
  const uint64_t B = dtype_block_elems(rec.dtype), rel = pos - rec.begin;
  const uint64_t first = rel / B * B, last = std::min(rec.count, (rel + n + B - 1) / B * B);
  bytes_.resize(static_cast<size_t>(tensor_bytes(rec.dtype, last - first)));
  ZOE_RETURN_IF_ERROR(pread(rec, bytes_.data(), bytes_.size(), tensor_bytes(rec.dtype, first)));
  decoded_.resize(static_cast<size_t>(last - first));
  Status s = optim::dequantize_state(state_kind(), fmt, bytes_.data(), decoded_.data(), decoded_.size());
  if (!s.is_ok())
    return values_error(std::move(s), "decoding", rec.begin + first, last - first, " (" + rec.dtype + ")");
  std::memcpy(dst, decoded_.data() + (rel - first), static_cast<size_t>(n) * sizeof(float));
  return Status::ok();
}

Status RangeRead::gather(uint64_t pos, uint64_t n, float* dst) {
  for (const uint64_t end = pos + n; pos < end;) {
    const TensorRecord* rec = covering(pos);
    if (!rec) return uncovered(pos);
    const uint64_t k = std::min(end, rec->begin + rec->count) - pos;
    ZOE_RETURN_IF_ERROR(decode(*rec, pos, k, dst));
    dst += k;
    pos += k;
  }
  return Status::ok();
}

Status RangeRead::convert_plain(const TensorRecord& rec, uint64_t pos, uint64_t n, const std::string& dt,
                                char* dst) {
  // Bounded pieces: a conversion never holds more than kReadPiece bytes of the source.
  const size_t ib = dtype_bytes(rec.dtype), ob = dtype_bytes(dt);
  const uint64_t per = kReadPiece / ib;
  for (uint64_t done = 0; done < n;) {
    const uint64_t k = std::min(n - done, per);
    bytes_.resize(static_cast<size_t>(k * ib));
    ZOE_RETURN_IF_ERROR(pread(rec, bytes_.data(), k * ib, (pos - rec.begin + done) * ib));
    detail::convert_elements(rec.dtype, bytes_.data(), dt, dst, static_cast<size_t>(k));
    dst += k * ob;
    done += k;
  }
  return Status::ok();
}

Status RangeRead::read_plain(const std::string& dt, char* dst) {
  const size_t ob = dtype_bytes(dt);
  for (uint64_t pos = begin_; pos < end_;) {
    const TensorRecord* rec = covering(pos);
    if (!rec) return uncovered(pos);
    const uint64_t n = std::min(end_, rec->begin + rec->count) - pos;
    if (rec->dtype == dt) {
      ZOE_RETURN_IF_ERROR(pread(*rec, dst, n * ob, (pos - rec->begin) * ob));
    } else if (!packed_dtype(rec->dtype)) {
      ZOE_RETURN_IF_ERROR(convert_plain(*rec, pos, n, dt, dst));
    } else {
      for (uint64_t done = 0; done < n;) {  // dequantized in pieces, then converted
        const uint64_t k = std::min(n - done, kValuePiece);
        float* vals = reinterpret_cast<float*>(dst + done * ob);
        if (dt != "f32") {
          values_.resize(static_cast<size_t>(k));
          vals = values_.data();
        }
        ZOE_RETURN_IF_ERROR(decode(*rec, pos + done, k, vals));
        if (dt != "f32") detail::convert_elements("f32", vals, dt, dst + done * ob, static_cast<size_t>(k));
        done += k;
      }
    }
    dst += n * ob;
    pos += n;
  }
  return Status::ok();
}

Status RangeRead::read_packed(const std::string& dt, char* dst) {
  optim::StateFormat fmt;
  packed_dtype(dt, &fmt);
  const uint64_t B = dtype_block_elems(dt);
  for (uint64_t pos = begin_; pos < end_;) {  // pos - begin_ is a multiple of B
    const TensorRecord* rec = covering(pos);
    if (!rec) return uncovered(pos);
    const uint64_t rec_end = rec->begin + rec->count, avail = std::min(end_, rec_end) - pos;
    if (rec->dtype == dt) {
      // The stored blocks as they are: whole ones, or a partial last one that ends the output
      // where the record ends (the bytes of a block cut short elsewhere are not its encoding).
      const bool whole_tail = pos + avail == end_ && (end_ % B == 0 || rec_end == end_);
      const uint64_t n = whole_tail ? avail : avail / B * B;
      if (n > 0) {
        const uint64_t bytes = tensor_bytes(dt, n);
        ZOE_RETURN_IF_ERROR(pread(*rec, dst, bytes, tensor_bytes(dt, pos - rec->begin)));
        dst += bytes;
        pos += n;
        continue;
      }
    }
    // Through f32: a piece of whole blocks (or the output's tail), from one record or several.
    uint64_t n = std::min(avail, kValuePiece);
    if (pos + n < end_) n = n / B * B;
    if (n == 0) n = std::min(B, end_ - pos);
    values_.resize(static_cast<size_t>(n));
    ZOE_RETURN_IF_ERROR(gather(pos, n, values_.data()));
    Status s = optim::quantize_state(state_kind(), fmt, values_.data(), dst, static_cast<size_t>(n));
    if (!s.is_ok()) return values_error(std::move(s), "storing", pos, n, " as " + dt);
    dst += tensor_bytes(dt, n);
    pos += n;
  }
  return Status::ok();
}

}  // namespace

Status Reader::read_range(uint32_t module, const std::string& kind, uint64_t begin, uint64_t count,
                          const std::string& dtype_out, void* out) const {
  const Manifest& m = impl_->manifest;
  if (module >= m.modules.size()) {
    return invalid_argument("read_range: module %u, the checkpoint has %zu modules", module,
                            m.modules.size());
  }
  const std::string& mname = m.modules[module].name;
  const std::string problem = record_dtype_problem(kind, dtype_out, 0);
  if (!problem.empty()) {
    return invalid_argument("read_range of module '%s' '%s' state: %s", mname.c_str(), kind.c_str(),
                            problem.c_str());
  }
  if (begin + count > m.modules[module].padded) {
    return invalid_argument("read_range: elements [%" PRIu64 ", %" PRIu64
                            ") of module '%s', which has %" PRIu64,
                            begin, begin + count, mname.c_str(), m.modules[module].padded);
  }
  auto it = impl_->index.find({module, kind});
  if (count > 0 && it == impl_->index.end()) {
    return not_found("checkpoint %s has no '%s' state for module '%s'", impl_->dir.c_str(), kind.c_str(),
                     mname.c_str());
  }
  RangeRead rr({m, impl_->dir, impl_->fds, impl_->file_of_rank},
               it == impl_->index.end() ? nullptr : &it->second, module, kind, begin, begin + count);
  if (!packed_dtype(dtype_out)) return rr.read_plain(dtype_out, static_cast<char*>(out));
  ZOE_RETURN_IF_ERROR(check_packed_range(m, it == impl_->index.end() ? nullptr : &it->second, module, kind,
                                         begin, count, dtype_out));
  return rr.read_packed(dtype_out, static_cast<char*>(out));
}

}  // namespace zoe::ckpt
