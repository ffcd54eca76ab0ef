// Runs the zoe binary for end-to-end tests: exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "tests/util/test_util.h"

namespace {

struct CmdResult {
  int rc = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// `shell` runs first in the same shell (e.g. "ulimit -f 64;"). timeout_s: how long the run may
// take before it is stopped (exit 124); long runs under the sanitizers need more than the default.
inline CmdResult zoe(const std::string& args, const std::string& shell = "", int timeout_s = 300) {
  zoe::test::ScratchDir d("cli");
  std::string err_path = d.file("stderr");
  // A hang fails the test in minutes (exit 124) instead of running into ctest's timeout.
  std::string cmd = shell + " timeout -k 5 " + std::to_string(timeout_s) + " " + std::string(ZOE_BIN) + " " +
                    args + " 2>" + err_path;
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  FILE* e = fopen(err_path.c_str(), "r");
  if (e) {
    while ((n = fread(buf, 1, sizeof(buf), e)) > 0) r.err.append(buf, n);
    fclose(e);
  }
  return r;
}

// Writes a config at `path`: micro-batch 16, stage 3, a 600 KiB activation device share, and
// activations on NVMe in `nvme_dir` (the small preset's block inputs at seq 64 overflow it).
inline void write_activation_nvme_config(const std::string& path, const std::string& nvme_dir) {
  std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 3}, )"
                      << R"("zoe": {"activation_device_budget": "600KiB", "activation_nvme_path": ")"
                      << nvme_dir << R"("}})";
}

}  // namespace
