// StopSignals: how `zoe train` stops on SIGINT/SIGTERM (at a step boundary, swap files unlinked at
// once, a watchdog for a step that never ends).
#pragma once

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include "zoe/zoe.h"

namespace zoe::cli {

// SIGINT and SIGTERM during a run. The first one asks the loop to stop at the next step
// boundary; a second SIGINT ends the process at once (exit 130). They are blocked in the threads
// created from here on (the engine's: no syscall of theirs fails with EINTR) and taken by one
// thread of their own in sigwait; threads that existed before (a BLAS pool started at load time)
// may still receive them, so a handler (SA_RESTART) does the same there.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    // Detached: it waits for the process's life; a signal after the run finds nobody asking.
    std::thread([set] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) continue;
        const bool first = requested_.load() == 0;
        on_signal(sig);
        if (first) unlink_swap_files(sig);
      }
    }).detach();
    // The watchdog: a stop asked for whose step never ends (the step waits in a collective for a
    // rank that was lost: mpirun then ends the job with SIGTERM, and later SIGKILL) removes this
    // rank's swap files and exits, saying so, instead of being killed with them left behind.
    std::thread([] {
      uint64_t asked_ns = 0;
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const int sig = requested_.load();
        if (sig == 0) continue;
        unlink_swap_files(sig);  // (a signal that reached another thread's handler)
        if (stopping_.load()) continue;
        const uint64_t now = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                       std::chrono::steady_clock::now().time_since_epoch())
                                                       .count());
        if (asked_ns == 0) asked_ns = now;
        const double grace = std::max(kMinGraceS, 3.0 * static_cast<double>(step_ns_.load()) * 1e-9);
        if (static_cast<double>(now - asked_ns) * 1e-9 < grace) continue;
        const size_t n = remove_swap_files_now();
        fputs(timeout_message(rank_.load(), world_.load(), sig, grace, n).c_str(), stderr);
        _exit(128 + sig);
      }
    }).detach();
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal asked for (SIGINT or SIGTERM), or 0.
  int requested() const { return requested_.load(); }
  // The loop reached a step boundary and is stopping (the watchdog stands down).
  void stopping() { stopping_.store(true); }
  // The duration of the last step (the watchdog waits three of them, at least kMinGraceS).
  void note_step(double seconds) { step_ns_.store(static_cast<uint64_t>(seconds * 1e9)); }
  // This process's rank and the number of ranks (the watchdog's message names the others only when
  // there are some).
  void set_rank(int r, int world) {
    rank_.store(r);
    world_.store(world);
  }

  // The watchdog's last line: a step of one process waits for nobody else; a step of several ranks
  // may wait in a collective for a lost one.
  static std::string timeout_message(int rank, int world, int sig, double grace, size_t removed) {
    const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    char buf[512];
    if (world > 1) {
      snprintf(buf, sizeof buf,
               "zoe: rank %d: %s, but the step in progress did not end within %.0f s (it waits for the other "
               "ranks: one of them was probably lost; mpirun names it); removed %zu swap file(s); exiting\n",
               rank, name, grace, removed);
    } else {
      snprintf(
          buf, sizeof buf,
          "zoe: %s, but the step in progress did not end within %.0f s (a run of one process waits for no "
          "other rank: the step itself is stuck, e.g. in I/O or in a library retrying a failed "
          "allocation); removed %zu swap file(s); exiting\n",
          name, grace, removed);
    }
    return buf;
  }

  // The command has ended and said so (its result, or its error, is printed; rc its exit status):
  // a signal from now on says nothing more (a "stopping at the next step boundary" after the
  // final error would be wrong, and would bury it). After a failure (mpirun ending the other ranks
  // of a job one of whose ranks failed) it ends the process at once with that status. After a
  // success the first one is ignored: the process finishes its exit, MPI's finalize included (a
  // rank leaving without it makes mpirun call the finished job failed, exit status 1); a second
  // one ends it at once.
  static void run_ended(int rc) { ended_rc_.store(rc); }

 private:
  // Async-signal-safe: a lock-free atomic, write(2) and _exit(2).
  static void on_signal(int sig) {
    if (const int rc = ended_rc_.load(); rc >= 0) {
      if (rc == 0 && late_signals_.fetch_add(1) == 0) return;
      _exit(rc);
    }
    if (sig == SIGINT && requested_.load() != 0) {
      static const char kMsg[] = "zoe: second SIGINT: exiting at once\n";
      (void)!write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
      _exit(128 + SIGINT);
    }
    int none = 0;
    requested_.compare_exchange_strong(none, sig);  // the first one decides
  }
  // At the first signal: the swap files' names go at once (the engine keeps using the open files,
  // a final checkpoint included), so a SIGKILL that follows (mpirun's, after a lost rank, comes
  // within a second) leaves nothing behind. Once per process.
  static void unlink_swap_files(int sig) {
    if (unlinked_.exchange(true)) return;
    const size_t n = remove_swap_files_now();
    fprintf(stderr, "zoe: rank %d: %s: stopping at the next step boundary (%zu swap file(s) unlinked now)\n",
            rank_.load(), sig == SIGINT ? "SIGINT" : "SIGTERM", n);
  }
  static constexpr double kMinGraceS = 10.0;
  static inline std::atomic<bool> unlinked_{false};
  static inline std::atomic<int> requested_{0};
  static inline std::atomic<int> ended_rc_{-1};
  static inline std::atomic<int> late_signals_{0};  // signals after a successful end
  static inline std::atomic<bool> stopping_{false};
  static inline std::atomic<uint64_t> step_ns_{0};
  static inline std::atomic<int> rank_{0};
  static inline std::atomic<int> world_{1};
};

}  // namespace zoe::cli
