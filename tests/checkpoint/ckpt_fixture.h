// Deterministic checkpoints for the checkpoint tests: a few modules, partitioned over W ranks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "checkpoint/xxh64.h"
#include "core/dtype.h"
#include "optim/lowbit.h"

namespace zoe::ckpt::test {

// Module layout: padded sizes are deliberately not multiples of the world sizes used.
inline std::vector<ModuleInfo> small_modules() {
  std::vector<ModuleInfo> m(3);
  m[0].name = "embed";
  m[0].params = {{"weight", {50, 8}, 0, 400}};
  m[0].padded = 403;
  m[1].name = "block0";
  m[1].params = {{"attn.w", {8, 24}, 0, 192}, {"attn.b", {24}, 192, 24}, {"mlp.w", {8, 32}, 216, 256}};
  m[1].padded = 475;
  m[2].name = "head";
  m[2].params = {{"weight", {8, 50}, 0, 400}};
  m[2].padded = 400;
  return m;
}

// The exact value of element i of a module's state ("master" and "exp_avg" are stored in f32,
// "param" in bf16 as the rounding of master).
inline float master_value(uint32_t module, uint64_t i) {
  uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(module) << 56);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return (static_cast<float>(h >> 40) / static_cast<float>(1 << 24) - 0.5f) * 4.0f;
}
inline float exp_avg_value(uint32_t module, uint64_t i) { return master_value(module + 17, i) * 0.01f; }

inline std::string stored_dtype(const std::string& kind) { return kind == "param" ? "bf16" : "f32"; }

// Stored bytes of element i in the stored dtype.
inline void stored_bytes(uint32_t module, const std::string& kind, uint64_t i, void* out) {
  if (kind == "param") {
    uint16_t b = f32_to_bf16(master_value(module, i));
    std::memcpy(out, &b, 2);
  } else {
    float f = kind == "master" ? master_value(module, i) : exp_avg_value(module, i);
    std::memcpy(out, &f, 4);
  }
}

// Element i as f32 after a conversion from the stored dtype to `out` dtype.
inline void expected_bytes(uint32_t module, const std::string& kind, uint64_t i, const std::string& out_dtype,
                           void* out) {
  float f = kind == "master"    ? master_value(module, i)
            : kind == "exp_avg" ? exp_avg_value(module, i)
                                : bf16_to_f32(f32_to_bf16(master_value(module, i)));
  if (out_dtype == "f32") {
    std::memcpy(out, &f, 4);
  } else {
    uint16_t h = out_dtype == "bf16" ? f32_to_bf16(f) : f32_to_f16(f);
    std::memcpy(out, &h, 2);
  }
}

// [begin, end) of rank r's partition of n elements over w ranks (the last ones may be shorter).
inline std::pair<uint64_t, uint64_t> partition(uint64_t n, int w, int r) {
  uint64_t per = (n + static_cast<uint64_t>(w) - 1) / static_cast<uint64_t>(w);
  uint64_t b = std::min<uint64_t>(n, per * static_cast<uint64_t>(r));
  return {b, std::min<uint64_t>(n, b + per)};
}

inline const std::vector<std::string>& kinds() {
  static const std::vector<std::string> k = {"master", "exp_avg", "param"};
  return k;
}

// Writes one rank's partitions of every module and kind, appending in odd-sized pieces.
inline Status write_rank(RankWriter& w, const std::vector<ModuleInfo>& modules, int world, int rank) {
  std::vector<unsigned char> piece;
  for (uint32_t m = 0; m < modules.size(); ++m) {
    auto [b, e] = partition(modules[m].padded, world, rank);
    if (b == e) continue;
    for (const auto& kind : kinds()) {
      const std::string dt = stored_dtype(kind);
      const size_t eb = dtype_bytes(dt);
      ZOE_RETURN_IF_ERROR(w.begin_tensor(m, kind, dt, b, e - b));
      const uint64_t kPiece = 4093;  // elements; odd so that pieces straddle everything
      for (uint64_t i = b; i < e;) {
        uint64_t k = std::min(kPiece, e - i);
        piece.resize(k * eb);
        for (uint64_t j = 0; j < k; ++j) stored_bytes(m, kind, i + j, &piece[j * eb]);
        ZOE_RETURN_IF_ERROR(w.append(piece.data(), piece.size()));
        i += k;
      }
      ZOE_RETURN_IF_ERROR(w.end_tensor());
    }
  }
  return Status::ok();
}

// A whole save, as the engine does it (all ranks in this process). On failure the temporary
// directory is removed (abort_checkpoint), as a caller must.
inline Status save(const std::string& dir, const std::string& tag, int world, int64_t step,
                   const std::vector<ModuleInfo>& modules = small_modules()) {
  ZOE_ASSIGN_OR_RETURN(std::string tmp, begin_checkpoint(dir, tag));
  Manifest man;
  man.world_size = world;
  man.stage = 2;
  man.step = step;
  man.modules = modules;
  man.engine = {{"steps", step}, {"loss_scale", 65536.0}, {"precision", "bf16"}};
  man.trainer = {{"step", step}, {"data_position", 1234}, {"seed", 42}};
  for (int r = 0; r < world; ++r) {
    auto w = RankWriter::create(tmp, r);
    if (!w.is_ok()) {
      abort_checkpoint(tmp);
      return w.status();
    }
    Status s = write_rank(*w.value(), modules, world, r);
    FileInfo fi;
    if (s.is_ok()) s = w.value()->finish(&man.tensors, &fi);
    if (!s.is_ok()) {
      abort_checkpoint(tmp);
      return s;
    }
    man.files.push_back(fi);
  }
  return commit_checkpoint(dir, tag, tmp, man);
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// Rewrites checkpoint ck's manifest.xxh64 to match manifest.json as it is now: what an edit of
// the manifest needs to get past the checksum and reach the structural checks behind it.
inline void reseal(const std::string& ck) {
  const std::string text = read_file(ck + "/" + kManifestName);
  detail::Xxh64 h;
  h.update(text.data(), text.size());
  write_file(ck + "/" + kManifestChecksumName, detail::hex64(h.digest()) + "  " + kManifestName + "\n");
}

// Parses ck's manifest, applies `edit`, writes it back (dump(1), as the writer does); resealed
// or not.
inline void edit_manifest(const std::string& ck, const std::function<void(nlohmann::json&)>& edit,
                          bool resealed) {
  nlohmann::json j = nlohmann::json::parse(read_file(ck + "/" + kManifestName));
  edit(j);
  write_file(ck + "/" + kManifestName, j.dump(1) + "\n");
  if (resealed) reseal(ck);
}

// ---- Packed optimizer states ----

// Module "big" (8269 elements) and "small" (300: int8 one block and a partial one, int4 two and a
// partial one).
inline std::vector<ModuleInfo> packed_modules() {
  std::vector<ModuleInfo> m(2);
  m[0].name = "big";
  m[0].params = {{"w", {8269}, 0, 8269}};
  m[0].padded = 8269;
  m[1].name = "small";
  m[1].params = {{"w", {3, 100}, 0, 300}};
  m[1].padded = 300;
  return m;
}

// Rank r's range as the engine partitions packed states: every rank starts at a multiple of 2048
// elements. Over 2 ranks, big's ranges are [0, 6144) and [6144, 8269) (a partial last block).
inline std::pair<uint64_t, uint64_t> packed_partition(uint64_t n, int w, int r) {
  const uint64_t per = ((n + static_cast<uint64_t>(w) - 1) / static_cast<uint64_t>(w) + 2047) / 2048 * 2048;
  const uint64_t b = std::min<uint64_t>(n, per * static_cast<uint64_t>(r));
  return {b, std::min<uint64_t>(n, b + per)};
}

// A module's m ("exp_avg": signed, magnitudes over 4 decades) or v ("exp_avg_sq": >= 0, some
// exact zeros, over 8 decades).
inline std::vector<float> moment_values(uint32_t module, const std::string& kind, uint64_t n) {
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) {
    const float x = master_value(module + 5, i), scale = std::pow(10.0f, -static_cast<float>(i % 5));
    v[i] = kind == "exp_avg" ? x * 1e-2f * scale : (i % 11 == 0 ? 0.0f : x * x * 1e-4f * scale * scale);
  }
  return v;
}

inline optim::StateKind state_kind(const std::string& kind) {
  return kind == "exp_avg" ? optim::StateKind::kExpAvg : optim::StateKind::kExpAvgSq;
}

// The packed bytes of elements [b, e) of a module's moment (b a multiple of the block).
inline std::vector<unsigned char> packed_moment(optim::StateFormat f, uint32_t module,
                                                const std::string& kind, uint64_t n, uint64_t b, uint64_t e) {
  const std::vector<float> v = moment_values(module, kind, n);
  std::vector<unsigned char> out(optim::state_bytes(f, e - b));
  const Status s = optim::quantize_state(state_kind(kind), f, v.data() + b, out.data(), e - b);
  if (!s.is_ok()) out.clear();
  return out;
}

// A save whose moments are stored in packed dtype `dt` ("int8b256" or "int4b128", format f),
// its masters in f32 and its parameters in bf16, partitioned by packed_partition.
inline Status save_packed(const std::string& dir, const std::string& tag, int world, const std::string& dt,
                          optim::StateFormat f) {
  const std::vector<ModuleInfo> modules = packed_modules();
  ZOE_ASSIGN_OR_RETURN(std::string tmp, begin_checkpoint(dir, tag));
  Manifest man;
  man.world_size = world;
  man.step = 4;
  man.modules = modules;
  man.engine = {{"steps", 4}};
  auto rank = [&](int r) -> Status {
    ZOE_ASSIGN_OR_RETURN(auto w, RankWriter::create(tmp, r));
    for (uint32_t m = 0; m < modules.size(); ++m) {
      auto [b, e] = packed_partition(modules[m].padded, world, r);
      if (b == e) continue;
      std::vector<float> master(e - b);
      std::vector<uint16_t> param(e - b);
      for (uint64_t i = b; i < e; ++i) master[i - b] = master_value(m, i);
      for (uint64_t i = b; i < e; ++i) param[i - b] = f32_to_bf16(master_value(m, i));
      ZOE_RETURN_IF_ERROR(w->begin_tensor(m, "param", "bf16", b, e - b));
      ZOE_RETURN_IF_ERROR(w->append(param.data(), param.size() * 2));
      ZOE_RETURN_IF_ERROR(w->end_tensor());
      ZOE_RETURN_IF_ERROR(w->begin_tensor(m, "master", "f32", b, e - b));
      ZOE_RETURN_IF_ERROR(w->append(master.data(), master.size() * 4));
      ZOE_RETURN_IF_ERROR(w->end_tensor());
      for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
        const std::vector<unsigned char> bytes = packed_moment(f, m, kind, modules[m].padded, b, e);
        ZOE_RETURN_IF_ERROR(w->begin_tensor(m, kind, dt, b, e - b));
        const size_t half = bytes.size() / 2 + 1;  // two odd pieces
        ZOE_RETURN_IF_ERROR(w->append(bytes.data(), half));
        ZOE_RETURN_IF_ERROR(w->append(bytes.data() + half, bytes.size() - half));
        ZOE_RETURN_IF_ERROR(w->end_tensor());
      }
    }
    FileInfo fi;
    ZOE_RETURN_IF_ERROR(w->finish(&man.tensors, &fi));
    man.files.push_back(fi);
    return Status::ok();
  };
  for (int r = 0; r < world; ++r) {
    Status s = rank(r);
    if (!s.is_ok()) {
      abort_checkpoint(tmp);
      return s;
    }
  }
  return commit_checkpoint(dir, tag, tmp, man);
}

}  // namespace zoe::ckpt::test
