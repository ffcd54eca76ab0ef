// ASSERT_OK(expr) / EXPECT_OK(expr): expr (a Status or a Result<T>, evaluated once) must be OK; a
// failure prints the expression and the whole Status: code, message, context lines and trace.
// Extra text may be streamed as with any assertion: ASSERT_OK(s) << "module " << m;
// Public headers only, so tests/api (built against the installed package) can use it too.
#pragma once

#include <gtest/gtest.h>

#include "zoe/status.h"

namespace zoe::test {

inline ::testing::AssertionResult status_is_ok(const char* expr, const ::zoe::Status& s) {
  if (s.is_ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr << " is not OK: " << s.to_string();
}

template <typename T>
::testing::AssertionResult status_is_ok(const char* expr, const ::zoe::Result<T>& r) {
  return status_is_ok(expr, r.status());
}

}  // namespace zoe::test

#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::zoe::test::status_is_ok, expr)
#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::zoe::test::status_is_ok, expr)
