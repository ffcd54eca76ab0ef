// The config's keys as one declarative table: each row names a JSON path, the Config member it
// fills, its default, what values are allowed, its older spellings and what zoe does with it.
// Config::parse, Config::to_json and the unimplemented-key policy are all driven by this table.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "config/config.h"
#include "config/json_reader.h"

namespace zoe::config::detail {

// The kind of value a key holds: how it is read, compared and written.
enum class Kind : uint8_t {
  kBool,          // true/false ("true"/"false" strings too, with a warning)
  kInt,           // an integer in [min, max] (whole doubles such as 5e8 too)
  kIntChoice,     // an integer from `choices`
  kDouble,        // a number in `range` (fp32, the default: also a normal float or 0)
  kChoice,        // a string from `choices` (fold_case: any case, stored as listed)
  kDevice,        // an Offload by name: "none", "cpu", "nvme"
  kBytes,         // a byte count: an integer >= 0 or a "256MiB"-style string
  kPaths,         // a directory or a list of distinct directories (not probed: see paths.h)
  kPair,          // [a, b], each a number in `range`
  kAny,           // anything; contents unchecked
  kFeatureBlock,  // {"enabled": bool, ...}: only "enabled" is read, the rest unchecked
};

// What zoe does with a key that is given.
enum class Disposition : uint8_t {
  kImplemented,  // read into its member, or by a rule of config_rules.cpp
  kWarn,         // recognised, no effect yet: listed in Config::unimplemented (one warning)
  kRefuse,       // an error (unsupported) when the value has an effect: it would change training
  kIgnore,       // harmless (logging, profiling): accepted, contents unchecked
};

// Two doubles read as one key (optimizer.params.betas).
struct DoublePair {
  double& first;
  double& second;
};

// Where a key's value lives in Config; monostate: nowhere (a rule reads it, or it has no effect).
using Member = std::variant<std::monostate, bool& (*)(Config&), int& (*)(Config&), int64_t& (*)(Config&),
                            double& (*)(Config&), std::string& (*)(Config&), Offload& (*)(Config&),
                            std::vector<std::string>& (*)(Config&), DoublePair (*)(Config&)>;

// One key. Built by the helpers below and refined by the chained setters, e.g.
//   integer("aio.intra_op_parallelism", ZOE_MEMBER(aio.intra_op_parallelism), 1, 1, 4096)
//       .alias("aio.thread_count")
struct Field {
  std::string path;  // JSON path of the key, e.g. "zero_optimization.offload_param.device"
  Kind kind = Kind::kAny;
  Member member;
  // The default as JSON. For a key with a member it equals what Config{} holds (a test checks);
  // for a warn/refuse key it is the value without effect.
  Json default_value;
  int64_t min = INT64_MIN, max = INT64_MAX;  // kInt
  Range range;                               // kDouble, kPair
  // kDouble, kPair: computed in fp32 (every number zoe reads is: Adam's hyperparameters, the loss
  // scale, clipping, the ratios), so the value must be a finite float and, where nonzero, a normal
  // one; as_fp64() for a key computed in double only.
  bool fp32 = true;
  std::vector<Json> choices;  // kIntChoice, kChoice, kDevice
  bool fold_case = false;     // kChoice
  // kChoice: a value that is no string is "not a string (expected A or B)", not "not one of".
  bool string_type_message = false;
  // kChoice: values refused with their reason ("zoe.master_weights: \"fp16\" is refused: ...").
  std::vector<std::pair<std::string, std::string>> refused_values;
  std::string expected;  // kPair: the shape, as the error says it ("[beta1, beta2]")
  // Older spellings (full JSON paths). The value is the first spelling given; two given with
  // different values is an error.
  std::vector<std::string> aliases;
  Disposition disposition = Disposition::kImplemented;
  std::string why;  // kWarn, kRefuse: said in the note or the error
  // kWarn, kRefuse: whether a given value has an effect; null: it differs from default_value
  // (kAny: any value given has).
  bool (*has_effect)(const Json& value) = nullptr;
  // to_json writes the key when this holds (null: always); keys without a member never.
  bool (*written)(const Config&) = nullptr;
  // A null given reads as the default (DeepSpeed's None, e.g. number_checkpoints).
  bool null_is_default = false;
  // zoe sizes it from the host share when the config leaves it out (zero/placement.cpp): the
  // default is not the value used, and Config::to_json(kGivenSizes) writes it only when given.
  bool sized_by_zoe = false;

  Field&& alias(std::string old_path) && {
    aliases.push_back(std::move(old_path));
    return std::move(*this);
  }
  Field&& warn(std::string reason = "", bool (*effect)(const Json&) = nullptr) && {
    disposition = Disposition::kWarn;
    why = std::move(reason);
    has_effect = effect;
    return std::move(*this);
  }
  Field&& refuse(std::string reason) && {
    disposition = Disposition::kRefuse;
    why = std::move(reason);
    return std::move(*this);
  }
  Field&& refuse_value(std::string value, std::string reason) && {
    refused_values.emplace_back(std::move(value), std::move(reason));
    return std::move(*this);
  }
  Field&& ignore() && {
    disposition = Disposition::kIgnore;
    return std::move(*this);
  }
  Field&& as_fp64() && {
    fp32 = false;
    return std::move(*this);
  }
  Field&& null_default() && {
    null_is_default = true;
    return std::move(*this);
  }
  Field&& sized() && {
    sized_by_zoe = true;
    return std::move(*this);
  }
  Field&& written_if(bool (*when)(const Config&)) && {
    written = when;
    return std::move(*this);
  }
};

// The accessor of a Config member, as a Member: ZOE_MEMBER(zero.offload_param.pin_memory).
#define ZOE_MEMBER(expr) (+[](::zoe::config::Config & c) -> auto& { return c.expr; })

// Row builders, one per kind.
Field boolean(std::string path, Member m, bool def);
Field integer(std::string path, Member m, int64_t def, int64_t min, int64_t max = INT64_MAX);
Field int_choice(std::string path, Member m, int def, std::vector<int> allowed);
Field number(std::string path, Member m, double def, Range range);
Field choice(std::string path, Member m, std::string def, std::vector<std::string> allowed,
             bool fold_case = false);
Field device(std::string path, Member m);
Field bytes(std::string path, Member m);
Field paths(std::string path, Member m);
Field pair(std::string path, Member m, double first, double second, Range range, std::string expected);
Field any(std::string path);
Field feature_block(std::string path);

// Every key zoe knows, in reading order (which is also to_json's order).
const std::vector<Field>& config_fields();

// The field at `path` (its canonical spelling), or null.
const Field* find_field(const std::string& path);

// The value given for `f` at `path` (the spelling used), checked and normalised: a bool, an
// integer, a double, the allowed spelling of a choice, a list of directories, [a, b], anything
// (kAny); kFeatureBlock: its "enabled" as a bool (false when absent). Errors name `path`, the
// value and what is allowed.
Result<Json> read_value(const Field& f, const Json& given, const std::string& path, ReadContext* ctx);
// Stores a value of read_value into f's member (no member: nothing).
void store_value(const Field& f, const Json& v, Config* c);
// f's member as to_json writes it (read_value's form, but a single directory as a string and no
// directory as null); null for a field without a member.
Json load_value(const Field& f, const Config& c);

}  // namespace zoe::config::detail
