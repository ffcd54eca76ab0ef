// Parsing and printing byte sizes ("256MiB", "4G", "1e9") and lists of them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zoe/status.h"

namespace zoe {

// Accepts plain integers, scientific notation (1e9) and suffixes K/KB/KiB, M/MB/MiB, G/GB/GiB,
// T/TB/TiB, P/PB/PiB, E/EB/EiB (any case). K ... E and the *iB forms are powers of 1024; KB ... EB
// are powers of 1000. A size must fit in 64 bits (below 16 EiB) and be a whole number of bytes;
// errors quote the text.
Result<uint64_t> parse_bytes(std::string_view text);
// A comma-separated list of sizes: "4KiB,1MiB". `what` (the flag, "--bs") and the text begin every
// error, with the item's position (1-based) where one item is at fault.
Result<std::vector<uint64_t>> parse_bytes_list(std::string_view text, const std::string& what);
// A comma-separated list of positive integers: "1,8,32" (errors as parse_bytes_list's).
Result<std::vector<uint64_t>> parse_uint_list(std::string_view text, const std::string& what);
// "1.5 GiB", "512 KiB", "17 B": B up to EiB, in a form parse_bytes reads back (to the digits shown).
std::string format_bytes(uint64_t bytes);
// Splits "a, b,c" on commas, each item trimmed of blanks. An empty item ("a,,b", "a,") or an empty
// text is an error naming `what`, the text and the item's position: nothing is dropped silently.
Result<std::vector<std::string>> split_list(std::string_view text, const std::string& what, char sep = ',');

}  // namespace zoe
