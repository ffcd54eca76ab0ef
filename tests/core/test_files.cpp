// zoe/files.h: outputs only over regular files, never inside a checkpoint save directory, whole or
// not at all; inputs opened without blocking, regular files only, capped.
#include "zoe/files.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/util/test_util.h"

namespace {

using zoe::test::ScratchDir;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void put(const std::string& p, const std::string& text) { std::ofstream(p) << text; }

// The names in `dir`, but for `keep`: what a write left behind.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

mode_t type_of(const std::string& p) {
  struct stat st {};
  lstat(p.c_str(), &st);
  return st.st_mode & S_IFMT;
}

// A save directory as the checkpoint writer leaves it: `latest` naming step-000002, which holds
// the manifest, its checksum and a rank file.
void make_save_dir(const std::string& save) {
  std::filesystem::create_directories(save + "/step-000002");
  put(save + "/latest", "step-000002\n");
  put(save + "/step-000002/manifest.json", "{}");
  put(save + "/step-000002/manifest.xxh64", "0000000000000000  manifest.json\n");
  put(save + "/step-000002/rank-00000.bin", "");
}

TEST(OutputFile, ReplacesARegularFileWholeAndLeavesNoTemporary) {
  ScratchDir d("files");
  const std::string p = d.file("out.json");
  put(p, "old");
  chmod(p.c_str(), 0600);
  {
    auto f = zoe::OutputFile::create(p, "--out");
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    ASSERT_TRUE(f.value().write("new contents").is_ok());
    EXPECT_EQ(slurp(p), "old");  // nothing at the path changes before commit()
    EXPECT_EQ(entries(d.path()).size(), 2u);
    ASSERT_TRUE(f.value().commit().is_ok());
  }
  EXPECT_EQ(slurp(p), "new contents");
  EXPECT_EQ(entries(d.path()), std::vector<std::string>{"out.json"});
  struct stat st {};
  ASSERT_EQ(stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // the replaced file's mode is kept

  // Not committed (a failure on the way): the old file stays, the temporary goes.
  {
    auto f = zoe::OutputFile::create(p, "--out");
    ASSERT_TRUE(f.is_ok());
    ASSERT_TRUE(f.value().write("half").is_ok());
  }
  EXPECT_EQ(slurp(p), "new contents");
  EXPECT_EQ(entries(d.path()), std::vector<std::string>{"out.json"});

  // A symbolic link is followed: the file it leads to is replaced, the link stays a link.
  ASSERT_EQ(symlink(p.c_str(), d.file("link").c_str()), 0);
  ASSERT_TRUE(zoe::write_output_file(d.file("link"), "via link", "--out").is_ok());
  EXPECT_EQ(type_of(d.file("link")), static_cast<mode_t>(S_IFLNK));
  EXPECT_EQ(slurp(p), "via link");
}

TEST(OutputFile, RefusesWhatIsNotARegularFileAndLeavesItAsItWas) {
  ScratchDir d("files");
  const std::string fifo = d.file("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  zoe::Status s = zoe::write_output_file(fifo, "x", "--trace");
  EXPECT_EQ(s.code(), zoe::StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "--trace " + fifo + " is a FIFO (named pipe), not a regular file");
  EXPECT_EQ(type_of(fifo), static_cast<mode_t>(S_IFIFO));

  s = zoe::write_output_file(d.path(), "x", "--out");
  EXPECT_HAS(s.message(), "--out " + d.path() + " is a directory, not a regular file");

  // A character device with /dev/null's numbers (creating one needs root).
  const std::string dev = d.file("null");
  if (mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {
    s = zoe::write_output_file(dev, "x", "--out");
    EXPECT_HAS(s.message(), "--out " + dev + " is a character device, not a regular file");
    EXPECT_EQ(type_of(dev), static_cast<mode_t>(S_IFCHR));
    unlink(dev.c_str());
  }
  EXPECT_EQ(entries(d.path()), std::vector<std::string>{"fifo"});  // no temporary left

  s = zoe::check_output_path(d.file("no/such/out"), "--plot");
  EXPECT_EQ(s.code(), zoe::StatusCode::kNotFound);
  EXPECT_HAS(s.message(), "--plot " + d.file("no/such/out") + ": its directory");
}

// A FIFO that appears at the path while the output is written is not renamed over either.
TEST(OutputFile, CommitChecksThePathAgain) {
  ScratchDir d("files");
  const std::string p = d.file("out");
  auto f = zoe::OutputFile::create(p, "--trace");
  ASSERT_TRUE(f.is_ok());
  ASSERT_TRUE(f.value().write("x").is_ok());
  ASSERT_EQ(mkfifo(p.c_str(), 0644), 0);
  zoe::Status s = f.value().commit();
  EXPECT_HAS(s.message(), "--trace " + p + " is a FIFO (named pipe), not a regular file");
  EXPECT_EQ(type_of(p), static_cast<mode_t>(S_IFIFO));
  EXPECT_EQ(entries(d.path()), std::vector<std::string>{"out"});
}

TEST(OutputFile, RefusesAPathInsideACheckpointSaveDirectory) {
  ScratchDir d("files");
  const std::string save = d.file("save");
  make_save_dir(save);
  for (const std::string& p : {save + "/latest", save + "/step-000002/x", save + "/new.json"}) {
    zoe::Status s = zoe::write_output_file(p, "x", "--out");
    EXPECT_EQ(s.code(), zoe::StatusCode::kInvalidArgument) << p;
    EXPECT_HAS(s.message(), "--out " + p + " lies inside the checkpoint save directory " + save);
  }
  EXPECT_EQ(slurp(save + "/latest"), "step-000002\n");
  EXPECT_EQ(entries(save), (std::vector<std::string>{"latest", "step-000002"}));
  // A checkpoint directory alone (copied out of its save directory) is protected too.
  std::filesystem::rename(save + "/step-000002", d.file("ck"));
  EXPECT_HAS(zoe::check_output_path(d.file("ck/manifest.json"), "--out").message(), "lies inside");
  // A save directory claimed by a run that has not saved yet (its lock file only).
  std::filesystem::create_directories(d.file("fresh"));
  put(d.file("fresh/.zoe-lock"), "");
  EXPECT_HAS(zoe::check_output_path(d.file("fresh/trace.json"), "--trace").message(),
             "inside the checkpoint save directory " + d.file("fresh"));
  // Beside it is fine; a `latest` that names no checkpoint makes no save directory.
  EXPECT_TRUE(zoe::check_output_path(d.file("trace.json"), "--trace").is_ok());
  std::filesystem::create_directories(d.file("plain"));
  put(d.file("plain/latest"), "news\n");
  EXPECT_TRUE(zoe::check_output_path(d.file("plain/out"), "--out").is_ok());
}

TEST(InputFile, RefusesAFifoADeviceAndADirectoryWithoutBlocking) {
  ScratchDir d("files");
  const std::string fifo = d.file("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = zoe::read_input_file(fifo, "config file", 1 << 20);  // no writer: a plain open blocks
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), zoe::StatusCode::kInvalidArgument);
  EXPECT_HAS(r.status().message(), "config file " + fifo + " is a FIFO (named pipe), not a regular file");

  r = zoe::read_input_file("/dev/zero", "--calibration", 1 << 20);
  EXPECT_HAS(r.status().message(), "--calibration /dev/zero is a character device, not a regular file");
  r = zoe::read_input_file(d.path(), "data file", 1 << 20);
  EXPECT_HAS(r.status().message(), "is a directory, not a regular file");
  r = zoe::read_input_file(d.file("none"), "data file", 1 << 20);
  EXPECT_EQ(r.status().code(), zoe::StatusCode::kNotFound);
  EXPECT_HAS(r.status().message(), "data file " + d.file("none") + " does not exist");

  put(d.file("f"), "0123456789");
  r = zoe::read_input_file(d.file("f"), "config file", 10);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r.value(), "0123456789");
  r = zoe::read_input_file(d.file("f"), "config file", 9);
  EXPECT_HAS(r.status().message(), "config file " + d.file("f") + " holds 10 bytes");
  // The descriptor open_input_file hands out blocks again (reads wait, as for any file).
  auto fd = zoe::open_input_file(d.file("f"), "data file");
  ASSERT_TRUE(fd.is_ok());
  EXPECT_EQ(fcntl(fd.value(), F_GETFL) & O_NONBLOCK, 0);
  close(fd.value());
}

}  // namespace
