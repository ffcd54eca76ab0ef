// zoe/cli.h: the frame of zoe's command-line program, for command-line programs built on libzoe:
// exit codes and errors, flag checks, tables and progress lines, plots of --json output, and the
// registry through which commands join a program. tools/ is the `zoe` program written this way:
// its main() and `zoe train` use only this header, zoe/zoe.h and the reference model's headers;
// zoe's diagnostic commands (info, bench, ckpt, plan, tune), which measure and inspect the
// engine's internal layers, register themselves from src/cli/.
//
// Not thread-safe: one command runs at a time on the main thread. Output conventions: results on
// stdout (one JSON object with --json), progress and errors on stderr.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "zoe/status.h"

namespace CLI {
class App;  // CLI11 (libcli11-dev): a program that adds commands includes <CLI/CLI.hpp>
class Option;
}  // namespace CLI

namespace zoe::cli {

// Exit codes: a command that failed, and a usage error (a bad flag or flag value, also CLI11's
// parse errors).
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// Thrown by a command to end with a clear message and its exit code (caught by run()). A status
// with code kCancelled (a run stopped by a signal, as asked) is printed without "error:".
struct CommandError {
  Status status;
  int exit_code = kExitFailure;
};
[[noreturn]] inline void fail(Status s) { throw CommandError{std::move(s), kExitFailure}; }
// A flag's value is wrong: the message names the flag and the value.
[[noreturn]] inline void usage_fail(Status s) { throw CommandError{std::move(s), kExitUsage}; }

// Bounds shared by the commands' integer flags (the messages give them).
constexpr int kMaxThreads = 4096;     // CPU threads
constexpr int kMaxNumaNode = 1023;    // Linux's default CONFIG_NODES_SHIFT
constexpr int kMaxRepeats = 1000000;  // measured rounds, passes
constexpr int kMaxLayers = 4096, kMaxWidth = 1 << 16, kMaxContext = 1 << 20, kMaxMicroBatch = 1 << 20;

// Checks an integer flag's value: "--eval-batches 0 is out of range (expected an integer in
// [1, 1000000])" as a usage error otherwise.
void check_flag_range(const char* flag, int64_t value, int64_t min, int64_t max);
// Bounds an integer option as it is parsed: a value that is not an integer in [min, max] is a usage
// error with check_flag_range's message, naming the option. Every integer option of a command is
// added through it: int_range(cmd->add_option("--threads", o->threads, "..."), 0, kMaxThreads).
CLI::Option* int_range(CLI::Option* opt, int64_t min, int64_t max);
// Bounds a real-valued option (a rate, a bandwidth, FLOP/s) as it is parsed: 0, negative, nan and
// inf are usage errors naming the option ("--flops 0 is not a positive finite number").
CLI::Option* positive_real(CLI::Option* opt);
// An unsigned integer flag given as text (CLI11 wraps "-1" into an unsigned): digits only.
uint64_t parse_uint_flag(const char* flag, const std::string& text);
// An output flag's path, checked before a long run (zoe/files.h's check_output_path: a regular file
// or nothing, outside every checkpoint save directory): fails naming the flag. "" passes.
void check_output_flag(const char* flag, const std::string& path);
template <typename T>
T value_or_fail(Result<T> r) {
  if (!r.is_ok()) fail(r.status());
  return std::move(r).value();
}

// One JSON object on stdout (indented), followed by a newline, flushed.
void print_json_text(const std::string& json_text);
// The same for any JSON value with dump(indent) (nlohmann::json).
template <typename Json>
void print_json(const Json& j) {
  print_json_text(j.dump(2));
}

// A fixed-width table in the style of fio/nccl-tests: header, units row, rows.
class Table {
 public:
  struct Column {
    std::string name;
    std::string unit;
    int width;
    bool left = false;
  };
  explicit Table(std::vector<Column> cols) : cols_(std::move(cols)) {}
  void print_header(FILE* out) const;
  void print_row(FILE* out, const std::vector<std::string>& cells) const;

 private:
  std::vector<Column> cols_;
};

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));

// A progress line on stderr, rewritten in place when stderr is a terminal. When it is not (a log
// file, a pipe), each update is its own line, at most one per every_s seconds (0: every update).
class Progress {
 public:
  explicit Progress(bool enabled, double every_s = 0);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void update(const std::string& line);
  void done();

 private:
  bool enabled_;
  bool tty_;
  double every_s_;
  size_t last_len_ = 0;
  uint64_t last_line_ns_ = 0;  // when the last line was printed (not a terminal)
  std::string held_;           // the latest line not printed yet (not a terminal): done() prints it
};

struct PlotSize {
  int width = 1200;  // pixels
  int height = 800;
};

// Draws `json_text` (the --json output of a command) into png_path with scripts/zoe_plot.py
// (matplotlib). kind: "train" (zoe train: loss and eval curves, time per step by part), "tune"
// (zoe tune --verify: predicted against measured step time per candidate) or "bench-io" (zoe bench
// io: GB/s against block size and queue depth). The interpreter is $ZOE_PYTHON or
// /usr/bin/python3; the script is $ZOE_PLOT_SCRIPT, else scripts/zoe_plot.py of the source tree
// zoe was built from, else <the program's directory>/zoe_plot.py. Blocks until the PNG is
// written. Errors: no interpreter or script (kNotFound, naming the path and the Debian package),
// matplotlib missing (kUnsupported, naming python3-matplotlib), any other failure of the script
// (kInternal with its stderr). The PNG is written through zoe/files.h's OutputFile: only over a
// regular file, never inside a checkpoint save directory, whole or not at all.
Status write_plot(const std::string& kind, const std::string& json_text, const std::string& png_path,
                  PlotSize size = {});
// Whether write_plot can work here (interpreter, script, matplotlib), so that a command asked to
// plot fails before its long run rather than after it. The same errors as write_plot.
Status plot_available();

// The command registry. A command joins every program it is linked into with a static
// CommandRegistrar in its source file; `group` "" adds it to the program's top level, any other
// name to that group of subcommands (created once, with `group_help`). Commands are added in
// ascending `order` (then by registration), so a program's --help lists them stably.
using AddCommand = void (*)(CLI::App& parent);
struct CommandRegistrar {
  CommandRegistrar(int order, const char* group, const char* group_help, AddCommand add);
};
// Adds every registered command to `app`.
void add_registered_commands(CLI::App& app);

// Runs the program: the options every zoe program has (--version, --log-level), the registered
// commands, then parses argv and runs the chosen command. Returns the exit code: 0; kExitUsage for
// a parse error or a usage_fail(); the CommandError's code; kExitFailure for any other exception
// (out of memory included), each with one line on stderr. SIGXFSZ is ignored, so that a write past
// `ulimit -f` fails with EFBIG and a message naming the file.
int run(CLI::App& app, int argc, char** argv);

}  // namespace zoe::cli
