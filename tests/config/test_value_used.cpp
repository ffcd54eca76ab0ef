// config::value_used: a value used other than as given is warned about once, naming the key and
// both values; a value used as given is not.
#include <gtest/gtest.h>

#include <string>

#include "config/value_used.h"
#include "core/log.h"

namespace zoe::config {
namespace {

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(ValueUsed, WarnsOncePerKeyAndValues) {
  const LogLevel level = log_level();
  set_log_level(LogLevel::kWarn);
  testing::internal::CaptureStderr();
  EXPECT_EQ(value_used("test.same", 5, 5, "why"), 5);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(value_used("test.raised", 4, 12, "three slots"), 12);
  EXPECT_EQ(value_used("test.raised", 8, 12, "three slots"), 12);  // another given value: its own warning
  EXPECT_EQ(value_clamped("test.clamped", 0, 1, 9, "at least one"), 1);
  EXPECT_EQ(value_clamped("test.clamped", 10, 1, 9, "at most nine"), 9);
  EXPECT_EQ(value_clamped("test.clamped", 5, 1, 9, "inside"), 5);
  const std::string err = testing::internal::GetCapturedStderr();
  set_log_level(level);
  EXPECT_EQ(err.find("test.same"), std::string::npos) << err;
  EXPECT_EQ(count_of(err, "config: test.raised is 4; zoe uses 12 (three slots)"), 1u) << err;
  EXPECT_EQ(count_of(err, "config: test.raised is 8; zoe uses 12 (three slots)"), 1u) << err;
  EXPECT_EQ(count_of(err, "test.clamped is 0; zoe uses 1 (at least one)"), 1u) << err;
  EXPECT_EQ(count_of(err, "test.clamped is 10; zoe uses 9 (at most nine)"), 1u) << err;
  EXPECT_EQ(count_of(err, "test.clamped is 5"), 0u) << err;
}

}  // namespace
}  // namespace zoe::config
