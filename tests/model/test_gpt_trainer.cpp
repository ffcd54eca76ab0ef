// GptTrainer::sample against the model's own forward pass, offloaded against not offloaded; the
// text corpus's directory loading and the known-word measure `zoe train` reports with a sample.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "model/corpus.h"
#include "model/gpt_trainer.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::model {
namespace {

constexpr int kBatch = 2, kT = 16;

GptConfig tiny() {
  GptConfig c;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 2;
  c.seq = kT;
  c.vocab = 256;
  return c;
}

// An engine holding the tiny GPT, initialised from seed 7, at stage 3 with parameters and
// optimizer states where `off` says (NVMe in `dir`).
struct Rig {
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<Engine> eng;
  std::unique_ptr<GptCpu> model;
  std::unique_ptr<GptTrainer> trainer;
};

Rig make(Offload off, const std::string& dir) {
  Rig s;
  const GptConfig c = tiny();
  auto rt = Runtime::init();
  EXPECT_OK(rt);
  s.rt = std::move(rt).value();
  Config::Builder b;
  b.stage(3).micro_batch(kBatch).precision(ComputeDType::kF32).lr(1e-3).param_persistence_threshold(0);
  if (off != Offload::kNone) b.offload_param(off, {dir}).offload_optimizer(off, {dir});
  auto cfg = b.build(s.rt->world_size());
  EXPECT_OK(cfg);
  auto eng = Engine::create(*s.rt, cfg.value());
  EXPECT_OK(eng);
  s.eng = std::move(eng).value();
  EXPECT_OK(add_gpt_modules(*s.eng, c));
  Status st = s.eng->initialize([&](size_t m, size_t p, float* x, size_t n) { gpt_init(c, 7, m, p, x, n); });
  EXPECT_OK(st);
  auto m = GptCpu::create(c, kBatch, kT, 1);
  EXPECT_OK(m);
  s.model = std::move(m).value();
  s.trainer = std::make_unique<GptTrainer>(*s.eng, *s.model, c, kT);
  return s;
}

// The most likely next byte after each prefix of `text` (<= T bytes), by one plain forward pass.
std::vector<int> argmax_chain(Rig& s, const std::string& text) {
  std::vector<int32_t> tokens(kBatch * kT, ' '), targets(tokens.size(), 0);
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  auto l = s.trainer->forward(tokens, targets);
  EXPECT_OK(l);
  std::vector<int> out;
  for (size_t i = 0; i < text.size(); ++i) {
    const float* row = s.model->logits() + i * 256;
    out.push_back(static_cast<int>(std::max_element(row, row + 256) - row));
  }
  return out;
}

TEST(GptTrainerSample, GreedyIsTheForwardPassArgmax) {
  test::ScratchDir dir("sample");
  Rig s = make(Offload::kNone, dir.path());
  const std::string prompt = "The ";
  // Within the context (4 + 10 <= 16 bytes) every sampled byte is the argmax of the forward pass
  // over prompt + sample at the position before it.
  auto greedy = s.trainer->sample(prompt, 10, 0.0, 1, kBatch);
  ASSERT_OK(greedy);
  ASSERT_EQ(greedy->size(), 10u);
  const std::string all = prompt + *greedy;
  std::vector<int> chain = argmax_chain(s, all.substr(0, all.size() - 1));
  for (size_t i = 0; i < greedy->size(); ++i) {
    EXPECT_EQ(static_cast<unsigned char>((*greedy)[i]), chain[prompt.size() - 1 + i]) << "byte " << i;
  }
  // Past the context the window slides: the byte after 40 bytes is the argmax after the last 16.
  auto longer = s.trainer->sample(prompt, 40, 0.0, 1, kBatch);
  ASSERT_OK(longer);
  EXPECT_EQ(longer->substr(0, 10), *greedy);
  const std::string whole = prompt + *longer;
  const std::string window = whole.substr(whole.size() - 1 - kT, kT);
  EXPECT_EQ(static_cast<unsigned char>(whole.back()), argmax_chain(s, window).back());
}

TEST(GptTrainerSample, SeededAndTheSameOffloaded) {
  test::ScratchDir dir("sample");
  Rig a = make(Offload::kNone, dir.path());
  auto s1 = a.trainer->sample("ab", 24, 1.0, 5, kBatch);
  auto s2 = a.trainer->sample("ab", 24, 1.0, 5, kBatch);
  auto s3 = a.trainer->sample("ab", 24, 1.0, 6, kBatch);
  ASSERT_TRUE(s1.is_ok() && s2.is_ok() && s3.is_ok());
  EXPECT_EQ(*s1, *s2);
  EXPECT_NE(*s1, *s3);  // 24 bytes from an untrained model's near-uniform distribution
  a = Rig{};
  Rig b = make(Offload::kNvme, dir.path());
  auto s4 = b.trainer->sample("ab", 24, 1.0, 5, kBatch);
  ASSERT_OK(s4);
  EXPECT_EQ(*s4, *s1);
  EXPECT_FALSE(b.trainer->sample("ab", 4, -1.0, 5, kBatch).is_ok());
  EXPECT_FALSE(b.trainer->sample("ab", -1, 1.0, 5, kBatch).is_ok());
}

TEST(TextCorpus, DirectoryIsItsRegularFilesInNameOrder) {
  test::ScratchDir dir("corpus");
  const std::string line(40, 'x');
  std::ofstream(dir.file("b.txt")) << "second " << line << "\n";
  std::ofstream(dir.file("a.txt")) << "first " << line;  // no final line break: one is added
  std::ofstream(dir.file(".hidden")) << "hidden\n";
  std::filesystem::create_symlink(dir.file("a.txt"), dir.file("c-link"));
  std::filesystem::create_directory(dir.file("sub"));
  std::ofstream(dir.file("sub/d.txt")) << "nested\n";
  auto c = data::load_text_file(dir.path(), 8, 0.2);
  ASSERT_OK(c);
  std::string all(c->train.begin(), c->train.end());
  all.append(c->eval.begin(), c->eval.end());
  EXPECT_EQ(all, "first " + line + "\nsecond " + line + "\n");
  EXPECT_NE(c->name.find("(2 files)"), std::string::npos) << c->name;

  test::ScratchDir empty("corpus");
  auto e = data::load_text_file(empty.path(), 8);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("holds no regular file"), std::string::npos);
}

TEST(TextCorpus, KnownWordFraction) {
  const std::string text = "The licence grants the Licensee rights; see section 2.";
  const std::vector<uint8_t> corpus(text.begin(), text.end());
  size_t words = 0;
  EXPECT_DOUBLE_EQ(data::known_word_fraction("THE rights zzqx a", corpus, &words), 2.0 / 3);
  EXPECT_EQ(words, 3u);  // "a" is too short to count
  EXPECT_DOUBLE_EQ(data::known_word_fraction("\x01\x02 7 !", corpus, &words), 0.0);
  EXPECT_EQ(words, 0u);
}

}  // namespace
}  // namespace zoe::model
