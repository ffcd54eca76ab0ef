// Status formatting, the propagation trace, and the syscall-error constructors.
#include "zoe/status.h"

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zoe {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kAlreadyExists:
      return "already exists";
    case StatusCode::kIoError:
      return "io error";
    case StatusCode::kNoSpace:
      return "no space";
    case StatusCode::kOutOfBudget:
      return "out of budget";
    case StatusCode::kUnsupported:
      return "unsupported";
    case StatusCode::kCorruption:
      return "corruption";
    case StatusCode::kPermissionDenied:
      return "permission denied";
    case StatusCode::kCancelled:
      return "cancelled";
    case StatusCode::kInternal:
      return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_ + trace_;
}

Status Status::with_location(const char* file, int line) && {
  if (is_ok()) return std::move(*this);
  const char* slash = strrchr(file, '/');
  trace_ += "\n  at ";
  trace_ += slash ? slash + 1 : file;
  trace_ += ':';
  trace_ += std::to_string(line);
  return std::move(*this);
}

namespace detail {
void value_of_error(const Status& status) {
  fprintf(stderr, "zoe: Result::value() called on an error: %s\n", status.to_string().c_str());
  fflush(stderr);
  abort();
}
}  // namespace detail

Status Status::with_context(std::string_view context) const& {
  Status s = *this;
  return std::move(s).with_context(context);
}

Status Status::with_context(std::string_view context) && {
  if (is_ok()) return std::move(*this);
  message_ += "\n  while ";
  message_ += context;
  return std::move(*this);
}

Status make_status(StatusCode code, const char* fmt, ...) {
  char stack_buf[512];
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(stack_buf, sizeof(stack_buf), fmt, ap);
  va_end(ap);
  std::string msg;
  if (n < 0) {
    msg = fmt;
  } else if (static_cast<size_t>(n) < sizeof(stack_buf)) {
    msg.assign(stack_buf, static_cast<size_t>(n));
  } else {
    msg.resize(static_cast<size_t>(n));
    vsnprintf(msg.data(), msg.size() + 1, fmt, ap2);
  }
  va_end(ap2);
  return Status(code, std::move(msg));
}

static StatusCode code_for_errno(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return StatusCode::kNoSpace;
    case EPERM:
    case EACCES:
      return StatusCode::kPermissionDenied;
    case ENOENT:
      return StatusCode::kNotFound;
    case EEXIST:
      return StatusCode::kAlreadyExists;
    case EOPNOTSUPP:
    case ENOSYS:
      return StatusCode::kUnsupported;
    case ECANCELED:
      return StatusCode::kCancelled;
    default:
      return StatusCode::kIoError;
  }
}

Status sys_error(std::string_view op, std::string_view path, uint64_t offset, uint64_t length, int err) {
  char buf[256];
  snprintf(buf, sizeof(buf), "While %.*s %llu bytes at offset %llu of ", static_cast<int>(op.size()),
           op.data(), static_cast<unsigned long long>(length), static_cast<unsigned long long>(offset));
  std::string msg = buf;
  msg += path;
  msg += ": ";
  msg += strerror(err);
  msg += " (errno " + std::to_string(err) + ")";
  return Status(code_for_errno(err), std::move(msg), err);
}

Status sys_error(std::string_view op, std::string_view path, int err) {
  std::string msg = "While ";
  msg += op;
  msg += " ";
  msg += path;
  msg += ": ";
  msg += strerror(err);
  msg += " (errno " + std::to_string(err) + ")";
  return Status(code_for_errno(err), std::move(msg), err);
}

}  // namespace zoe
