// Helpers shared by the CLI's commands: JSON output, tables, progress lines, exit codes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zoe/status.h"

namespace zoe::cli {

// Thrown by a command to end with a clear message and exit code 1 (caught in main).
struct CommandError {
  Status status;
};
[[noreturn]] inline void fail(Status s) { throw CommandError{std::move(s)}; }
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
};

}  // namespace zoe::cli
