// Helpers shared by the CLI's commands: JSON output, tables, progress lines, exit codes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zoe/status.h"

namespace zoe::cli {

// Exit codes: a command that failed, and a usage error (a bad flag or flag value, also CLI11's
// parse errors).
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// Thrown by a command to end with a clear message and its exit code (caught in main).
struct CommandError {
  Status status;
  int exit_code = kExitFailure;
};
[[noreturn]] inline void fail(Status s) { throw CommandError{std::move(s), kExitFailure}; }
// A flag's value is wrong: the message names the flag and the value.
[[noreturn]] inline void usage_fail(Status s) { throw CommandError{std::move(s), kExitUsage}; }

// Checks an integer flag's value: "--eval-batches 0 is out of range (expected an integer in
// [1, 1000000])" as a usage error otherwise.
void check_flag_range(const char* flag, int64_t value, int64_t min, int64_t max);
// An unsigned integer flag given as text (CLI11 wraps "-1" into an unsigned): digits only.
uint64_t parse_uint_flag(const char* flag, const std::string& text);
template <typename T>
T value_or_fail(Result<T> r) {
  if (!r.is_ok()) fail(r.status());
  return std::move(r).value();
}

// One JSON object on stdout, followed by a newline.
void print_json(const nlohmann::json& j);

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

}  // namespace zoe::cli
