// Byte-size parsing and formatting.
#include "core/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace zoe {

Result<uint64_t> parse_bytes(std::string_view text) {
  std::string s(text);
  while (!s.empty() && isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t start = 0;
  while (start < s.size() && isspace(static_cast<unsigned char>(s[start]))) ++start;
  s = s.substr(start);
  if (s.empty() || s[0] == '-') {
    return invalid_argument("'%s' is not a byte size (expected e.g. 4096, 1e9, 256MiB, 4GiB)",
                            std::string(text).c_str());
  }
  char* end = nullptr;
  double num = strtod(s.c_str(), &end);
  if (end == s.c_str()) {
    return invalid_argument("'%s' is not a byte size (expected e.g. 4096, 1e9, 256MiB, 4GiB)",
                            std::string(text).c_str());
  }
  std::string suffix(end);
  while (!suffix.empty() && isspace(static_cast<unsigned char>(suffix[0]))) suffix.erase(0, 1);
  for (auto& c : suffix) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  double mul = 1;
  static const struct {
    const char* s;
    double m;
  } kSuffixes[] = {{"", 1},
                   {"B", 1},
                   {"K", 1024.0},
                   {"KIB", 1024.0},
                   {"KB", 1e3},
                   {"M", 1048576.0},
                   {"MIB", 1048576.0},
                   {"MB", 1e6},
                   {"G", 1073741824.0},
                   {"GIB", 1073741824.0},
                   {"GB", 1e9},
                   {"T", 1099511627776.0},
                   {"TIB", 1099511627776.0},
                   {"TB", 1e12}};
  bool known = false;
  for (const auto& e : kSuffixes) {
    if (suffix == e.s) {
      mul = e.m;
      known = true;
      break;
    }
  }
  if (!known) {
    return invalid_argument("'%s': unknown size suffix '%s' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                            std::string(text).c_str(), end);
  }
  double v = num * mul;
  if (!std::isfinite(v) || v < 0 || v > 1.8e19) {
    return invalid_argument("'%s' is out of range for a byte size", std::string(text).c_str());
  }
  double r = std::floor(v);
  if (r != v) {
    return invalid_argument("'%s' is not a whole number of bytes", std::string(text).c_str());
  }
  return static_cast<uint64_t>(r);
}

std::vector<std::string> split_list(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t next = text.find(sep, pos);
    if (next == std::string_view::npos) next = text.size();
    std::string item(text.substr(pos, next - pos));
    if (!item.empty()) out.push_back(item);
    pos = next + 1;
  }
  return out;
}

Result<std::vector<uint64_t>> parse_bytes_list(std::string_view text) {
  std::vector<uint64_t> out;
  for (const auto& item : split_list(text)) {
    ZOE_ASSIGN_OR_RETURN(uint64_t v, parse_bytes(item));
    out.push_back(v);
  }
  if (out.empty()) return invalid_argument("empty list of sizes");
  return out;
}

Result<std::vector<uint64_t>> parse_uint_list(std::string_view text) {
  std::vector<uint64_t> out;
  for (const auto& item : split_list(text)) {
    char* end = nullptr;
    unsigned long long v = strtoull(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || item[0] == '-' || v == 0) {
      return invalid_argument("'%s' is not a positive integer", item.c_str());
    }
    out.push_back(v);
  }
  if (out.empty()) return invalid_argument("empty list of integers");
  return out;
}

std::string format_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else if (v == std::floor(v)) {
    snprintf(buf, sizeof(buf), "%.0f %s", v, kUnits[u]);
  } else {
    snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

}  // namespace zoe
