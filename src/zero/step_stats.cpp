// zoe/step_stats.h: the field list's documentation and JSON form.
#include "zoe/step_stats.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <type_traits>

namespace zoe {

const char* step_stats_doc(const std::string& name) {
#define ZOE_STEP_STATS_DOC_(type, field, init, doc) \
  if (name == #field) return doc;
  ZOE_STEP_STATS_FIELDS(ZOE_STEP_STATS_DOC_)
#undef ZOE_STEP_STATS_DOC_
  return "";
}

namespace {

void append_value(std::string* out, bool v) { *out += v ? "true" : "false"; }
void append_value(std::string* out, int64_t v) { *out += std::to_string(v); }
void append_value(std::string* out, uint64_t v) { *out += std::to_string(v); }
void append_value(std::string* out, double v) {
  if (!std::isfinite(v)) {
    *out += "null";
    return;
  }
  char b[32];
  snprintf(b, sizeof(b), "%.17g", v);
  *out += b;
}
void append_value(std::string* out, const TierBytesArray& v) {
  *out += "{\"device\": " + std::to_string(v[0]) + ", \"host\": " + std::to_string(v[1]) +
          ", \"nvme\": " + std::to_string(v[2]) + "}";
}

}  // namespace

std::string step_stats_json(const StepStats& s) {
  std::string out = "{";
  bool first = true;
  for_each_field(s, [&](const char* name, const auto& value) {
    out += first ? "\"" : ", \"";
    first = false;
    out += name;
    out += "\": ";
    append_value(&out, value);
  });
  return out + "}";
}

}  // namespace zoe
