// SwapFile tests: extent allocation, striping layout on disk, growth, full disks, no-O_DIRECT paths,
// unique locked names, reclaim of dead processes' files, checksums.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "io/buffer.h"
#include "io/fault_injector.h"
#include "io/swap_file.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::io {
namespace {

using test::first_mismatch;
using test::random_bytes;
using test::ScratchDir;
using test::ScratchMount;

std::unique_ptr<IoEngine> make_engine() {
  auto e = IoEngine::create({});
  EXPECT_OK(e);
  return std::move(e).value();
}

TEST(SwapFile, AllocateFreeCoalesce) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.initial_bytes = 1 << 20;
  o.grow_bytes = 1 << 20;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  SwapFile& s = *sf.value();
  EXPECT_EQ(s.capacity(), 1u << 20);
  auto a = s.allocate(1000).value();  // rounded to 4096
  auto b = s.allocate(8192).value();
  auto c = s.allocate(4096).value();
  EXPECT_EQ(a.bytes, 4096u);
  EXPECT_EQ(a.offset % 4096, 0u);
  EXPECT_EQ(b.offset, a.offset + 4096);
  EXPECT_EQ(s.used_bytes(), 16384u);
  s.free(b);
  auto d = s.allocate(4096).value();  // first fit reuses b's hole
  EXPECT_EQ(d.offset, b.offset);
  s.free(a);
  s.free(d);
  s.free(c);
  EXPECT_EQ(s.used_bytes(), 0u);
  // Everything coalesced: the whole capacity is one free range again.
  auto all = s.allocate(1 << 20).value();
  EXPECT_EQ(all.offset, 0u);
  EXPECT_EQ(s.capacity(), 1u << 20);
  // A request larger than what is left grows the files.
  auto more = s.allocate(3 << 20).value();
  EXPECT_GE(s.capacity(), 4u << 20);
  EXPECT_EQ(more.offset, 1u << 20);
  EXPECT_EQ(s.files()[0]->size().value(), s.capacity() + kSwapGuardBytes);
}

TEST(SwapFile, StripesAcrossPathsInTheDocumentedLayout) {
  ScratchDir d0("s0"), d1("s1"), d2("s2");
  SwapFileOptions o;
  o.dirs = {d0.path(), d1.path(), d2.path()};
  o.stripe_bytes = 64 * 1024;
  o.keep = true;  // read the files directly below
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  auto eng = make_engine();
  const size_t n = 10 * 64 * 1024 + 4096 * 3;  // 10 stripes and a bit
  auto ext = sf.value()->allocate(n).value();
  ASSERT_EQ(ext.offset, 0u);
  auto data = random_bytes(n, 99);
  auto buf = AlignedBuffer::allocate(n).value();
  memcpy(buf.data(), data.data(), n);
  ASSERT_OK(sf.value()->write(*eng, ext, buf.data(), n)->wait());
  // Logical stripe k lives in file k % 3 at offset (k / 3) * stripe.
  for (size_t k = 0; k * 65536 < n; ++k) {
    const auto& f = sf.value()->files()[k % 3];
    std::ifstream in(f->path(), std::ios::binary);
    in.seekg(static_cast<std::streamoff>((k / 3) * 65536));
    size_t len = std::min<size_t>(65536, n - k * 65536);
    std::vector<char> got(len);
    in.read(got.data(), static_cast<std::streamsize>(len));
    ASSERT_EQ(first_mismatch(got.data(), data.data() + k * 65536, len), -1) << "stripe " << k;
  }
  // And a read of a middle piece that crosses stripe boundaries.
  auto rb = AlignedBuffer::allocate(200 * 1024).value();
  ASSERT_OK(sf.value()->read(*eng, ext, rb.data(), 200 * 1024, 40960)->wait());
  EXPECT_EQ(first_mismatch(rb.data(), data.data() + 40960, 200 * 1024), -1);
  for (const auto& f : sf.value()->files()) unlink(f->path().c_str());
}

TEST(SwapFile, MissingDirectoryIsAClearError) {
  SwapFileOptions o;
  o.dirs = {"/nonexistent/zoe-nvme"};
  auto sf = SwapFile::create(o);
  ASSERT_FALSE(sf.is_ok());
  EXPECT_EQ(sf.status().code(), StatusCode::kNotFound);
  EXPECT_NE(sf.status().message().find("/nonexistent/zoe-nvme"), std::string::npos) << sf.status().message();
}

TEST(SwapFile, SpaceLimit) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.max_bytes = 2 << 20;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  EXPECT_OK(sf.value()->allocate(1 << 20));
  auto r = sf.value()->allocate(2 << 20);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNoSpace);
}

TEST(SwapFile, FullDiskNamesPathAskedAndFree) {
  // A real full file system: a 4 MiB tmpfs.
  ScratchMount m("tmpfs", "size=4m");
  if (!m.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  SwapFileOptions o;
  o.dirs = {m.path()};
  o.grow_bytes = 1 << 20;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  EXPECT_OK(sf.value()->allocate(2 << 20));
  auto r = sf.value()->allocate(16 << 20);
  ASSERT_FALSE(r.is_ok());
  const Status& s = r.status();
  EXPECT_EQ(s.code(), StatusCode::kNoSpace);
  EXPECT_NE(s.message().find(m.path()), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("were free there before the attempt"), std::string::npos) << s.message();
  // The earlier extent still works.
  EXPECT_EQ(sf.value()->used_bytes(), 2u << 20);
}

TEST(SwapFile, FileSizeLimitIsReportedAsNoSpace) {
  // RLIMIT_FSIZE makes fallocate fail with EFBIG: a second, unprivileged way to hit the wall.
  ScratchDir dir("swap");
  struct rlimit old;
  getrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = {1 << 20, old.rlim_max};
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.grow_bytes = 4096;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  auto r = sf.value()->allocate(8 << 20);
  setrlimit(RLIMIT_FSIZE, &old);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNoSpace);
  EXPECT_NE(r.status().message().find(dir.path()), std::string::npos) << r.status().message();
}

TEST(SwapFile, PathWithoutODirect) {
  // ramfs refuses O_DIRECT: "require" is a clear error, "prefer" falls back to buffered I/O.
  ScratchMount m("ramfs", "");
  if (!m.ok()) GTEST_SKIP() << "cannot mount a ramfs here (needs root)";
  SwapFileOptions o;
  o.dirs = {m.path()};
  o.direct = DirectMode::kRequire;
  auto bad = SwapFile::create(o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(bad.status().message().find("does not support O_DIRECT"), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find(m.path()), std::string::npos);

  o.direct = DirectMode::kPrefer;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  EXPECT_FALSE(sf.value()->direct());
  auto eng = make_engine();
  auto ext = sf.value()->allocate(1 << 20).value();
  auto data = random_bytes(1 << 20, 5);
  ASSERT_OK(sf.value()->write(*eng, ext, data.data(), data.size())->wait());
  std::vector<unsigned char> back(data.size());
  ASSERT_OK(sf.value()->read(*eng, ext, back.data(), back.size())->wait());
  EXPECT_EQ(first_mismatch(back.data(), data.data(), data.size()), -1);
}

TEST(FsProbe, ReportsTypeSpaceAndODirect) {
  ScratchDir dir("probe");
  auto r = probe_fs(dir.path());
  ASSERT_OK(r);
  EXPECT_FALSE(r.value().fs_type.empty());
  EXPECT_GT(r.value().total_bytes, 0u);
  ScratchMount m("ramfs", "");
  if (m.ok()) {
    auto rr = probe_fs(m.path());
    ASSERT_OK(rr);
    EXPECT_FALSE(rr.value().direct_io);
    EXPECT_FALSE(rr.value().direct_io_error.empty());
  }
  EXPECT_FALSE(probe_fs("/nonexistent/x").is_ok());
}

// A small ext4 file system on a loop device: unlike tmpfs, ext4 keeps the blocks a failed
// fallocate reserved, which is how "0 bytes are free" came about.
class ScratchExt4 {
 public:
  explicit ScratchExt4(const char* size) {
    img_ = dir_.file("img");
    mnt_ = dir_.file("mnt");
    std::filesystem::create_directories(mnt_);
    std::string mk = "truncate -s " + std::string(size) + " " + img_ + " && mkfs.ext4 -q -F " + img_ +
                     " >/dev/null 2>&1 && mount -o loop " + img_ + " " + mnt_ + " >/dev/null 2>&1";
    ok_ = system(mk.c_str()) == 0;
  }
  ~ScratchExt4() {
    if (ok_) umount2(mnt_.c_str(), MNT_DETACH);
  }
  bool ok() const { return ok_; }
  const std::string& path() const { return mnt_; }

 private:
  ScratchDir dir_{"ext4"};
  std::string img_, mnt_;
  bool ok_ = false;
};

uint64_t free_at(const std::string& path) { return free_bytes_at(path).value(); }

TEST(SwapFile, FreeSpaceIsKnownThroughTheDescriptorOnceThePathIsUnlinked) {
  // A SIGINT while a model initialises unlinks the swap files at once (the run stops at its next
  // step); the engine's NVMe space check that follows must still see the file system's free space.
  ScratchMount m("tmpfs", "size=8m");
  if (!m.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  SwapFileOptions o;
  o.dirs = {m.path()};
  o.initial_bytes = 1 << 20;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  const File& f = *sf.value()->files()[0];
  const uint64_t before = free_at(m.path());
  EXPECT_GE(unlink_live_swap_files(), 1u);
  EXPECT_FALSE(free_bytes_at(f.path()).is_ok());  // the path says nothing now
  auto fb = f.free_bytes();
  ASSERT_OK(fb);
  EXPECT_EQ(fb.value(), before);  // the unlinked file still holds its blocks
  EXPECT_GT(fb.value(), 6u << 20);
  EXPECT_LT(fb.value(), 7u << 20);
  struct stat st;
  ASSERT_EQ(stat(m.path().c_str(), &st), 0);
  auto dev = f.device();
  ASSERT_OK(dev);
  EXPECT_EQ(dev.value(), static_cast<uint64_t>(st.st_dev));
}

TEST(SwapFileGrowth, StepShrinksToWhatFitsOnANearlyFullDisk) {
  // The reported case in small: the default 256 MiB step on a disk with less free than that.
  ScratchMount m("tmpfs", "size=8m");
  if (!m.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  SwapFileOptions o;
  o.dirs = {m.path()};
  ASSERT_EQ(o.grow_bytes, 256u << 20);
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  auto a = sf.value()->allocate(3 << 20);
  ASSERT_OK(a);
  EXPECT_EQ(sf.value()->capacity(), 3u << 20);  // just what was needed
  auto b = sf.value()->allocate(4 << 20);
  ASSERT_OK(b);
  EXPECT_EQ(sf.value()->capacity(), 7u << 20);
}

TEST(SwapFileGrowth, FullStepWhenTheDiskHasRoom) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.grow_bytes = 8 << 20;
  if (free_at(dir.path()) < (64u << 20)) GTEST_SKIP() << "less than 64 MiB free in " << dir.path();
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  ASSERT_OK(sf.value()->allocate(4096));
  EXPECT_EQ(sf.value()->capacity(), 8u << 20);
  ASSERT_OK(sf.value()->allocate(6 << 20));  // fits the free tail
  EXPECT_EQ(sf.value()->capacity(), 8u << 20);
  // More than a step: at least what is needed (the tail's 2 MiB - 4 KiB, then whole stripes).
  ASSERT_OK(sf.value()->allocate(20 << 20));
  EXPECT_EQ(sf.value()->capacity(), 27u << 20);
}

TEST(SwapFileGrowth, Ext4NoSpaceReportsTheFreeSpaceBeforeTheAttemptAndGivesItBack) {
  ScratchExt4 fs("32M");
  if (!fs.ok()) GTEST_SKIP() << "cannot make and loop-mount an ext4 image here (needs root and mkfs.ext4)";
  SwapFileOptions o;
  o.dirs = {fs.path()};
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  // 8 MiB fits where the 256 MiB step does not.
  auto a = sf.value()->allocate(8 << 20);
  ASSERT_OK(a);
  const uint64_t before = free_at(fs.path());
  ASSERT_GT(before, 4u << 20);
  auto r = sf.value()->allocate(64 << 20);
  ASSERT_FALSE(r.is_ok());
  const std::string& msg = r.status().message();
  EXPECT_EQ(r.status().code(), StatusCode::kNoSpace) << msg;
  EXPECT_NE(msg.find(" " + std::to_string(before) + " bytes ("), std::string::npos)
      << "expected the " << before << " bytes free before the attempt in: " << msg;
  EXPECT_NE(msg.find("before the attempt"), std::string::npos) << msg;
  // ext4 holds what the failed fallocate reserved until the file is cut back (a metadata block
  // may stay).
  EXPECT_GE(free_at(fs.path()) + (64u << 10), before);
  EXPECT_EQ(sf.value()->files()[0]->size().value(), (8u << 20) + kSwapGuardBytes);
  EXPECT_OK(sf.value()->allocate(4 << 20));
}

TEST(SwapFileGrowth, AFailedGrowthCutsBackTheFilesThatGrew) {
  // File 0 on a roomy disk grows, file 1 on a 4 MiB tmpfs cannot: file 0 goes back to its size.
  ScratchDir big("swap");
  ScratchMount small("tmpfs", "size=4m");
  if (!small.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  SwapFileOptions o;
  o.dirs = {big.path(), small.path()};
  o.grow_bytes = 0;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  ASSERT_OK(sf.value()->allocate(2 << 20));
  auto r = sf.value()->allocate(16 << 20);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNoSpace);
  EXPECT_NE(r.status().message().find(small.path()), std::string::npos) << r.status().message();
  EXPECT_EQ(sf.value()->files()[0]->size().value(), (1u << 20) + kSwapGuardBytes);
  EXPECT_EQ(sf.value()->files()[1]->size().value(), (1u << 20) + kSwapGuardBytes);
}

// Another open file description on path: does it get the lock?
bool lockable(const std::string& path) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = flock(fd, LOCK_EX | LOCK_NB) == 0;
  close(fd);
  return ok;
}

TEST(SwapFileNames, TwoSetsOnOnePathGetTheirOwnLockedFiles) {
  ScratchDir d0("s0"), d1("s1");
  SwapFileOptions o;
  o.dirs = {d0.path(), d1.path()};
  o.stripe_bytes = 64 * 1024;
  auto a = SwapFile::create(o);
  auto b = SwapFile::create(o);  // same name, same paths: a second job
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  std::vector<std::string> paths;
  for (auto* sf : {a.value().get(), b.value().get()}) {
    ASSERT_EQ(sf->files().size(), 2u);
    for (const auto& f : sf->files()) {
      std::string base = std::filesystem::path(f->path()).filename();
      EXPECT_TRUE(is_unique_swap_file_name(base)) << base;
      EXPECT_EQ(base.rfind("zoe-swap-", 0), 0u) << base;
      EXPECT_FALSE(lockable(f->path())) << f->path() << " is not locked";
      paths.push_back(f->path());
    }
  }
  // One suffix per set, the same in every directory.
  auto suffix = [](const std::string& p) { return std::filesystem::path(p).stem().stem().string(); };
  EXPECT_EQ(suffix(paths[0]), suffix(paths[1]));
  EXPECT_NE(paths[0], paths[2]);
  // The data of one set never shows in the other.
  auto eng = make_engine();
  const size_t n = 256 * 1024;
  auto ea = a.value()->allocate(n).value(), eb = b.value()->allocate(n).value();
  auto da = random_bytes(n, 1), db = random_bytes(n, 2);
  auto buf = AlignedBuffer::allocate(n).value();
  memcpy(buf.data(), da.data(), n);
  ASSERT_OK(a.value()->write(*eng, ea, buf.data(), n)->wait());
  memcpy(buf.data(), db.data(), n);
  ASSERT_OK(b.value()->write(*eng, eb, buf.data(), n)->wait());
  ASSERT_OK(a.value()->read(*eng, ea, buf.data(), n)->wait());
  EXPECT_EQ(first_mismatch(buf.data(), da.data(), n), -1);
  a.value().reset();
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(std::filesystem::exists(paths[i])) << paths[i];
  EXPECT_TRUE(std::filesystem::exists(paths[2]));
}

uint64_t g_fixed_suffix = 0x1234;
std::atomic<int> g_draws{0};
uint64_t repeating_source() {
  // 0x1234 twice, then 0x1235: the second set's first name collides.
  int k = g_draws.fetch_add(1);
  return g_fixed_suffix + (k >= 2 ? 1 : 0);
}
uint64_t constant_source() { return 0xabcdef; }

TEST(SwapFileNames, AnExistingNameIsNeverOpenedTwice) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.random_source = repeating_source;
  g_draws = 0;
  auto a = SwapFile::create(o);
  ASSERT_OK(a);
  EXPECT_EQ(a.value()->files()[0]->path(), dir.file("zoe-swap-0000000000001234.0.swap"));
  auto b = SwapFile::create(o);
  ASSERT_OK(b);
  EXPECT_EQ(b.value()->files()[0]->path(), dir.file("zoe-swap-0000000000001235.0.swap"));
  EXPECT_EQ(g_draws.load(), 3);
  // A source that never changes: a clear error after a bounded number of tries.
  o.random_source = constant_source;
  auto c = SwapFile::create(o);
  ASSERT_OK(c);
  auto d = SwapFile::create(o);
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(d.status().message().find("zoe-swap-0000000000abcdef.0.swap"), std::string::npos)
      << d.status().message();
}

TEST(SwapFileNames, KeptFilesRefuseASecondUser) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.name = "zoe-bench";
  o.keep = true;
  o.reuse = true;
  auto a = SwapFile::create(o);
  ASSERT_OK(a);
  EXPECT_EQ(a.value()->files()[0]->path(), dir.file("zoe-bench.0.swap"));
  auto b = SwapFile::create(o);
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(b.status().message().find(dir.file("zoe-bench.0.swap")), std::string::npos)
      << b.status().message();
  a.value().reset();
  EXPECT_OK(SwapFile::create(o));  // free again once the first user closed it
}

TEST(SwapFileNames, WhatCountsAsAReclaimableName) {
  EXPECT_TRUE(is_unique_swap_file_name("zoe-swap-0123456789abcdef.0.swap"));
  EXPECT_TRUE(is_unique_swap_file_name("zoe-swap-r3-77-0123456789abcdef.12.swap"));
  EXPECT_FALSE(is_unique_swap_file_name("zoe-swap.0.swap"));          // kept
  EXPECT_FALSE(is_unique_swap_file_name("zoe-swap-r0-1234.0.swap"));  // old PID names
  EXPECT_FALSE(is_unique_swap_file_name("zoe-swap-0123456789ABCDEF.0.swap"));
  EXPECT_FALSE(is_unique_swap_file_name("zoe-swap-0123456789abcdef.swap"));
  EXPECT_FALSE(is_unique_swap_file_name("zoe-swap-0123456789abcdef.0.swap.tmp"));
  EXPECT_FALSE(is_unique_swap_file_name("-0123456789abcdef.0.swap"));
  EXPECT_FALSE(is_unique_swap_file_name(".swap"));
}

// A child process creates a swap file set and dies by SIGKILL: its files stay, unlocked.
std::vector<std::string> orphan_files(const SwapFileOptions& o) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    auto sf = SwapFile::create(o);
    std::string out;
    if (sf.is_ok()) {
      for (const auto& f : sf.value()->files()) out += f->path() + "\n";
    }
    (void)!write(fds[1], out.data(), out.size());
    close(fds[1]);
    raise(SIGKILL);
    _exit(1);
  }
  close(fds[1]);
  std::string got;
  char b[512];
  ssize_t r;
  while ((r = read(fds[0], b, sizeof(b))) > 0) got.append(b, static_cast<size_t>(r));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  std::vector<std::string> paths;
  for (size_t p = 0, q; (q = got.find('\n', p)) != std::string::npos; p = q + 1)
    paths.push_back(got.substr(p, q - p));
  return paths;
}

TEST(SwapFileReclaim, FilesOfDeadProcessesGoFilesOfLiveOnesStay) {
  ScratchDir d0("s0"), d1("s1");
  SwapFileOptions o;
  o.dirs = {d0.path(), d1.path()};
  o.initial_bytes = 4 << 20;
  auto live = SwapFile::create(o);  // a job that keeps running
  ASSERT_OK(live);
  // Kept files and other files are not swap files to reclaim.
  SwapFileOptions ko = o;
  ko.keep = true;
  ko.initial_bytes = 0;
  { ASSERT_OK(SwapFile::create(ko)); }
  std::ofstream(d0.file("notes-0123456789abcdef.txt")) << "x";
  std::vector<std::string> orphans = orphan_files(o);
  ASSERT_EQ(orphans.size(), 2u);
  for (const auto& p : orphans) ASSERT_TRUE(std::filesystem::exists(p)) << p;

  auto next = SwapFile::create(o);
  ASSERT_OK(next);
  EXPECT_EQ(next.value()->reclaimed().files, 2u);
  EXPECT_GE(next.value()->reclaimed().bytes, 4u << 20);  // 2 MiB preallocated in each
  for (const auto& p : orphans) EXPECT_FALSE(std::filesystem::exists(p)) << p;
  for (const auto& f : live.value()->files()) EXPECT_TRUE(std::filesystem::exists(f->path())) << f->path();
  EXPECT_TRUE(std::filesystem::exists(d0.file("zoe-swap.0.swap")));
  EXPECT_TRUE(std::filesystem::exists(d0.file("notes-0123456789abcdef.txt")));
  // Nothing left to reclaim; the live sets are untouched by a scan on its own.
  auto again = reclaim_stale_swap_files(d0.path());
  ASSERT_OK(again);
  EXPECT_EQ(again.value().files, 0u);
  o.reclaim_stale = false;
  std::vector<std::string> more = orphan_files(o);
  ASSERT_EQ(more.size(), 2u);
  ASSERT_OK(SwapFile::create(o));
  EXPECT_TRUE(std::filesystem::exists(more[0])) << "reclaim_stale = false still removed " << more[0];
}

TEST(SwapFileReclaim, DirectoryLocksNeitherSelfDeadlockNorCrossDeadlock) {
  ScratchDir a("sa"), b("sb");
  // One directory under two spellings: locked once.
  SwapFileOptions o;
  o.dirs = {a.path(), a.path() + "/.", b.path()};
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  EXPECT_EQ(sf.value()->files().size(), 3u);
  // Two jobs naming the same directories in opposite orders, over and over.
  std::atomic<int> failures{0};
  auto churn = [&](std::vector<std::string> dirs) {
    SwapFileOptions so;
    so.dirs = std::move(dirs);
    for (int i = 0; i < 200; ++i) failures += SwapFile::create(so).is_ok() ? 0 : 1;
  };
  std::thread t1(churn, std::vector<std::string>{a.path(), b.path()});
  std::thread t2(churn, std::vector<std::string>{b.path(), a.path()});
  t1.join();
  t2.join();
  EXPECT_EQ(failures.load(), 0);
}

// Flips one bit of the byte at logical offset `logical` on disk, through the file system (an
// aligned O_DIRECT read-modify-write of its block when the swap file uses O_DIRECT).
void flip_on_disk(const SwapFile& sf, uint64_t logical) {
  std::vector<IoRequest> where;
  char probe = 0;
  sf.map(IoOp::kRead, logical, &probe, 1, &where);
  ASSERT_EQ(where.size(), 1u);
  const File& f = *where[0].file;
  const uint64_t block = where[0].offset & ~uint64_t{4095};
  int fd = open(f.path().c_str(), O_RDWR | O_CLOEXEC | (f.direct() ? O_DIRECT : 0));
  ASSERT_GE(fd, 0) << f.path();
  auto b = AlignedBuffer::allocate(4096).value();
  ASSERT_EQ(pread(fd, b.data(), 4096, static_cast<off_t>(block)), 4096);
  b.bytes()[where[0].offset - block] ^= 0x01;
  ASSERT_EQ(pwrite(fd, b.data(), 4096, static_cast<off_t>(block)), 4096);
  ASSERT_EQ(fdatasync(fd), 0);
  close(fd);
}

class SwapChecksum : public ::testing::TestWithParam<DirectMode> {};

TEST_P(SwapChecksum, AByteFlippedOnDiskIsACorruptionError) {
  ScratchDir d0("s0"), d1("s1");
  SwapFileOptions o;
  o.dirs = {d0.path(), d1.path()};
  o.direct = GetParam();
  o.checksum = true;  // off by default (its cost is above 3% here)
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  SwapFile& s = *sf.value();
  auto eng = make_engine();
  const size_t n = 3 << 20;
  s.allocate(8192).value();  // the extent below starts off a piece boundary of the logical space
  auto e = s.allocate(n).value();
  auto data = random_bytes(n, 7);
  auto buf = AlignedBuffer::allocate(n).value();
  memcpy(buf.data(), data.data(), n);
  ASSERT_OK(s.write(*eng, e, buf.data(), n)->wait());
  ASSERT_OK(s.read(*eng, e, buf.data(), n)->wait());
  EXPECT_EQ(s.verified_bytes(), n);
  EXPECT_EQ(first_mismatch(buf.data(), data.data(), n), -1);

  const uint64_t at = (1 << 20) + 12345;  // in the second piece
  flip_on_disk(s, e.offset + at);
  auto name = [](size_t i) { return "test tensor " + std::to_string(i); };
  Status st = s.read(*eng, e, buf.data(), n, 0, {}, name)->wait();
  ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
  std::vector<IoRequest> where;
  s.map(IoOp::kRead, e.offset + (1 << 20), buf.data(), 1 << 20, &where);
  const std::string& msg = st.message();
  EXPECT_NE(msg.find("test tensor 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1048576 bytes at byte 1048576 of its extent"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at offset " + std::to_string(where[0].offset) + " of " + where[0].file->path()),
            std::string::npos)
      << msg;
  // The pieces that did not change still read fine, alone.
  EXPECT_OK(s.read(*eng, e, buf.data(), 1 << 20)->wait());
  EXPECT_OK(s.read(*eng, e, buf.data(), 1 << 20, 2 << 20)->wait());
  // Rewriting the data makes the range good again.
  memcpy(buf.data(), data.data(), n);
  ASSERT_OK(s.write(*eng, e, buf.data(), n)->wait());
  EXPECT_OK(s.read(*eng, e, buf.data(), n)->wait());
}

TEST_P(SwapChecksum, WithoutChecksumsTheSameFlipGoesUnnoticed) {
  // What the option buys: the same damage, read back as if it were data.
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.direct = GetParam();
  o.checksum = false;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  auto eng = make_engine();
  const size_t n = 1 << 20;
  auto e = sf.value()->allocate(n).value();
  auto data = random_bytes(n, 8);
  auto buf = AlignedBuffer::allocate(n).value();
  memcpy(buf.data(), data.data(), n);
  ASSERT_OK(sf.value()->write(*eng, e, buf.data(), n)->wait());
  flip_on_disk(*sf.value(), e.offset + 100);
  ASSERT_OK(sf.value()->read(*eng, e, buf.data(), n)->wait());
  EXPECT_EQ(first_mismatch(buf.data(), data.data(), n), 100);
  EXPECT_EQ(sf.value()->verified_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(DirectModes, SwapChecksum, ::testing::Values(DirectMode::kPrefer, DirectMode::kOff),
                         [](const ::testing::TestParamInfo<DirectMode>& p) {
                           return std::string(direct_mode_name(p.param));
                         });

TEST(SwapChecksumShapes, ReadsVerifyTheRecordedPiecesTheyCoverWhole) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.checksum = true;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  SwapFile& s = *sf.value();
  auto eng = make_engine();
  const size_t n = 4 << 20;
  s.allocate(4096).value();
  auto e = s.allocate(n).value();
  auto buf = AlignedBuffer::allocate(n).value();
  memcpy(buf.data(), random_bytes(n, 9).data(), n);
  // Written whole: pieces of kChecksumPieceBytes from the extent start.
  ASSERT_OK(s.write(*eng, e, buf.data(), n)->wait());
  uint64_t v = s.verified_bytes();
  ASSERT_OK(s.read(*eng, e, buf.data(), 2 << 20, 1 << 20)->wait());  // two whole pieces
  EXPECT_EQ(s.verified_bytes() - v, 2u << 20);
  v = s.verified_bytes();
  ASSERT_OK(s.read(*eng, e, buf.data(), 256 << 10, 256 << 10)->wait());  // inside one piece
  EXPECT_EQ(s.verified_bytes() - v, 0u) << "a part of a piece cannot be verified";
  // Written in 256 KiB pieces, read whole: every piece verified.
  for (uint64_t at = 0; at < n; at += 256 << 10) {
    ASSERT_OK(s.write(*eng, e, buf.bytes() + at, 256 << 10, at)->wait());
  }
  v = s.verified_bytes();
  ASSERT_OK(s.read(*eng, e, buf.data(), n)->wait());
  EXPECT_EQ(s.verified_bytes() - v, n);
}

TEST(SwapChecksumShapes, FreedExtentsForgetTheirChecksums) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.checksum = true;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  SwapFile& s = *sf.value();
  auto eng = make_engine();
  const size_t n = 1 << 20;
  auto e = s.allocate(n).value();
  auto buf = AlignedBuffer::allocate(n).value();
  memset(buf.data(), 1, n);
  ASSERT_OK(s.write(*eng, e, buf.data(), n)->wait());
  s.free(e);
  auto e2 = s.allocate(n).value();
  ASSERT_EQ(e2.offset, e.offset);
  // New contents by a raw write (no record), then a checked read: nothing stale to compare with,
  // and nothing written through the checked path since the allocation.
  memset(buf.data(), 2, n);
  std::vector<IoRequest> reqs;
  s.map(IoOp::kWrite, e2.offset, buf.data(), n, &reqs);
  ASSERT_OK(eng->submit(reqs)->wait());
  Status st = s.read(*eng, e2, buf.data(), n)->wait();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_EQ(st.message().find("checksum mismatch"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("never written"), std::string::npos) << st.message();
  // A checked write of the new contents records them: they read and verify.
  ASSERT_OK(s.write(*eng, e2, buf.data(), n)->wait());
  EXPECT_OK(s.read(*eng, e2, buf.data(), n)->wait());
}

TEST(SwapChecksumFaults, ACorruptedReadBufferIsACorruptionError) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.checksum = true;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  SwapFile& s = *sf.value();
  FaultInjector faults;
  IoEngineOptions eo;
  eo.faults = &faults;
  eo.block_size = 256 << 10;
  auto eng = IoEngine::create(eo).value();
  const size_t n = 2 << 20;
  auto e = s.allocate(n).value();
  auto data = random_bytes(n, 10);
  auto buf = AlignedBuffer::allocate(n).value();
  memcpy(buf.data(), data.data(), n);
  ASSERT_OK(s.write(*eng, e, buf.data(), n)->wait());
  faults.add(FaultKind::kCorruptRead, 6);  // the 6th 256 KiB chunk read: in the second piece
  Status st = s.read(*eng, e, buf.data(), n)->wait();
  EXPECT_EQ(faults.injected(), 1u);
  ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
  EXPECT_NE(st.message().find("at byte 1048576 of its extent"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(s.files()[0]->path()), std::string::npos) << st.message();
  // The disk is fine: the next read is clean and correct.
  ASSERT_OK(s.read(*eng, e, buf.data(), n)->wait());
  EXPECT_EQ(first_mismatch(buf.data(), data.data(), n), -1);
}

// Always on, checksums or not: reads of bytes no write covered are errors.
TEST(SwapIntegrity, AReadOfNeverWrittenBytesIsAnErrorNamingTheFile) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  SwapFile& s = *sf.value();
  auto eng = make_engine();
  const size_t n = 2 << 20;
  s.allocate(8192).value();
  auto e = s.allocate(n).value();
  auto buf = AlignedBuffer::allocate(n).value();
  memset(buf.data(), 3, n);
  auto name = [](size_t) { return std::string("test tensor w"); };
  Status st = s.read(*eng, e, buf.data(), n, 0, {}, name)->wait();
  ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
  EXPECT_NE(st.message().find("test tensor w"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("never written"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("byte 0 of its extent (offset 8192 of " + s.files()[0]->path() + ")"),
            std::string::npos)
      << st.message();
  // Half written: that half reads, the whole does not (the error names the first unwritten byte).
  ASSERT_OK(s.write(*eng, e, buf.data(), n / 2)->wait());
  EXPECT_OK(s.read(*eng, e, buf.data(), n / 2)->wait());
  st = s.read(*eng, e, buf.data(), n)->wait();
  ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
  EXPECT_NE(st.message().find("byte " + std::to_string(n / 2) + " of its extent"), std::string::npos)
      << st.message();
  ASSERT_OK(s.write(*eng, e, buf.data(), n / 2, n / 2)->wait());
  EXPECT_OK(s.read(*eng, e, buf.data(), n)->wait());
  // Freed and allocated again: the old contents are not this allocation's data.
  s.free(e);
  auto e2 = s.allocate(n).value();
  ASSERT_EQ(e2.offset, e.offset);
  EXPECT_EQ(s.read(*eng, e2, buf.data(), 4096)->wait().code(), StatusCode::kCorruption);
}

TEST(SwapIntegrity, UnwrittenBytesOfAZeroFillExtentReadAsZerosNotOldData) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  SwapFile& s = *sf.value();
  auto eng = make_engine();
  const size_t n = 1 << 20;
  auto old = s.allocate(n).value();
  auto buf = AlignedBuffer::allocate(n).value();
  memset(buf.data(), 0x77, n);
  ASSERT_OK(s.write(*eng, old, buf.data(), n)->wait());
  s.free(old);
  auto e = s.allocate(n, Unwritten::kZeros).value();
  ASSERT_EQ(e.offset, old.offset);
  std::vector<char> zeros(n, 0);
  ASSERT_OK(s.read(*eng, e, buf.data(), n)->wait());
  EXPECT_EQ(first_mismatch(buf.data(), zeros.data(), n), -1);
  // Written in the middle: that part reads back, the rest as zeros.
  auto data = random_bytes(n / 4, 12);
  memcpy(buf.data(), data.data(), n / 4);
  ASSERT_OK(s.write(*eng, e, buf.data(), n / 4, n / 2)->wait());
  memset(buf.data(), 0x55, n);
  ASSERT_OK(s.read(*eng, e, buf.data(), n)->wait());
  EXPECT_EQ(first_mismatch(buf.data(), zeros.data(), n / 2), -1);
  EXPECT_EQ(first_mismatch(buf.bytes() + n / 2, data.data(), n / 4), -1);
  EXPECT_EQ(first_mismatch(buf.bytes() + 3 * n / 4, zeros.data(), n / 4), -1);
  // Freed and allocated again without kZeros: an error again.
  s.free(e);
  auto e2 = s.allocate(n).value();
  ASSERT_EQ(e2.offset, e.offset);
  EXPECT_EQ(s.read(*eng, e2, buf.data(), n)->wait().code(), StatusCode::kCorruption);
}

TEST(SwapIntegrity, AnUnalignedWriteCoversItsLastPage) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.direct = DirectMode::kOff;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  SwapFile& s = *sf.value();
  auto eng = make_engine();
  auto e = s.allocate(3 * 4096).value();
  auto buf = AlignedBuffer::allocate(3 * 4096).value();
  ASSERT_OK(s.write(*eng, e, buf.data(), 4096 + 10)->wait());
  EXPECT_OK(s.read(*eng, e, buf.data(), 2 * 4096)->wait());
  EXPECT_EQ(s.read(*eng, e, buf.data(), 3 * 4096)->wait().code(), StatusCode::kCorruption);
}

class SwapTruncation : public ::testing::TestWithParam<DirectMode> {};

// The reported case: the file cut to 0 bytes, then extended again by later writes, so that the
// holes read back as zeros with a full count. Deterministic: the cut happens between the write
// and the read of the extent.
TEST_P(SwapTruncation, ATruncatedThenReExtendedFileIsAnErrorNotZeros) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.direct = GetParam();
  o.initial_bytes = 2 << 20;
  o.grow_bytes = 0;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  SwapFile& s = *sf.value();
  ASSERT_EQ(s.capacity(), 2u << 20);
  auto eng = make_engine();
  const size_t n = 1 << 20;
  auto a = s.allocate(n).value();
  auto b = s.allocate(n).value();  // the last MiB of the file
  ASSERT_EQ(b.offset + n, s.capacity());
  auto data = random_bytes(n, 11);
  auto buf = AlignedBuffer::allocate(n).value();
  memcpy(buf.data(), data.data(), n);
  ASSERT_OK(s.write(*eng, a, buf.data(), n)->wait());
  ASSERT_OK(s.write(*eng, b, buf.data(), n)->wait());
  const std::string path = s.files()[0]->path();
  ASSERT_EQ(truncate(path.c_str(), 0), 0) << path;
  // A later write of the last extent extends the file to where the data ended before.
  ASSERT_OK(s.write(*eng, b, buf.data(), n)->wait());
  ASSERT_GE(std::filesystem::file_size(path), s.capacity());
  memset(buf.data(), 0x5a, n);
  Status st = s.read(*eng, a, buf.data(), n)->wait();
  ASSERT_EQ(st.code(), StatusCode::kCorruption)
      << st.to_string() << " first bytes read: " << int(buf.bytes()[0]);
  EXPECT_NE(st.message().find("swap file " + path), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("at offset 0 of it"), std::string::npos) << st.message();
  // Growing the file (fallocate would fill the holes) does not hide it either.
  auto grown = s.allocate(4 << 20);
  ASSERT_FALSE(grown.is_ok());
  EXPECT_EQ(grown.status().code(), StatusCode::kCorruption) << grown.status().to_string();
  EXPECT_NE(grown.status().message().find(path), std::string::npos) << grown.status().message();
}

TEST_P(SwapTruncation, ATruncationBeforeGrowthIsAnErrorAtTheGrowth) {
  ScratchDir d0("s0"), d1("s1");
  SwapFileOptions o;
  o.dirs = {d0.path(), d1.path()};
  o.direct = GetParam();
  o.grow_bytes = 0;
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  SwapFile& s = *sf.value();
  auto eng = make_engine();
  const size_t n = 2 << 20;
  auto e = s.allocate(n).value();  // a stripe in each file
  auto buf = AlignedBuffer::allocate(n).value();
  memcpy(buf.data(), random_bytes(n, 13).data(), n);
  ASSERT_OK(s.write(*eng, e, buf.data(), n)->wait());
  const std::string path = s.files()[1]->path();
  ASSERT_EQ(truncate(path.c_str(), 4096), 0) << path;
  auto grown = s.allocate(2 << 20);
  ASSERT_FALSE(grown.is_ok());
  EXPECT_EQ(grown.status().code(), StatusCode::kCorruption) << grown.status().to_string();
  EXPECT_NE(grown.status().message().find("swap file " + path + " lost its guard page"), std::string::npos)
      << grown.status().message();
  // The growth made the file long again, past the old guard: reads still fail.
  ASSERT_GE(std::filesystem::file_size(path), (1u << 20) + kSwapGuardBytes);
  Status st = s.read(*eng, e, buf.data(), n)->wait();
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
  EXPECT_NE(st.message().find("swap file " + path + " lost its guard page"), std::string::npos)
      << st.message();
}

class SwapHoles : public ::testing::TestWithParam<DirectMode> {};

// Punches [offset, offset + len) of a swap file out of its disk blocks, keeping its size.
void punch_hole(const std::string& path, uint64_t offset, uint64_t len) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                      static_cast<off_t>(len)),
            0)
      << path << ": " << strerror(errno);
  close(fd);
}

// The reported case: a hole punched into a live file (its size unchanged) reads back as zeros with
// a full count. By default (no checksums) that read is an error naming the file.
TEST_P(SwapHoles, AHolePunchedIntoALiveFileIsAnErrorByDefault) {
  for (bool hole_check : {true, false}) {
    SCOPED_TRACE(hole_check ? "hole checks on (the default)" : "hole checks off");
    ScratchDir dir("swap");
    SwapFileOptions o;
    o.dirs = {dir.path()};
    o.direct = GetParam();
    o.initial_bytes = 4 << 20;
    o.grow_bytes = 0;
    if (!hole_check) o.hole_check = false;
    ASSERT_TRUE(SwapFileOptions{}.hole_check);
    ASSERT_FALSE(SwapFileOptions{}.checksum);
    auto sf = SwapFile::create(o);
    ASSERT_OK(sf);
    SwapFile& s = *sf.value();
    auto eng = make_engine();
    const size_t n = 1 << 20;
    auto a = s.allocate(n).value();
    auto b = s.allocate(n).value();
    auto data = random_bytes(n, 17);
    auto buf = AlignedBuffer::allocate(n).value();
    memcpy(buf.data(), data.data(), n);
    ASSERT_OK(s.write(*eng, a, buf.data(), n)->wait());
    ASSERT_OK(s.write(*eng, b, buf.data(), n)->wait());
    ASSERT_OK(s.read(*eng, a, buf.data(), n)->wait());
    std::vector<IoRequest> where;
    s.map(IoOp::kRead, a.offset, buf.data(), n, &where);
    ASSERT_EQ(where.size(), 1u);
    const std::string path = where[0].file->path();
    punch_hole(path, where[0].offset + 8192, 64 << 10);
    memset(buf.data(), 0x5a, n);
    Status st = s.read(*eng, a, buf.data(), n)->wait();
    if (!hole_check) {
      // What the default buys: the same hole read back as data.
      ASSERT_OK(st);
      const std::vector<char> zeros(64 << 10, 0);
      EXPECT_EQ(memcmp(buf.bytes() + 8192, zeros.data(), zeros.size()), 0);
      EXPECT_NE(first_mismatch(buf.data(), data.data(), n), -1);
      continue;
    }
    ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
    EXPECT_NE(st.message().find("swap file " + path + " has holes"), std::string::npos) << st.message();
    // Every read of the damaged file fails, not only one that covers the hole.
    EXPECT_EQ(s.read(*eng, b, buf.data(), n)->wait().code(), StatusCode::kCorruption);
    // Writing the damaged extent again gives the file its blocks back: no data is lost then.
    memcpy(buf.data(), data.data(), n);
    ASSERT_OK(s.write(*eng, a, buf.data(), n)->wait());
    ASSERT_OK(s.read(*eng, a, buf.data(), n)->wait());
    EXPECT_EQ(first_mismatch(buf.data(), data.data(), n), -1);
  }
}

// The whole file punched, its guard page too (fallocate --punch-hole over the file's length).
TEST_P(SwapHoles, AWholeFilePunchedIsAnErrorNotZeros) {
  ScratchDir d0("s0"), d1("s1");
  SwapFileOptions o;
  o.dirs = {d0.path(), d1.path()};
  o.direct = GetParam();
  auto sf = SwapFile::create(o);
  ASSERT_OK(sf);
  SwapFile& s = *sf.value();
  auto eng = make_engine();
  const size_t n = 4 << 20;
  auto e = s.allocate(n).value();
  auto buf = AlignedBuffer::allocate(n).value();
  memcpy(buf.data(), random_bytes(n, 19).data(), n);
  ASSERT_OK(s.write(*eng, e, buf.data(), n)->wait());
  const std::string path = s.files()[1]->path();
  punch_hole(path, 0, std::filesystem::file_size(path));
  Status st = s.read(*eng, e, buf.data(), n)->wait();
  ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.to_string();
  EXPECT_NE(st.message().find("swap file " + path + " has holes"), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(DirectModes, SwapHoles, ::testing::Values(DirectMode::kPrefer, DirectMode::kOff),
                         [](const ::testing::TestParamInfo<DirectMode>& p) {
                           return std::string(direct_mode_name(p.param));
                         });

INSTANTIATE_TEST_SUITE_P(DirectModes, SwapTruncation,
                         ::testing::Values(DirectMode::kPrefer, DirectMode::kOff),
                         [](const ::testing::TestParamInfo<DirectMode>& p) {
                           return std::string(direct_mode_name(p.param));
                         });

}  // namespace
}  // namespace zoe::io
