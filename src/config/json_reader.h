// JsonSection: typed reads of one JSON object for Config::parse, with errors that name the key's
// JSON path, the value given and what is allowed, and unknown keys collected with suggestions.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zoe/status.h"

namespace zoe::config::detail {

using Json = nlohmann::json;

// Shared by every section of one parse.
struct ReadContext {
  struct Unknown {
    std::string section;  // JSON path of the object holding it ("" = top level)
    std::string key;
    std::vector<std::string> known;  // the keys that object does know, for "did you mean"
  };
  std::vector<Unknown> unknown;
  // Every key some section knows, with that section's path: for "it belongs under ...".
  std::vector<std::pair<std::string, std::string>> known_anywhere;
  // Paths of boolean keys written as the strings "true"/"false" (read as such, with a warning).
  std::vector<std::string> string_booleans;
};

// An inclusive-or-open numeric range, printed as "[0, 1)", ">= 1", "> 0".
struct Range {
  double lo = -1e308, hi = 1e308;
  bool lo_open = false, hi_open = false;
  static Range at_least(double lo) { return {lo, 1e308, false, false}; }
  static Range above(double lo) { return {lo, 1e308, true, false}; }
  bool contains(double v) const;
  std::string describe() const;
};

// The value as written, shortened: 1.5, "gpu", true, [1, 2], {...}.
std::string describe(const Json& v);
// Levenshtein distance, case-insensitive.
size_t edit_distance(std::string_view a, std::string_view b);
// "a.b" or "b" when a is empty.
std::string join_path(std::string_view section, std::string_view key);

// Conversions of one JSON value at `path` (also used for array elements "betas[0]").
Result<bool> to_bool(const Json& v, const std::string& path, ReadContext* ctx);
// Integers may be written as integral doubles (5e8); 1.5 is an error.
Result<int64_t> to_int(const Json& v, const std::string& path, int64_t min, int64_t max);
Result<double> to_double(const Json& v, const std::string& path, const Range& range);

// One JSON object (or an absent one: every read leaves its default). Each read marks its key as
// known; finish() records the keys nobody read as unknown.
class JsonSection {
 public:
  JsonSection(const Json* obj, std::string path, ReadContext* ctx)
      : obj_(obj), path_(std::move(path)), ctx_(ctx) {}

  const std::string& path() const { return path_; }
  std::string key_path(std::string_view key) const { return join_path(path_, key); }
  // Marks `key` known; the value, or null when the key is absent or JSON null.
  const Json* find(std::string_view key);
  bool has(std::string_view key) { return find(key) != nullptr; }

  // Each leaves *out unchanged when the key is absent or null.
  Status read(std::string_view key, bool* out);
  Status read(std::string_view key, int64_t* out, int64_t min, int64_t max = INT64_MAX);
  Status read(std::string_view key, int* out, int min, int max);
  Status read(std::string_view key, double* out, const Range& range);
  // A string from `allowed`; stores the allowed spelling (so fold_case canonicalises "adamw").
  Status read_choice(std::string_view key, std::string* out, const std::vector<std::string>& allowed,
                     bool fold_case);
  // An integer from `allowed` ("4 is not one of 0, 1, 2, 3").
  Status read_choice(std::string_view key, int* out, const std::vector<int>& allowed);

  // The sub-object at key: absent/null gives an empty section; anything but an object is an error.
  Result<JsonSection> section(std::string_view key);
  // A known key whose contents are not checked (keys without effect on training).
  void accept(std::string_view key) { (void)find(key); }
  // Records the keys of this object that no read asked for.
  void finish();

 private:
  const Json* obj_;
  std::string path_;
  ReadContext* ctx_;
  std::vector<std::string> known_;
};

// The error message for the unknown keys in ctx (empty when there are none).
std::string unknown_keys_message(const ReadContext& ctx);

}  // namespace zoe::config::detail
