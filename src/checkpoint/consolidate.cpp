// consolidate: a checkpoint's full parameters as one safetensors file, streamed in bounded pieces.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>

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
  for (const auto& mod : m.modules) {
    for (const auto& p : mod.params) {
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
    const uint64_t per = std::max<uint64_t>(1, piece_bytes / eb);
    uint64_t largest = 0;
    for (const auto& mod : m.modules) {
      for (const auto& p : mod.params) largest = std::max(largest, p.numel);
    }
    std::vector<char> piece(static_cast<size_t>(std::min(per, largest) * eb));
    for (uint32_t mi = 0; mi < m.modules.size(); ++mi) {
      for (const auto& p : m.modules[mi].params) {
        for (uint64_t done = 0; done < p.numel;) {
          uint64_t k = std::min<uint64_t>(p.numel - done, per);
          ZOE_RETURN_IF_ERROR_CTX(r.read_range(mi, kind, p.offset + done, k, dtype, piece.data()),
                                  "reading " + m.modules[mi].name + "." + p.name);
          ZOE_RETURN_IF_ERROR(detail::pwrite_all(fd, tmp, piece.data(), static_cast<size_t>(k * eb), off));
          off += k * eb;
          done += k;
        }
      }
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
