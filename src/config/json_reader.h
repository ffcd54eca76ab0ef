// The validating reader of external JSON bytes (config files, and any other JSON zoe reads from
// outside: size cap, nesting limit, NUL bytes, number overflow, duplicate keys, all as Status
// errors), and JsonSection: typed reads of one JSON object for Config::parse, with errors that
// name the key's JSON path, the value given and what is allowed, and unknown keys collected with
// suggestions.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zoe/status.h"

namespace zoe::config {

// Limits of parse_json_checked. The defaults suit configs and manifests: far above any real
// file, far below what would exhaust memory or the stack.
struct JsonLimits {
  size_t max_bytes = size_t{16} << 20;  // a larger text is refused before parsing
  int max_depth = 64;                   // nesting of arrays and objects
  bool allow_comments = true;           // // and /* */ (DeepSpeed configs carry them)
};

// Parses bytes that came from outside zoe. Never throws; every failure is an invalid-argument
// Status that starts with `what` (e.g. "config file /x/ds.json") and says where: a NUL byte
// (offset, line, column), a text over limits.max_bytes, nesting deeper than limits.max_depth (the
// JSON path), a number outside the range of a double such as 1e400 (the JSON path), a syntax
// error (line and column), a key given twice in one object (the JSON path), a number whose text is not zero
// but which a double reads as 0 such as 1e-400 (the JSON path).
Result<nlohmann::json> parse_json_checked(std::string_view bytes, const std::string& what,
                                          const JsonLimits& limits = {});

// The whole content of the regular file `path`, refused (never read) when it holds more than
// max_bytes; anything but a regular file (a FIFO, /dev/zero, a directory) is refused without
// blocking: zoe/files.h's read_input_file. Errors name `what` ("config file"), the path, and the
// size and the cap or what the path is.
Result<std::string> read_file_capped(const std::string& path, size_t max_bytes,
                                     const std::string& what = "file");

}  // namespace zoe::config

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
// fp32: the value is used as a float (Adam's hyperparameters): refused when the float it becomes
// differs in kind (a non-zero value that rounds to 0, a finite one that rounds to infinity).
Result<double> to_double(const Json& v, const std::string& path, const Range& range, bool fp32 = false);

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
  // Marks `key` known; whether it is given as JSON null (which find() does not tell from absent).
  bool is_null(std::string_view key);
  bool has(std::string_view key) { return find(key) != nullptr; }

  // Each leaves *out unchanged when the key is absent or null.
  Status read(std::string_view key, bool* out);
  Status read(std::string_view key, int64_t* out, int64_t min, int64_t max = INT64_MAX);
  Status read(std::string_view key, int* out, int min, int max);
  Status read(std::string_view key, double* out, const Range& range, bool fp32 = false);
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
