// Tests of byte-size parsing and formatting.
#include <gtest/gtest.h>

#include "core/units.h"
#include "tests/util/status_test_util.h"

namespace zoe {
namespace {

TEST(Units, ParseBytes) {
  EXPECT_EQ(parse_bytes("4096").value(), 4096u);
  EXPECT_EQ(parse_bytes("1e9").value(), 1000000000u);
  EXPECT_EQ(parse_bytes("256MiB").value(), 256ull << 20);
  EXPECT_EQ(parse_bytes("256M").value(), 256ull << 20);
  EXPECT_EQ(parse_bytes("4GiB").value(), 4ull << 30);
  EXPECT_EQ(parse_bytes("4gb").value(), 4000000000ull);
  EXPECT_EQ(parse_bytes("1.5KiB").value(), 1536u);
  EXPECT_EQ(parse_bytes(" 8 KiB ").value(), 8192u);
  EXPECT_FALSE(parse_bytes("").is_ok());
  EXPECT_FALSE(parse_bytes("-1").is_ok());
  EXPECT_FALSE(parse_bytes("12XB").is_ok());
  EXPECT_FALSE(parse_bytes("0.5").is_ok());
  EXPECT_NE(parse_bytes("12XB").status().message().find("12XB"), std::string::npos);
}

TEST(Units, Lists) {
  auto l = parse_bytes_list("4KiB,1MiB");
  ASSERT_OK(l);
  EXPECT_EQ(l.value(), (std::vector<uint64_t>{4096, 1 << 20}));
  EXPECT_EQ(parse_uint_list("1,8,32").value(), (std::vector<uint64_t>{1, 8, 32}));
  EXPECT_FALSE(parse_uint_list("1,x").is_ok());
  EXPECT_FALSE(parse_uint_list("0").is_ok());
}

TEST(Units, Format) {
  EXPECT_EQ(format_bytes(17), "17 B");
  EXPECT_EQ(format_bytes(1 << 20), "1 MiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
}

}  // namespace
}  // namespace zoe
