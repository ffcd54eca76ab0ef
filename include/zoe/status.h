// Status and Result<T>: how every expected failure in zoe travels (I/O, bad config, budgets).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace zoe {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,  // bad input from the user: config key, CLI flag, argument
  kNotFound,         // a path, key or item that does not exist
  kAlreadyExists,
  kIoError,           // a syscall or device reported an error (EIO, short read, ...)
  kNoSpace,           // ENOSPC, or a file system too small for the request
  kOutOfBudget,       // a tier's hard byte budget would be exceeded
  kUnsupported,       // a feature missing here (O_DIRECT on tmpfs, io_uring under seccomp)
  kCorruption,        // checksum mismatch, truncated file, bad magic
  kPermissionDenied,  // EPERM/EACCES, RLIMIT_MEMLOCK
  kCancelled,         // the engine shut down before the work ran
  kInternal,          // a bug in zoe; the message says where
};

const char* status_code_name(StatusCode code);

// A cheap value type: OK carries no allocation. Programming errors are not Statuses;
// they abort through ZOE_CHECK.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message, int sys_errno = 0)
      : code_(code), errno_(sys_errno), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // errno of the failing syscall, 0 when the failure was not a syscall's.
  int sys_errno() const { return errno_; }

  // "io error: While pread 4096 bytes at offset 8192 of /x: Input/output error (errno 5)", then
  // the context lines and the trace's lines:
  //   "\n  while loading the swap file\n  at swap_file.cpp:88\n  at engine.cpp:130".
  std::string to_string() const;

  // Adds one line of context, outermost last, like a stack of "while ..." frames.
  Status with_context(std::string_view context) const&;
  Status with_context(std::string_view context) &&;

  // The path the error took back up the stack, as to_string() prints it: one "\n  at file.cpp:123"
  // per hop through ZOE_RETURN_IF_ERROR, ZOE_RETURN_IF_ERROR_CTX or ZOE_ASSIGN_OR_RETURN, innermost
  // first ("" when it took none). message() leaves it out.
  const std::string& trace() const { return trace_; }
  // Adds one hop to trace() (file: a path; its last component is kept). For the macros below.
  Status with_location(const char* file, int line) &&;

 private:
  StatusCode code_ = StatusCode::kOk;
  int errno_ = 0;
  std::string message_;
  std::string trace_;
};

// printf-style constructors: Status err = invalid_argument("key %s: expected a number", k);
Status make_status(StatusCode code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
#define ZOE_STATUS_CTOR(fn, code)             \
  template <typename... Args>                 \
  Status fn(const char* fmt, Args... args) {  \
    if constexpr (sizeof...(Args) == 0)       \
      return make_status(code, "%s", fmt);    \
    else                                      \
      return make_status(code, fmt, args...); \
  }
ZOE_STATUS_CTOR(invalid_argument, StatusCode::kInvalidArgument)
ZOE_STATUS_CTOR(not_found, StatusCode::kNotFound)
ZOE_STATUS_CTOR(io_error, StatusCode::kIoError)
ZOE_STATUS_CTOR(no_space, StatusCode::kNoSpace)
ZOE_STATUS_CTOR(out_of_budget, StatusCode::kOutOfBudget)
ZOE_STATUS_CTOR(unsupported, StatusCode::kUnsupported)
ZOE_STATUS_CTOR(corruption, StatusCode::kCorruption)
ZOE_STATUS_CTOR(internal_error, StatusCode::kInternal)
#undef ZOE_STATUS_CTOR

// A failed syscall: the operation with its byte count and offset, the path, and errno's text.
// sys_error("pread", "/nvme/x", 8192, 4096, EIO) ->
//   "While pread 4096 bytes at offset 8192 of /nvme/x: Input/output error (errno 5)".
// ENOSPC maps to kNoSpace, EPERM/EACCES to kPermissionDenied, the rest to kIoError.
Status sys_error(std::string_view op, std::string_view path, uint64_t offset, uint64_t length, int err);
// A failed syscall that has no offset/length (open, fallocate of a whole file, statfs...).
Status sys_error(std::string_view op, std::string_view path, int err);

namespace detail {
// Result<T>::value() on an error: prints the Status to stderr and aborts.
[[noreturn]] void value_of_error(const Status& status);
}  // namespace detail

#if defined(__GNUC__) || defined(__clang__)
#define ZOE_UNLIKELY_(x) __builtin_expect(!!(x), 0)
#else
#define ZOE_UNLIKELY_(x) (x)
#endif

// A value or the Status of why there is none. value() (and * and ->) on an error is a programming
// error: it prints the Status to stderr and aborts (check is_ok() first, or propagate with
// ZOE_ASSIGN_OR_RETURN).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).is_ok()) v_ = Status(StatusCode::kInternal, "Result built from OK");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    check_value();
    return *std::get_if<T>(&v_);
  }
  const T& value() const& {
    check_value();
    return *std::get_if<T>(&v_);
  }
  T&& value() && {
    check_value();
    return std::move(*std::get_if<T>(&v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  void check_value() const {
    if (ZOE_UNLIKELY_(!is_ok())) detail::value_of_error(*std::get_if<Status>(&v_));
  }
  std::variant<T, Status> v_;
};

}  // namespace zoe

#define ZOE_CONCAT_INNER_(a, b) a##b
#define ZOE_CONCAT_(a, b) ZOE_CONCAT_INNER_(a, b)
// The file a macro is expanded in, for the trace (with_location keeps the path's last component).
#ifdef __FILE_NAME__
#define ZOE_FILE_ __FILE_NAME__
#else
#define ZOE_FILE_ __FILE__
#endif

// Returns the Status from the enclosing function when expr fails, adding "at file.cpp:line" (this
// line) to its trace.
#define ZOE_RETURN_IF_ERROR(expr)                                       \
  do {                                                                  \
    ::zoe::Status zoe_status_ = (expr);                                 \
    if (ZOE_UNLIKELY_(!zoe_status_.is_ok()))                            \
      return std::move(zoe_status_).with_location(ZOE_FILE_, __LINE__); \
  } while (0)

// Same, adding a line of context ("while loading the swap file") to the error.
#define ZOE_RETURN_IF_ERROR_CTX(expr, ctx)                                                \
  do {                                                                                    \
    ::zoe::Status zoe_status_ = (expr);                                                   \
    if (ZOE_UNLIKELY_(!zoe_status_.is_ok()))                                              \
      return std::move(zoe_status_).with_context(ctx).with_location(ZOE_FILE_, __LINE__); \
  } while (0)

// auto x = ...; from a Result<T>, returning its Status (with this line in its trace) on failure.
#define ZOE_ASSIGN_OR_RETURN(lhs, expr) ZOE_ASSIGN_OR_RETURN_IMPL_(ZOE_CONCAT_(zoe_r_, __LINE__), lhs, expr)
#define ZOE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)                                                        \
  auto tmp = (expr);                                                                                      \
  if (ZOE_UNLIKELY_(!tmp.is_ok())) return ::zoe::Status(tmp.status()).with_location(ZOE_FILE_, __LINE__); \
  lhs = std::move(tmp).value()
