// Tests of the Hugging Face GPT-2 export: names, Conv1D transposes and conversions checked element
// by element against the fixture's values for a checkpoint partitioned over 3 ranks, config.json,
// refusals (not a GPT, bad n_head, bad --out), and a damaged rank file caught by its checksum.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "checkpoint/checkpoint.h"
#include "export/hf_gpt2.h"
#include "model/gpt.h"
#include "tests/checkpoint/ckpt_fixture.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::ckpt {
namespace {

namespace fs = std::filesystem;
using zoe::test::ScratchDir;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// zoe's GPT layout (src/model/gpt.h) for small dimensions, with padded sizes that are not
// multiples of the world size (partition boundaries fall inside rows).
std::vector<ModuleInfo> gpt_layout(const model::GptConfig& c) {
  std::vector<ModuleInfo> out;
  for (const auto& m : model::gpt_modules(c)) {
    ModuleInfo mi;
    mi.name = m.name;
    uint64_t off = 0;
    for (const auto& t : m.params) {
      mi.params.push_back({t.name, t.shape, off, t.numel()});
      off += t.numel();
    }
    mi.padded = off + 5;
    out.push_back(mi);
  }
  return out;
}

model::GptConfig small_gpt() {
  model::GptConfig c;
  c.vocab = 37;
  c.seq = 11;
  c.d_model = 32;
  c.heads = 4;
  c.layers = 2;
  return c;
}

struct St {
  nlohmann::json header;
  std::string data;  // the data section
};

St read_st(const std::string& path) {
  std::string all = test::read_file(path);
  St st;
  if (all.size() < 8) return st;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(all[static_cast<size_t>(i)]);
  st.header = nlohmann::json::parse(all.substr(8, n));
  st.data = all.substr(8 + n);
  return st;
}

// HF name -> (module, param, transposed), independently of hf_gpt2.cpp's table.
std::map<std::string, std::tuple<uint32_t, size_t, bool>> expected_names(int layers) {
  std::map<std::string, std::tuple<uint32_t, size_t, bool>> m;
  m["transformer.wte.weight"] = {0, 0, false};
  m["transformer.wpe.weight"] = {0, 1, false};
  const char* names[] = {"ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
                         "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
                         "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  for (int l = 0; l < layers; ++l) {
    for (size_t p = 0; p < 12; ++p) {
      const bool t = p == 2 || p == 4 || p == 8 || p == 10;
      m["transformer.h." + std::to_string(l) + "." + names[p]] = {static_cast<uint32_t>(l + 1), p, t};
    }
  }
  m["transformer.ln_f.weight"] = {static_cast<uint32_t>(layers + 1), 0, false};
  m["transformer.ln_f.bias"] = {static_cast<uint32_t>(layers + 1), 1, false};
  return m;
}

TEST(HfGpt2, ExportNamesLayoutsAndValues) {
  ScratchDir d("hf"), od("hf-out");  // outputs outside the save directory
  const model::GptConfig c = small_gpt();
  const auto mods = gpt_layout(c);
  ASSERT_OK(test::save(d.path(), "s", 3, 7, mods));
  auto rr = Reader::open(d.path());
  ASSERT_OK(rr);
  const Reader& r = *rr.value();
  auto dims = gpt_dims(r.manifest(), "test");
  ASSERT_OK(dims);
  EXPECT_EQ(dims.value().vocab, 37);
  EXPECT_EQ(dims.value().n_positions, 11);
  EXPECT_EQ(dims.value().n_embd, 32);
  EXPECT_EQ(dims.value().n_layer, 2);

  for (const char* dt : {"fp32", "bf16"}) {
    SCOPED_TRACE(dt);
    const std::string out = od.file(std::string("hf-") + dt);
    HfGpt2Options o;
    o.n_head = 4;
    o.dtype = dt;
    o.piece_bytes = 4096;  // pieces end inside rows of every matrix
    Status s = export_hf_gpt2(r, out, o);
    ASSERT_OK(s);
    const std::string sdt = std::string(dt) == "fp32" ? "f32" : "bf16";
    const size_t eb = dtype_bytes(sdt);
    St st = read_st(out + "/model.safetensors");
    const auto want = expected_names(c.layers);
    EXPECT_EQ(st.header.size(), want.size() + 1);  // + __metadata__
    EXPECT_EQ(st.header["__metadata__"]["zoe_export"], "hf-gpt2");
    for (const auto& [name, where] : want) {
      SCOPED_TRACE(name);
      const auto [mi, pi, tr] = where;
      const ParamInfo& p = mods[mi].params[pi];
      const auto& e = st.header[name];
      ASSERT_TRUE(e.is_object());
      EXPECT_EQ(e["dtype"], std::string(dt) == "fp32" ? "F32" : "BF16");
      std::vector<int64_t> shape = p.shape;
      if (tr) std::swap(shape[0], shape[1]);
      ASSERT_EQ(e["shape"].get<std::vector<int64_t>>(), shape);
      const uint64_t a = e["data_offsets"][0], b = e["data_offsets"][1];
      ASSERT_EQ(b - a, p.numel * eb);
      ASSERT_LE(b, st.data.size());
      // Output element k is source element k, or (transposed: output [C, R]) element (k % R) * C + k / R.
      long long wrong = 0, first = -1;
      std::vector<unsigned char> w(eb);
      for (uint64_t k = 0; k < p.numel; ++k) {
        uint64_t src = k;
        if (tr) {
          const uint64_t R = static_cast<uint64_t>(p.shape[0]), C = static_cast<uint64_t>(p.shape[1]);
          src = (k % R) * C + k / R;
        }
        test::expected_bytes(mi, "master", p.offset + src, sdt, w.data());
        if (std::memcmp(st.data.data() + a + k * eb, w.data(), eb) != 0) {
          if (first < 0) first = static_cast<long long>(k);
          ++wrong;
        }
      }
      EXPECT_EQ(wrong, 0) << "first wrong output element " << first;
    }
    auto cfg = nlohmann::json::parse(test::read_file(out + "/config.json"));
    EXPECT_EQ(cfg["model_type"], "gpt2");
    EXPECT_EQ(cfg["vocab_size"], 37);
    EXPECT_EQ(cfg["n_positions"], 11);
    EXPECT_EQ(cfg["n_embd"], 32);
    EXPECT_EQ(cfg["n_layer"], 2);
    EXPECT_EQ(cfg["n_head"], 4);
    EXPECT_EQ(cfg["activation_function"], "gelu_new");
    EXPECT_EQ(cfg["tie_word_embeddings"], true);
    EXPECT_FLOAT_EQ(cfg["layer_norm_epsilon"].get<float>(), 1e-5f);
    EXPECT_EQ(cfg["torch_dtype"], std::string(dt) == "fp32" ? "float32" : "bfloat16");
  }
}

TEST(HfGpt2, Refusals) {
  ScratchDir d("hf"), od("hf-out");  // outputs outside the save directory
  // Not zoe's GPT: the fixture's generic modules.
  ASSERT_OK(test::save(d.path() + "", "generic", 1, 1));
  {
    auto r = Reader::open(d.path() + "/generic");
    ASSERT_OK(r);
    HfGpt2Options o;
    o.n_head = 1;
    Status s = export_hf_gpt2(*r.value(), od.file("out"), o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_HAS(s.message(), "reference GPT");
    EXPECT_FALSE(fs::exists(od.file("out/model.safetensors")));
  }
  // A GPT with one block whose fc1_w has the wrong shape.
  const model::GptConfig c = small_gpt();
  auto mods = gpt_layout(c);
  mods[2].params[model::kFc1W].shape = {32, 128};
  ASSERT_OK(test::save(d.path(), "bent", 1, 1, mods));
  {
    auto r = Reader::open(d.path() + "/bent");
    ASSERT_OK(r);
    auto dims = gpt_dims(r.value()->manifest(), "ckpt bent");
    ASSERT_FALSE(dims.is_ok());
    EXPECT_HAS(dims.status().message(), "module 'block.1' is fc1_w [32, 128]");
    EXPECT_HAS(dims.status().message(), "fc1_w [128, 32]");
  }
  ASSERT_OK(test::save(d.path(), "good", 2, 1, gpt_layout(c)));
  auto r = Reader::open(d.path() + "/good");
  ASSERT_OK(r);
  HfGpt2Options o;
  o.n_head = 5;  // does not divide 32
  Status s = export_hf_gpt2(*r.value(), od.file("out5"), o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "n_head 5");
  o.n_head = 4;
  o.dtype = "int8";
  EXPECT_EQ(export_hf_gpt2(*r.value(), od.file("out8"), o).code(), StatusCode::kInvalidArgument);
  o.dtype = "fp32";
  test::write_file(od.file("plain"), "x");
  s = export_hf_gpt2(*r.value(), od.file("plain"), o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "not a directory");
  s = export_hf_gpt2(*r.value(), od.file("no/such/dir"), o);
  EXPECT_FALSE(s.is_ok());
  EXPECT_HAS(s.to_string(), "no/such/dir");
}

// One flipped byte inside a rank file's tensor: the export fails naming the file and leaves no
// model.safetensors (nor its temporary) behind.
TEST(HfGpt2, DamagedRankFileFails) {
  ScratchDir d("hf"), od("hf-out");  // outputs outside the save directory
  ASSERT_OK(test::save(d.path(), "s", 2, 3, gpt_layout(small_gpt())));
  const std::string rank1 = d.path() + "/s/rank-00001.bin";
  {
    std::fstream f(rank1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(4096 + 100);
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x10);
    f.seekp(4096 + 100);
    f.write(&b, 1);
  }
  auto r = Reader::open(d.path());
  ASSERT_OK(r);
  HfGpt2Options o;
  o.n_head = 4;
  const std::string out = od.file("hf");
  Status s = export_hf_gpt2(*r.value(), out, o);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_HAS(s.message(), "rank-00001.bin");
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(out + "/config.json"));
  // Nothing left behind: not the output directory, nor the temporary one beside it.
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(od.path())) ADD_FAILURE() << "left behind: " << e.path();
}

}  // namespace
}  // namespace zoe::ckpt
