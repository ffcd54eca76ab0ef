// consolidate: a checkpoint's full parameters as one safetensors file, streamed in bounded pieces
// from every rank file in turn, checksummed on the way (write_safetensors, for any selection of
// parameters, renamed and transposed as an exporter asks).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <map>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "checkpoint/safetensors_export.h"
#include "core/dtype.h"
#include "zoe/files.h"

namespace zoe::ckpt {
namespace detail {
namespace {

constexpr size_t kScratchBytes = 1u << 20;

// Where one output tensor's bytes go, and how.
struct OutSlot {
  const ExportTensor* t;
  const ParamInfo* p;
  std::string kind;             // the state read: t->kind, or the parameters' values' kind
  uint64_t at = 0;              // offset in the data section
  uint64_t rows = 0, cols = 0;  // transposed: the source matrix's shape
};

// Writes source elements [la, lb) of slot s (local to its parameter), whose bytes start at src
// (element la), converted from sdt to dt, at their places in the output file.
class SlotWriter {
 public:
  SlotWriter(int fd, const std::string& path, uint64_t data_start, const std::string& dt)
      : fd_(fd), path_(path), data_start_(data_start), dt_(dt), eb_(dtype_bytes(dt)) {}

  Status write(const OutSlot& s, const std::string& sdt, const char* src, uint64_t la, uint64_t lb) {
    const size_t ib = dtype_bytes(sdt);
    const uint64_t per = kScratchBytes / std::max(eb_, ib) / 2;  // gather and conversion halves
    if (!s.t->transpose) {
      const uint64_t dst = data_start_ + s.at + la * eb_;
      if (sdt == dt_) return pwrite_all(fd_, path_, src, static_cast<size_t>((lb - la) * eb_), dst);
      for (uint64_t k = la; k < lb;) {
        const uint64_t c = std::min(lb - k, per);
        conv_.resize(static_cast<size_t>(c * eb_));
        convert_elements(sdt, src + (k - la) * ib, dt_, conv_.data(), static_cast<size_t>(c));
        ZOE_RETURN_IF_ERROR(pwrite_all(fd_, path_, conv_.data(), conv_.size(), dst + (k - la) * eb_));
        k += c;
      }
      return Status::ok();
    }
    // Source [rows, cols] row-major, output [cols, rows]: the elements of one source column j
    // inside [la, lb) are the rows [i0, i1) of it, one contiguous run of the output.
    const uint64_t R = s.rows, C = s.cols;
    const uint64_t ra = la / C, ca = la % C, rb = (lb - 1) / C, cb = (lb - 1) % C + 1;
    for (uint64_t j = 0; j < C; ++j) {
      const uint64_t i0 = j >= ca ? ra : ra + 1, i1 = j < cb ? rb + 1 : rb;
      for (uint64_t i = i0; i < i1;) {
        const uint64_t c = std::min(i1 - i, per);
        gather_.resize(static_cast<size_t>(c * ib));
        for (uint64_t k = 0; k < c; ++k) {
          std::memcpy(gather_.data() + k * ib, src + ((i + k) * C + j - la) * ib, ib);
        }
        const char* out = gather_.data();
        if (sdt != dt_) {
          conv_.resize(static_cast<size_t>(c * eb_));
          convert_elements(sdt, gather_.data(), dt_, conv_.data(), static_cast<size_t>(c));
          out = conv_.data();
        }
        ZOE_RETURN_IF_ERROR(pwrite_all(fd_, path_, out, static_cast<size_t>(c * eb_),
                                       data_start_ + s.at + (j * R + i) * eb_));
        i += c;
      }
    }
    return Status::ok();
  }

 private:
  int fd_;
  const std::string& path_;
  uint64_t data_start_;
  std::string dt_;
  size_t eb_;
  std::vector<char> gather_, conv_;
};

// The output's layout: every tensor, in the order given, back to back; its header entries, and
// per module the slots its parameters feed.
struct Layout {
  nlohmann::json header = nlohmann::json::object();
  uint64_t data_bytes = 0;
  std::vector<OutSlot> slots;
  std::vector<std::vector<size_t>> slots_of_module;
};

// The header's tensor entries: each asks for an existing parameter, under a name not empty,
// reserved or used twice; only a matrix is transposed.
Status lay_out(const Reader& r, const std::vector<ExportTensor>& tensors, const std::string& values_kind,
               const char* st_dtype, size_t eb, Layout* l) {
  const Manifest& m = r.manifest();
  l->slots_of_module.resize(m.modules.size());
  for (const ExportTensor& t : tensors) {
    if (t.module >= m.modules.size() || t.param >= m.modules[t.module].params.size()) {
      return invalid_argument(
          "consolidate: tensor '%s' asks for parameter %zu of module %u, which %s has not", t.name.c_str(),
          t.param, t.module, r.path().c_str());
    }
    const ParamInfo& p = m.modules[t.module].params[t.param];
    if (t.name.empty() || t.name == "__metadata__" || l->header.contains(t.name)) {
      return invalid_argument("consolidate: tensor name '%s' (from %s.%s) is empty, reserved or used twice",
                              t.name.c_str(), m.modules[t.module].name.c_str(), p.name.c_str());
    }
    OutSlot s{&t, &p, t.kind.empty() ? values_kind : t.kind, l->data_bytes};
    std::vector<int64_t> shape = p.shape;
    if (t.transpose) {
      if (p.shape.size() != 2) {
        return invalid_argument("consolidate: %s.%s has %zu dimensions; only a matrix can be transposed",
                                m.modules[t.module].name.c_str(), p.name.c_str(), p.shape.size());
      }
      s.rows = static_cast<uint64_t>(p.shape[0]);
      s.cols = static_cast<uint64_t>(p.shape[1]);
      shape = {p.shape[1], p.shape[0]};
    }
    l->header[t.name] = {{"dtype", st_dtype},
                         {"shape", shape},
                         {"data_offsets", {l->data_bytes, l->data_bytes + p.numel * eb}}};
    l->data_bytes += p.numel * eb;
    l->slots_of_module[t.module].push_back(l->slots.size());
    l->slots.push_back(s);
  }
  return Status::ok();
}

// Every exported element must be in some rank's file: checked before anything is written.
Status check_coverage(const Reader& r, const Layout& l) {
  const Manifest& m = r.manifest();
  // [begin, end) of the records of each (module, kind), sorted.
  std::map<std::pair<uint32_t, std::string>, std::vector<std::pair<uint64_t, uint64_t>>> have;
  for (const auto& t : m.tensors) {
    if (t.count > 0) have[{t.module, t.kind}].emplace_back(t.begin, t.begin + t.count);
  }
  for (auto& [key, v] : have) std::sort(v.begin(), v.end());
  for (const OutSlot& s : l.slots) {
    const ParamInfo& p = *s.p;
    uint64_t pos = p.offset;  // the first element not yet known to be covered
    auto it = have.find({s.t->module, s.kind});
    for (size_t i = 0; it != have.end() && i < it->second.size(); ++i) {
      if (it->second[i].first > pos) break;
      pos = std::max(pos, it->second[i].second);
    }
    if (pos < p.offset + p.numel) {
      return not_found("consolidate: checkpoint %s: element %" PRIu64 " of %s.%s (module element %" PRIu64
                       ") has no '%s' state in any rank's file",
                       r.path().c_str(), pos - p.offset, m.modules[s.t->module].name.c_str(), p.name.c_str(),
                       pos, s.kind.c_str());
    }
  }
  return Status::ok();
}

// The slots of layout l that record t feeds: its module's, of its kind.
template <typename Fn>
Status for_slots_of(const Layout& l, const TensorRecord& t, Fn&& fn) {
  for (size_t si : l.slots_of_module[t.module]) {
    const OutSlot& s = l.slots[si];
    const uint64_t a = std::max(t.begin, s.p->offset),
                   b = std::min(t.begin + t.count, s.p->offset + s.p->numel);
    if (s.kind == t.kind && a < b) ZOE_RETURN_IF_ERROR(fn(s, a, b));
  }
  return Status::ok();
}

// A packed record's share of the output, dequantized through Reader::read_range in bounded pieces.
Status copy_packed(const Reader& r, const TensorRecord& t, const Layout& l, SlotWriter* out) {
  constexpr uint64_t kPiece = kScratchBytes / sizeof(float) / 4;
  std::vector<float> vals;
  return for_slots_of(l, t, [&](const OutSlot& s, uint64_t a, uint64_t b) -> Status {
    for (uint64_t k = a; k < b;) {
      const uint64_t n = std::min(b - k, kPiece);
      vals.resize(static_cast<size_t>(n));
      ZOE_RETURN_IF_ERROR(r.read_range(t.module, t.kind, k, n, "f32", vals.data()));
      ZOE_RETURN_IF_ERROR(out->write(s, "f32", reinterpret_cast<const char*>(vals.data()), k - s.p->offset,
                                     k + n - s.p->offset));
      k += n;
    }
    return Status::ok();
  });
}

// One rank file, start to end: scan_file checks every tensor's and the file's xxh64 while the
// pieces of the records the slots read are converted and written where their tensors go. Packed
// records (whose blocks straddle the pieces) are read again once the scan has checked them.
Status copy_rank_file(const Reader& r, size_t fi, const Layout& l, size_t piece_bytes, SlotWriter* out) {
  const Manifest& m = r.manifest();
  std::set<std::string> kinds;
  for (const OutSlot& s : l.slots) kinds.insert(s.kind);
  std::vector<const TensorRecord*> recs, packed;  // the records the slots read, in this file
  for (const auto& t : m.tensors) {
    char name[32];
    snprintf(name, sizeof(name), "rank-%05d.bin", t.rank);
    if (!kinds.count(t.kind) || t.bytes == 0 || m.files[fi].name != name) continue;
    (packed_dtype(t.dtype) ? packed : recs).push_back(&t);
  }
  auto on_piece = [&](uint64_t at, const void* data, size_t n) -> Status {
    for (const TensorRecord* t : recs) {
      const uint64_t lo = std::max(at, t->offset), hi = std::min(at + n, t->offset + t->bytes);
      if (lo >= hi) continue;
      const size_t ib = dtype_bytes(t->dtype);
      // Pieces and tensors start at multiples of kTensorAlign: no element straddles two pieces.
      TensorRecord part = *t;
      part.begin = t->begin + (lo - t->offset) / ib;
      part.count = (hi - lo) / ib;
      ZOE_RETURN_IF_ERROR(for_slots_of(l, part, [&](const OutSlot& s, uint64_t a, uint64_t b) {
        const char* src = static_cast<const char*>(data) + (t->offset + (a - t->begin) * ib - at);
        return out->write(s, t->dtype, src, a - s.p->offset, b - s.p->offset);
      }));
    }
    return Status::ok();
  };
  ZOE_RETURN_IF_ERROR(r.scan_file(fi, piece_bytes, on_piece));
  for (const TensorRecord* t : packed) ZOE_RETURN_IF_ERROR(copy_packed(r, *t, l, out));
  return Status::ok();
}

}  // namespace

Status write_safetensors(const Reader& r, const std::string& out_path, const std::string& dtype_arg,
                         const std::vector<ExportTensor>& tensors, const nlohmann::json& metadata,
                         size_t piece_bytes) {
  DType dt;
  if (!parse_dtype(dtype_arg, &dt)) {
    return invalid_argument("consolidate: dtype '%s': expected fp32, bf16 or fp16", dtype_arg.c_str());
  }
  const std::string dtype = dt == DType::kF32 ? "f32" : dt == DType::kBF16 ? "bf16" : "f16";
  const char* st_dtype = dt == DType::kF32 ? "F32" : dt == DType::kBF16 ? "BF16" : "F16";
  const size_t eb = dtype_bytes(dtype);
  const std::string kind = r.has_kind("master") ? "master" : "param";
  if (!r.has_kind(kind)) {
    return not_found("checkpoint %s holds neither 'master' nor 'param' state: nothing to consolidate",
                     r.path().c_str());
  }
  const Manifest& m = r.manifest();

  // Header: every output tensor, in the order given, laid out back to back.
  Layout l;
  ZOE_RETURN_IF_ERROR(lay_out(r, tensors, kind, st_dtype, eb, &l));
  nlohmann::json meta = {{"format", "pt"},
                         {"zoe_checkpoint", r.path()},
                         {"zoe_step", std::to_string(m.step)},
                         {"zoe_source_state", kind}};
  for (const auto& [k, v] : metadata.items()) meta[k] = v.is_string() ? v.get<std::string>() : v.dump();
  l.header["__metadata__"] = meta;
  ZOE_RETURN_IF_ERROR(check_coverage(r, l));
  std::string htext = l.header.dump();
  htext.append((8 - htext.size() % 8) % 8, ' ');
  uint64_t hlen = htext.size();
  unsigned char len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<unsigned char>(hlen >> (8 * i));

  // Through a temporary beside out_path, renamed over it when complete (only over a regular
  // file, never inside a checkpoint save directory: zoe/files.h).
  ZOE_ASSIGN_OR_RETURN(OutputFile file, OutputFile::create(out_path, "output file"));
  const int fd = file.fd();
  const std::string& tmp = file.temp_path();
  auto body = [&]() -> Status {
    uint64_t off = 0;
    ZOE_RETURN_IF_ERROR(pwrite_all(fd, tmp, len_le, 8, off));
    off += 8;
    ZOE_RETURN_IF_ERROR(pwrite_all(fd, tmp, htext.data(), htext.size(), off));
    off += htext.size();
    SlotWriter out(fd, tmp, off, dtype);
    for (size_t fi = 0; fi < m.files.size(); ++fi) {
      ZOE_RETURN_IF_ERROR(copy_rank_file(r, fi, l, piece_bytes, &out));
    }
    return file.commit();
  };
  Status s = body();
  if (!s.is_ok()) return std::move(s).with_context("writing " + out_path + " from checkpoint " + r.path());
  return Status::ok();
}

}  // namespace detail

Status consolidate(const Reader& r, const std::string& out_path, const std::string& dtype, size_t piece_bytes,
                   bool with_moments) {
  const Manifest& m = r.manifest();
  // The states of the optimizer that wrote it (engine.optimizer; none: AdamW): AdamW's m and v,
  // Lion's m, or Adagrad's sum.
  const nlohmann::json* opt =
      m.engine.is_object() && m.engine.contains("optimizer") ? &m.engine["optimizer"] : nullptr;
  const std::string type = opt && opt->is_string() ? opt->get<std::string>() : "AdamW";
  std::vector<const char*> kinds;
  if (with_moments) {
    kinds = type == "Lion"      ? std::vector<const char*>{"exp_avg"}
            : type == "Adagrad" ? std::vector<const char*>{"sum"}
                                : std::vector<const char*>{"exp_avg", "exp_avg_sq"};
  }
  for (const char* k : kinds) {
    if (!r.has_kind(k)) {
      return not_found("consolidate: checkpoint %s holds no optimizer moments ('%s' of its optimizer %s)",
                       r.path().c_str(), k, type.c_str());
    }
  }
  std::vector<detail::ExportTensor> tensors;
  for (uint32_t mi = 0; mi < m.modules.size(); ++mi) {
    for (size_t pi = 0; pi < m.modules[mi].params.size(); ++pi) {
      const std::string name = m.modules[mi].name + "." + m.modules[mi].params[pi].name;
      tensors.push_back({name, mi, pi, false});
      if (!with_moments || m.modules[mi].frozen) continue;  // a frozen module has no moments
      for (const char* kind : kinds) tensors.push_back({name + "." + kind, mi, pi, false, kind});
    }
  }
  return detail::write_safetensors(r, out_path, dtype, tensors, nlohmann::json::object(), piece_bytes);
}

}  // namespace zoe::ckpt
