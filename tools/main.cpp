// zoe: the command-line program. The frame of zoe/cli.h with every command linked in: zoe's
// diagnostic commands from src/cli/ (info, bench, ckpt, plan, tune) and `zoe train`
// (tools/cmd_train.cpp), each of which registers itself.
#include <unistd.h>

#include <cstring>

#include <CLI/CLI.hpp>

#include "tools/stop_signals.h"

#include "zoe/cli.h"
#include "zoe/runtime.h"

namespace {

// OpenBLAS starts its thread pool when the library loads, before main(), sized by
// OPENBLAS_NUM_THREADS (else OMP_NUM_THREADS, else every core); openblas_set_num_threads(1) later
// only idles the threads. zoe's loops supply the parallelism and call OpenBLAS from each of them,
// so the pool is never used: unless the user set OPENBLAS_NUM_THREADS, the program runs itself
// again once with it set to 1, so that no pool starts. Each pool thread would otherwise map its
// own GEMM buffer and hold address space a tight `ulimit -v` needs; and under a process limit
// (`ulimit -u`) that leaves no thread to start, OpenBLAS ends the program with its own message
// (raise(SIGINT)) before zoe can say what to change.
//
// This runs from the executable's .preinit_array: before any shared library's initializer, so
// before OpenBLAS's, which therefore never runs in the first process. Only the C library's
// syscall wrappers and string functions are used (it is set up by then; its constructors may not
// have run). The variable, once set, stops a second exec; when exec fails (or the environment is
// larger than the copy below) the program runs on as it is.
char* g_env[8192];
char g_self[4096];
constexpr char kBlasThreads[] = "OPENBLAS_NUM_THREADS=1";

void bound_blas_threads(int /*argc*/, char** argv, char** envp) {
  if (argv == nullptr || envp == nullptr) return;
  size_t n = 0;
  for (; envp[n] != nullptr; ++n) {
    if (strncmp(envp[n], kBlasThreads, sizeof kBlasThreads - 2) == 0) return;  // "OPENBLAS_NUM_THREADS="
  }
  if (n + 2 > sizeof g_env / sizeof g_env[0]) return;
  for (size_t i = 0; i < n; ++i) g_env[i] = envp[i];
  g_env[n] = const_cast<char*>(kBlasThreads);
  g_env[n + 1] = nullptr;
  // The binary's own path, not /proc/self/exe: the kernel names a process after the file it
  // executes, so the process stays `zoe` for ps, top, pgrep and pkill (through /proc/self/exe it
  // would be `exe`). When the file was replaced or removed since (its link then ends in
  // " (deleted)" and the exec fails), the link itself runs the same file.
  const ssize_t len = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
  if (len > 0) {
    g_self[len] = '\0';
    execve(g_self, argv, g_env);
  }
  execve("/proc/self/exe", argv, g_env);
}

__attribute__((section(".preinit_array"), used)) void (*g_bound_blas_threads)(int, char**,
                                                                              char**) = bound_blas_threads;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "zoe: train models larger than accelerator memory (ZeRO stages 1-3 with offload of\n"
      "parameters, gradients and optimizer states to pinned host RAM and NVMe).\n"
      "Results go to stdout (one JSON object with --json), progress to stderr.",
      "zoe"};
  zoe::cli::add_registered_commands(app);
  const int rc = zoe::cli::run(app, argc, argv);
  zoe::cli::StopSignals::run_ended(rc);  // a signal from here on: exit quietly with rc
  zoe::set_exit_status(rc);              // the other ranks hear how this one ended
  return rc;
}
