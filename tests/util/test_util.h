// Helpers shared by the test suites: scratch directories, deterministic data, tmpfs/ramfs mounts.
#pragma once

#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace zoe::test {

// A fresh directory under $ZOE_TEST_TMPDIR (the build's test-tmp) or /var/tmp, removed at the end.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag = "t") {
    const char* base = getenv("ZOE_TEST_TMPDIR");
    std::string root = base && *base ? base : "/var/tmp";
    std::filesystem::create_directories(root);
    std::string tmpl = root + "/zoe-" + tag + "-XXXXXX";
    path_ = mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A small file system mounted on a scratch directory for the test's life: tmpfs with a size
// limit (a disk that fills up) or ramfs (no O_DIRECT). ok() is false where mount is not allowed.
class ScratchMount {
 public:
  ScratchMount(const char* fstype, const std::string& options) : dir_(fstype) {
    ok_ = mount(fstype, dir_.path().c_str(), fstype, 0, options.empty() ? nullptr : options.c_str()) == 0;
  }
  ~ScratchMount() {
    if (ok_) umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool ok() const { return ok_; }
  const std::string& path() const { return dir_.path(); }

 private:
  ScratchDir dir_;
  bool ok_ = false;
};

inline std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::vector<unsigned char> v(n);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = rng();
    memcpy(&v[i], &w, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<unsigned char>(rng());
  return v;
}

// Runs fn in a forked child (for tests that drop capabilities or install seccomp filters, which
// cannot be undone) and returns the string it produced.
inline std::string run_in_child(const std::function<std::string()>& fn) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return "pipe failed";
  pid_t pid = fork();
  if (pid == 0) {
    close(pipefd[0]);
    std::string out = fn();
    ssize_t w = write(pipefd[1], out.data(), out.size());
    (void)w;
    _exit(0);
  }
  close(pipefd[1]);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int st;
  waitpid(pid, &st, 0);
  return got;
}

// Index of the first differing byte, or -1.
inline long long first_mismatch(const void* a, const void* b, size_t n) {
  auto* x = static_cast<const unsigned char*>(a);
  auto* y = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < n; ++i) {
    if (x[i] != y[i]) return static_cast<long long>(i);
  }
  return -1;
}

}  // namespace zoe::test
