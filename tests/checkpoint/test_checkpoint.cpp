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
#include "tests/util/status_test_util.h"
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
  EXPECT_OK(r);
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
  EXPECT_OK(s);
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
  ASSERT_OK(save(d.path(), "step-7", 2, 7));
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
  EXPECT_OK(r->verify());

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
  for (int w : {1, 2, 3, 5}) ASSERT_OK(save(d.path(), tag(w), w, 1));
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
        ASSERT_OK(r1->read_range(mi, kind, b, n, "f32", a.data()));
        ASSERT_OK(rw->read_range(mi, kind, b, n, "f32", c.data()));
        ASSERT_EQ(first_mismatch(a.data(), c.data(), n * 4), -1)
            << "w" << w << " module " << mi << " " << kind;
      }
    }
  }
}

TEST(Checkpoint, WriterContract) {
  ScratchDir d("ckpt");
  auto tmp = begin_checkpoint(d.path(), "t");
  ASSERT_OK(tmp);
  auto w = RankWriter::create(tmp.value(), 0);
  ASSERT_OK(w);
  EXPECT_EQ(w.value()->append("x", 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.value()->begin_tensor(0, "master", "f64", 0, 4).code(), StatusCode::kInvalidArgument);
  ASSERT_OK(w.value()->begin_tensor(0, "master", "f32", 0, 4));
  float v[5] = {};
  EXPECT_EQ(w.value()->append(v, 20).code(), StatusCode::kInvalidArgument);  // more than 4 x 4 bytes
  ASSERT_OK(w.value()->append(v, 8));
  Status s = w.value()->end_tensor();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "8 bytes appended, 16 expected");
  std::vector<TensorRecord> recs;
  FileInfo fi;
  EXPECT_EQ(w.value()->finish(&recs, &fi).code(), StatusCode::kInvalidArgument);  // a tensor is open
  // A manifest that does not match the files fails the commit and removes the temporary dir.
  ASSERT_OK(w.value()->append(v, 8));
  ASSERT_OK(w.value()->end_tensor());
  ASSERT_OK(w.value()->finish(&recs, &fi));
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
  ASSERT_OK(save(d.path(), "step-1", 2, 1));
  ASSERT_OK(save(d.path(), "step-2", 1, 2));
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->manifest().step, 2);
  EXPECT_EQ(r->manifest().world_size, 1);
  // The older one is still there and readable by its own path.
  auto r1 = open_ok(d.path() + "/step-1/");
  ASSERT_TRUE(r1);
  EXPECT_EQ(r1->manifest().step, 1);
  // Saving an existing tag again swaps it in atomically.
  ASSERT_OK(save(d.path(), "step-2", 3, 22));
  r = open_ok(d.path());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->manifest().step, 22);
  EXPECT_OK(r->verify());
  EXPECT_EQ(count_tmp(d.path()), 0u);
}

// A save killed at random moments: the previous checkpoint stays loadable and verify-clean.
TEST(Checkpoint, KilledSaveLeavesPreviousIntact) {
  ScratchDir d("ckpt");
  ASSERT_OK(save(d.path(), "step-1", 2, 1));
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
    EXPECT_OK(r->verify()) << "trial " << trial;
    int64_t step = r->manifest().step;
    EXPECT_TRUE(step == 1 || step == 2) << step;
    if (step == 1) {
      EXPECT_EQ(check_range(*r, 1, "master", 0, 475, "f32"), -1);
    }
    auto r1 = open_ok(d.path() + "/step-1");
    ASSERT_TRUE(r1);
    EXPECT_OK(r1->verify());
    // Back to the previous state for the next trial: only step-1, maybe a temporary left over.
    std::error_code ec;
    fs::remove_all(d.path() + "/step-2", ec);
    ASSERT_TRUE(detail_write_latest_for_test(d.path(), "step-1"));
  }
  // The next save removes leftover temporaries.
  ASSERT_OK(save(d.path(), "step-3", 1, 3));
  EXPECT_EQ(count_tmp(d.path()), 0u);
  printf("uninterrupted save: %lld us; %d of 5 killed saves had completed\n", static_cast<long long>(full_us),
         completed);
}

TEST(Checkpoint, Corruption) {
  ScratchDir d("ckpt");
  ASSERT_OK(save(d.path(), "s", 2, 5));
  const std::string ck = d.path() + "/s";

  // A flipped byte: open succeeds (sizes match), verify names the file and both hashes.
  flip_byte(ck + "/rank-00001.bin", 5000);
  {
    auto r = open_ok(d.path());
    ASSERT_TRUE(r);
    EXPECT_OK(r->verify_file(0));
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
  ASSERT_OK(save(d.path(), "s", 2, 5));
  ASSERT_EQ(unlink((ck + "/rank-00001.bin").c_str()), 0);
  e = open_error(d.path());
  EXPECT_HAS(e, "not found");
  EXPECT_HAS(e, ck + "/rank-00001.bin is missing");

  // A manifest from a newer zoe, and a damaged one (resealed: past the checksum, for the checks
  // behind it; ManifestEdits checks the checksum itself).
  ASSERT_OK(save(d.path(), "v", 1, 5));
  const std::string vk = d.path() + "/v";
  const std::string mp = vk + "/manifest.json";
  test::edit_manifest(
      vk, [](nlohmann::json& j) { j["format_version"] = 99; }, true);
  e = open_error(d.path());
  EXPECT_HAS(e, mp + ": format_version 99 was written by a newer zoe");
  test::edit_manifest(
      vk, [](nlohmann::json& j) { j["format_version"] = 2, j["tensors"][0]["dtype"] = "f64"; }, true);
  EXPECT_HAS(open_error(d.path()),
             mp + ": key 'tensors[0].dtype': expected \"f32\", \"bf16\", \"f16\", \"int8b256\" or "
                  "\"int4b128\", found string \"f64\"");
  test::edit_manifest(
      vk, [](nlohmann::json& j) { j["tensors"][0].erase("dtype"); }, true);
  EXPECT_HAS(open_error(d.path()), "key 'tensors[0].dtype' is missing");
  std::string text = read_text(mp);
  test::write_file(mp, text.substr(0, text.size() / 2));
  test::reseal(vk);
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
  const std::string sd = mnt.path() + "/save";  // outputs go beside it, never inside
  fs::create_directories(sd);
  ASSERT_OK(save(sd, "step-1", 2, 1));
  std::vector<ModuleInfo> big(1);
  big[0].name = "big";
  big[0].padded = 1u << 20;  // 4 MiB of f32 per kind: cannot fit in 1 MiB
  big[0].params = {{"w", {1024, 1024}, 0, 1u << 20}};
  Status s = save(sd, "step-2", 2, 2, big);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.to_string();
  EXPECT_HAS(s.message(), sd + "/step-2.tmp-");
  EXPECT_HAS(s.message(), "/rank-00000.bin");
  EXPECT_HAS(s.message(), "bytes at offset");
  EXPECT_HAS(s.message(), "No space left on device");
  EXPECT_EQ(count_tmp(sd), 0u) << "the temporary directory is removed";
  EXPECT_EQ(read_text(sd + "/latest"), "step-1\n");
  auto r = open_ok(sd);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->manifest().step, 1);
  EXPECT_OK(r->verify());
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
  ScratchDir d("ckpt"), o("ckpt-out");  // outputs outside the save directory
  ASSERT_OK(save(d.path(), "s", 2, 9));
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);
  for (const char* dt : {"fp32", "bf16"}) {
    std::string out = o.file(std::string("model-") + dt + ".safetensors");
    Status s = consolidate(*r, out, dt, 100);  // tiny pieces: every parameter takes several
    ASSERT_OK(s);
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
  EXPECT_EQ(consolidate(*r, o.file("x.safetensors"), "int8").code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(o.file("x.safetensors")));
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
  ScratchDir d("ckpt"), o("ckpt-out");  // outputs outside the save directory
  std::vector<ModuleInfo> big(1);
  const uint64_t n = 16u << 20;  // 64 MiB of f32
  big[0].name = "big";
  big[0].padded = n;
  big[0].params = {{"w", {4096, 4096}, 0, n}};
  // Only master: consolidate's source, and keeps the test short.
  auto tmp = begin_checkpoint(d.path(), "s");
  ASSERT_OK(tmp);
  Manifest man;
  man.world_size = 2;
  man.modules = big;
  {
    std::vector<float> piece(1 << 16);
    for (int r = 0; r < 2; ++r) {
      auto w = RankWriter::create(tmp.value(), r);
      ASSERT_OK(w);
      auto [b, e] = test::partition(n, 2, r);
      ASSERT_OK(w.value()->begin_tensor(0, "master", "f32", b, e - b));
      for (uint64_t i = b; i < e; i += piece.size()) {
        for (size_t j = 0; j < piece.size(); ++j) piece[j] = master_value(0, i + j);
        ASSERT_OK(w.value()->append(piece.data(), piece.size() * 4));
      }
      ASSERT_OK(w.value()->end_tensor());
      FileInfo fi;
      ASSERT_OK(w.value()->finish(&man.tensors, &fi));
      man.files.push_back(fi);
    }
  }
  ASSERT_OK(commit_checkpoint(d.path(), "s", tmp.value(), man));
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);

  std::vector<const char*> dts = {"fp32"};
#if !defined(__SANITIZE_ADDRESS__)
  dts.push_back("bf16");  // conversion scratch is freed per call; ASan's quarantine would keep it
#endif
  for (const char* dt : dts) {
    std::string out = o.file("big.safetensors");
    if (!reset_hwm()) GTEST_SKIP() << "cannot reset VmHWM";
    uint64_t before = vm_hwm_kib();
    Status s = consolidate(*r, out, dt, 1u << 20);
    uint64_t growth_kib = vm_hwm_kib() - before;
    ASSERT_OK(s);
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

// ---- consolidate checks every byte it streams ----

// 25 flips: one inside each of the 18 tensors (every kind, both files) and 7 in the padding
// between them. Each fails consolidate with kCorruption naming the file (and the tensor, for
// those inside one); nothing is left behind; the undamaged checkpoint then consolidates.
TEST(Checkpoint, ConsolidateCatchesEveryByteFlip) {
  ScratchDir d("ckpt"), o("ckpt-out");  // outputs outside the save directory
  ASSERT_OK(save(d.path(), "s", 2, 4));
  const std::string ck = d.path() + "/s";
  const std::string out = o.file("m.safetensors");
  struct Flip {
    std::string file;
    uint64_t offset;
    long long tensor;  // index in manifest().tensors, -1 for padding
  };
  std::vector<Flip> flips;
  {
    auto r = open_ok(d.path());
    ASSERT_TRUE(r);
    const Manifest& m = r->manifest();
    std::mt19937_64 rng(11);
    for (size_t t = 0; t < m.tensors.size(); ++t) {
      const TensorRecord& rec = m.tensors[t];
      char name[32];
      snprintf(name, sizeof(name), "rank-%05d.bin", rec.rank);
      flips.push_back({ck + "/" + name, rec.offset + rng() % rec.bytes, static_cast<long long>(t)});
    }
    for (size_t t = 0; t < m.tensors.size() && flips.size() < 25; ++t) {
      const TensorRecord& rec = m.tensors[t];
      const uint64_t end = rec.offset + rec.bytes;
      if (end % 4096 == 0) continue;  // no padding after this one
      bool last = true;               // nothing follows in this file: no padding either
      for (const auto& o : m.tensors) last = last && !(o.rank == rec.rank && o.offset > rec.offset);
      if (last) continue;
      char name[32];
      snprintf(name, sizeof(name), "rank-%05d.bin", rec.rank);
      flips.push_back({ck + "/" + name, end + rng() % (4096 - end % 4096), -1});
    }
  }
  ASSERT_EQ(flips.size(), 25u);
  int caught = 0;
  for (const Flip& f : flips) {
    flip_byte(f.file, f.offset);
    auto r = open_ok(d.path());  // sizes match: only the checksums can tell
    ASSERT_TRUE(r);
    Status s = consolidate(*r, out, "bf16", 1000);  // odd piece size: rounded up to 4096
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << f.file << " byte " << f.offset << ": " << s.to_string();
    EXPECT_HAS(s.message(), "checksum mismatch in " + f.file);
    if (f.tensor >= 0) {
      EXPECT_HAS(s.message(), "tensors[" + std::to_string(f.tensor) + "] (module");
    } else {
      EXPECT_HAS(s.message(), "the damage is in the padding");
    }
    EXPECT_HAS(s.message(), "writing " + out);
    caught += s.code() == StatusCode::kCorruption;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_EQ(count_tmp(o.path()), 0u);
    flip_byte(f.file, f.offset);  // back
  }
  EXPECT_EQ(caught, 25);
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);
  Status s = consolidate(*r, out, "bf16", 1000);
  EXPECT_OK(s);
}

// ---- the manifest is checksummed and checked ----

struct ManifestEdit {
  const char* what;
  std::function<void(nlohmann::json&)> edit;
  // With the checksum resealed: the structural error open() gives ("" when the edit is
  // structurally valid), else the error verify() gives.
  std::string open_error, verify_error;
};

// Index of the tensor record of (rank, module, kind).
size_t find_tensor(const nlohmann::json& j, int rank, int module, const std::string& kind) {
  for (size_t i = 0; i < j["tensors"].size(); ++i) {
    const auto& t = j["tensors"][i];
    if (t["rank"] == rank && t["module"] == module && t["kind"] == kind) return i;
  }
  ADD_FAILURE() << "no tensor " << rank << " " << module << " " << kind;
  return 0;
}

std::vector<ManifestEdit> manifest_edits() {
  std::vector<ManifestEdit> e;
  e.push_back({"a tensor's offset - 4096",
               [](nlohmann::json& j) {
                 j["tensors"][find_tensor(j, 1, 1, "exp_avg")]["offset"] =
                     j["tensors"][find_tensor(j, 1, 1, "exp_avg")]["offset"].get<uint64_t>() - 4096;
               },
               "overlap", ""});
  e.push_back({"a parameter tensor's offset + 4",
               [](nlohmann::json& j) {
                 j["tensors"][find_tensor(j, 0, 2, "param")]["offset"] =
                     j["tensors"][find_tensor(j, 0, 2, "param")]["offset"].get<uint64_t>() + 4;
               },
               "expected a multiple of 4096", ""});
  // The fixture stores no exp_avg_sq: master and exp_avg are the same size and dtype, the same case.
  e.push_back({"two states' offsets swapped",
               [](nlohmann::json& j) {
                 auto& a = j["tensors"][find_tensor(j, 0, 1, "master")];
                 auto& b = j["tensors"][find_tensor(j, 0, 1, "exp_avg")];
                 std::swap(a["offset"], b["offset"]);
               },
               "", "checksum mismatch in "});
  e.push_back(
      {"trainer.step 3 -> 1", [](nlohmann::json& j) { j["trainer"]["step"] = 1; },
       "key 'trainer.step': expected a count of iterations >= the optimizer steps taken (step 3), found "
       "number 1",
       ""});
  e.push_back({"trainer.step 3 -> -5", [](nlohmann::json& j) { j["trainer"]["step"] = -5; },
               "key 'trainer.step'", ""});
  e.push_back({"engine.steps 3 -> 100", [](nlohmann::json& j) { j["engine"]["steps"] = 100; },
               "key 'engine.steps': expected the top-level step (3), found number 100", ""});
  e.push_back(
      {"step 3 -> -1 everywhere",
       [](nlohmann::json& j) { j["step"] = -1, j["engine"]["steps"] = -1, j["trainer"]["step"] = -1; },
       "key 'step': expected a non-negative step count, found number -1", ""});
  e.push_back({"a parameter renamed",
               [](nlohmann::json& j) { j["modules"][1]["params"][0]["name"] = "attn.q"; }, "", ""});
  e.push_back({"a parameter's numel", [](nlohmann::json& j) { j["modules"][1]["params"][1]["numel"] = 25; },
               "key 'modules[1].params[1].numel': shape has 24 elements but numel is 25", ""});
  e.push_back(
      {"parameters overlapping", [](nlohmann::json& j) { j["modules"][1]["params"][1]["offset"] = 190; },
       "key 'modules[1].params[1].offset': elements [190, 214) overlap modules[1].params[0]'s [0, 192)", ""});
  e.push_back({"a tensor's bytes", [](nlohmann::json& j) { j["tensors"][0]["bytes"] = 8; },
               "key 'tensors[0].bytes': expected count x the dtype's size", ""});
  e.push_back({"a tensor past its file's end",
               [](nlohmann::json& j) { j["tensors"][find_tensor(j, 1, 2, "param")]["offset"] = 1u << 20; },
               "inside rank-00001.bin", ""});
  return e;
}

TEST(Checkpoint, ManifestEditsCaught) {
  ScratchDir d("ckpt");
  const std::string ck = d.path() + "/s";
  const std::string mp = ck + "/manifest.json";
  for (const ManifestEdit& e : manifest_edits()) {
    SCOPED_TRACE(e.what);
    ASSERT_OK(save(d.path(), "s", 2, 3));
    const std::string pristine = read_text(mp);
    // As it is: the checksum catches every edit, on open (load, verify, inspect, consolidate).
    test::edit_manifest(ck, e.edit, false);
    ASSERT_NE(read_text(mp), pristine) << "the edit changed nothing";
    std::string err = open_error(d.path());
    EXPECT_HAS(err, "corruption: checksum mismatch in " + mp + ": manifest.xxh64 says xxh64");
    EXPECT_HAS(err, "the manifest was modified or damaged after checkpoint " + ck + " was written");
    // Resealed: the structural checks behind the checksum, or the per-tensor checksums.
    test::reseal(ck);
    auto r = Reader::open(d.path());
    if (!e.open_error.empty()) {
      ASSERT_FALSE(r.is_ok());
      EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
      EXPECT_HAS(r.status().message(), mp + ": ");
      EXPECT_HAS(r.status().message(), e.open_error);
      continue;
    }
    ASSERT_OK(r);
    Status v = r.value()->verify();
    if (e.verify_error.empty()) {
      EXPECT_OK(v);
    } else {
      EXPECT_EQ(v.code(), StatusCode::kCorruption);
      EXPECT_HAS(v.message(), e.verify_error);
      EXPECT_HAS(v.message(), "tensors[");
    }
  }
}

TEST(Checkpoint, ManifestWrongTypesAndLimits) {
  ScratchDir d("ckpt");
  const std::string ck = d.path() + "/s";
  const std::string mp = ck + "/manifest.json";
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"trainer.step a string", [](nlohmann::json& j) { j["trainer"]["step"] = "3"; },
       "key 'trainer.step': expected an integer in [-9223372036854775808, 9223372036854775807], found string "
       "\"3\""},
      {"engine.steps a string", [](nlohmann::json& j) { j["engine"]["steps"] = "3"; },
       "key 'engine.steps': expected an integer"},
      {"engine a number", [](nlohmann::json& j) { j["engine"] = 7; },
       "key 'engine': expected an object, found number 7"},
      {"trainer an array",
       [](nlohmann::json& j) {
         j["trainer"] = {1, 2};
       },
       "key 'trainer': expected an object"},
      {"step a float", [](nlohmann::json& j) { j["step"] = 3.5; }, "key 'step': expected an integer"},
      {"world_size past int", [](nlohmann::json& j) { j["world_size"] = 4294967298ull; },
       "key 'world_size': expected an integer in [-2147483648, 2147483647], found number 4294967298"},
      {"module index negative", [](nlohmann::json& j) { j["tensors"][0]["module"] = -1; },
       "key 'tensors[0].module': expected an integer in [0, 4294967295], found number -1"},
      {"offset near 2^64", [](nlohmann::json& j) { j["tensors"][0]["offset"] = 18446744073709547520ull; },
       "key 'tensors[0].offset': expected a count below 2^56"},
      {"shape with a string", [](nlohmann::json& j) { j["modules"][0]["params"][0]["shape"][1] = "8"; },
       "key 'modules[0].params[0].shape[1]': expected a dimension in [0, 2^56), found string \"8\""},
      {"modules an object", [](nlohmann::json& j) { j["modules"] = nlohmann::json::object(); },
       "key 'modules': expected an array"},
      {"a file listed twice", [](nlohmann::json& j) { j["files"].push_back(j["files"][0]); },
       "key 'files[2].name': expected a file that 'files' lists once (it is also files[0])"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ASSERT_OK(save(d.path(), "s", 2, 3));
    test::edit_manifest(ck, c.edit, true);
    std::string err = open_error(d.path());
    EXPECT_HAS(err, "corruption: " + mp + ": " + c.error);
  }

  // Raw text the JSON library would throw on, or that is too deep or too big.
  ASSERT_OK(save(d.path(), "s", 2, 3));
  const std::string pristine = read_text(mp);
  auto with_text = [&](const std::string& text) {
    test::write_file(mp, text);
    test::reseal(ck);
    return open_error(d.path());
  };
  std::string text = pristine;
  text.replace(text.find("\"world_size\": 2"), 15, "\"world_size\": 1e400");
  std::string err = with_text(text);
  EXPECT_HAS(err, "corruption: " + mp + " is not valid JSON");
  EXPECT_HAS(err, "1e400");
  text = pristine;
  text.replace(text.find("\"trainer\": {"), 12,
               "\"trainer\": {\"deep\": " + std::string(100, '[') + std::string(100, ']') + ",");
  err = with_text(text);
  EXPECT_HAS(err, "corruption: " + mp + " nests deeper than 64 levels at byte");
  ASSERT_EQ(truncate(mp.c_str(), static_cast<off_t>(kManifestMaxBytes + 1)), 0);  // sparse: cheap
  err = open_error(d.path());
  EXPECT_HAS(err, "corruption: " + mp + " has 268435457 bytes, more than the 268435456");

  // The checksum file itself: garbage, missing.
  test::write_file(mp, pristine);
  test::write_file(ck + "/manifest.xxh64", "hello\x01\n");
  EXPECT_HAS(open_error(d.path()),
             ck + "/manifest.xxh64 is corrupt: expected \"<16 hex digits>  manifest.json\", "
                  "found \"hello\\x01\\x0a\"");
  ASSERT_EQ(unlink((ck + "/manifest.xxh64").c_str()), 0);
  EXPECT_HAS(open_error(d.path()), ck + "/manifest.xxh64 is missing: format 2 manifests are checksummed");
  // A format 1 manifest (older zoe: no checksums at all) still opens, with a warning.
  test::edit_manifest(
      ck,
      [](nlohmann::json& j) {
        j["format_version"] = 1;
        for (auto& t : j["tensors"]) t.erase("xxh64");
      },
      false);
  auto r = open_ok(d.path());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->manifest().format_version, 1);
  EXPECT_EQ(r->manifest_xxh64(), "");
  EXPECT_OK(r->verify());
  flip_byte(ck + "/rank-00000.bin", 10);
  Status s = r->verify();
  EXPECT_HAS(s.message(), "a format 1 checkpoint has no per-tensor checksums");
}

TEST(Checkpoint, LatestCorrupt) {
  ScratchDir d("ckpt");
  ASSERT_OK(save(d.path(), "step-1", 1, 1));
  test::write_file(d.file("latest"), std::string("step-1\0\x07x", 9) + "\n");
  std::string err = open_error(d.path());
  EXPECT_HAS(err, "corruption: " + d.file("latest") + " is corrupt: expected the tag of a checkpoint");
  EXPECT_HAS(err, "found \"step-1\\x00\\x07x\\x0a\"");
  test::write_file(d.file("latest"), std::string(5000, 'a'));
  EXPECT_HAS(open_error(d.path()), d.file("latest") + " has 5000 bytes, more than the 4096");
  test::write_file(d.file("latest"), "../etc\n");
  EXPECT_HAS(open_error(d.path()), "found \"../etc\\x0a\"");
  // Tags with control characters are refused when saving, too.
  EXPECT_EQ(begin_checkpoint(d.path(), std::string("a\0b", 3)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(begin_checkpoint(d.path(), ".zoe-lock").status().code(), StatusCode::kInvalidArgument);
}

TEST(Checkpoint, JsonFieldsTypes) {
  nlohmann::json j = {{"i", 1ll << 40}, {"neg", -1}, {"d", 2.5}, {"b", true}, {"s", "x"}, {"u", 7u}};
  JsonFields f(j, "M", "engine");
  int i = 0;
  EXPECT_HAS(f.get("i", &i).message(),
             "M: key 'engine.i': expected an integer in [-2147483648, 2147483647], "
             "found number 1099511627776");
  int64_t i64 = 0;
  EXPECT_OK(f.get("i", &i64));
  EXPECT_EQ(i64, 1ll << 40);
  uint64_t u = 0;
  EXPECT_EQ(f.get("neg", &u).code(), StatusCode::kCorruption);
  EXPECT_OK(f.get("u", &u));
  EXPECT_EQ(u, 7u);
  double dv = 0;
  EXPECT_OK(f.get("d", &dv));
  EXPECT_EQ(dv, 2.5);
  EXPECT_OK(f.get("u", &dv));  // an integer is a number
  EXPECT_HAS(f.get("d", &i64).message(), "found number 2.5");
  bool b = false;
  EXPECT_OK(f.get("b", &b));
  EXPECT_TRUE(b);
  EXPECT_HAS(f.get("s", &b).message(), "expected true or false, found string \"x\"");
  std::string s;
  EXPECT_HAS(f.get("b", &s).message(), "expected a string, found boolean true");
  EXPECT_HAS(f.get("nope", &s).message(), "M: key 'engine.nope' is missing");
  s = "kept";
  EXPECT_OK(f.get_optional("nope", &s));
  EXPECT_EQ(s, "kept");
  EXPECT_EQ(f.get_optional("d", &s).code(), StatusCode::kCorruption);
}

// ---- one writer per save directory ----

TEST(Checkpoint, SaveDirLockRefusesSecondWriter) {
  ScratchDir d("ckpt");
  ASSERT_OK(save(d.path(), "a", 1, 1));  // this process now holds d's lock
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  // A second open file description, in this same process: refused, naming the holder.
  auto second = SaveDirLock::acquire(d.path());
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_HAS(second.status().message(), "save directory " + d.path() +
                                            " is in use by another writer (\"pid " +
                                            std::to_string(getpid()) + " host " + host + " since ");
  EXPECT_HAS(second.status().message(), "holds " + d.path() + "/.zoe-lock");
  // Saving again from this process is fine; once it lets go, another writer may take it, and
  // then this process is the one refused.
  ASSERT_OK(save(d.path(), "b", 1, 2));
  release_save_dir(d.path());
  auto other = SaveDirLock::acquire(d.path());
  ASSERT_OK(other);
  auto t = begin_checkpoint(d.path(), "c");
  EXPECT_EQ(t.status().code(), StatusCode::kAlreadyExists) << t.status().to_string();
  EXPECT_HAS(t.status().message(), "save directory " + d.path() + " is in use by another writer");
  other.value().reset();  // the other writer lets go
  Status s = save(d.path(), "c", 1, 3);
  EXPECT_OK(s);
  release_save_dir(d.path());
}

// Another process saving into the directory: its live temporary survives our attempt to save
// (which is refused, naming its pid); once it is dead, the leftover is removed by our next save.
TEST(Checkpoint, SaveDirLockProtectsLiveTemporary) {
  ScratchDir d("ckpt");
  int ready[2], stop[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(stop), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(ready[0]);
    close(stop[1]);
    auto lock = SaveDirLock::acquire(d.path());
    char ok = lock.is_ok() && mkdir((d.path() + "/step-9.tmp-live").c_str(), 0755) == 0 ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1) _exit(2);
    char c;
    (void)!read(stop[0], &c, 1);  // until the parent says so (or dies)
    _exit(0);
  }
  close(ready[1]);
  close(stop[0]);
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 'y');
  auto t = begin_checkpoint(d.path(), "step-10");
  EXPECT_EQ(t.status().code(), StatusCode::kAlreadyExists) << t.status().to_string();
  EXPECT_HAS(t.status().message(), "in use by another writer (\"pid " + std::to_string(pid) + " host ");
  EXPECT_TRUE(fs::exists(d.path() + "/step-9.tmp-live")) << "a live writer's temporary was removed";
  EXPECT_EQ(count_tmp(d.path()), 1u);
  // The other writer ends without cleaning up (as if killed): its temporary is now a leftover.
  kill(pid, SIGKILL);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  close(ready[0]);
  close(stop[1]);
  Status s = save(d.path(), "step-10", 1, 10);
  ASSERT_OK(s);
  EXPECT_FALSE(fs::exists(d.path() + "/step-9.tmp-live"));
  EXPECT_EQ(count_tmp(d.path()), 0u);
  release_save_dir(d.path());
}

}  // namespace
}  // namespace zoe::ckpt
