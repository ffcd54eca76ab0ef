// The validating JSON reader, typed path-aware reads of JSON objects, and the unknown-key report
// for Config::parse.
#include "config/json_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "core/units.h"
#include "zoe/files.h"

namespace zoe::config {

namespace {

using Json = nlohmann::json;

// Thrown from the parser's callback to stop at the first nesting level over the limit.
struct TooDeep {};

// Where the parser is: one frame per open object or array.
struct Frame {
  bool is_object;
  std::set<std::string> keys;
  std::string key;   // objects: the key being read
  size_t index = 0;  // arrays: the element being read
};

std::string frames_path(const std::vector<Frame>& stack) {
  std::string path;
  for (const auto& f : stack) {
    if (f.is_object) {
      if (f.key.empty() && f.keys.empty()) continue;  // no key read yet: the object itself
      if (!path.empty()) path += '.';
      path += f.key;
    } else {
      path += '[';
      path += std::to_string(f.index);
      path += ']';
    }
  }
  if (path.empty()) return "the top level";
  if (path.size() > 120) path = path.substr(0, 117) + "...";
  return path;
}

// A number whose text is not zero but which a double reads as 0 (1e-400): the reader would
// silently change its meaning. Whether the text is zero is a question of its digits before the
// exponent.
bool underflows_to_zero(double value, const std::string& text) {
  if (value != 0) return false;
  for (char ch : text) {
    if (ch == 'e' || ch == 'E') break;
    if (ch >= '1' && ch <= '9') return true;
  }
  return false;
}

// A second pass over a text the DOM parser accepted, with the number texts it does not keep:
// finds the first number that underflows to 0, and where.
struct UnderflowFinder {
  std::vector<Frame> stack;
  std::string path, text;  // the first one found ("" = none)

  void value() {
    if (!stack.empty() && !stack.back().is_object) ++stack.back().index;
  }
  bool null() { return value(), true; }
  bool boolean(bool) { return value(), true; }
  bool number_integer(Json::number_integer_t) { return value(), true; }
  bool number_unsigned(Json::number_unsigned_t) { return value(), true; }
  bool number_float(Json::number_float_t v, const std::string& s) {
    if (text.empty() && underflows_to_zero(v, s)) {
      path = frames_path(stack);
      text = s;
    }
    return value(), true;
  }
  bool string(std::string&) { return value(), true; }
  bool binary(Json::binary_t&) { return value(), true; }
  bool start_object(size_t) { return stack.push_back({true, {}, {}, 0}), true; }
  bool start_array(size_t) { return stack.push_back({false, {}, {}, 0}), true; }
  bool end_object() { return end(); }
  bool end_array() { return end(); }
  bool end() {
    if (!stack.empty()) stack.pop_back();
    return value(), true;
  }
  bool key(std::string& k) {
    if (!stack.empty()) {
      stack.back().key = k;
      stack.back().keys.insert(k);
    }
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
};

}  // namespace

Result<nlohmann::json> parse_json_checked(std::string_view bytes, const std::string& what,
                                          const JsonLimits& limits) {
  if (bytes.size() > limits.max_bytes) {
    return invalid_argument("%s: %zu bytes (%s) is more than the %zu bytes (%s) a JSON text may have here",
                            what.c_str(), bytes.size(), format_bytes(bytes.size()).c_str(), limits.max_bytes,
                            format_bytes(limits.max_bytes).c_str());
  }
  if (size_t nul = bytes.find('\0'); nul != std::string_view::npos) {
    const size_t line = 1 + static_cast<size_t>(std::count(bytes.begin(), bytes.begin() + nul, '\n'));
    const size_t line_start = bytes.rfind('\n', nul == 0 ? 0 : nul - 1);
    const size_t column = line_start == std::string_view::npos || nul == 0 ? nul + 1 : nul - line_start;
    return invalid_argument(
        "%s: a NUL byte at offset %zu (line %zu, column %zu): JSON text cannot contain one (a binary or "
        "truncated file?)",
        what.c_str(), nul, line, column);
  }
  std::vector<Frame> stack;
  std::string duplicate;
  auto cb = [&](int /*depth*/, Json::parse_event_t ev, Json& parsed) -> bool {
    switch (ev) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (static_cast<int>(stack.size()) >= limits.max_depth) throw TooDeep{};
        stack.push_back({ev == Json::parse_event_t::object_start, {}, {}, 0});
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        if (!stack.empty() && !stack.back().is_object) ++stack.back().index;
        break;
      case Json::parse_event_t::key: {
        if (stack.empty()) break;
        Frame& f = stack.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second && duplicate.empty()) duplicate = frames_path(stack);
        break;
      }
      case Json::parse_event_t::value:
        if (!stack.empty() && !stack.back().is_object) ++stack.back().index;
        break;
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(bytes.begin(), bytes.end(), cb, /*allow_exceptions=*/true, limits.allow_comments);
  } catch (const TooDeep&) {
    return invalid_argument("%s: arrays and objects nested more than %d deep at %s (the limit is %d)",
                            what.c_str(), limits.max_depth, frames_path(stack).c_str(), limits.max_depth);
  } catch (const Json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 3, column 5: ..." without the tag.
    std::string msg = e.what();
    auto pos = msg.find("] ");
    if (pos != std::string::npos) msg = msg.substr(pos + 2);
    return invalid_argument("%s: invalid JSON: %s", what.c_str(), msg.c_str());
  } catch (const Json::out_of_range& e) {
    // 406: a number beyond a double (1e400); the callback's frames say where.
    std::string msg = e.what();
    auto pos = msg.find("] ");
    if (pos != std::string::npos) msg = msg.substr(pos + 2);
    return invalid_argument("%s: invalid JSON at %s: %s (numbers must lie within +-%g)", what.c_str(),
                            frames_path(stack).c_str(), msg.c_str(), DBL_MAX);
  } catch (const std::exception& e) {
    return invalid_argument("%s: invalid JSON at %s: %s", what.c_str(), frames_path(stack).c_str(), e.what());
  }
  if (!duplicate.empty()) {
    return invalid_argument("%s: duplicate key '%s' (a JSON reader would silently keep only one of them)",
                            what.c_str(), duplicate.c_str());
  }
  UnderflowFinder under;
  Json::sax_parse(bytes.begin(), bytes.end(), &under, Json::input_format_t::json, true,
                  limits.allow_comments);
  if (!under.text.empty()) {
    return invalid_argument(
        "%s: invalid JSON at %s: %s is too small for a double and would be read as 0 (write 0, or a number "
        "of magnitude >= %g)",
        what.c_str(), under.path.c_str(), under.text.c_str(), DBL_MIN);
  }
  return j;
}

Result<std::string> read_file_capped(const std::string& path, size_t max_bytes, const std::string& what) {
  return read_input_file(path, what, max_bytes);
}

}  // namespace zoe::config

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

Result<double> to_double(const Json& v, const std::string& path, const Range& range, bool fp32) {
  if (!v.is_number()) {
    return invalid_argument("%s: %s is not a number (expected %s)%s", path.c_str(), describe(v).c_str(),
                            range.describe().c_str(), auto_hint(v).c_str());
  }
  double d = v.get<double>();
  if (!std::isfinite(d) || !range.contains(d)) {
    return invalid_argument("%s: %s is out of range (expected %s)", path.c_str(), describe(v).c_str(),
                            range.describe().c_str());
  }
  if (fp32) {
    const auto f = static_cast<float>(d);
    if (std::isinf(f)) {
      return invalid_argument("%s: %s is out of range (zoe computes it in fp32: expected a magnitude <= %g)",
                              path.c_str(), describe(v).c_str(), static_cast<double>(FLT_MAX));
    }
    if (d != 0 && std::fabs(d) < FLT_MIN) {
      return invalid_argument(
          "%s: %s is out of range (zoe computes it in fp32, where it would be denormal or 0: expected 0 or a "
          "magnitude >= %g)",
          path.c_str(), describe(v).c_str(), static_cast<double>(FLT_MIN));
    }
    if (!range.contains(static_cast<double>(f))) {
      return invalid_argument("%s: %s is out of range (expected %s; in fp32, as zoe computes it, it is %.9g)",
                              path.c_str(), describe(v).c_str(), range.describe().c_str(),
                              static_cast<double>(f));
    }
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

bool JsonSection::is_null(std::string_view key) {
  (void)find(key);
  if (obj_ == nullptr) return false;
  auto it = obj_->find(std::string(key));
  return it != obj_->end() && it->is_null();
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

Status JsonSection::read(std::string_view key, double* out, const Range& range, bool fp32) {
  const Json* v = find(key);
  if (!v) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(*out, to_double(*v, key_path(key), range, fp32));
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
