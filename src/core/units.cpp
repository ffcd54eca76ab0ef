// Byte-size parsing and formatting.
#include "core/units.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace zoe {

namespace {

constexpr const char* kByteExamples = "expected e.g. 4096, 1e9, 256MiB, 4GiB";

struct Suffix {
  const char* s;
  uint64_t m;
};
// Every suffix parse_bytes knows, upper case; format_bytes prints the *iB ones.
constexpr Suffix kSuffixes[] = {
    {"", 1},
    {"B", 1},
    {"K", 1ull << 10},
    {"KIB", 1ull << 10},
    {"KB", 1000ull},
    {"M", 1ull << 20},
    {"MIB", 1ull << 20},
    {"MB", 1000000ull},
    {"G", 1ull << 30},
    {"GIB", 1ull << 30},
    {"GB", 1000000000ull},
    {"T", 1ull << 40},
    {"TIB", 1ull << 40},
    {"TB", 1000000000000ull},
    {"P", 1ull << 50},
    {"PIB", 1ull << 50},
    {"PB", 1000000000000000ull},
    {"E", 1ull << 60},
    {"EIB", 1ull << 60},
    {"EB", 1000000000000000000ull},
};

std::string trimmed(std::string_view text) {
  size_t b = 0, e = text.size();
  while (b < e && isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  return std::string(text.substr(b, e - b));
}

Status out_of_range(std::string_view text) {
  return invalid_argument(
      "'%s' is out of range for a byte size (at most 18446744073709551615 bytes, just under "
      "16 EiB)",
      std::string(text).c_str());
}

// number x mul as a whole number of bytes: exact for a plain integer ("4096", "16EiB"), through a
// double otherwise ("1.5KiB", "1e9").
Result<uint64_t> scaled(std::string_view text, const std::string& number, uint64_t mul) {
  bool digits = !number.empty();
  for (char c : number) digits = digits && c >= '0' && c <= '9';
  if (digits) {
    errno = 0;
    const unsigned long long n = strtoull(number.c_str(), nullptr, 10);
    uint64_t v = 0;
    if (errno == ERANGE || __builtin_mul_overflow(static_cast<uint64_t>(n), mul, &v))
      return out_of_range(text);
    return v;
  }
  const double v = strtod(number.c_str(), nullptr) * static_cast<double>(mul);
  if (!std::isfinite(v) || v < 0 || v >= 0x1p64) return out_of_range(text);
  if (std::floor(v) != v) {
    return invalid_argument("'%s' is not a whole number of bytes", std::string(text).c_str());
  }
  return static_cast<uint64_t>(v);
}

}  // namespace

Result<uint64_t> parse_bytes(std::string_view text) {
  const std::string s = trimmed(text);
  char* end = nullptr;
  if (!s.empty() && s[0] != '-') strtod(s.c_str(), &end);
  if (s.empty() || s[0] == '-' || end == s.c_str()) {
    return invalid_argument("'%s' is not a byte size (%s)", std::string(text).c_str(), kByteExamples);
  }
  const std::string number = trimmed(s.substr(0, static_cast<size_t>(end - s.c_str())));
  std::string suffix = trimmed(end);
  for (auto& c : suffix) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  for (const Suffix& e : kSuffixes) {
    if (suffix == e.s) return scaled(text, number, e.m);
  }
  return invalid_argument(
      "'%s': unknown size suffix '%s' (use B, KiB, MiB, GiB, TiB, PiB, EiB, or KB, MB, GB, TB, PB, EB)",
      std::string(text).c_str(), trimmed(end).c_str());
}

Result<std::vector<std::string>> split_list(std::string_view text, const std::string& what, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t next = text.find(sep, pos);
    if (next == std::string_view::npos) next = text.size();
    std::string item = trimmed(text.substr(pos, next - pos));
    if (item.empty()) {
      if (text.find_first_not_of(" \t") == std::string_view::npos) {
        return invalid_argument("%s '%s': an empty list", what.c_str(), std::string(text).c_str());
      }
      return invalid_argument("%s '%s': item %zu is empty (a stray '%c': remove it)", what.c_str(),
                              std::string(text).c_str(), out.size() + 1, sep);
    }
    out.push_back(item);
    pos = next + 1;
  }
  return out;
}

Result<std::vector<uint64_t>> parse_bytes_list(std::string_view text, const std::string& what) {
  ZOE_ASSIGN_OR_RETURN(const std::vector<std::string> items, split_list(text, what));
  std::vector<uint64_t> out;
  for (const auto& item : items) {
    auto v = parse_bytes(item);
    if (!v.is_ok()) {
      return invalid_argument("%s '%s': item %zu: %s", what.c_str(), std::string(text).c_str(),
                              out.size() + 1, v.status().message().c_str());
    }
    out.push_back(v.value());
  }
  return out;
}

Result<std::vector<uint64_t>> parse_uint_list(std::string_view text, const std::string& what) {
  ZOE_ASSIGN_OR_RETURN(const std::vector<std::string> items, split_list(text, what));
  std::vector<uint64_t> out;
  for (const auto& item : items) {
    char* end = nullptr;
    errno = 0;
    unsigned long long v = strtoull(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || item[0] == '-' || v == 0 || errno == ERANGE) {
      return invalid_argument("%s '%s': item %zu, '%s', is not a positive integer", what.c_str(),
                              std::string(text).c_str(), out.size() + 1, item.c_str());
    }
    out.push_back(v);
  }
  return out;
}

std::string format_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 6 && v >= 15.99) v = 15.99;  // not "16.00 EiB", which is 2^64, beyond parse_bytes's range
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
