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

// Every suffix up to E (64 bits): binary K ... E and *iB, decimal KB ... EB; a size of 2^64 or more
// is out of range, with a message, not a wrapped or saturated value.
TEST(Units, ParseBytesUpToExa) {
  EXPECT_EQ(parse_bytes("1PiB").value(), 1ull << 50);
  EXPECT_EQ(parse_bytes("2P").value(), 2ull << 50);
  EXPECT_EQ(parse_bytes("3PB").value(), 3000000000000000ull);
  EXPECT_EQ(parse_bytes("1EiB").value(), 1ull << 60);
  EXPECT_EQ(parse_bytes("15 eib").value(), 15ull << 60);
  EXPECT_EQ(parse_bytes("1E").value(), 1ull << 60);
  EXPECT_EQ(parse_bytes("18EB").value(), 18000000000000000000ull);
  EXPECT_EQ(parse_bytes("0.5EiB").value(), 1ull << 59);
  EXPECT_EQ(parse_bytes("18446744073709551615").value(), UINT64_MAX);  // exact, not through a double
  EXPECT_EQ(parse_bytes("9007199254740993").value(), 9007199254740993ull);
  for (const char* big : {"16EiB", "19EB", "18446744073709551616", "1e20", "100000000000000000000000"}) {
    auto r = parse_bytes(big);
    ASSERT_FALSE(r.is_ok()) << big << " parsed as " << r.value();
    EXPECT_NE(r.status().message().find(std::string("'") + big + "' is out of range"), std::string::npos)
        << r.status().message();
  }
  EXPECT_NE(parse_bytes("1ZiB").status().message().find("EiB"), std::string::npos);  // the suffixes known
}

TEST(Units, Lists) {
  auto l = parse_bytes_list("4KiB,1MiB", "--bs");
  ASSERT_OK(l);
  EXPECT_EQ(l.value(), (std::vector<uint64_t>{4096, 1 << 20}));
  EXPECT_EQ(parse_bytes_list("4KiB, 1EiB", "--bs").value(), (std::vector<uint64_t>{4096, 1ull << 60}));
  EXPECT_EQ(parse_uint_list("1,8,32", "--qd").value(), (std::vector<uint64_t>{1, 8, 32}));
  EXPECT_FALSE(parse_uint_list("1,x", "--qd").is_ok());
  EXPECT_FALSE(parse_uint_list("0", "--qd").is_ok());
  EXPECT_NE(parse_uint_list("1,x", "--qd").status().message().find("--qd '1,x': item 2, 'x', is not"),
            std::string::npos);
  EXPECT_NE(parse_bytes_list("1KiB,2XB", "--bs").status().message().find("--bs '1KiB,2XB': item 2:"),
            std::string::npos);
}

// An empty item is an error naming the flag, the text and the item's position, in every list
// parser: never dropped.
TEST(Units, EmptyListItemsAreRefused) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c :
       {Case{"1KiB,,2KiB", "--x '1KiB,,2KiB': item 2 is empty"},
        Case{",1KiB", "--x ',1KiB': item 1 is empty"}, Case{"1KiB,", "--x '1KiB,': item 2 is empty"},
        Case{"1KiB, ,2KiB", "item 2 is empty"}, Case{"", "--x '': an empty list"}}) {
    for (const Status& s : {split_list(c.text, "--x").status(), parse_bytes_list(c.text, "--x").status(),
                            parse_uint_list(c.text, "--x").status()}) {
      ASSERT_FALSE(s.is_ok()) << c.text;
      EXPECT_NE(s.message().find(c.says), std::string::npos) << s.message();
    }
  }
  EXPECT_EQ(split_list(" read , write", "--rw").value(), (std::vector<std::string>{"read", "write"}));
}

TEST(Units, Format) {
  EXPECT_EQ(format_bytes(17), "17 B");
  EXPECT_EQ(format_bytes(1 << 20), "1 MiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(1ull << 50), "1 PiB");
  EXPECT_EQ(format_bytes(3ull << 60), "3 EiB");
}

// What format_bytes prints, parse_bytes reads back: the same value where the text is exact, and a
// size in range for every 64-bit value (the largest prints under 16 EiB).
TEST(Units, FormatParsesBack) {
  for (int k = 0; k < 64; ++k) {
    for (uint64_t m : {1ull, 3ull}) {
      if (k == 63 && m == 3) continue;
      const uint64_t v = m << k;
      auto r = parse_bytes(format_bytes(v));
      ASSERT_OK(r) << format_bytes(v);
      EXPECT_EQ(r.value(), v) << format_bytes(v);
    }
  }
  EXPECT_EQ(format_bytes(UINT64_MAX), "15.99 EiB");
  EXPECT_OK(parse_bytes(format_bytes(UINT64_MAX)));
}

}  // namespace
}  // namespace zoe
