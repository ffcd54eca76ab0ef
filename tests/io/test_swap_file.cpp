// SwapFile tests: extent allocation, striping layout on disk, growth, full disks, no-O_DIRECT paths.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <fstream>

#include "io/buffer.h"
#include "io/swap_file.h"
#include "tests/util/test_util.h"

namespace zoe::io {
namespace {

using test::first_mismatch;
using test::random_bytes;
using test::ScratchDir;
using test::ScratchMount;

std::unique_ptr<IoEngine> make_engine() {
  auto e = IoEngine::create({});
  EXPECT_TRUE(e.is_ok());
  return std::move(e).value();
}

TEST(SwapFile, AllocateFreeCoalesce) {
  ScratchDir dir("swap");
  SwapFileOptions o;
  o.dirs = {dir.path()};
  o.initial_bytes = 1 << 20;
  o.grow_bytes = 1 << 20;
  auto sf = SwapFile::create(o);
  ASSERT_TRUE(sf.is_ok()) << sf.status().to_string();
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
  EXPECT_EQ(s.files()[0]->size().value(), s.capacity());
}

TEST(SwapFile, StripesAcrossPathsInTheDocumentedLayout) {
  ScratchDir d0("s0"), d1("s1"), d2("s2");
  SwapFileOptions o;
  o.dirs = {d0.path(), d1.path(), d2.path()};
  o.stripe_bytes = 64 * 1024;
  o.keep = true;  // read the files directly below
  auto sf = SwapFile::create(o);
  ASSERT_TRUE(sf.is_ok()) << sf.status().to_string();
  auto eng = make_engine();
  const size_t n = 10 * 64 * 1024 + 4096 * 3;  // 10 stripes and a bit
  auto ext = sf.value()->allocate(n).value();
  ASSERT_EQ(ext.offset, 0u);
  auto data = random_bytes(n, 99);
  auto buf = AlignedBuffer::allocate(n).value();
  memcpy(buf.data(), data.data(), n);
  ASSERT_TRUE(sf.value()->write(*eng, ext, buf.data(), n)->wait().is_ok());
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
  ASSERT_TRUE(sf.value()->read(*eng, ext, rb.data(), 200 * 1024, 40960)->wait().is_ok());
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
  ASSERT_TRUE(sf.is_ok());
  EXPECT_TRUE(sf.value()->allocate(1 << 20).is_ok());
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
  ASSERT_TRUE(sf.is_ok()) << sf.status().to_string();
  EXPECT_TRUE(sf.value()->allocate(2 << 20).is_ok());
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
  ASSERT_TRUE(sf.is_ok());
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
  EXPECT_NE(bad.status().message().find("does not support O_DIRECT"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find(m.path()), std::string::npos);

  o.direct = DirectMode::kPrefer;
  auto sf = SwapFile::create(o);
  ASSERT_TRUE(sf.is_ok()) << sf.status().to_string();
  EXPECT_FALSE(sf.value()->direct());
  auto eng = make_engine();
  auto ext = sf.value()->allocate(1 << 20).value();
  auto data = random_bytes(1 << 20, 5);
  ASSERT_TRUE(sf.value()->write(*eng, ext, data.data(), data.size())->wait().is_ok());
  std::vector<unsigned char> back(data.size());
  ASSERT_TRUE(sf.value()->read(*eng, ext, back.data(), back.size())->wait().is_ok());
  EXPECT_EQ(first_mismatch(back.data(), data.data(), data.size()), -1);
}

TEST(FsProbe, ReportsTypeSpaceAndODirect) {
  ScratchDir dir("probe");
  auto r = probe_fs(dir.path());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_FALSE(r.value().fs_type.empty());
  EXPECT_GT(r.value().total_bytes, 0u);
  ScratchMount m("ramfs", "");
  if (m.ok()) {
    auto rr = probe_fs(m.path());
    ASSERT_TRUE(rr.is_ok());
    EXPECT_FALSE(rr.value().direct_io);
    EXPECT_FALSE(rr.value().direct_io_error.empty());
  }
  EXPECT_FALSE(probe_fs("/nonexistent/x").is_ok());
}

}  // namespace
}  // namespace zoe::io
