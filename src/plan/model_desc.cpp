// Model descriptions for the planner: zoe's GPT presets and bare parameter counts.
#include "plan/model_desc.h"

namespace zoe::plan {

uint64_t count_params(const std::vector<zero::ModuleShape>& modules) {
  uint64_t n = 0;
  for (const auto& m : modules) {
    for (size_t p : m.param_numel) n += p;
  }
  return n;
}

Result<ModelDesc> gpt_model(const model::GptConfig& c, const std::string& name) {
  ZOE_RETURN_IF_ERROR_CTX(c.validate(), "model " + name);
  ModelDesc d;
  d.name = name;
  for (const model::ModuleSpec& m : model::gpt_modules(c)) {
    zero::ModuleShape s;
    s.name = m.name;
    for (const auto& t : m.params) {
      s.param_numel.push_back(t.numel());
      s.specs.push_back({t.name, t.shape});
    }
    d.modules.push_back(std::move(s));
  }
  d.params = count_params(d.modules);
  d.layers = c.layers;
  d.d_model = c.d_model;
  d.heads = c.heads;
  d.vocab = c.vocab;
  d.context = c.seq;
  d.zoe_gpt = true;
  d.fetches_per_pass.assign(d.modules.size(), 1);
  d.fetches_per_pass[0] = 2;  // "embed": the input, then the tied output layer (model::GptTrainer)
  return d;
}

Result<ModelDesc> gpt_model(const std::string& preset, int layers, int d_model, int heads, int context) {
  std::string names;
  const GptPreset* p = model::find_gpt_preset(preset, &names);
  if (!p) return invalid_argument("--preset %s is not one of %s", preset.c_str(), names.c_str());
  model::GptConfig c;
  c.layers = layers ? layers : p->layers;
  c.d_model = d_model ? d_model : p->d_model;
  c.heads = heads ? heads : p->heads;
  c.seq = context ? context : p->context;
  c.vocab = 256;
  const bool custom = layers || d_model || heads || context;
  return gpt_model(c, std::string("zoe-gpt ") + p->name + (custom ? " (modified)" : ""));
}

Result<ModelDesc> params_model(uint64_t params, int modules) {
  if (params == 0) return invalid_argument("--params 0: a model needs at least one parameter");
  if (modules < 1 || static_cast<uint64_t>(modules) > params) {
    return invalid_argument("--layers %d: a model of %llu parameters splits into 1 to %llu modules", modules,
                            static_cast<unsigned long long>(params), static_cast<unsigned long long>(params));
  }
  ModelDesc d;
  d.name = "a model of " + std::to_string(modules) + " equal modules";
  const uint64_t m = static_cast<uint64_t>(modules), each = params / m, extra = params % m;
  for (uint64_t i = 0; i < m; ++i) {
    d.modules.push_back({"block." + std::to_string(i), {static_cast<size_t>(each + (i < extra ? 1 : 0))}});
  }
  d.params = params;
  d.layers = modules;
  return d;
}

}  // namespace zoe::plan
