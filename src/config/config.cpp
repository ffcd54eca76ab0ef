// Config::parse, load and to_json, driven by the table of config_table.cpp: each row is read from
// its JSON path (or an older spelling), checked, stored, noted or refused by its disposition; then
// the rules of config_rules.cpp; to_json writes the rows with a member back in table order.
#include "config/config.h"

#include <map>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "config/config_rules.h"
#include "config/config_table.h"
#include "config/json_reader.h"
#include "core/log.h"

namespace zoe::config {

using detail::Field;
using detail::Json;
using detail::JsonSection;

bool Config::operator==(const Config& o) const {
  return train_batch_size == o.train_batch_size &&
         train_micro_batch_size_per_gpu == o.train_micro_batch_size_per_gpu &&
         gradient_accumulation_steps == o.gradient_accumulation_steps &&
         gradient_clipping == o.gradient_clipping && fp16 == o.fp16 && bf16 == o.bf16 && zero == o.zero &&
         aio == o.aio && optimizer == o.optimizer && scheduler == o.scheduler && zoe == o.zoe &&
         activation_checkpointing == o.activation_checkpointing;
}

namespace {

// "a.b.c" -> {"a.b", "c"}; "c" -> {"", "c"}.
std::pair<std::string, std::string> split_path(const std::string& path) {
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos) return {"", path};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

// One parse: the file's objects as JsonSections (created as the table reaches them, so each
// object's known keys are in table order), what was given, and the notes of warn rows.
class TableReader {
 public:
  explicit TableReader(const Json* root) { nodes_.emplace("", Node{JsonSection(root, "", &ctx_), {}}); }
  TableReader(const TableReader&) = delete;
  TableReader& operator=(const TableReader&) = delete;

  // Reads row `f` into `c`.
  Status read(const Field& f, Config* c) {
    std::optional<Json> value;
    std::string value_path;
    std::vector<std::string> spellings{f.path};
    spellings.insert(spellings.end(), f.aliases.begin(), f.aliases.end());
    for (const std::string& spelling : spellings) {
      auto [parent, key] = split_path(spelling);
      ZOE_ASSIGN_OR_RETURN(JsonSection * s, section(parent));
      if (s->is_null(key)) ZOE_RETURN_IF_ERROR(null_given(f, spelling));
      const Json* raw = s->find(key);
      if (!raw) continue;
      given_.present.insert(spelling);
      ZOE_ASSIGN_OR_RETURN(Json v, detail::read_value(f, *raw, spelling, &ctx_));
      if (!value) {
        value = std::move(v);
        value_path = spelling;
      } else if (v != *value) {
        return invalid_argument("%s and %s (its older name) are both given, with different values",
                                value_path.c_str(), spelling.c_str());
      }
    }
    if (!value) return Status::ok();
    given_.present.insert(f.path);
    const bool effect =
        f.has_effect ? f.has_effect(*value) : f.kind == detail::Kind::kAny || *value != f.default_value;
    switch (f.disposition) {
      case detail::Disposition::kImplemented:
        detail::store_value(f, *value, c);
        break;
      case detail::Disposition::kWarn:
        detail::store_value(f, *value, c);
        if (effect) note(f, value_path, *value);
        break;
      case detail::Disposition::kRefuse:
        if (effect) {
          const std::string at = f.kind == detail::Kind::kFeatureBlock ? value_path + ".enabled" : value_path;
          return unsupported("%s: %s is not supported by zoe (%s)", at.c_str(),
                             detail::describe(*value).c_str(), f.why.c_str());
        }
        break;
      case detail::Disposition::kIgnore:
        break;
    }
    given_.values[f.path] = std::move(*value);
    return Status::ok();
  }

  // Records the keys no row read, objects before the object holding them.
  void finish(const std::string& path = "") {
    Node& n = nodes_.at(path);
    for (const auto& child : n.children) finish(child);
    n.section.finish();
  }

  const detail::ReadContext& context() const { return ctx_; }
  const detail::GivenKeys& given() const { return given_; }
  std::vector<std::string> take_unimplemented() { return std::move(unimplemented_); }

 private:
  struct Node {
    JsonSection section;
    std::vector<std::string> children;  // paths of the sub-objects, in the order first reached
  };

  // The object at `path`, created with its parents on first use (absent: an empty section).
  Result<JsonSection*> section(const std::string& path) {
    auto it = nodes_.find(path);
    if (it != nodes_.end()) return &it->second.section;
    auto [parent_path, key] = split_path(path);
    ZOE_ASSIGN_OR_RETURN(JsonSection * parent, section(parent_path));
    if (parent->find(key)) given_.present.insert(path);
    ZOE_ASSIGN_OR_RETURN(JsonSection s, parent->section(key));
    nodes_.at(parent_path).children.push_back(path);
    return &nodes_.emplace(path, Node{std::move(s), {}}).first->second.section;
  }

  // A key given as null. DeepSpeed gives null no meaning for zoe's keys but "none" where that is
  // the default (nvme_path; its Optional sections too, which JsonSection reads as absent), and
  // reading it as the default would change the user's value without a word: an error, except
  // there and for keys without effect whose contents are never checked.
  static Status null_given(const Field& f, const std::string& path) {
    if (f.disposition == detail::Disposition::kIgnore || f.kind == detail::Kind::kAny ||
        f.default_value.is_null() || f.null_is_default) {
      return Status::ok();
    }
    const std::string def = detail::describe(f.default_value);
    return invalid_argument(
        "%s: null is not a value zoe reads (give a value, or leave the key out for its "
        "default %s)",
        path.c_str(), def.c_str());
  }

  // A warn row with an effect: "path" or "path (why)"; kAny rows also say what was given.
  void note(const Field& f, const std::string& path, const Json& v) {
    std::string why = f.why;
    if (f.kind == detail::Kind::kAny) why += (why.empty() ? "given " : "; given ") + detail::describe(v);
    unimplemented_.push_back(why.empty() ? path : path + " (" + why + ")");
  }

  detail::ReadContext ctx_;  // before nodes_: every section points at it
  std::map<std::string, Node> nodes_;
  detail::GivenKeys given_;
  std::vector<std::string> unimplemented_;
};

std::string joined(const std::vector<std::string>& items) {
  std::string list;
  for (const auto& k : items) list += (list.empty() ? "" : ", ") + k;
  return list;
}

}  // namespace

Result<Config> Config::parse(const std::string& json_text, int world_size) {
  if (world_size < 1) return invalid_argument("world size %d: expected >= 1", world_size);
  ZOE_ASSIGN_OR_RETURN(Json j, parse_json_checked(json_text, "config"));
  if (!j.is_object()) {
    return invalid_argument("the config is %s, not a JSON object ({...})", detail::describe(j).c_str());
  }
  Config c;
  TableReader reader(&j);
  for (const Field& f : detail::config_fields()) ZOE_RETURN_IF_ERROR(reader.read(f, &c));
  reader.finish();
  const std::string unknown = detail::unknown_keys_message(reader.context());
  if (!unknown.empty()) return invalid_argument("%s", unknown.c_str());
  ZOE_RETURN_IF_ERROR(detail::apply_rules(reader.given(), world_size, &c));

  if (!reader.context().string_booleans.empty()) {
    ZOE_LOG_WARN(
        "config: booleans written as strings, read as the booleans they spell: %s (write true/false "
        "without quotes; DeepSpeed's runtime may read \"false\" as true)",
        joined(reader.context().string_booleans).c_str());
  }
  c.unimplemented = reader.take_unimplemented();
  c.given_keys = reader.given().present;
  if (!c.unimplemented.empty()) {
    ZOE_LOG_WARN("config: DeepSpeed settings zoe does not implement (ignored): %s",
                 joined(c.unimplemented).c_str());
  }
  return c;
}

Result<Config> Config::load(const std::string& path, int world_size) {
  ZOE_ASSIGN_OR_RETURN(std::string text, read_file_capped(path, JsonLimits{}.max_bytes, "config file"));
  auto c = parse(text, world_size);
  if (!c.is_ok()) return c.status().with_context("reading config file " + path);
  return c;
}

std::string Config::to_json(JsonKeys keys) const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const Field& f : detail::config_fields()) {
    if (std::holds_alternative<std::monostate>(f.member)) continue;
    if (f.written && !f.written(*this)) continue;
    if (keys == JsonKeys::kGivenSizes && f.sized_by_zoe && !given(f.path)) continue;
    Json v = detail::load_value(f, *this);
    if (v.is_null()) continue;
    nlohmann::ordered_json* node = &j;
    std::string rest = f.path;
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
      node = &(*node)[rest.substr(0, dot)];
    }
    (*node)[rest] = nlohmann::ordered_json(v);
  }
  return j.dump(2) + "\n";
}

}  // namespace zoe::config
