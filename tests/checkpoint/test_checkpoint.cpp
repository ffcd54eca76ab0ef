// Checkpoint tests: round trips across world sizes, atomicity under SIGKILL, corruption, full
// disks, consolidation to safetensors with bounded memory.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/xxh64.h"
#include "tests/checkpoint/ckpt_fixture.h"
#include "tests/util/test_util.h"

namespace zoe::ckpt {
namespace {

namespace fs = std::filesystem;
using test::kinds;
using test::master_value;
using test::save;
using test::small_modules;
using zoe::test::first_mismatch;
using zoe::test::ScratchDir;
using zoe::test::ScratchMount;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

std::unique_ptr<Reader> open_ok(const std::string& dir) {
  auto r = Reader::open(dir);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r).value() : nullptr;
}

std::string open_error(const std::string& dir) {
  auto r = Reader::open(dir);
  EXPECT_FALSE(r.is_ok()) << "opened " << dir;
  return r.is_ok() ? "" : r.status().to_string();
}

// Reads [b, b + n) and compares with the fixture's values; returns the first wrong element or -1.
long long check_range(const Reader& r, uint32_t m, const std::string& kind, uint64_t b, uint64_t n,
                      const std::string& dt) {
  size_t eb = dtype_bytes(dt);
  std::vector<unsigned char> got(n * eb), want(n * eb);
  Status s = r.read_range(m, kind, b, n, dt, got.data());
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  for (uint64_t i = 0; i < n; ++i) test::expected_bytes(m, kind, b + i, dt, &want[i * eb]);
  long long at = first_mismatch(got.data(), want.data(), got.size());
  return at < 0 ? -1 : at / static_cast<long long>(eb);
}

size_t count_tmp(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    n += e.path().filename().string().find(".tmp-") != std::string::npos;
  return n;
}

void flip_byte(const std::string& path, uint64_t offset) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char c;
  ASSERT_EQ(pread(fd, &c, 1, static_cast<off_t>(offset)), 1);
  c ^= 0x20;
  ASSERT_EQ(pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1);
  close(fd);
}

// Points `latest` at tag (what commit_checkpoint does last), to rewind a test's save directory.
bool detail_write_latest_for_test(const std::string& dir, const std::string& tag) {
  std::ofstream f(dir + "/latest.new");
  f << tag << "\n";
  f.close();
  return f && rename((dir + "/latest.new").c_str(), (dir + "/latest").c_str()) == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Checkpoint, RoundTripTwoRanks) {
  ScratchDir d("ckpt");
  ASSERT_TRUE(save(d.path(), "step-7", 2, 7).is_ok());
  EXPECT_EQ(read_text(d.file("latest")), "step-7\n");
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->path(), d.path() + "/step-7");
  const Manifest& m = r->manifest();
  EXPECT_EQ(m.format_version, kFormatVersion);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.stage, 2);
  EXPECT_EQ(m.step, 7);
  ASSERT_EQ(m.modules.size(), 3u);
  EXPECT_EQ(m.modules[1].params[2].name, "mlp.w");
  EXPECT_EQ(m.modules[1].params[2].shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.tensors.size(), 3u * 3u * 2u);
  EXPECT_EQ(m.engine["precision"], "bf16");
  EXPECT_EQ(m.trainer["data_position"], 1234);
  for (const auto& t : m.tensors) EXPECT_EQ(t.offset % 4096, 0u) << "tensor offsets are 4096-aligned";
  EXPECT_TRUE(r->has_kind("master"));
  EXPECT_FALSE(r->has_kind("grad"));
  EXPECT_TRUE(r->verify().is_ok());

  // Whole modules, and random ranges (most cross the rank boundary), in every dtype.
  std::mt19937_64 rng(1);
  for (uint32_t mi = 0; mi < 3; ++mi) {
    uint64_t padded = m.modules[mi].padded;
    for (const auto& kind : kinds()) {
      for (const char* dt : {"f32", "bf16", "f16"}) {
        EXPECT_EQ(check_range(*r, mi, kind, 0, padded, dt), -1) << mi << " " << kind << " " << dt;
        for (int k = 0; k < 20; ++k) {
          uint64_t b = rng() % padded;
          uint64_t n = 1 + rng() % (padded - b);
          EXPECT_EQ(check_range(*r, mi, kind, b, n, dt), -1)
              << mi << " " << kind << " " << dt << " [" << b << ", +" << n << ")";
        }
      }
    }
  }
  // Outside the module, or a state that is not there: clear errors.
  std::vector<float> buf(600);
  Status s = r->read_range(0, "master", 400, 10, "f32", buf.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "module 'embed'");
  s = r->read_range(0, "grad", 0, 10, "f32", buf.data());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_HAS(s.message(), "no 'grad' state");
  EXPECT_EQ(r->read_range(9, "master", 0, 1, "f32", buf.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r->read_range(0, "master", 0, 1, "f64", buf.data()).code(), StatusCode::kInvalidArgument);
}

TEST(Checkpoint, ReshardAcrossWorldSizes) {
  ScratchDir d("ckpt");
  auto tag = [](int w) { return std::string("w") + std::to_string(w); };
  for (int w : {1, 2, 3, 5}) ASSERT_TRUE(save(d.path(), tag(w), w, 1).is_ok());
  auto r1 = open_ok(d.path() + "/w1");
  ASSERT_TRUE(r1);
  std::mt19937_64 rng(2);
  for (int w : {2, 3, 5}) {
    auto rw = open_ok(d.path() + "/" + tag(w));
    ASSERT_TRUE(rw);
    EXPECT_EQ(rw->manifest().world_size, w);
    for (uint32_t mi = 0; mi < 3; ++mi) {
      uint64_t padded = r1->manifest().modules[mi].padded;
      for (int k = 0; k < 30; ++k) {
        uint64_t b = rng() % padded, n = 1 + rng() % (padded - b);
        const std::string& kind = kinds()[static_cast<size_t>(k) % 3];
        std::vector<float> a(n), c(n);
        ASSERT_TRUE(r1->read_range(mi, kind, b, n, "f32", a.data()).is_ok());
        ASSERT_TRUE(rw->read_range(mi, kind, b, n, "f32", c.data()).is_ok());
        ASSERT_EQ(first_mismatch(a.data(), c.data(), n * 4), -1)
            << "w" << w << " module " << mi << " " << kind;
      }
    }
  }
}

TEST(Checkpoint, WriterContract) {
  ScratchDir d("ckpt");
  auto tmp = begin_checkpoint(d.path(), "t");
  ASSERT_TRUE(tmp.is_ok()) << tmp.status().to_string();
  auto w = RankWriter::create(tmp.value(), 0);
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ(w.value()->append("x", 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.value()->begin_tensor(0, "master", "f64", 0, 4).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.value()->begin_tensor(0, "master", "f32", 0, 4).is_ok());
  float v[5] = {};
  EXPECT_EQ(w.value()->append(v, 20).code(), StatusCode::kInvalidArgument);  // more than 4 x 4 bytes
  ASSERT_TRUE(w.value()->append(v, 8).is_ok());
  Status s = w.value()->end_tensor();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "8 bytes appended, 16 expected");
  std::vector<TensorRecord> recs;
  FileInfo fi;
  EXPECT_EQ(w.value()->finish(&recs, &fi).code(), StatusCode::kInvalidArgument);  // a tensor is open
  // A manifest that does not match the files fails the commit and removes the temporary dir.
  ASSERT_TRUE(w.value()->append(v, 8).is_ok());
  ASSERT_TRUE(w.value()->end_tensor().is_ok());
  ASSERT_TRUE(w.value()->finish(&recs, &fi).is_ok());
  EXPECT_EQ(fi.bytes, 16u);
  Manifest man;
  man.modules = {{"m", 4, {{"w", {4}, 0, 4}}}};
  man.tensors = recs;
  man.files = {fi};
  man.files[0].bytes = 17;
  s = commit_checkpoint(d.path(), "t", tmp.value(), man);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "rank-00000.bin has 16 bytes, the manifest says 17");
  EXPECT_EQ(count_tmp(d.path()), 0u);
  EXPECT_FALSE(fs::exists(d.file("latest")));
  // Bad tags.
  EXPECT_EQ(begin_checkpoint(d.path(), "latest").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(begin_checkpoint(d.path(), "a/b").status().code(), StatusCode::kInvalidArgument);
}

TEST(Checkpoint, LatestReplacedAndTagResaved) {
  ScratchDir d("ckpt");
  ASSERT_TRUE(save(d.path(), "step-1", 2, 1).is_ok());
  ASSERT_TRUE(save(d.path(), "step-2", 1, 2).is_ok());
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->manifest().step, 2);
  EXPECT_EQ(r->manifest().world_size, 1);
  // The older one is still there and readable by its own path.
  auto r1 = open_ok(d.path() + "/step-1/");
  ASSERT_TRUE(r1);
  EXPECT_EQ(r1->manifest().step, 1);
  // Saving an existing tag again swaps it in atomically.
  ASSERT_TRUE(save(d.path(), "step-2", 3, 22).is_ok());
  r = open_ok(d.path());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->manifest().step, 22);
  EXPECT_TRUE(r->verify().is_ok());
  EXPECT_EQ(count_tmp(d.path()), 0u);
}

// A save killed at random moments: the previous checkpoint stays loadable and verify-clean.
TEST(Checkpoint, KilledSaveLeavesPreviousIntact) {
  ScratchDir d("ckpt");
  ASSERT_TRUE(save(d.path(), "step-1", 2, 1).is_ok());
  // ~3 x 3 x 8 MiB per save: long enough to be killed in the middle.
  std::vector<ModuleInfo> big(3);
  for (size_t i = 0; i < big.size(); ++i) {
    big[i].name = "big" + std::to_string(i);
    big[i].padded = 2u << 20;
    big[i].params = {{"w", {1024, 2048}, 0, 2u << 20}};
  }
  std::mt19937 rng(3);
  int completed = 0;
  int64_t full_us = 0;  // how long an uninterrupted save takes: trial 0 measures it
  for (int trial = 0; trial < 6; ++trial) {
    auto t0 = std::chrono::steady_clock::now();
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      Status s = save(d.path(), "step-2", 2, 2, big);
      _exit(s.is_ok() ? 0 : 1);
    }
    // Kill moments spread over the whole save, commit included (some land after it ends).
    int64_t delay_us = trial == 0   ? -1
                       : trial == 1 ? 0
                                    : static_cast<int64_t>(rng() % (full_us * 11 / 10 + 1));
    if (delay_us >= 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      kill(pid, SIGKILL);
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    if (trial == 0) {
      ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the uninterrupted save failed";
      full_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
                    .count();
    } else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      ++completed;
    }

    // Whatever the moment, `latest` names a complete, verify-clean checkpoint; a leftover
    // temporary directory does not confuse open().
    auto r = open_ok(d.path());
    ASSERT_TRUE(r) << "trial " << trial << " killed after " << delay_us << " us";
    EXPECT_TRUE(r->verify().is_ok()) << "trial " << trial;
    int64_t step = r->manifest().step;
    EXPECT_TRUE(step == 1 || step == 2) << step;
    if (step == 1) {
      EXPECT_EQ(check_range(*r, 1, "master", 0, 475, "f32"), -1);
    }
    auto r1 = open_ok(d.path() + "/step-1");
    ASSERT_TRUE(r1);
    EXPECT_TRUE(r1->verify().is_ok());
    // Back to the previous state for the next trial: only step-1, maybe a temporary left over.
    std::error_code ec;
    fs::remove_all(d.path() + "/step-2", ec);
    ASSERT_TRUE(detail_write_latest_for_test(d.path(), "step-1"));
  }
  // The next save removes leftover temporaries.
  ASSERT_TRUE(save(d.path(), "step-3", 1, 3).is_ok());
  EXPECT_EQ(count_tmp(d.path()), 0u);
  printf("uninterrupted save: %lld us; %d of 5 killed saves had completed\n", static_cast<long long>(full_us),
         completed);
}

TEST(Checkpoint, Corruption) {
  ScratchDir d("ckpt");
  ASSERT_TRUE(save(d.path(), "s", 2, 5).is_ok());
  const std::string ck = d.path() + "/s";

  // A flipped byte: open succeeds (sizes match), verify names the file and both hashes.
  flip_byte(ck + "/rank-00001.bin", 5000);
  {
    auto r = open_ok(d.path());
    ASSERT_TRUE(r);
    EXPECT_TRUE(r->verify_file(0).is_ok());
    Status s = r->verify();
    EXPECT_EQ(s.code(), StatusCode::kCorruption);
    EXPECT_HAS(s.message(), ck + "/rank-00001.bin");
    EXPECT_HAS(s.message(), "checksum mismatch");
    EXPECT_HAS(s.message(), "xxh64 " + r->manifest().files[1].xxh64);
  }
  flip_byte(ck + "/rank-00001.bin", 5000);  // back

  // Truncated: open names the file and the sizes.
  uint64_t size0 = fs::file_size(ck + "/rank-00000.bin");
  ASSERT_EQ(truncate((ck + "/rank-00000.bin").c_str(), static_cast<off_t>(size0 - 100)), 0);
  std::string e = open_error(d.path());
  EXPECT_HAS(e, "corruption");
  EXPECT_HAS(e, ck + "/rank-00000.bin has " + std::to_string(size0 - 100) + " bytes, the manifest says " +
                    std::to_string(size0) + " (truncated)");
  // Truncated after open: verify reports the short read, naming the file.
  ASSERT_EQ(truncate((ck + "/rank-00000.bin").c_str(), static_cast<off_t>(size0)), 0);
  {
    auto r = open_ok(d.path());
    ASSERT_TRUE(r);
    ASSERT_EQ(truncate((ck + "/rank-00000.bin").c_str(), 4096), 0);
    Status s = r->verify();
    EXPECT_EQ(s.code(), StatusCode::kCorruption);
    EXPECT_HAS(s.message(), ck + "/rank-00000.bin");
  }

  // A missing rank file (on a fresh save of the same tag).
  ASSERT_TRUE(save(d.path(), "s", 2, 5).is_ok());
  ASSERT_EQ(unlink((ck + "/rank-00001.bin").c_str()), 0);
  e = open_error(d.path());
  EXPECT_HAS(e, "not found");
  EXPECT_HAS(e, ck + "/rank-00001.bin is missing");

  // A manifest from a newer zoe, and a damaged one.
  ASSERT_TRUE(save(d.path(), "v", 1, 5).is_ok());
  const std::string mp = d.path() + "/v/manifest.json";
  nlohmann::json j = nlohmann::json::parse(read_text(mp));
  j["format_version"] = 99;
  std::ofstream(mp) << j.dump();
  e = open_error(d.path());
  EXPECT_HAS(e, mp + ": format_version 99 was written by a newer zoe");
  j["format_version"] = 1;
  j["tensors"][0]["dtype"] = "f64";
  std::ofstream(mp) << j.dump();
  EXPECT_HAS(open_error(d.path()), mp + ": key 'tensors[0].dtype': expected \"f32\", \"bf16\" or \"f16\"");
  j["tensors"][0].erase("dtype");
  std::ofstream(mp) << j.dump();
  EXPECT_HAS(open_error(d.path()), "key 'tensors[0].dtype' is missing");
  std::string text = j.dump();
  std::ofstream(mp) << text.substr(0, text.size() / 2);
  e = open_error(d.path());
  EXPECT_HAS(e, mp + " is not valid JSON");

  // `latest` naming nothing; a directory that is not a checkpoint; one that does not exist.
  ASSERT_TRUE(detail_write_latest_for_test(d.path(), "gone"));
  EXPECT_HAS(open_error(d.path()), "names checkpoint 'gone'");
  ScratchDir empty("ckpt");
  EXPECT_HAS(open_error(empty.path()), "no 'latest' file");
  EXPECT_HAS(open_error(empty.path() + "/nope"), "does not exist");
}

TEST(Checkpoint, BadSaveDir) {
  ScratchDir d("ckpt");
  auto t = begin_checkpoint(d.path() + "/nope", "s");
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_HAS(t.status().message(), "save directory " + d.path() + "/nope does not exist");
  std::ofstream(d.file("f")) << "x";
  t = begin_checkpoint(d.file("f"), "s");
  EXPECT_HAS(t.status().message(), "is not a directory");

  // Not writable: root passes access(W_OK), so check from a child that dropped to nobody.
  char tmpl[] = "/tmp/zoe-ckpt-ro-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string ro = tmpl;
  ASSERT_EQ(chmod(ro.c_str(), 0555), 0);
  auto check = [&]() -> std::string {
    auto r = begin_checkpoint(ro, "s");
    return r.is_ok() ? "ok" : r.status().to_string();
  };
  std::string got;
  if (geteuid() == 0) {
    got = zoe::test::run_in_child([&]() -> std::string {
      if (setgid(65534) != 0 || setuid(65534) != 0) return "SKIP";
      return check();
    });
  } else {
    got = check();
  }
  rmdir(ro.c_str());
  if (got == "SKIP") GTEST_SKIP() << "cannot drop to uid 65534";
  EXPECT_HAS(got, "permission denied");
  EXPECT_HAS(got, ro);
}

TEST(Checkpoint, FullDisk) {
  ScratchMount mnt("tmpfs", "size=1m");
  if (!mnt.ok()) GTEST_SKIP() << "cannot mount a tmpfs here";
  ASSERT_TRUE(save(mnt.path(), "step-1", 2, 1).is_ok());
  std::vector<ModuleInfo> big(1);
  big[0].name = "big";
  big[0].padded = 1u << 20;  // 4 MiB of f32 per kind: cannot fit in 1 MiB
  big[0].params = {{"w", {1024, 1024}, 0, 1u << 20}};
  Status s = save(mnt.path(), "step-2", 2, 2, big);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.to_string();
  EXPECT_HAS(s.message(), mnt.path() + "/step-2.tmp-");
  EXPECT_HAS(s.message(), "/rank-00000.bin");
  EXPECT_HAS(s.message(), "bytes at offset");
  EXPECT_HAS(s.message(), "No space left on device");
  EXPECT_EQ(count_tmp(mnt.path()), 0u) << "the temporary directory is removed";
  EXPECT_EQ(read_text(mnt.path() + "/latest"), "step-1\n");
  auto r = open_ok(mnt.path());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->manifest().step, 1);
  EXPECT_TRUE(r->verify().is_ok());
  EXPECT_EQ(check_range(*r, 2, "exp_avg", 0, 400, "f32"), -1);

  // consolidate on a full disk: the error names the output, nothing is left behind.
  std::string pad = mnt.path() + "/pad";
  {
    std::ofstream f(pad);
    std::string chunk(4096, 'x');
    while (f.write(chunk.data(), chunk.size())) {
    }
  }
  s = consolidate(*r, mnt.path() + "/model.safetensors", "fp32");
  EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.to_string();
  EXPECT_HAS(s.message(), mnt.path() + "/model.safetensors");
  EXPECT_FALSE(fs::exists(mnt.path() + "/model.safetensors"));
  EXPECT_EQ(count_tmp(mnt.path()), 0u);
}

// ---- safetensors ----

struct Safetensors {
  nlohmann::json header;
  uint64_t data_start = 0;
  std::string error;
};

Safetensors read_safetensors_header(const std::string& path) {
  Safetensors st;
  std::ifstream f(path, std::ios::binary);
  unsigned char len[8];
  if (!f.read(reinterpret_cast<char*>(len), 8)) {
    st.error = "no length";
    return st;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  std::string h(n, '\0');
  if (!f.read(h.data(), static_cast<std::streamsize>(n))) {
    st.error = "short header";
    return st;
  }
  if ((8 + n) % 8 != 0) st.error = "header not padded to 8 bytes";
  st.header = nlohmann::json::parse(h);
  st.data_start = 8 + n;
  return st;
}

TEST(Checkpoint, ConsolidateSafetensors) {
  ScratchDir d("ckpt");
  ASSERT_TRUE(save(d.path(), "s", 2, 9).is_ok());
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);
  for (const char* dt : {"fp32", "bf16"}) {
    std::string out = d.file(std::string("model-") + dt + ".safetensors");
    Status s = consolidate(*r, out, dt, 100);  // tiny pieces: every parameter takes several
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    Safetensors st = read_safetensors_header(out);
    ASSERT_EQ(st.error, "");
    const std::string want_dt = std::string(dt) == "fp32" ? "F32" : "BF16";
    const std::string dt_short = std::string(dt) == "fp32" ? "f32" : "bf16";
    const size_t eb = dtype_bytes(dt_short);
    EXPECT_EQ(st.header["__metadata__"]["format"], "pt");
    EXPECT_EQ(st.header["__metadata__"]["zoe_step"], "9");
    std::ifstream f(out, std::ios::binary);
    size_t params = 0;
    uint64_t data_end = 0;
    const auto mods = small_modules();
    for (uint32_t mi = 0; mi < mods.size(); ++mi) {
      for (const auto& p : mods[mi].params) {
        ++params;
        const auto& e = st.header[mods[mi].name + "." + p.name];
        ASSERT_TRUE(e.is_object()) << mods[mi].name << "." << p.name;
        EXPECT_EQ(e["dtype"], want_dt);
        EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), p.shape);
        uint64_t a = e["data_offsets"][0], b = e["data_offsets"][1];
        ASSERT_EQ(b - a, p.numel * eb);
        data_end = std::max(data_end, b);
        std::vector<unsigned char> got(b - a), want(b - a);
        f.seekg(static_cast<std::streamoff>(st.data_start + a));
        ASSERT_TRUE(f.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size())));
        for (uint64_t i = 0; i < p.numel; ++i)
          test::expected_bytes(mi, "master", p.offset + i, dt_short, &want[i * eb]);
        EXPECT_EQ(first_mismatch(got.data(), want.data(), got.size()), -1) << mods[mi].name << "." << p.name;
      }
    }
    EXPECT_EQ(st.header.size(), params + 1);
    EXPECT_EQ(fs::file_size(out), st.data_start + data_end);
  }
  EXPECT_EQ(consolidate(*r, d.file("x.safetensors"), "int8").code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(d.file("x.safetensors")));
}

uint64_t vm_hwm_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

bool reset_hwm() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

// A 64 MiB parameter consolidated with 1 MiB pieces: the peak RSS grows by a few MiB at most.
TEST(Checkpoint, ConsolidateBoundedMemory) {
  ScratchDir d("ckpt");
  std::vector<ModuleInfo> big(1);
  const uint64_t n = 16u << 20;  // 64 MiB of f32
  big[0].name = "big";
  big[0].padded = n;
  big[0].params = {{"w", {4096, 4096}, 0, n}};
  // Only master: consolidate's source, and keeps the test short.
  auto tmp = begin_checkpoint(d.path(), "s");
  ASSERT_TRUE(tmp.is_ok());
  Manifest man;
  man.world_size = 2;
  man.modules = big;
  {
    std::vector<float> piece(1 << 16);
    for (int r = 0; r < 2; ++r) {
      auto w = RankWriter::create(tmp.value(), r);
      ASSERT_TRUE(w.is_ok());
      auto [b, e] = test::partition(n, 2, r);
      ASSERT_TRUE(w.value()->begin_tensor(0, "master", "f32", b, e - b).is_ok());
      for (uint64_t i = b; i < e; i += piece.size()) {
        for (size_t j = 0; j < piece.size(); ++j) piece[j] = master_value(0, i + j);
        ASSERT_TRUE(w.value()->append(piece.data(), piece.size() * 4).is_ok());
      }
      ASSERT_TRUE(w.value()->end_tensor().is_ok());
      FileInfo fi;
      ASSERT_TRUE(w.value()->finish(&man.tensors, &fi).is_ok());
      man.files.push_back(fi);
    }
  }
  ASSERT_TRUE(commit_checkpoint(d.path(), "s", tmp.value(), man).is_ok());
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);

  std::vector<const char*> dts = {"fp32"};
#if !defined(__SANITIZE_ADDRESS__)
  dts.push_back("bf16");  // conversion scratch is freed per call; ASan's quarantine would keep it
#endif
  for (const char* dt : dts) {
    std::string out = d.file("big.safetensors");
    if (!reset_hwm()) GTEST_SKIP() << "cannot reset VmHWM";
    uint64_t before = vm_hwm_kib();
    Status s = consolidate(*r, out, dt, 1u << 20);
    uint64_t growth_kib = vm_hwm_kib() - before;
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    // Bound: piece (1 MiB) + read scratch (<= 1 MiB) + header; allow slack for the allocator.
    printf("consolidate %s of a 64 MiB tensor, 1 MiB pieces: peak RSS +%llu KiB\n", dt,
           static_cast<unsigned long long>(growth_kib));
    EXPECT_LT(growth_kib, 8u * 1024) << dt << ": peak RSS grew by " << growth_kib
                                     << " KiB for a 64 MiB tensor";
    // Spot-check the data.
    Safetensors st = read_safetensors_header(out);
    ASSERT_EQ(st.error, "");
    std::ifstream f(out, std::ios::binary);
    for (uint64_t i : {uint64_t{0}, n / 2 - 1, n / 2, n - 1}) {
      size_t eb = std::string(dt) == "fp32" ? 4 : 2;
      unsigned char got[4] = {}, want[4] = {};
      f.seekg(static_cast<std::streamoff>(st.data_start + i * eb));
      f.read(reinterpret_cast<char*>(got), static_cast<std::streamsize>(eb));
      test::expected_bytes(0, "master", i, eb == 4 ? "f32" : "bf16", want);
      EXPECT_EQ(memcmp(got, want, eb), 0) << dt << " element " << i;
    }
  }
}

TEST(Checkpoint, PortableXxh64MatchesLibxxhash) {
#if ZOE_HAVE_XXHASH
  auto data = zoe::test::random_bytes(1000, 4);
  std::mt19937 rng(5);
  for (size_t len : {0, 1, 3, 4, 7, 8, 15, 31, 32, 33, 63, 64, 100, 999, 1000}) {
    detail::PortableXxh64 p;
    size_t off = 0;
    while (off < len) {  // random split points
      size_t k = std::min<size_t>(len - off, rng() % 40);
      p.update(data.data() + off, k);
      off += k;
    }
    EXPECT_EQ(p.digest(), XXH64(data.data(), len, 0)) << "length " << len;
  }
#else
  GTEST_SKIP() << "built without libxxhash";
#endif
}

}  // namespace
}  // namespace zoe::ckpt
