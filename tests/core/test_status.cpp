// Tests of Status/Result and the syscall-error messages.
#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <utility>

#include "tests/util/status_test_util.h"
#include "zoe/status.h"

namespace zoe {
namespace {

Result<int> half(int x) {
  if (x % 2) return invalid_argument("%d is odd", x);
  return x / 2;
}

Status quarter(int x, int* out) {
  ZOE_ASSIGN_OR_RETURN(int h, half(x));
  ZOE_ASSIGN_OR_RETURN(int q, half(h));
  *out = q;
  return Status::ok();
}

TEST(Status, OkAndErrors) {
  EXPECT_OK(Status::ok());
  Status s = invalid_argument("key %s: expected %d", "stage", 3);
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "key stage: expected 3");
  EXPECT_EQ(s.to_string(), "invalid argument: key stage: expected 3");
}

TEST(Status, ContextAddsLines) {
  Status s = io_error("disk broke").with_context("reading the swap file").with_context("step 3");
  EXPECT_EQ(s.message(), "disk broke\n  while reading the swap file\n  while step 3");
  EXPECT_OK(Status::ok().with_context("x"));
}

TEST(Status, SysErrorNamesEverything) {
  Status s = sys_error("pread", "/nvme/x", 8192, 4096, EIO);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.sys_errno(), EIO);
  EXPECT_NE(s.message().find("pread 4096 bytes at offset 8192 of /nvme/x"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("Input/output error"), std::string::npos);
  EXPECT_EQ(sys_error("pwrite", "/p", 0, 1, ENOSPC).code(), StatusCode::kNoSpace);
  EXPECT_EQ(sys_error("open", "/p", EACCES).code(), StatusCode::kPermissionDenied);
}

TEST(Result, ValueAndPropagation) {
  int out = 0;
  EXPECT_OK(quarter(12, &out));
  EXPECT_EQ(out, 3);
  Status s = quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "3 is odd");
  Result<int> bad = Status::ok();  // a Result may not be built from OK
  EXPECT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
}

Status open_swap(bool fail) {
  if (fail) return io_error("disk broke");
  return Status::ok();
}
Status load_swap(bool fail) {
  ZOE_RETURN_IF_ERROR_CTX(open_swap(fail), "loading the swap file");
  return Status::ok();
}
constexpr int kLoadLine = __LINE__ - 3;
Status start(bool fail) {
  ZOE_RETURN_IF_ERROR(load_swap(fail));
  return Status::ok();
}
constexpr int kStartLine = __LINE__ - 3;

// Each propagation macro adds "at <file basename>:<line>"; message() keeps the message and its
// context only.
TEST(Status, MacrosAddTheirFileAndLine) {
  EXPECT_OK(start(false));
  Status s = start(true);
  EXPECT_EQ(s.message(), "disk broke\n  while loading the swap file");
  EXPECT_EQ(s.trace(), "\n  at test_status.cpp:" + std::to_string(kLoadLine) +
                           "\n  at test_status.cpp:" + std::to_string(kStartLine));
  EXPECT_EQ(s.to_string(), "io error: " + s.message() + s.trace());
  int out = 0;
  Status q = quarter(6, &out);  // the second half() fails, at quarter's second line
  EXPECT_EQ(q.message(), "3 is odd");
  EXPECT_NE(q.trace().find("at test_status.cpp:"), std::string::npos) << q.trace();
  EXPECT_EQ(Status::ok().with_location("a/b.cpp", 1).trace(), "");
  EXPECT_EQ(io_error("x").with_location("/src/zero/engine.cpp", 12).trace(), "\n  at engine.cpp:12");
}

TEST(ResultDeathTest, ValueOfAnErrorPrintsTheStatus) {
  Result<int> r = not_found("no file /x/y");
  EXPECT_DEATH((void)r.value(), "not found: no file /x/y");
  EXPECT_DEATH((void)std::move(r).value(), "Result::value\\(\\) called on an error");
}

}  // namespace
}  // namespace zoe
