// The rules between config keys, applied after the table has read every key: the batch triple,
// defaults that depend on other keys, deprecated spellings that set other keys, and
// contradictions (offload below the stage it needs, fp16 with bf16, nvme without a path).
#pragma once

#include <map>
#include <set>
#include <string>

#include "config/config.h"
#include "config/json_reader.h"

namespace zoe::config::detail {

// What the file said, for the rules: which keys it gave and the values of those keys.
struct GivenKeys {
  // JSON paths present and not null: every spelling given (aliases too), the canonical path of
  // a field given under any spelling, and the sections given.
  std::set<std::string> present;
  // Canonical path -> the value read (read_value's form), for every field given.
  std::map<std::string, Json> values;

  bool has(const std::string& path) const { return present.count(path) != 0; }
  // The value of a field given, or null when it was not.
  const Json* value(const std::string& path) const {
    auto it = values.find(path);
    return it == values.end() ? nullptr : &it->second;
  }
};

// Applies the rules to `c` (read by the table) in order; the first broken one is the error,
// naming the keys involved and their values.
Status apply_rules(const GivenKeys& given, int world_size, Config* c);

}  // namespace zoe::config::detail
