// `zoe ckpt inspect|verify|consolidate` through the zoe binary, on checkpoints the library wrote.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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
  ScratchDir d("ckpt-cli"), o("ckpt-out");  // outputs outside the save directory
  ASSERT_OK(zoe::ckpt::test::save(d.path(), "s", 2, 1));
  std::string out = o.file("m.safetensors");
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

// Packed optimizer states: inspect shows their dtype and stored bytes; consolidate --with-moments
// writes them dequantized beside each parameter.
TEST(CkptCli, PackedStates) {
  ScratchDir d("ckpt-cli"), o("ckpt-out");  // outputs outside the save directory
  ASSERT_OK(zoe::ckpt::test::save_packed(d.path(), "s", 2, "int8b256", zoe::optim::StateFormat::kInt8));
  CmdResult r = zoe("ckpt inspect " + d.path() + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  // big over 2 ranks: 6144 elements (24 blocks of 260 bytes) + 2125 (8 blocks + 77 in 81 bytes);
  // small: 300 (one block + 44 in 48 bytes).
  const nlohmann::json want = {
      {"kind", "exp_avg"}, {"dtype", "int8b256"}, {"elements", 8569}, {"bytes", 8709}};
  bool found = false;
  for (const auto& st : j["states"]) found = found || st == want;
  EXPECT_TRUE(found) << j["states"].dump();
  r = zoe("ckpt inspect " + d.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_HAS(r.out, "exp_avg_sq");
  EXPECT_HAS(r.out, "int8b256");

  const std::string out = o.file("m.safetensors");
  r = zoe("ckpt consolidate " + d.path() + " --out " + out + " --with-moments --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tensors"], 6);
  std::ifstream f(out, std::ios::binary);
  uint64_t n = 0;
  ASSERT_TRUE(f.read(reinterpret_cast<char*>(&n), 8));
  std::string h(n, '\0');
  ASSERT_TRUE(f.read(h.data(), static_cast<std::streamsize>(n)));
  auto hj = nlohmann::json::parse(h);
  EXPECT_EQ(hj["small.w.exp_avg_sq"]["dtype"], "F32");
  EXPECT_EQ(hj["small.w.exp_avg_sq"]["shape"], nlohmann::json({3, 100}));
  EXPECT_TRUE(hj.contains("big.w.exp_avg"));

  r = zoe("ckpt consolidate " + d.path() + " --out " + o.file("hf") + " --format hf --with-moments");
  EXPECT_EQ(r.rc, 1);
  EXPECT_HAS(r.err, "--with-moments: only with --format safetensors (not hf)");
}

// A flipped byte in a rank file: consolidate fails naming the file and the tensor, writes nothing.
TEST(CkptCli, ConsolidateChecksRankFiles) {
  ScratchDir d("ckpt-cli"), o("ckpt-out");  // outputs outside the save directory
  ASSERT_OK(zoe::ckpt::test::save(d.path(), "s", 2, 1));
  const std::string f = d.path() + "/s/rank-00000.bin";
  int fd = open(f.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char c = 0;
  ASSERT_EQ(pread(fd, &c, 1, 4096 + 10), 1);  // inside rank 0's second tensor
  c ^= 0x80;
  ASSERT_EQ(pwrite(fd, &c, 1, 4096 + 10), 1);
  close(fd);
  const std::string out = o.file("m.safetensors");
  CmdResult r = zoe("ckpt consolidate " + d.path() + " --out " + out);
  EXPECT_EQ(r.rc, 1);
  EXPECT_HAS(r.err, "zoe: error: corruption: checksum mismatch in " + f +
                        ": tensors[1] (module 0 'embed', "
                        "'exp_avg' f32 elements [0, 202) at bytes [4096, 4904))");
  EXPECT_FALSE(std::filesystem::exists(out));
}

// Every command checks the manifest's own checksum before trusting a byte of it.
TEST(CkptCli, EditedManifestRefused) {
  ScratchDir d("ckpt-cli"), o("ckpt-out");  // outputs outside the save directory
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
                                 "consolidate " + d.path() + " --out " + o.file("m.safetensors")}) {
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

mode_t type_of(const std::string& p) {
  struct stat st {};
  return lstat(p.c_str(), &st) == 0 ? (st.st_mode & S_IFMT) : 0;
}

// A run of zoe that must end quickly (a FIFO once made it wait forever): its result.
CmdResult quick(const std::string& args) {
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult r = zoe(args, "", 30);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0) << args;
  return r;
}

// consolidate --out never replaces what is not a regular file (as root it replaced /dev/full with
// a regular file) nor writes inside a save directory (--out SAVE/latest destroyed its pointer).
TEST(CkptCli, ConsolidateNeverClobbers) {
  ScratchDir save("ckpt-save"), out("ckpt-out");
  ASSERT_OK(zoe::ckpt::test::save(save.path(), "step-000002", 2, 2));
  const std::string fifo = out.file("fifo"), dev = out.file("full");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  CmdResult r = quick("ckpt consolidate " + save.path() + " --out " + fifo);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err,
             "zoe: error: invalid argument: --out " + fifo + " is a FIFO (named pipe), not a regular file");
  EXPECT_EQ(type_of(fifo), static_cast<mode_t>(S_IFIFO));
  // A character device with /dev/full's numbers (only root may make one).
  if (mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0) {
    r = quick("ckpt consolidate " + save.path() + " --out " + dev);
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_HAS(r.err, "--out " + dev + " is a character device, not a regular file");
    EXPECT_EQ(type_of(dev), static_cast<mode_t>(S_IFCHR));
  }
  for (const std::string& inside : {save.file("latest"), save.file("step-000002/x")}) {
    r = quick("ckpt consolidate " + save.path() + " --out " + inside);
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_HAS(r.err, "--out " + inside + " lies inside the checkpoint save directory " + save.path());
  }
  r = zoe("ckpt consolidate " + save.path() + " --format hf-gpt2 --out " + save.file("hf"));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_HAS(r.err, "lies inside the checkpoint save directory " + save.path());
  EXPECT_EQ(type_of(save.file("hf")), 0u);
  r = zoe("ckpt verify " + save.path());
  EXPECT_EQ(r.rc, 0) << r.err;
  // A normal output: written whole, nothing else left beside it.
  r = zoe("ckpt consolidate " + save.path() + " --out " + out.file("m.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(out.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  std::vector<std::string> want = {"fifo", "m.safetensors"};
  if (type_of(dev) != 0) want.insert(want.begin() + 1, "full");
  EXPECT_EQ(names, want);
}

// A FIFO in place of a checkpoint's manifest or of a rank file is refused at once (opening it
// waited for a writer forever), naming the file.
TEST(CkptCli, FifoInPlaceOfACheckpointFileIsRefusedAtOnce) {
  for (const std::string name : {"manifest.json", "rank-00001.bin"}) {
    ScratchDir d("ckpt-fifo");
    ASSERT_OK(zoe::ckpt::test::save(d.path(), "s", 2, 1));
    const std::string p = d.path() + "/s/" + name;
    ASSERT_EQ(unlink(p.c_str()), 0);
    ASSERT_EQ(mkfifo(p.c_str(), 0644), 0);
    for (const char* cmd : {"ckpt verify ", "ckpt inspect "}) {
      CmdResult r = quick(cmd + d.path());
      EXPECT_EQ(r.rc, 1) << cmd << name << "\n" << r.err;
      EXPECT_HAS(r.err, p + " is a FIFO (named pipe), not a regular file");
    }
  }
}

}  // namespace
