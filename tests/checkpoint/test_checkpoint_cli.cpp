// `zoe ckpt inspect|verify|consolidate` through the zoe binary, on checkpoints the library wrote.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/checkpoint/ckpt_fixture.h"
#include "tests/cli/run_zoe.h"
#include "tests/util/status_test_util.h"

namespace {

using zoe::test::ScratchDir;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

TEST(CkptCli, Inspect) {
  ScratchDir d("ckpt-cli");
  ASSERT_OK(zoe::ckpt::test::save(d.path(), "step-3", 2, 3));
  CmdResult r = zoe("ckpt inspect " + d.path() + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["path"], d.path() + "/step-3");
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["stage"], 2);
  EXPECT_EQ(j["step"], 3);
  EXPECT_EQ(j["modules"].size(), 3u);
  EXPECT_EQ(j["params"], 5);
  EXPECT_EQ(j["files"].size(), 3u);  // manifest + 2 rank files
  ASSERT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][0]["tensors"], 9);
  EXPECT_EQ(j["trainer"]["seed"], 42);

  r = zoe("ckpt inspect " + d.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_HAS(r.out, "world size 2, ZeRO stage 2, step 3");
  EXPECT_HAS(r.out, "rank-00001.bin");
  EXPECT_HAS(r.out, "5 parameters");

  r = zoe("ckpt inspect " + d.path() + "/nope");
  EXPECT_EQ(r.rc, 1);
  EXPECT_HAS(r.err, "zoe: error: not found: checkpoint " + d.path() + "/nope does not exist");
}

TEST(CkptCli, Verify) {
  ScratchDir d("ckpt-cli");
  ASSERT_OK(zoe::ckpt::test::save(d.path(), "s", 2, 1));
  CmdResult r = zoe("ckpt verify " + d.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_HAS(r.out, "verified 2 files");
  r = zoe("ckpt verify " + d.path() + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ok"], true);

  // Flip one byte of rank 1's file.
  std::string f = d.path() + "/s/rank-00001.bin";
  int fd = open(f.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char c = 0;
  ASSERT_EQ(pread(fd, &c, 1, 100), 1);
  c ^= 1;
  ASSERT_EQ(pwrite(fd, &c, 1, 100), 1);
  close(fd);
  r = zoe("ckpt verify " + d.path());
  EXPECT_EQ(r.rc, 1);
  EXPECT_HAS(r.out, "FAILED rank-00001.bin");
  EXPECT_HAS(r.err, "zoe: error: corruption: checksum mismatch in " + f);
  r = zoe("ckpt verify " + d.path() + " --json");
  EXPECT_EQ(r.rc, 1);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["files"][0]["ok"], true);
  EXPECT_EQ(j["files"][1]["ok"], false);
}

TEST(CkptCli, Consolidate) {
  ScratchDir d("ckpt-cli");
  ASSERT_OK(zoe::ckpt::test::save(d.path(), "s", 2, 1));
  std::string out = d.file("m.safetensors");
  CmdResult r = zoe("ckpt consolidate " + d.path() + " --out " + out + " --dtype bf16 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tensors"], 5);
  EXPECT_EQ(j["bytes"], std::filesystem::file_size(out));
  // The header: 8-byte little-endian length, then JSON naming every parameter.
  std::ifstream f(out, std::ios::binary);
  unsigned char len[8];
  ASSERT_TRUE(f.read(reinterpret_cast<char*>(len), 8));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  std::string h(n, '\0');
  ASSERT_TRUE(f.read(h.data(), static_cast<std::streamsize>(n)));
  auto hj = nlohmann::json::parse(h);
  EXPECT_EQ(hj["block0.mlp.w"]["dtype"], "BF16");
  EXPECT_EQ(hj["block0.mlp.w"]["shape"], nlohmann::json({8, 32}));

  r = zoe("ckpt consolidate " + d.path() + " --out " + out + " --dtype int4");
  EXPECT_EQ(r.rc, 1);
  EXPECT_HAS(r.err, "zoe: error: invalid argument: consolidate: dtype 'int4'");
  r = zoe("ckpt consolidate " + d.path());
  EXPECT_NE(r.rc, 0);  // --out is required
}

// A flipped byte in a rank file: consolidate fails naming the file and the tensor, writes nothing.
TEST(CkptCli, ConsolidateChecksRankFiles) {
  ScratchDir d("ckpt-cli");
  ASSERT_OK(zoe::ckpt::test::save(d.path(), "s", 2, 1));
  const std::string f = d.path() + "/s/rank-00000.bin";
  int fd = open(f.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char c = 0;
  ASSERT_EQ(pread(fd, &c, 1, 4096 + 10), 1);  // inside rank 0's second tensor
  c ^= 0x80;
  ASSERT_EQ(pwrite(fd, &c, 1, 4096 + 10), 1);
  close(fd);
  const std::string out = d.file("m.safetensors");
  CmdResult r = zoe("ckpt consolidate " + d.path() + " --out " + out);
  EXPECT_EQ(r.rc, 1);
  EXPECT_HAS(r.err, "zoe: error: corruption: checksum mismatch in " + f +
                        ": tensors[1] (module 0 'embed', "
                        "'exp_avg' f32 elements [0, 202) at bytes [4096, 4904))");
  EXPECT_FALSE(std::filesystem::exists(out));
}

// Every command checks the manifest's own checksum before trusting a byte of it.
TEST(CkptCli, EditedManifestRefused) {
  ScratchDir d("ckpt-cli");
  ASSERT_OK(zoe::ckpt::test::save(d.path(), "s", 2, 3));
  CmdResult r = zoe("ckpt inspect " + d.path() + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["files"][0]["name"], "manifest.json");
  EXPECT_EQ(j["files"][0]["xxh64"].get<std::string>().size(), 16u);
  const std::string ck = d.path() + "/s";
  zoe::ckpt::test::edit_manifest(
      ck, [](nlohmann::json& m) { m["trainer"]["step"] = 1; }, false);
  for (const std::string& cmd : {"inspect " + d.path(), "verify " + d.path(),
                                 "consolidate " + d.path() + " --out " + d.file("m.safetensors")}) {
    r = zoe("ckpt " + cmd);
    EXPECT_EQ(r.rc, 1) << cmd;
    EXPECT_HAS(r.err, "zoe: error: corruption: checksum mismatch in " + ck + "/manifest.json");
  }
  // Resealed, the structural check names the field.
  zoe::ckpt::test::reseal(ck);
  r = zoe("ckpt verify " + d.path());
  EXPECT_EQ(r.rc, 1);
  EXPECT_HAS(r.err, ck +
                        "/manifest.json: key 'trainer.step': expected a count of iterations >= the optimizer "
                        "steps taken (step 3), found number 1");
  // `latest` with a NUL byte: said to be corrupt, its content shown escaped.
  zoe::ckpt::test::write_file(d.path() + "/latest", std::string("s\0", 2));
  r = zoe("ckpt inspect " + d.path());
  EXPECT_EQ(r.rc, 1);
  EXPECT_HAS(r.err, d.path() + "/latest is corrupt: expected the tag of a checkpoint");
  EXPECT_HAS(r.err, "found \"s\\x00\"");
}

}  // namespace
