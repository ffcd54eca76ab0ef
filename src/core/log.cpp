// Leveled logging: one line per message on stderr, serialized across threads.
#include "core/log.h"

#include <atomic>
#include <cstdarg>
#include <cstring>
#include <mutex>

namespace zoe {
namespace {

std::atomic<int> g_level{-1};
std::mutex g_log_mu;

const char* level_tag(LogLevel l) {
  switch (l) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warning";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kTrace:
      return "trace";
  }
  return "?";
}

}  // namespace

bool parse_log_level(const char* name, LogLevel* out) {
  static const struct {
    const char* n;
    LogLevel l;
  } kNames[] = {{"error", LogLevel::kError}, {"warn", LogLevel::kWarn},   {"warning", LogLevel::kWarn},
                {"info", LogLevel::kInfo},   {"debug", LogLevel::kDebug}, {"trace", LogLevel::kTrace}};
  for (const auto& e : kNames) {
    if (strcasecmp(name, e.n) == 0) {
      *out = e.l;
      return true;
    }
  }
  return false;
}

LogLevel log_level() {
  int l = g_level.load(std::memory_order_relaxed);
  if (l < 0) {
    LogLevel parsed = LogLevel::kWarn;
    const char* env = getenv("ZOE_LOG_LEVEL");
    if (env && !parse_log_level(env, &parsed)) {
      fprintf(stderr, "zoe: warning: ZOE_LOG_LEVEL=%s is not one of error|warn|info|debug|trace\n", env);
    }
    l = static_cast<int>(parsed);
    g_level.store(l, std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(l);
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }

void log_message(LogLevel level, const char* file, int line, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(g_log_mu);
  if (log_level() >= LogLevel::kDebug) {
    const char* base = strrchr(file, '/');
    fprintf(stderr, "zoe: %s: %s [%s:%d]\n", level_tag(level), buf, base ? base + 1 : file, line);
  } else {
    fprintf(stderr, "zoe: %s: %s\n", level_tag(level), buf);
  }
}

void check_failed(const char* file, int line, const char* cond, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  fprintf(stderr, "zoe: internal check failed at %s:%d: %s %s\n", file, line, cond, buf);
  fflush(stderr);
  abort();
}

}  // namespace zoe
