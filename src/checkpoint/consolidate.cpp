// consolidate: a checkpoint's full parameters as one safetensors file, streamed in bounded pieces
// from every rank file in turn, checksummed on the way.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "core/dtype.h"

namespace zoe::ckpt {

Status consolidate(const Reader& r, const std::string& out_path, const std::string& dtype_arg,
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

  // Header: every parameter, in module order, laid out back to back.
  nlohmann::json header = nlohmann::json::object();
  uint64_t data_bytes = 0;
  std::vector<std::vector<uint64_t>> out_at(m.modules.size());  // [module][param]: offset in the data
  for (size_t mi = 0; mi < m.modules.size(); ++mi) {
    const auto& mod = m.modules[mi];
    for (const auto& p : mod.params) {
      out_at[mi].push_back(data_bytes);
      std::string name = mod.name + "." + p.name;
      if (header.contains(name)) {
        return invalid_argument("consolidate: two parameters are named '%s' in %s", name.c_str(),
                                r.path().c_str());
      }
      header[name] = {
          {"dtype", st_dtype}, {"shape", p.shape}, {"data_offsets", {data_bytes, data_bytes + p.numel * eb}}};
      data_bytes += p.numel * eb;
    }
  }
  header["__metadata__"] = {{"format", "pt"},
                            {"zoe_checkpoint", r.path()},
                            {"zoe_step", std::to_string(m.step)},
                            {"zoe_source_state", kind}};
  // Every parameter element must be in some rank's file: check before writing anything.
  for (uint32_t mi = 0; mi < m.modules.size(); ++mi) {
    std::vector<std::pair<uint64_t, uint64_t>> have;  // [begin, end) of the records of `kind`
    for (const auto& t : m.tensors) {
      if (t.module == mi && t.kind == kind && t.count > 0) have.emplace_back(t.begin, t.begin + t.count);
    }
    std::sort(have.begin(), have.end());
    for (const auto& p : m.modules[mi].params) {
      uint64_t pos = p.offset;  // the first element not yet known to be covered
      for (const auto& [b, e] : have) {
        if (b > pos) break;
        pos = std::max(pos, e);
      }
      if (pos < p.offset + p.numel) {
        return not_found("consolidate: checkpoint %s: element %" PRIu64 " of %s.%s (module element %" PRIu64
                         ") has no '%s' state in any rank's file",
                         r.path().c_str(), pos - p.offset, m.modules[mi].name.c_str(), p.name.c_str(), pos,
                         kind.c_str());
      }
    }
  }
  std::string htext = header.dump();
  htext.append((8 - htext.size() % 8) % 8, ' ');
  uint64_t hlen = htext.size();
  unsigned char len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<unsigned char>(hlen >> (8 * i));

  std::string tmp = out_path + ".tmp-" + std::to_string(getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return sys_error("create", tmp, errno);
  auto body = [&]() -> Status {
    uint64_t off = 0;
    ZOE_RETURN_IF_ERROR(detail::pwrite_all(fd, tmp, len_le, 8, off));
    off += 8;
    ZOE_RETURN_IF_ERROR(detail::pwrite_all(fd, tmp, htext.data(), htext.size(), off));
    off += htext.size();
    const uint64_t data_start = off;
    // Each rank file once, start to end: scan_file checks every tensor's and the file's xxh64
    // while the pieces of `kind` records are converted and written where their parameters go.
    std::vector<char> scratch;  // conversions only, at most 1 MiB
    for (size_t fi = 0; fi < m.files.size(); ++fi) {
      std::vector<const TensorRecord*> recs;  // the `kind` records in this file
      for (const auto& t : m.tensors) {
        char name[32];
        snprintf(name, sizeof(name), "rank-%05d.bin", t.rank);
        if (t.kind == kind && t.bytes > 0 && m.files[fi].name == name) recs.push_back(&t);
      }
      auto on_piece = [&](uint64_t at, const void* data, size_t n) -> Status {
        for (const TensorRecord* t : recs) {
          const uint64_t lo = std::max(at, t->offset), hi = std::min(at + n, t->offset + t->bytes);
          if (lo >= hi) continue;
          const size_t ib = dtype_bytes(t->dtype);
          // Pieces and tensors start at multiples of kTensorAlign: no element straddles two pieces.
          const uint64_t e0 = t->begin + (lo - t->offset) / ib, e1 = t->begin + (hi - t->offset) / ib;
          const auto& params = m.modules[t->module].params;
          for (size_t pi = 0; pi < params.size(); ++pi) {
            const ParamInfo& p = params[pi];
            const uint64_t a = std::max(e0, p.offset), b = std::min(e1, p.offset + p.numel);
            if (a >= b) continue;
            const char* src = static_cast<const char*>(data) + (t->offset + (a - t->begin) * ib - at);
            uint64_t dst = data_start + out_at[t->module][pi] + (a - p.offset) * eb;
            if (t->dtype == dtype) {
              ZOE_RETURN_IF_ERROR(detail::pwrite_all(fd, tmp, src, static_cast<size_t>((b - a) * eb), dst));
              continue;
            }
            const uint64_t per = (1u << 20) / std::max(eb, ib);
            for (uint64_t k = a; k < b;) {
              const uint64_t c = std::min(b - k, per);
              scratch.resize(static_cast<size_t>(c * eb));
              detail::convert_elements(t->dtype, src + (k - a) * ib, dtype, scratch.data(),
                                       static_cast<size_t>(c));
              ZOE_RETURN_IF_ERROR(
                  detail::pwrite_all(fd, tmp, scratch.data(), scratch.size(), dst + (k - a) * eb));
              k += c;
            }
          }
        }
        return Status::ok();
      };
      ZOE_RETURN_IF_ERROR(r.scan_file(fi, piece_bytes, on_piece));
    }
    ZOE_RETURN_IF_ERROR(detail::fsync_fd(fd, tmp));
    int f = fd;
    fd = -1;
    if (close(f) != 0) return sys_error("close", tmp, errno);
    if (rename(tmp.c_str(), out_path.c_str()) != 0) return sys_error("rename to " + out_path, tmp, errno);
    return detail::fsync_dir(detail::parent_dir(out_path));
  };
  Status s = body();
  if (fd >= 0) close(fd);
  if (!s.is_ok()) {
    unlink(tmp.c_str());
    return std::move(s).with_context("writing " + out_path + " from checkpoint " + r.path());
  }
  return Status::ok();
}

}  // namespace zoe::ckpt
