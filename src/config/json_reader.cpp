// Typed, path-aware reads of JSON objects and the unknown-key report for Config::parse.
#include "config/json_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

namespace zoe::config::detail {

namespace {

std::string fmt_double(double v) {
  char buf[64];
  snprintf(buf, sizeof buf, "%.17g", v);
  // Shortest form that reads back to the same double, like nlohmann's output.
  for (int prec = 1; prec <= 17; ++prec) {
    char s[64];
    snprintf(s, sizeof s, "%.*g", prec, v);
    if (strtod(s, nullptr) == v) return s;
  }
  return buf;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return out;
}

// Hugging Face's Trainer writes "auto" for values it fills in itself; say so instead of
// "not a number".
std::string auto_hint(const Json& v) {
  if (v.is_string() && v.get<std::string>() == "auto") {
    return " (\"auto\" is a placeholder the Hugging Face Trainer fills in; zoe needs the value)";
  }
  return "";
}

}  // namespace

bool Range::contains(double v) const {
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  if (hi_open ? !(v < hi) : !(v <= hi)) return false;
  return true;
}

std::string Range::describe() const {
  bool has_lo = lo > -1e307, has_hi = hi < 1e307;
  if (has_lo && has_hi) {
    return std::string(lo_open ? "(" : "[") + fmt_double(lo) + ", " + fmt_double(hi) + (hi_open ? ")" : "]");
  }
  if (has_lo) return std::string(lo_open ? "> " : ">= ") + fmt_double(lo);
  if (has_hi) return std::string(hi_open ? "< " : "<= ") + fmt_double(hi);
  return "any number";
}

std::string describe(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      bool same =
          tolower(static_cast<unsigned char>(a[i - 1])) == tolower(static_cast<unsigned char>(b[j - 1]));
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string join_path(std::string_view section, std::string_view key) {
  if (section.empty()) return std::string(key);
  std::string out(section);
  out += '.';
  out += key;
  return out;
}

Result<bool> to_bool(const Json& v, const std::string& path, ReadContext* ctx) {
  if (v.is_boolean()) return v.get<bool>();
  // DeepSpeed's NVMe tuner writes "true"/"false" strings. Their meaning is plain, so they are
  // read as the booleans they spell (never as a non-empty string = true), with a warning.
  if (v.is_string()) {
    std::string s = lower(v.get<std::string>());
    if (s == "true" || s == "false") {
      if (ctx) ctx->string_booleans.push_back(path);
      return s == "true";
    }
  }
  return invalid_argument("%s: %s is not a boolean (expected true or false)%s", path.c_str(),
                          describe(v).c_str(), auto_hint(v).c_str());
}

Result<int64_t> to_int(const Json& v, const std::string& path, int64_t min, int64_t max) {
  auto range_text = [&] {
    if (max == INT64_MAX) return "an integer >= " + std::to_string(min);
    return "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  };
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      return invalid_argument("%s: %s is out of range (expected %s)", path.c_str(), describe(v).c_str(),
                              range_text().c_str());
    }
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d) {
      return invalid_argument("%s: %s is not an integer (expected %s; 5e8-style numbers are fine when whole)",
                              path.c_str(), describe(v).c_str(), range_text().c_str());
    }
    // 2^63 itself is not representable as int64; compare before converting.
    if (d >= 9223372036854775808.0 || d < -9223372036854775808.0) {
      return invalid_argument("%s: %s is out of range (expected %s)", path.c_str(), describe(v).c_str(),
                              range_text().c_str());
    }
    x = static_cast<int64_t>(d);
  } else {
    return invalid_argument("%s: %s is not a number (expected %s)%s", path.c_str(), describe(v).c_str(),
                            range_text().c_str(), auto_hint(v).c_str());
  }
  if (x < min || x > max) {
    return invalid_argument("%s: %s is out of range (expected %s)", path.c_str(), describe(v).c_str(),
                            range_text().c_str());
  }
  return x;
}

Result<double> to_double(const Json& v, const std::string& path, const Range& range) {
  if (!v.is_number()) {
    return invalid_argument("%s: %s is not a number (expected %s)%s", path.c_str(), describe(v).c_str(),
                            range.describe().c_str(), auto_hint(v).c_str());
  }
  double d = v.get<double>();
  if (!std::isfinite(d) || !range.contains(d)) {
    return invalid_argument("%s: %s is out of range (expected %s)", path.c_str(), describe(v).c_str(),
                            range.describe().c_str());
  }
  return d;
}

const Json* JsonSection::find(std::string_view key) {
  std::string k(key);
  if (std::find(known_.begin(), known_.end(), k) == known_.end()) {
    known_.push_back(k);
    ctx_->known_anywhere.emplace_back(k, path_);
  }
  if (obj_ == nullptr) return nullptr;
  auto it = obj_->find(k);
  if (it == obj_->end() || it->is_null()) return nullptr;
  return &*it;
}

Status JsonSection::read(std::string_view key, bool* out) {
  const Json* v = find(key);
  if (!v) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(*out, to_bool(*v, key_path(key), ctx_));
  return Status::ok();
}

Status JsonSection::read(std::string_view key, int64_t* out, int64_t min, int64_t max) {
  const Json* v = find(key);
  if (!v) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(*out, to_int(*v, key_path(key), min, max));
  return Status::ok();
}

Status JsonSection::read(std::string_view key, int* out, int min, int max) {
  const Json* v = find(key);
  if (!v) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(int64_t x, to_int(*v, key_path(key), min, max));
  *out = static_cast<int>(x);
  return Status::ok();
}

Status JsonSection::read(std::string_view key, double* out, const Range& range) {
  const Json* v = find(key);
  if (!v) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(*out, to_double(*v, key_path(key), range));
  return Status::ok();
}

Status JsonSection::read_choice(std::string_view key, std::string* out,
                                const std::vector<std::string>& allowed, bool fold_case) {
  const Json* v = find(key);
  if (!v) return Status::ok();
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    for (const auto& a : allowed) {
      if (s == a || (fold_case && lower(s) == lower(a))) {
        *out = a;
        return Status::ok();
      }
    }
  }
  return invalid_argument("%s: %s is not one of %s%s", key_path(key).c_str(), describe(*v).c_str(),
                          list.c_str(), fold_case ? " (case-insensitive)" : "");
}

Status JsonSection::read_choice(std::string_view key, int* out, const std::vector<int>& allowed) {
  const Json* v = find(key);
  if (!v) return Status::ok();
  std::string list;
  for (int a : allowed) list += (list.empty() ? "" : ", ") + std::to_string(a);
  auto x = to_int(*v, key_path(key), INT64_MIN, INT64_MAX);
  if (x.is_ok()) {
    for (int a : allowed) {
      if (x.value() == a) {
        *out = a;
        return Status::ok();
      }
    }
  }
  return invalid_argument("%s: %s is not one of %s", key_path(key).c_str(), describe(*v).c_str(),
                          list.c_str());
}

Result<JsonSection> JsonSection::section(std::string_view key) {
  const Json* v = find(key);
  if (v && !v->is_object()) {
    return invalid_argument("%s: %s is not an object (expected {...})", key_path(key).c_str(),
                            describe(*v).c_str());
  }
  return JsonSection(v, key_path(key), ctx_);
}

void JsonSection::finish() {
  if (obj_ == nullptr) return;
  for (auto it = obj_->begin(); it != obj_->end(); ++it) {
    if (std::find(known_.begin(), known_.end(), it.key()) == known_.end()) {
      ctx_->unknown.push_back({path_, it.key(), known_});
    }
  }
}

std::string unknown_keys_message(const ReadContext& ctx) {
  std::string msg;
  for (const auto& u : ctx.unknown) {
    if (!msg.empty()) msg += "; ";
    msg += "unknown key '" + join_path(u.section, u.key) + "'";
    // The closest sibling within a small edit distance: a typo.
    std::string best;
    size_t best_d = SIZE_MAX;
    for (const auto& k : u.known) {
      size_t d = edit_distance(u.key, k);
      if (d < best_d) {
        best_d = d;
        best = k;
      }
    }
    size_t limit = u.key.size() <= 6 ? 1 : u.key.size() <= 12 ? 2 : 3;
    if (!best.empty() && best_d <= limit) {
      msg += " (did you mean '" + best + "'?)";
      continue;
    }
    // A key of another section put at the wrong level.
    std::string elsewhere;
    for (const auto& [k, section] : ctx.known_anywhere) {
      if (k == u.key && section != u.section) {
        elsewhere = section.empty() ? "the top level" : "'" + section + "'";
        break;
      }
    }
    if (!elsewhere.empty()) {
      msg += " (it belongs under " + elsewhere + ")";
    } else if (u.section.empty()) {
      msg += " (not a DeepSpeed key zoe knows; zoe's own keys go under \"zoe\")";
    }
  }
  return msg;
}

}  // namespace zoe::config::detail
