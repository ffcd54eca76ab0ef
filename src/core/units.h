// Parsing and printing byte sizes ("256MiB", "4G", "1e9") and lists of them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zoe/status.h"

namespace zoe {

// Accepts plain integers, scientific notation (1e9) and suffixes K/KB/KiB, M/MB/MiB, G/GB/GiB,
// T/TB/TiB. K, M, G, T and the *iB forms are powers of 1024; KB, MB, GB, TB are powers of 1000.
Result<uint64_t> parse_bytes(std::string_view text);
// A comma-separated list of sizes: "4KiB,1MiB".
Result<std::vector<uint64_t>> parse_bytes_list(std::string_view text);
// A comma-separated list of positive integers: "1,8,32".
Result<std::vector<uint64_t>> parse_uint_list(std::string_view text);
// "1.5 GiB", "512 KiB", "17 B".
std::string format_bytes(uint64_t bytes);
// Splits "a,b,c" on commas, dropping empty items.
std::vector<std::string> split_list(std::string_view text, char sep = ',');

}  // namespace zoe
