// The CLI frame (zoe/cli.h): flag checks, JSON printing, tables and progress lines.
#include "zoe/cli.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "core/clock.h"
#include "zoe/files.h"

namespace zoe::cli {

void print_json_text(const std::string& s) {
  fwrite(s.data(), 1, s.size(), stdout);
  fputc('\n', stdout);
  fflush(stdout);
}

void Table::print_header(FILE* out) const {
  for (size_t i = 0; i < cols_.size(); ++i) {
    const auto& c = cols_[i];
    fprintf(out, c.left ? "%-*s" : "%*s", c.width, c.name.c_str());
    fputc(i + 1 < cols_.size() ? ' ' : '\n', out);
  }
  for (size_t i = 0; i < cols_.size(); ++i) {
    const auto& c = cols_[i];
    fprintf(out, c.left ? "%-*s" : "%*s", c.width, c.unit.c_str());
    fputc(i + 1 < cols_.size() ? ' ' : '\n', out);
  }
}

void Table::print_row(FILE* out, const std::vector<std::string>& cells) const {
  for (size_t i = 0; i < cols_.size(); ++i) {
    const auto& c = cols_[i];
    const char* v = i < cells.size() ? cells[i].c_str() : "";
    fprintf(out, c.left ? "%-*s" : "%*s", c.width, v);
    fputc(i + 1 < cols_.size() ? ' ' : '\n', out);
  }
  fflush(out);
}

void check_output_flag(const char* flag, const std::string& path) {
  if (path.empty()) return;
  Status s = check_output_path(path, flag);
  if (!s.is_ok()) fail(s);
}

void check_flag_range(const char* flag, int64_t value, int64_t min, int64_t max) {
  if (value >= min && value <= max) return;
  usage_fail(invalid_argument("%s %lld is out of range (expected an integer in [%lld, %lld])", flag,
                              static_cast<long long>(value), static_cast<long long>(min),
                              static_cast<long long>(max)));
}

CLI::Option* int_range(CLI::Option* opt, int64_t min, int64_t max) {
  const std::string flag = opt->get_name();
  opt->check(
      [flag, min, max](const std::string& text) {
        char* end = nullptr;
        errno = 0;
        const long long v = strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != 0 || errno == ERANGE) {
          usage_fail(invalid_argument("%s %s is not an integer (expected one in [%lld, %lld])", flag.c_str(),
                                      text.c_str(), static_cast<long long>(min),
                                      static_cast<long long>(max)));
        }
        check_flag_range(flag.c_str(), v, min, max);
        return std::string();
      },
      fmt("INT in [%lld, %lld]", static_cast<long long>(min), static_cast<long long>(max)));
  return opt;
}

CLI::Option* positive_real(CLI::Option* opt) {
  const std::string flag = opt->get_name();
  opt->check(
      [flag](const std::string& text) {
        char* end = nullptr;
        const double v = strtod(text.c_str(), &end);
        if (text.empty() || *end != 0 || !std::isfinite(v) || v <= 0) {
          usage_fail(invalid_argument("%s %s is not a positive finite number", flag.c_str(), text.c_str()));
        }
        return std::string();
      },
      "a positive finite number");
  return opt;
}

uint64_t parse_uint_flag(const char* flag, const std::string& text) {
  bool digits = !text.empty() && text.size() <= 20;
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  errno = 0;
  unsigned long long v = digits ? strtoull(text.c_str(), nullptr, 10) : 0;
  if (!digits || errno == ERANGE) {
    usage_fail(invalid_argument("%s %s is not an unsigned integer (expected one in [0, %llu])", flag,
                                text.c_str(), static_cast<unsigned long long>(UINT64_MAX)));
  }
  return v;
}

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

Progress::Progress(bool enabled, double every_s)
    : enabled_(enabled), tty_(isatty(STDERR_FILENO)), every_s_(every_s) {}

Progress::~Progress() { done(); }

void Progress::update(const std::string& line) {
  if (!enabled_) return;
  if (tty_) {
    fprintf(stderr, "\r%s", line.c_str());
    if (line.size() < last_len_) fprintf(stderr, "%*s", static_cast<int>(last_len_ - line.size()), "");
    last_len_ = line.size();
  } else {
    const uint64_t now = now_ns();
    if (last_line_ns_ != 0 && static_cast<double>(now - last_line_ns_) * 1e-9 < every_s_) {
      held_ = line;
      return;
    }
    last_line_ns_ = now;
    held_.clear();
    fprintf(stderr, "%s\n", line.c_str());
  }
  fflush(stderr);
}

void Progress::done() {
  if (enabled_ && !tty_ && !held_.empty()) {  // the final state, even if it came soon after the last line
    fprintf(stderr, "%s\n", held_.c_str());
    held_.clear();
  }
  if (enabled_ && tty_ && last_len_) {
    fprintf(stderr, "\n");
    last_len_ = 0;
  }
}

}  // namespace zoe::cli
