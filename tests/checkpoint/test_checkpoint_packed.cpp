// Checkpoints with packed optimizer states (optim/lowbit.h's int8 and int4 blockwise formats):
// the stored bytes read back bit for bit from one record or several, conversions to and from
// floats equal the quantizer's, refusals name what is wrong, consolidate dequantizes the moments.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "checkpoint/checkpoint.h"
#include "optim/lowbit.h"
#include "tests/checkpoint/ckpt_fixture.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::ckpt {
namespace {

using optim::StateFormat;
using test::moment_values;
using test::packed_modules;
using test::packed_moment;
using test::save_packed;
using test::state_kind;
using zoe::test::first_mismatch;
using zoe::test::ScratchDir;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

struct Packed {
  const char* dtype;
  StateFormat format;
  uint64_t block;
};
const Packed kPacked[] = {{"int8b256", StateFormat::kInt8, 256}, {"int4b128", StateFormat::kInt4, 128}};

std::unique_ptr<Reader> open_ok(const std::string& dir) {
  auto r = Reader::open(dir);
  EXPECT_OK(r);
  return r.is_ok() ? std::move(r).value() : nullptr;
}

// read_range into a buffer of `bytes`, checking that it writes no byte past them.
std::vector<unsigned char> read_bytes(const Reader& r, uint32_t m, const std::string& kind, uint64_t b,
                                      uint64_t n, const std::string& dt, size_t bytes) {
  std::vector<unsigned char> out(bytes + 64, 0xA5);
  Status s = r.read_range(m, kind, b, n, dt, out.data());
  EXPECT_OK(s);
  for (size_t i = bytes; i < out.size(); ++i) EXPECT_EQ(out[i], 0xA5) << "wrote past " << bytes;
  out.resize(bytes);
  return out;
}

std::vector<float> dequantized(StateFormat f, const std::string& kind,
                               const std::vector<unsigned char>& bytes, uint64_t n) {
  std::vector<float> v(n);
  EXPECT_OK(optim::dequantize_state(state_kind(kind), f, bytes.data(), v.data(), n));
  return v;
}

TEST(CheckpointPacked, SameDtypeBitIdenticalAcrossRanks) {
  ScratchDir d("ckpt-packed");
  for (const Packed& p : kPacked) {
    for (int world : {1, 2}) {
      const std::string tag = std::string(p.dtype) + "-w" + std::to_string(world);
      ASSERT_OK(save_packed(d.path(), tag, world, p.dtype, p.format));
      auto r = open_ok(d.path() + "/" + tag);
      ASSERT_TRUE(r);
      EXPECT_OK(r->verify());
      EXPECT_OK(r->check_complete());
      // Each record holds state_bytes() of its count; over 2 ranks big's records are 6144 + 2125.
      for (const TensorRecord& t : r->manifest().tensors) {
        if (t.kind == "master" || t.kind == "param") continue;
        EXPECT_EQ(t.dtype, p.dtype);
        EXPECT_EQ(t.bytes, optim::state_bytes(p.format, t.count))
            << t.kind << " [" << t.begin << ", +" << t.count;
        if (world == 2 && t.module == 0) {
          EXPECT_EQ(t.count, t.rank == 0 ? 6144u : 2125u);
        }
      }
      for (uint32_t m = 0; m < 2; ++m) {
        const uint64_t n = packed_modules()[m].padded;
        for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
          // The whole module: the quantizer's bytes of the whole, which are the records' bytes
          // concatenated (every record starts at a block).
          const auto want = packed_moment(p.format, m, kind, n, 0, n);
          ASSERT_FALSE(want.empty());
          EXPECT_EQ(first_mismatch(read_bytes(*r, m, kind, 0, n, p.dtype, want.size()).data(), want.data(),
                                   want.size()),
                    -1)
              << p.dtype << " w" << world << " module " << m << " " << kind;
          // Block-aligned pieces: inside a record, across the rank boundary, to the end.
          const uint64_t B = p.block;
          for (auto [b, e] : std::vector<std::pair<uint64_t, uint64_t>>{
                   {B, 3 * B}, {6144 - 2 * B, 6144 + 3 * B}, {6144 - B, n}, {n / B * B, n}}) {
            if (e > n || b >= e) continue;
            const size_t off = optim::state_bytes(p.format, b), len = optim::state_bytes(p.format, e - b);
            const auto got = read_bytes(*r, m, kind, b, e - b, p.dtype, len);
            EXPECT_EQ(first_mismatch(got.data(), want.data() + off, len), -1)
                << p.dtype << " w" << world << " " << kind << " [" << b << ", " << e << ")";
          }
        }
      }
    }
  }
}

TEST(CheckpointPacked, ToFloatsIsTheDequantizedState) {
  ScratchDir d("ckpt-packed");
  std::mt19937_64 rng(3);
  for (const Packed& p : kPacked) {
    ASSERT_OK(save_packed(d.path(), p.dtype, 2, p.dtype, p.format));
    auto r = open_ok(d.path() + "/" + p.dtype);
    ASSERT_TRUE(r);
    const uint64_t n = 8269;
    for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
      const std::vector<float> want =
          dequantized(p.format, kind, packed_moment(p.format, 0, kind, n, 0, n), n);
      const auto got = read_bytes(*r, 0, kind, 0, n, "f32", n * 4);
      EXPECT_EQ(first_mismatch(got.data(), want.data(), n * 4), -1) << p.dtype << " " << kind;
      // Any range (not block-aligned, across the ranks), in f32 and bf16.
      for (int k = 0; k < 20; ++k) {
        const uint64_t b = rng() % n, c = 1 + rng() % (n - b);
        const auto f = read_bytes(*r, 0, kind, b, c, "f32", c * 4);
        EXPECT_EQ(first_mismatch(f.data(), want.data() + b, c * 4), -1) << p.dtype << " [" << b << ", +" << c;
        const auto h = read_bytes(*r, 0, kind, b, c, "bf16", c * 2);
        std::vector<uint16_t> hw(c);
        for (uint64_t i = 0; i < c; ++i) hw[i] = f32_to_bf16(want[b + i]);
        EXPECT_EQ(first_mismatch(h.data(), hw.data(), c * 2), -1) << p.dtype << " bf16 [" << b << ", +" << c;
      }
    }
  }
}

TEST(CheckpointPacked, FromFloatsIsTheQuantizedState) {
  // The fixture's fp32-state checkpoint over 2 ranks: its exp_avg records split at element 202,
  // inside a block, so one output block gathers from both.
  ScratchDir d("ckpt-packed");
  ASSERT_OK(test::save(d.path(), "f32", 2, 1));
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);
  const uint64_t n = 403;
  std::vector<float> vals(n);
  for (uint64_t i = 0; i < n; ++i) vals[i] = test::exp_avg_value(0, i);
  for (const Packed& p : kPacked) {
    std::vector<unsigned char> want(optim::state_bytes(p.format, n));
    ASSERT_OK(optim::quantize_state(optim::StateKind::kExpAvg, p.format, vals.data(), want.data(), n));
    const auto got = read_bytes(*r, 0, "exp_avg", 0, n, p.dtype, want.size());
    EXPECT_EQ(first_mismatch(got.data(), want.data(), want.size()), -1) << p.dtype;
    // From the second block to the end.
    const uint64_t b = p.block;
    std::vector<unsigned char> tail(optim::state_bytes(p.format, n - b));
    ASSERT_OK(
        optim::quantize_state(optim::StateKind::kExpAvg, p.format, vals.data() + b, tail.data(), n - b));
    const auto got_tail = read_bytes(*r, 0, "exp_avg", b, n - b, p.dtype, tail.size());
    EXPECT_EQ(first_mismatch(got_tail.data(), tail.data(), tail.size()), -1) << p.dtype;
  }
  // Packed to another packed dtype: through f32.
  ASSERT_OK(save_packed(d.path(), "i8", 2, "int8b256", StateFormat::kInt8));
  auto r8 = open_ok(d.path() + "/i8");
  ASSERT_TRUE(r8);
  const uint64_t nb = 8269;
  const auto v8 = dequantized(StateFormat::kInt8, "exp_avg_sq",
                              packed_moment(StateFormat::kInt8, 0, "exp_avg_sq", nb, 0, nb), nb);
  std::vector<unsigned char> want4(optim::state_bytes(StateFormat::kInt4, nb));
  ASSERT_OK(
      optim::quantize_state(optim::StateKind::kExpAvgSq, StateFormat::kInt4, v8.data(), want4.data(), nb));
  const auto got4 = read_bytes(*r8, 0, "exp_avg_sq", 0, nb, "int4b128", want4.size());
  EXPECT_EQ(first_mismatch(got4.data(), want4.data(), want4.size()), -1);
}

TEST(CheckpointPacked, RefusalsNameWhatIsWrong) {
  ScratchDir d("ckpt-packed");
  ASSERT_OK(save_packed(d.path(), "s", 2, "int8b256", StateFormat::kInt8));
  const std::string ck = d.path() + "/s";
  auto r = open_ok(ck);
  ASSERT_TRUE(r);
  std::vector<unsigned char> buf(1 << 16);
  // Not block-aligned in the packed output.
  Status s = r->read_range(0, "exp_avg", 100, 512, "int8b256", buf.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "elements [100, 612) of module 'big' 'exp_avg' state as int8b256");
  EXPECT_HAS(s.message(), "the start is not a multiple of its block of 256 elements");
  s = r->read_range(0, "exp_avg", 256, 300, "int8b256", buf.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "elements [256, 556)");
  EXPECT_HAS(s.message(), "the end is neither a multiple of its block");
  // A packed dtype for a state other than the moments.
  s = r->read_range(0, "master", 0, 256, "int8b256", buf.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(),
             "'int8b256' (packed) holds only 'exp_avg', 'exp_avg_sq' and 'sum' states, not 'master'");

  // The writer refuses both.
  auto tmp = begin_checkpoint(d.path(), "t");
  ASSERT_OK(tmp);
  {
    auto w = RankWriter::create(tmp.value(), 0);
    ASSERT_OK(w);
    s = w.value()->begin_tensor(0, "master", "int8b256", 0, 256);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_HAS(s.message(), "module 0 'master' [0, +256): dtype 'int8b256' (packed) holds only");
    s = w.value()->begin_tensor(0, "exp_avg", "int4b128", 100, 256);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_HAS(s.message(), "begin 100 is not a multiple of int4b128's block of 128 elements");
  }
  abort_checkpoint(tmp.value());

  // A manifest edited (and resealed) to the same: corruption naming the manifest and the record.
  const std::string mp = ck + "/manifest.json";
  const std::string text = test::read_file(mp);
  size_t master = 0, packed = 0;  // a master record and rank 1's exp_avg of big (begin 6144)
  const auto& ts = r->manifest().tensors;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].kind == "master") master = i;
    if (ts[i].kind == "exp_avg" && ts[i].begin == 6144) packed = i;
  }
  test::edit_manifest(
      ck, [&](nlohmann::json& j) { j["tensors"][master]["dtype"] = "int8b256"; }, true);
  auto bad = Reader::open(ck);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
  EXPECT_HAS(bad.status().message(),
             mp + ": key 'tensors[" + std::to_string(master) +
                 "].dtype': expected \"f32\", \"bf16\" or \"f16\" for a 'master' state "
                 "(int8b256 holds only 'exp_avg', 'exp_avg_sq' and 'sum')");
  test::write_file(mp, text);
  test::edit_manifest(
      ck, [&](nlohmann::json& j) { j["tensors"][packed]["begin"] = 6145; }, true);
  bad = Reader::open(ck);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
  EXPECT_HAS(bad.status().message(), mp + ": key 'tensors[" + std::to_string(packed) +
                                         "].begin': expected a multiple of int8b256's block of 256 elements, "
                                         "found number 6145");
  test::write_file(mp, text);
  test::edit_manifest(
      ck, [&](nlohmann::json& j) { j["tensors"][packed]["bytes"] = 2125; }, true);
  bad = Reader::open(ck);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_HAS(bad.status().message(), "key 'tensors[" + std::to_string(packed) +
                                         "].bytes': expected the bytes of count elements of int8b256 (2161)");
}

TEST(CheckpointPacked, NonFiniteValuesAndScalesNameTheState) {
  ScratchDir d("ckpt-packed");
  auto tmp = begin_checkpoint(d.path(), "s");
  ASSERT_OK(tmp);
  Manifest man;
  man.modules = {{"layer", 512, {{"w", {512}, 0, 512}}}};
  auto w = RankWriter::create(tmp.value(), 0);
  ASSERT_OK(w);
  // exp_avg in f32 with a NaN at 300; exp_avg_sq packed with an infinite scale in its 2nd block.
  std::vector<float> m(512, 0.5f);
  m[300] = NAN;
  ASSERT_OK(w.value()->begin_tensor(0, "exp_avg", "f32", 0, 512));
  ASSERT_OK(w.value()->append(m.data(), m.size() * 4));
  ASSERT_OK(w.value()->end_tensor());
  std::vector<unsigned char> v(optim::state_bytes(StateFormat::kInt8, 512), 0);
  const float inf = INFINITY;
  std::memcpy(v.data() + 260, &inf, 4);
  ASSERT_OK(w.value()->begin_tensor(0, "exp_avg_sq", "int8b256", 0, 512));
  ASSERT_OK(w.value()->append(v.data(), v.size()));
  ASSERT_OK(w.value()->end_tensor());
  FileInfo fi;
  ASSERT_OK(w.value()->finish(&man.tensors, &fi));
  man.files = {fi};
  ASSERT_OK(commit_checkpoint(d.path(), "s", tmp.value(), man));
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);
  std::vector<unsigned char> buf(4096);
  Status s = r->read_range(0, "exp_avg", 0, 512, "int8b256", buf.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "non-finite (inf or NaN)");
  EXPECT_HAS(s.message(), "while storing elements [0, 512) of module 'layer' 'exp_avg' state of checkpoint " +
                              d.path() + "/s as int8b256");
  ASSERT_OK(r->read_range(0, "exp_avg", 0, 256, "int8b256", buf.data()));  // the first block is finite
  s = r->read_range(0, "exp_avg_sq", 0, 512, "f32", buf.data());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_HAS(s.message(), "is not finite");
  EXPECT_HAS(s.message(),
             "while decoding elements [0, 512) of module 'layer' 'exp_avg_sq' state of checkpoint " +
                 d.path() + "/s (int8b256)");
  ASSERT_OK(r->read_range(0, "exp_avg_sq", 0, 256, "f32", buf.data()));
}

TEST(CheckpointPacked, ConsolidateDequantizesTheMoments) {
  ScratchDir d("ckpt-packed"), o("ckpt-packed-out");
  ASSERT_OK(save_packed(d.path(), "s", 2, "int4b128", StateFormat::kInt4));
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);
  for (const char* dt : {"fp32", "bf16"}) {
    const std::string out = o.file(std::string("m-") + dt + ".safetensors");
    ASSERT_OK(consolidate(*r, out, dt, 4096, true));  // small pieces: records straddle them
    std::ifstream f(out, std::ios::binary);
    uint64_t hlen = 0;
    f.read(reinterpret_cast<char*>(&hlen), 8);
    std::string htext(hlen, '\0');
    f.read(htext.data(), static_cast<std::streamsize>(hlen));
    const auto header = nlohmann::json::parse(htext);
    EXPECT_EQ(header.size(), 2u * 3u + 1u);  // w, w.exp_avg, w.exp_avg_sq of 2 modules, metadata
    const size_t eb = std::string(dt) == "fp32" ? 4 : 2;
    for (uint32_t m = 0; m < 2; ++m) {
      const ModuleInfo mod = packed_modules()[m];
      for (const std::string kind : {"", "exp_avg", "exp_avg_sq"}) {
        const std::string name = mod.name + ".w" + (kind.empty() ? "" : "." + kind);
        ASSERT_TRUE(header.contains(name)) << name;
        const auto& e = header[name];
        EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), mod.params[0].shape);
        const uint64_t a = e["data_offsets"][0], b = e["data_offsets"][1], n = mod.padded;
        ASSERT_EQ(b - a, n * eb);
        std::vector<float> want(n);
        if (kind.empty()) {
          for (uint64_t i = 0; i < n; ++i) want[i] = test::master_value(m, i);
        } else {
          want =
              dequantized(StateFormat::kInt4, kind, packed_moment(StateFormat::kInt4, m, kind, n, 0, n), n);
        }
        std::vector<unsigned char> got(n * eb), wb(n * eb);
        f.seekg(static_cast<std::streamoff>(8 + hlen + a));
        ASSERT_TRUE(f.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size())));
        for (uint64_t i = 0; i < n; ++i) {
          if (eb == 4) {
            std::memcpy(&wb[i * 4], &want[i], 4);
          } else {
            const uint16_t h = f32_to_bf16(want[i]);
            std::memcpy(&wb[i * 2], &h, 2);
          }
        }
        EXPECT_EQ(first_mismatch(got.data(), wb.data(), got.size()), -1) << dt << " " << name;
      }
    }
  }
  // Without moments in the checkpoint: kNotFound, nothing written.
  ScratchDir d2("ckpt-packed");
  ASSERT_OK(test::save(d2.path(), "s", 1, 1, test::small_modules()));
  auto r2 = open_ok(d2.path());
  ASSERT_TRUE(r2);
  Status s = consolidate(*r2, o.file("x.safetensors"), "fp32", kConsolidatePiece, true);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_HAS(s.message(), "holds no optimizer moments");
  EXPECT_FALSE(std::filesystem::exists(o.file("x.safetensors")));
}

}  // namespace
}  // namespace zoe::ckpt
