// zoe: the command-line program. The frame of zoe/cli.h with every command linked in: zoe's
// diagnostic commands from src/cli/ (info, bench, ckpt, plan, tune) and `zoe train`
// (tools/cmd_train.cpp), each of which registers itself.
#include <limits.h>
#include <unistd.h>

#include <cstdlib>

#include <CLI/CLI.hpp>

#include "zoe/cli.h"
#include "zoe/runtime.h"

namespace {

// OpenBLAS starts its thread pool when the library loads, before main(), sized by
// OPENBLAS_NUM_THREADS (else OMP_NUM_THREADS, else every core); openblas_set_num_threads(1) later
// only idles the threads. zoe's loops supply the parallelism and call OpenBLAS from each of them,
// so the pool is never used: unless the user set OPENBLAS_NUM_THREADS, the program runs itself
// again once with it set to 1, so that no pool starts. Each pool thread would otherwise map its
// own GEMM buffer and hold address space a tight `ulimit -v` needs. The variable, once set,
// stops a second exec; when exec fails the program runs on as it is. The exec names the binary's
// own path, not /proc/self/exe: the kernel names a process after the file it executes, so the
// process stays `zoe` for ps, top, pgrep and pkill (through /proc/self/exe it would be `exe`).
void bound_blas_threads(char** argv) {
  if (getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
  if (setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0) return;
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    execv(self, argv);  // fails when the file was replaced or removed since: then the link itself
  }
  execv("/proc/self/exe", argv);
}

}  // namespace

int main(int argc, char** argv) {
  bound_blas_threads(argv);
  CLI::App app{
      "zoe: train models larger than accelerator memory (ZeRO stages 1-3 with offload of\n"
      "parameters, gradients and optimizer states to pinned host RAM and NVMe).\n"
      "Results go to stdout (one JSON object with --json), progress to stderr.",
      "zoe"};
  zoe::cli::add_registered_commands(app);
  const int rc = zoe::cli::run(app, argc, argv);
  zoe::set_exit_status(rc);  // the other ranks hear how this one ended
  return rc;
}
