// Leveled logging to stderr and the ZOE_CHECK macro for programming errors.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace zoe {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

// The level comes from ZOE_LOG_LEVEL (error|warn|info|debug|trace) at first use; default warn.
LogLevel log_level();
void set_log_level(LogLevel level);
// Parses "error", "warn", ... ; returns false for an unknown name.
bool parse_log_level(const char* name, LogLevel* out);

void log_message(LogLevel level, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

[[noreturn]] void check_failed(const char* file, int line, const char* cond, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

}  // namespace zoe

#define ZOE_LOG(level, ...)                                                               \
  do {                                                                                    \
    if (static_cast<int>(::zoe::LogLevel::level) <= static_cast<int>(::zoe::log_level())) \
      ::zoe::log_message(::zoe::LogLevel::level, __FILE__, __LINE__, __VA_ARGS__);        \
  } while (0)
#define ZOE_LOG_ERROR(...) ZOE_LOG(kError, __VA_ARGS__)
#define ZOE_LOG_WARN(...) ZOE_LOG(kWarn, __VA_ARGS__)
#define ZOE_LOG_INFO(...) ZOE_LOG(kInfo, __VA_ARGS__)
#define ZOE_LOG_DEBUG(...) ZOE_LOG(kDebug, __VA_ARGS__)

// Aborts with file:line and the condition when a programming invariant is broken.
#define ZOE_CHECK(cond)                                                                         \
  do {                                                                                          \
    if (__builtin_expect(!(cond), 0)) ::zoe::check_failed(__FILE__, __LINE__, #cond, "%s", ""); \
  } while (0)
#define ZOE_CHECK_MSG(cond, ...)                                                                   \
  do {                                                                                             \
    if (__builtin_expect(!(cond), 0)) ::zoe::check_failed(__FILE__, __LINE__, #cond, __VA_ARGS__); \
  } while (0)
