// Parameter counts of Hugging Face decoders, tensor by tensor, as transformers builds them:
//   gpt2      wte, wpe; per block ln_1 (w, b), attn.c_attn (w, b), attn.c_proj (w, b), ln_2,
//             mlp.c_fc, mlp.c_proj; ln_f; lm_head tied unless tie_word_embeddings is false.
//   llama     embed_tokens; per block input_layernorm, q/k/v/o_proj (biases with
//   mistral   attention_bias), gate/up/down_proj (biases with mlp_bias), post_attention_layernorm;
//   qwen2     norm; lm_head unless tied. qwen2: q/k/v always have biases, o_proj none.
//   gpt_neox  embed_in; per block input_layernorm and post_attention_layernorm (w, b),
//             attention.query_key_value and attention.dense (biases with attention_bias, default
//             true), mlp.dense_h_to_4h and dense_4h_to_h (w, b); final_layer_norm (w, b);
//             embed_out unless tied.
// Buffers (rotary inv_freq, causal masks) are not parameters and are not counted.
#include "plan/hf_config.h"

#include <algorithm>
#include <cerrno>

#include <nlohmann/json.hpp>

#include "config/json_reader.h"
#include "zoe/files.h"

namespace zoe::plan {

using nlohmann::json;

const std::vector<std::string>& hf_model_types() {
  static const std::vector<std::string> kTypes = {"gpt2", "llama", "mistral", "qwen2", "gpt_neox"};
  return kTypes;
}

namespace {

// The largest dimensions zoe plans for (a key above its cap is refused, naming the key and the cap,
// before anything is built); the model's parameters are capped at kMaxModelParams.
constexpr int64_t kMaxLayers = 1 << 16, kMaxWidth = 1 << 20, kMaxVocab = 1 << 24, kMaxPositions = 1 << 24;

// The description's dimensions (what `zoe plan` prints beside the counts).
ModelDesc with_dims(ModelDesc m, int64_t layers, int64_t d, int64_t heads, int64_t vocab, int64_t context) {
  m.layers = static_cast<int>(layers);
  m.d_model = static_cast<int>(d);
  m.heads = static_cast<int>(heads);
  m.vocab = static_cast<int>(vocab);
  m.context = static_cast<int>(context);
  return m;
}

// Reads keys of one config with errors naming the file, the model_type and the key.
struct Reader {
  const json& j;
  std::string where, type;

  // A positive integer at most `max` under the first of `keys` present; `def` (> 0) when none is and
  // def is set.
  Result<int64_t> dim(std::initializer_list<const char*> keys, int64_t max, int64_t def = 0) const {
    for (const char* k : keys) {
      auto it = j.find(k);
      if (it == j.end() || it->is_null()) continue;
      if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
        return invalid_argument("%s: key \"%s\" of a %s config is %s, expected a positive integer",
                                where.c_str(), k, type.c_str(), it->dump().c_str());
      }
      if (it->get<int64_t>() > max) {
        return invalid_argument("%s: key \"%s\" of a %s config is %s, more than %lld, the most zoe plans for",
                                where.c_str(), k, type.c_str(), it->dump().c_str(),
                                static_cast<long long>(max));
      }
      return it->get<int64_t>();
    }
    if (def > 0) return def;
    return invalid_argument("%s: a %s config needs the key \"%s\" (a positive integer)", where.c_str(),
                            type.c_str(), *keys.begin());
  }
  Result<bool> flag(const char* key, bool def) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_boolean()) {
      return invalid_argument("%s: key \"%s\" of a %s config is %s, expected true or false", where.c_str(),
                              key, type.c_str(), it->dump().c_str());
    }
    return it->get<bool>();
  }
};

size_t sz(int64_t v) { return static_cast<size_t>(v); }

Result<ModelDesc> gpt2(const Reader& r) {
  ZOE_ASSIGN_OR_RETURN(int64_t vocab, r.dim({"vocab_size"}, kMaxVocab));
  ZOE_ASSIGN_OR_RETURN(int64_t pos, r.dim({"n_positions", "n_ctx"}, kMaxPositions));
  ZOE_ASSIGN_OR_RETURN(int64_t d, r.dim({"n_embd"}, kMaxWidth));
  ZOE_ASSIGN_OR_RETURN(int64_t layers, r.dim({"n_layer"}, kMaxLayers));
  ZOE_ASSIGN_OR_RETURN(int64_t heads, r.dim({"n_head"}, kMaxWidth));
  ZOE_ASSIGN_OR_RETURN(int64_t inner, r.dim({"n_inner"}, kMaxWidth, 4 * d));
  ZOE_ASSIGN_OR_RETURN(bool tied, r.flag("tie_word_embeddings", true));
  if (d % heads != 0) {
    return invalid_argument("%s: n_embd %lld is not a multiple of n_head %lld", r.where.c_str(),
                            static_cast<long long>(d), static_cast<long long>(heads));
  }
  ModelDesc m;
  m.modules.push_back({"embed", {sz(vocab * d), sz(pos * d)}});
  for (int64_t l = 0; l < layers; ++l) {
    m.modules.push_back({"block." + std::to_string(l),
                         {sz(d), sz(d), sz(d * 3 * d), sz(3 * d), sz(d * d), sz(d), sz(d), sz(d),
                          sz(d * inner), sz(inner), sz(inner * d), sz(d)}});
  }
  m.modules.push_back({"final", {sz(d), sz(d)}});
  if (!tied) m.modules.push_back({"head", {sz(vocab * d)}});
  return with_dims(std::move(m), layers, d, heads, vocab, pos);
}

// llama, mistral, qwen2: the same layout; qwen2 has q/k/v biases.
Result<ModelDesc> llama_like(const Reader& r) {
  ZOE_ASSIGN_OR_RETURN(int64_t vocab, r.dim({"vocab_size"}, kMaxVocab));
  ZOE_ASSIGN_OR_RETURN(int64_t d, r.dim({"hidden_size"}, kMaxWidth));
  ZOE_ASSIGN_OR_RETURN(int64_t inter, r.dim({"intermediate_size"}, kMaxWidth));
  ZOE_ASSIGN_OR_RETURN(int64_t layers, r.dim({"num_hidden_layers"}, kMaxLayers));
  ZOE_ASSIGN_OR_RETURN(int64_t heads, r.dim({"num_attention_heads"}, kMaxWidth));
  ZOE_ASSIGN_OR_RETURN(int64_t kv, r.dim({"num_key_value_heads"}, kMaxWidth, heads));
  if (!r.j.contains("head_dim") && d % heads != 0) {
    return invalid_argument(
        "%s: hidden_size %lld is not a multiple of num_attention_heads %lld (and no head_dim)",
        r.where.c_str(), static_cast<long long>(d), static_cast<long long>(heads));
  }
  ZOE_ASSIGN_OR_RETURN(int64_t hd, r.dim({"head_dim"}, kMaxWidth, d / heads));
  if (std::max(heads, kv) * hd > kMaxWidth) {
    return invalid_argument(
        "%s: num_attention_heads %lld (num_key_value_heads %lld) x head_dim %lld is more than %lld, the most "
        "zoe plans for",
        r.where.c_str(), static_cast<long long>(heads), static_cast<long long>(kv),
        static_cast<long long>(hd), static_cast<long long>(kMaxWidth));
  }
  ZOE_ASSIGN_OR_RETURN(int64_t ctx, r.dim({"max_position_embeddings"}, kMaxPositions, 2048));
  ZOE_ASSIGN_OR_RETURN(bool tied, r.flag("tie_word_embeddings", false));
  const bool qwen = r.type == "qwen2";
  ZOE_ASSIGN_OR_RETURN(bool attn_bias, r.flag("attention_bias", false));
  ZOE_ASSIGN_OR_RETURN(bool mlp_bias, r.flag("mlp_bias", false));
  const bool qkv_bias = qwen || attn_bias, o_bias = !qwen && attn_bias;
  ModelDesc m;
  m.modules.push_back({"embed", {sz(vocab * d)}});
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<size_t> p;
    p.push_back(sz(d));  // input_layernorm
    p.push_back(sz(d * heads * hd));
    if (qkv_bias) p.push_back(sz(heads * hd));
    p.push_back(sz(d * kv * hd));
    if (qkv_bias) p.push_back(sz(kv * hd));
    p.push_back(sz(d * kv * hd));
    if (qkv_bias) p.push_back(sz(kv * hd));
    p.push_back(sz(heads * hd * d));
    if (o_bias) p.push_back(sz(d));
    for (int k = 0; k < 2; ++k) {  // gate_proj, up_proj
      p.push_back(sz(d * inter));
      if (mlp_bias) p.push_back(sz(inter));
    }
    p.push_back(sz(inter * d));  // down_proj
    if (mlp_bias) p.push_back(sz(d));
    p.push_back(sz(d));  // post_attention_layernorm
    m.modules.push_back({"block." + std::to_string(l), std::move(p)});
  }
  m.modules.push_back({"final", {sz(d)}});
  if (!tied) m.modules.push_back({"head", {sz(vocab * d)}});
  return with_dims(std::move(m), layers, d, heads, vocab, ctx);
}

Result<ModelDesc> gpt_neox(const Reader& r) {
  ZOE_ASSIGN_OR_RETURN(int64_t vocab, r.dim({"vocab_size"}, kMaxVocab));
  ZOE_ASSIGN_OR_RETURN(int64_t d, r.dim({"hidden_size"}, kMaxWidth));
  ZOE_ASSIGN_OR_RETURN(int64_t layers, r.dim({"num_hidden_layers"}, kMaxLayers));
  ZOE_ASSIGN_OR_RETURN(int64_t heads, r.dim({"num_attention_heads"}, kMaxWidth));
  ZOE_ASSIGN_OR_RETURN(int64_t inter, r.dim({"intermediate_size"}, kMaxWidth, 4 * d));
  ZOE_ASSIGN_OR_RETURN(int64_t ctx, r.dim({"max_position_embeddings"}, kMaxPositions, 2048));
  ZOE_ASSIGN_OR_RETURN(bool tied, r.flag("tie_word_embeddings", false));
  ZOE_ASSIGN_OR_RETURN(bool bias, r.flag("attention_bias", true));
  if (d % heads != 0) {
    return invalid_argument("%s: hidden_size %lld is not a multiple of num_attention_heads %lld",
                            r.where.c_str(), static_cast<long long>(d), static_cast<long long>(heads));
  }
  ModelDesc m;
  m.modules.push_back({"embed", {sz(vocab * d)}});
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<size_t> p = {sz(d), sz(d), sz(d), sz(d), sz(d * 3 * d)};  // two LayerNorms, qkv weight
    if (bias) p.push_back(sz(3 * d));
    p.push_back(sz(d * d));
    if (bias) p.push_back(sz(d));
    for (size_t v : {sz(d * inter), sz(inter), sz(inter * d), sz(d)}) p.push_back(v);
    m.modules.push_back({"block." + std::to_string(l), std::move(p)});
  }
  m.modules.push_back({"final", {sz(d), sz(d)}});
  if (!tied) m.modules.push_back({"head", {sz(vocab * d)}});
  return with_dims(std::move(m), layers, d, heads, vocab, ctx);
}

}  // namespace

Result<ModelDesc> hf_model_from_json(const std::string& text, const std::string& where) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("%s: not valid JSON", where.c_str());
  if (!j.is_object())
    return invalid_argument("%s: expected a JSON object (a Hugging Face config.json)", where.c_str());
  std::string supported;
  for (const auto& t : hf_model_types()) supported += (supported.empty() ? "" : ", ") + t;
  auto it = j.find("model_type");
  if (it == j.end() || !it->is_string()) {
    return invalid_argument("%s: no string key \"model_type\" (supported model_types: %s)", where.c_str(),
                            supported.c_str());
  }
  Reader r{j, where, it->get<std::string>()};
  Result<ModelDesc> m = invalid_argument("%s: model_type \"%s\" is not supported; supported model_types: %s",
                                         where.c_str(), r.type.c_str(), supported.c_str());
  if (r.type == "gpt2")
    m = gpt2(r);
  else if (r.type == "llama" || r.type == "mistral" || r.type == "qwen2")
    m = llama_like(r);
  else if (r.type == "gpt_neox")
    m = gpt_neox(r);
  if (!m.is_ok()) return m.status();
  ModelDesc d = std::move(m).value();
  d.params = count_params(d.modules);
  if (d.params > kMaxModelParams) {
    return invalid_argument(
        "%s: its dimensions give %llu parameters, more than %llu, the most zoe plans for (key \"%s\" is %d, "
        "the width %d, the vocabulary %d)",
        where.c_str(), static_cast<unsigned long long>(d.params),
        static_cast<unsigned long long>(kMaxModelParams), r.type == "gpt2" ? "n_layer" : "num_hidden_layers",
        d.layers, d.d_model, d.vocab);
  }
  d.name = r.type + " (" + where + ")";
  return d;
}

Result<ModelDesc> hf_model(const std::string& path) {
  ZOE_ASSIGN_OR_RETURN(std::string text,
                       read_input_file(path, "--hf-config", config::JsonLimits{}.max_bytes));
  return hf_model_from_json(text, path);
}

}  // namespace zoe::plan
