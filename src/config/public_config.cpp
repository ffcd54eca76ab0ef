// zoe::Config (include/zoe/config.h) over config::Config: loading and parsing, the typed setters
// (each an edit of the config's JSON parsed back, with the same validation as a file), the
// getters, any key by its JSON path (get/set), and the Builder. Config::optimizer_swap_buffer_bytes()
// is the engine's (src/zero/public_api.cpp): it asks the placement's sizing rules.
#include "config/public_config.h"

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/paths.h"
#include "zoe/activations.h"

namespace zoe {

using nlohmann::json;

namespace {

void set_precision_json(json* j, ComputeDType d) {
  (*j)["bf16"]["enabled"] = d == ComputeDType::kBF16;
  (*j)["fp16"]["enabled"] = d == ComputeDType::kF16;
}

json offload_block(Offload where, const std::vector<std::string>& paths) {
  json b = {{"device", offload_name(where)}};
  if (where == Offload::kNvme) b["nvme_path"] = paths;
  return b;
}
}  // namespace

Config ConfigAccess::wrap(config::Config cfg, int world_size) {
  Config c;
  c.impl_->cfg = std::move(cfg);
  c.impl_->world_size = world_size;
  return c;
}

// The config of an empty file ("{}"): every key at its default, as parse() resolves them (the
// parser's defaults, not the raw struct's, so a setter's re-check passes).
Config::Config() : impl_(std::make_unique<Impl>()) {
  auto c = config::Config::parse("{}", 1);
  if (c.is_ok()) impl_->cfg = std::move(c).value();
}
Config::Config(const Config& o) : impl_(std::make_unique<Impl>(*o.impl_)) {}
Config::Config(Config&& o) noexcept : impl_(std::move(o.impl_)) {}
Config& Config::operator=(const Config& o) {
  if (this != &o) impl_ = std::make_unique<Impl>(*o.impl_);
  return *this;
}
Config& Config::operator=(Config&& o) noexcept {
  impl_ = std::move(o.impl_);
  return *this;
}
Config::~Config() = default;

Result<Config> Config::load(const std::string& path, int world_size) {
  ZOE_ASSIGN_OR_RETURN(config::Config c, config::Config::load(path, world_size));
  return ConfigAccess::wrap(std::move(c), world_size);
}

Result<Config> Config::parse(const std::string& json_text, int world_size) {
  ZOE_ASSIGN_OR_RETURN(config::Config c, config::Config::parse(json_text, world_size));
  return ConfigAccess::wrap(std::move(c), world_size);
}

namespace {
// The paths of the values (leaves: anything but an object) of `after` that `before` lacks or
// holds otherwise, into *out.
void changed_paths(const json& before, const json& after, const std::string& at, std::set<std::string>* out) {
  if (!after.is_object()) {
    if (before != after) out->insert(at);
    return;
  }
  for (auto it = after.begin(); it != after.end(); ++it) {
    const std::string path = at.empty() ? it.key() : at + "." + it.key();
    const json none;
    changed_paths(before.is_object() && before.contains(it.key()) ? before[it.key()] : none, it.value(), path,
                  out);
  }
}

// Applies `edit` to the config's JSON and parses it back: the same validation (and errors) as a
// file; *cfg changes only when that succeeds.
template <typename Edit>
Status edit_config(config::Config* cfg, int world_size, const char* what, Edit edit) {
  const json before = json::parse(cfg->to_json());
  json j = before;
  edit(j);
  auto r = config::Config::parse(j.dump(), world_size);
  if (!r.is_ok()) return r.status().with_context(std::string("setting ") + what);
  // to_json writes every key, defaults too: what counts as given is what the config gave and
  // what the edit wrote, not the defaults nobody chose (Config::given).
  std::set<std::string> given = cfg->given_keys;
  changed_paths(before, j, "", &given);
  *cfg = std::move(r).value();
  cfg->given_keys = std::move(given);
  return Status::ok();
}
}  // namespace

#define ZOE_EDIT(what, body) edit_config(&impl_->cfg, impl_->world_size, what, [&](json& j) { body; })

Status Config::set_micro_batch(int64_t n) {
  const int64_t accum = impl_->cfg.gradient_accumulation_steps;
  return ZOE_EDIT("train_micro_batch_size_per_gpu", {
    j["train_micro_batch_size_per_gpu"] = n;
    j["train_batch_size"] = n * accum * impl_->world_size;
  });
}
Status Config::set_gradient_accumulation_steps(int64_t n) {
  const int64_t micro = impl_->cfg.train_micro_batch_size_per_gpu;
  return ZOE_EDIT("gradient_accumulation_steps", {
    j["gradient_accumulation_steps"] = n;
    j["train_batch_size"] = micro * n * impl_->world_size;
  });
}
Status Config::set_precision(ComputeDType d) {
  return ZOE_EDIT("bf16.enabled / fp16.enabled", set_precision_json(&j, d));
}
Status Config::set_lr(double lr) {
  return ZOE_EDIT("optimizer.params.lr", j["optimizer"]["params"]["lr"] = lr);
}
Status Config::set_optimizer(const std::string& type) {
  const std::set<std::string>& given = impl_->cfg.given_keys;
  return ZOE_EDIT("optimizer.type", {
    j["optimizer"]["type"] = type;
    // to_json wrote the old type's defaults too: those nobody gave go, so the new type's apply.
    json& params = j["optimizer"]["params"];
    for (auto it = params.begin(); it != params.end();) {
      it = given.count("optimizer.params." + it.key()) ? std::next(it) : params.erase(it);
    }
  });
}
Status Config::set_stage(int stage) {
  return ZOE_EDIT("zero_optimization.stage", j["zero_optimization"]["stage"] = stage);
}
Status Config::set_offload_optimizer(Offload where, const std::vector<std::string>& paths) {
  return ZOE_EDIT("zero_optimization.offload_optimizer", {
    json& b = j["zero_optimization"]["offload_optimizer"];
    b["device"] = offload_name(where);
    if (where == Offload::kNvme) b["nvme_path"] = paths;
  });
}
Status Config::set_offload_param(Offload where, const std::vector<std::string>& paths) {
  return ZOE_EDIT("zero_optimization.offload_param", {
    json& b = j["zero_optimization"]["offload_param"];
    b["device"] = offload_name(where);
    if (where == Offload::kNvme) b["nvme_path"] = paths;
  });
}
Status Config::set_device_budget(uint64_t bytes) {
  return ZOE_EDIT("zoe.device_budget", j["zoe"]["device_budget"] = bytes);
}
Status Config::set_optimizer_threads(int threads) {
  return ZOE_EDIT("zoe.optimizer_threads", j["zoe"]["optimizer_threads"] = threads);
}
Status Config::set_device(const std::string& device) {
  return ZOE_EDIT("zoe.device", j["zoe"]["device"] = device);
}
Status Config::set_activation_offload(ActivationOffload where) {
  return ZOE_EDIT("zoe.activation_offload", j["zoe"]["activation_offload"] = activation_offload_name(where));
}
Status Config::set_activation_host_budget(uint64_t bytes) {
  return ZOE_EDIT("zoe.activation_host_budget", j["zoe"]["activation_host_budget"] = bytes);
}

#undef ZOE_EDIT

// The placeholders as this process's launcher gives them (the engine uses the Runtime's values).
Status Config::check_paths() const {
  config::Config c = impl_->cfg;
  ZOE_RETURN_IF_ERROR(config::expand_paths(&c, config::process_path_vars()));
  return config::check_paths(c, impl_->cfg);
}

Result<std::string> check_nvme_dir(const std::string& flag, const std::string& dir) {
  return config::check_flag_dir(flag, dir, config::process_path_vars());
}

int Config::world_size() const { return impl_->world_size; }
int64_t Config::micro_batch() const { return impl_->cfg.train_micro_batch_size_per_gpu; }
int64_t Config::gradient_accumulation_steps() const { return impl_->cfg.gradient_accumulation_steps; }
int64_t Config::train_batch_size() const { return impl_->cfg.train_batch_size; }
ComputeDType Config::precision() const {
  return impl_->cfg.bf16           ? ComputeDType::kBF16
         : impl_->cfg.fp16.enabled ? ComputeDType::kF16
                                   : ComputeDType::kF32;
}
double Config::lr() const { return impl_->cfg.optimizer.lr; }
double Config::lr_at(int64_t step) const { return impl_->cfg.lr_at(step); }
std::string Config::scheduler_type() const { return impl_->cfg.scheduler.type; }
int Config::stage() const { return impl_->cfg.zero.stage; }
Offload Config::offload_optimizer() const { return impl_->cfg.zero.offload_optimizer.device; }
Offload Config::offload_param() const { return impl_->cfg.zero.offload_param.device; }
std::vector<std::string> Config::offload_optimizer_nvme_paths() const {
  return impl_->cfg.zero.offload_optimizer.nvme_path;
}
std::vector<std::string> Config::offload_param_nvme_paths() const {
  return impl_->cfg.zero.offload_param.nvme_path;
}
int64_t Config::offload_optimizer_buffer_count() const {
  return impl_->cfg.zero.offload_optimizer.buffer_count;
}
int64_t Config::sub_group_size() const { return impl_->cfg.zero.sub_group_size; }
uint64_t Config::device_budget() const { return static_cast<uint64_t>(impl_->cfg.zoe.device_budget_bytes); }
int Config::optimizer_threads() const { return static_cast<int>(impl_->cfg.zoe.optimizer_threads); }
std::string Config::device() const { return impl_->cfg.zoe.device; }
std::string Config::to_json() const { return impl_->cfg.to_json(); }

ActivationOffload Config::activation_offload() const {
  auto r = parse_activation_offload(impl_->cfg.zoe.activation_offload);
  return r.is_ok() ? r.value() : ActivationOffload::kNone;  // the table allows only the three names
}
uint64_t Config::activation_host_budget() const {
  return static_cast<uint64_t>(impl_->cfg.zoe.activation_host_budget_bytes);
}
uint64_t Config::activation_device_budget() const {
  return static_cast<uint64_t>(impl_->cfg.zoe.activation_device_budget_bytes);
}
int Config::activation_prefetch() const { return static_cast<int>(impl_->cfg.zoe.activation_prefetch); }
uint64_t Config::activation_min_bytes() const {
  return static_cast<uint64_t>(impl_->cfg.zoe.activation_min_bytes);
}
std::vector<std::string> Config::activation_nvme_paths() const {
  return config::activation_nvme_dirs(impl_->cfg);
}
Config::ActivationCheckpointing Config::activation_checkpointing() const {
  const config::ActivationCheckpointingConfig& a = impl_->cfg.activation_checkpointing;
  ActivationCheckpointing out;
  out.given = a.given;
  out.partition_activations = a.partition_activations;
  out.cpu_checkpointing = a.cpu_checkpointing;
  out.contiguous_memory_optimization = a.contiguous_memory_optimization;
  out.number_checkpoints = a.number_checkpoints;
  out.synchronize_checkpoint_boundary = a.synchronize_checkpoint_boundary;
  out.profile = a.profile;
  return out;
}

namespace {
// "a.b.c" -> {"a", "b", "c"}; an empty key or an empty part is an error naming the key.
Result<std::vector<std::string>> split_key(const std::string& key) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (;;) {
    const size_t dot = key.find('.', begin);
    parts.push_back(key.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
    if (parts.back().empty()) {
      return invalid_argument("config key '%s': expected a JSON path such as \"zero_optimization.stage\"",
                              key.c_str());
    }
    if (dot == std::string::npos) return parts;
    begin = dot + 1;
  }
}

std::string key_list(const json& obj) {
  std::string out;
  for (auto it = obj.begin(); it != obj.end(); ++it) out += (out.empty() ? "" : ", ") + it.key();
  return out;
}
}  // namespace

Result<std::string> Config::get(const std::string& key) const {
  ZOE_ASSIGN_OR_RETURN(std::vector<std::string> parts, split_key(key));
  const json j = json::parse(to_json());
  const json* node = &j;
  std::string at;  // the path walked so far
  for (const std::string& part : parts) {
    if (!node->is_object()) {
      return not_found("config key '%s': '%s' is a value (%s), not a section", key.c_str(), at.c_str(),
                       node->dump().c_str());
    }
    auto it = node->find(part);
    if (it == node->end()) {
      return not_found("config key '%s': no key '%s' in %s (its keys: %s)", key.c_str(), part.c_str(),
                       at.empty() ? "the config" : ("'" + at + "'").c_str(), key_list(*node).c_str());
    }
    node = &*it;
    at += (at.empty() ? "" : ".") + part;
  }
  return node->dump();
}

Status Config::set(const std::string& key, const std::string& json_value) {
  ZOE_ASSIGN_OR_RETURN(std::vector<std::string> parts, split_key(key));
  json value = json::parse(json_value, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return invalid_argument("config key '%s': the value %s is not JSON (a string needs quotes: \"nvme\")",
                            key.c_str(), json_value.c_str());
  }
  if (key == "optimizer.type" && value.is_string()) return set_optimizer(value.get<std::string>());
  Status shape;  // a path through a value that is not a section
  Status s = edit_config(&impl_->cfg, impl_->world_size, key.c_str(), [&](json& j) {
    json* node = &j;
    std::string at;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      at += (at.empty() ? "" : ".") + parts[i];
      node = &(*node)[parts[i]];
      if (!node->is_null() && !node->is_object()) {
        shape = invalid_argument("config key '%s': '%s' is a value (%s), not a section", key.c_str(),
                                 at.c_str(), node->dump().c_str());
        return;
      }
    }
    (*node)[parts.back()] = value;
  });
  return shape.is_ok() ? s : shape;
}

namespace {
Status wrong_type(const std::string& key, const std::string& text, const char* expected) {
  return invalid_argument("config key '%s': expected %s, found %s", key.c_str(), expected, text.c_str());
}
}  // namespace

Result<int64_t> Config::get_int(const std::string& key) const {
  ZOE_ASSIGN_OR_RETURN(std::string text, get(key));
  const json v = json::parse(text);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return wrong_type(key, text, "an integer in the range of int64");
  }
  if (!v.is_number_integer()) return wrong_type(key, text, "an integer");
  return v.get<int64_t>();
}

Result<double> Config::get_double(const std::string& key) const {
  ZOE_ASSIGN_OR_RETURN(std::string text, get(key));
  const json v = json::parse(text);
  if (!v.is_number()) return wrong_type(key, text, "a number");
  return v.get<double>();
}

Result<bool> Config::get_bool(const std::string& key) const {
  ZOE_ASSIGN_OR_RETURN(std::string text, get(key));
  const json v = json::parse(text);
  if (!v.is_boolean()) return wrong_type(key, text, "true or false");
  return v.get<bool>();
}

Result<std::string> Config::get_string(const std::string& key) const {
  ZOE_ASSIGN_OR_RETURN(std::string text, get(key));
  const json v = json::parse(text);
  if (!v.is_string()) return wrong_type(key, text, "a string");
  return v.get<std::string>();
}

// ---------------------------------------------------------------------------------------------
// Config::Builder: the keys set so far, as JSON values (never text), parsed by build().

struct Config::Builder::Impl {
  json j = json::object();
};

Config::Builder::Builder() : impl_(std::make_unique<Impl>()) {}
Config::Builder::Builder(const Builder& o) : impl_(std::make_unique<Impl>(*o.impl_)) {}
Config::Builder& Config::Builder::operator=(const Builder& o) {
  if (this != &o) impl_ = std::make_unique<Impl>(*o.impl_);
  return *this;
}
Config::Builder::~Builder() = default;

Config::Builder& Config::Builder::micro_batch(int64_t n) {
  impl_->j["train_micro_batch_size_per_gpu"] = n;
  return *this;
}
Config::Builder& Config::Builder::gradient_accumulation_steps(int64_t n) {
  impl_->j["gradient_accumulation_steps"] = n;
  return *this;
}
Config::Builder& Config::Builder::precision(ComputeDType d) {
  // Only the format in use is written (fp32: neither), as a file would say it.
  impl_->j.erase("bf16");
  impl_->j.erase("fp16");
  if (d == ComputeDType::kBF16) impl_->j["bf16"] = {{"enabled", true}};
  if (d == ComputeDType::kF16) impl_->j["fp16"] = {{"enabled", true}};
  return *this;
}
Config::Builder& Config::Builder::stage(int stage) {
  impl_->j["zero_optimization"]["stage"] = stage;
  return *this;
}
Config::Builder& Config::Builder::optimizer(const std::string& type) {
  impl_->j["optimizer"]["type"] = type;
  return *this;
}
Config::Builder& Config::Builder::lr(double lr) {
  if (!impl_->j["optimizer"].contains("type")) impl_->j["optimizer"]["type"] = "AdamW";
  impl_->j["optimizer"]["params"]["lr"] = lr;
  return *this;
}
Config::Builder& Config::Builder::weight_decay(double wd) {
  if (!impl_->j["optimizer"].contains("type")) impl_->j["optimizer"]["type"] = "AdamW";
  impl_->j["optimizer"]["params"]["weight_decay"] = wd;
  return *this;
}
Config::Builder& Config::Builder::gradient_clipping(double max_norm) {
  impl_->j["gradient_clipping"] = max_norm;
  return *this;
}
Config::Builder& Config::Builder::offload_optimizer(Offload where, const std::vector<std::string>& paths) {
  impl_->j["zero_optimization"]["offload_optimizer"] = offload_block(where, paths);
  return *this;
}
Config::Builder& Config::Builder::offload_param(Offload where, const std::vector<std::string>& paths) {
  impl_->j["zero_optimization"]["offload_param"] = offload_block(where, paths);
  return *this;
}
Config::Builder& Config::Builder::param_persistence_threshold(int64_t elements) {
  impl_->j["zero_optimization"]["stage3_param_persistence_threshold"] = elements;
  return *this;
}
Config::Builder& Config::Builder::device_budget(uint64_t bytes) {
  impl_->j["zoe"]["device_budget"] = bytes;
  return *this;
}
Config::Builder& Config::Builder::optimizer_threads(int threads) {
  impl_->j["zoe"]["optimizer_threads"] = threads;
  return *this;
}
Config::Builder& Config::Builder::device(const std::string& device) {
  impl_->j["zoe"]["device"] = device;
  return *this;
}

Result<Config> Config::Builder::build(int world_size) const {
  auto r = Config::parse(impl_->j.dump(), world_size);
  if (!r.is_ok()) return r.status().with_context("building a Config");
  return r;
}

}  // namespace zoe
