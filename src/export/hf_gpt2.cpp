// export_hf_gpt2: a checkpoint of zoe's reference GPT as a Hugging Face GPT-2 directory.
#include "export/hf_gpt2.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

#include "checkpoint/file_util.h"
#include "checkpoint/safetensors_export.h"
#include "export/export_dir.h"
#include "model/gpt.h"
#include "model/kernels.h"
#include "zoe/files.h"

namespace zoe::ckpt {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// GPT-2's name of parameter `param` of block `layer`, and whether it is a Conv1D weight
// (transposed from zoe's [out, in]).
std::pair<std::string, bool> hf_block_name(int layer, size_t param) {
  static const char* const kNames[model::kBlockParams] = {
      "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
      "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
      "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  const bool conv =
      param == model::kQkvW || param == model::kProjW || param == model::kFc1W || param == model::kFc2W;
  return {"transformer.h." + std::to_string(layer) + "." + kNames[param], conv};
}

}  // namespace

Result<GptDims> gpt_dims(const Manifest& m, const std::string& where) {
  if (m.modules.size() < 3 || m.modules.front().name != "embed" || m.modules.back().name != "final" ||
      m.modules.front().params.size() != 2 || m.modules.front().params[0].shape.size() != 2) {
    return invalid_argument(
        "%s does not hold zoe's reference GPT: expected modules embed (wte, wpe), block.0 .. block.N, final; "
        "found %zu modules, the first '%s'",
        where.c_str(), m.modules.size(), m.modules.empty() ? "" : m.modules.front().name.c_str());
  }
  const auto& wte = m.modules[0].params[0].shape;
  const auto& wpe = m.modules[0].params[1].shape;
  model::GptConfig c;
  c.vocab = static_cast<int>(wte[0]);
  c.d_model = static_cast<int>(wte[1]);
  c.seq = wpe.size() == 2 ? static_cast<int>(wpe[0]) : 0;
  c.layers = static_cast<int>(m.modules.size() - 2);
  c.heads = 1;  // shapes do not depend on it
  Status v = c.validate();
  if (!v.is_ok()) {
    return invalid_argument("%s: embed.wte %s, embed.wpe %s: %s", where.c_str(), shape_str(wte).c_str(),
                            shape_str(wpe).c_str(), v.message().c_str());
  }
  // Every module and parameter as src/model/gpt.h lays them out for these dimensions.
  const std::vector<model::ModuleSpec> want = model::gpt_modules(c);
  for (size_t mi = 0; mi < want.size(); ++mi) {
    const ModuleInfo& got = m.modules[mi];
    if (got.name != want[mi].name || got.params.size() != want[mi].params.size()) {
      return invalid_argument("%s: module %zu is '%s' with %zu parameters; zoe's GPT has '%s' with %zu there",
                              where.c_str(), mi, got.name.c_str(), got.params.size(), want[mi].name.c_str(),
                              want[mi].params.size());
    }
    for (size_t pi = 0; pi < got.params.size(); ++pi) {
      const ParamInfo& p = got.params[pi];
      const model::TensorSpec& w = want[mi].params[pi];
      if (p.name != w.name || p.shape != w.shape) {
        return invalid_argument(
            "%s: parameter %zu of module '%s' is %s %s; zoe's GPT (d %d, vocab %d, %d "
            "positions) has %s %s there",
            where.c_str(), pi, got.name.c_str(), p.name.c_str(), shape_str(p.shape).c_str(), c.d_model,
            c.vocab, c.seq, w.name.c_str(), shape_str(w.shape).c_str());
      }
    }
  }
  return GptDims{c.vocab, c.seq, c.d_model, c.layers};
}

nlohmann::json hf_gpt2_config(const GptDims& d, int n_head, const std::string& dtype) {
  const char* torch_dtype = dtype == "bf16"                       ? "bfloat16"
                            : (dtype == "fp16" || dtype == "f16") ? "float16"
                                                                  : "float32";
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", d.vocab},
          {"n_positions", d.n_positions},
          {"n_ctx", d.n_positions},
          {"n_embd", d.n_embd},
          {"n_layer", d.n_layer},
          {"n_head", n_head},
          {"n_inner", nullptr},  // 4 * n_embd, as zoe's MLP
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", static_cast<double>(model::kernels::kLayerNormEps)},
          {"tie_word_embeddings", true},
          {"scale_attn_weights", true},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", 0.02},
          {"torch_dtype", torch_dtype},
          {"bos_token_id", 10},  // byte-level vocabulary: '\n' separates documents
          {"eos_token_id", 10}};
}

Status export_hf_gpt2(const Reader& r, const std::string& out_dir, const HfGpt2Options& o) {
  ZOE_ASSIGN_OR_RETURN(GptDims dims, gpt_dims(r.manifest(), "checkpoint " + r.path()));
  if (o.n_head < 1 || dims.n_embd % o.n_head != 0) {
    return invalid_argument("hf-gpt2 export of %s: n_head %d: expected a divisor of n_embd %d",
                            r.path().c_str(), o.n_head, dims.n_embd);
  }
  const std::string dtype = o.dtype == "f32" ? "fp32" : o.dtype == "f16" ? "fp16" : o.dtype;
  if (dtype != "fp32" && dtype != "bf16" && dtype != "fp16") {
    return invalid_argument("hf-gpt2 export: dtype '%s': expected fp32, bf16 or fp16", o.dtype.c_str());
  }
  // An empty directory, nothing, or an earlier export, outside every checkpoint save directory:
  // written beside it and renamed into place whole (export_dir.h).
  ZOE_ASSIGN_OR_RETURN(ExportDir dir, ExportDir::open(out_dir, "hf-gpt2 export: --out", "hf-gpt2"));
  std::vector<detail::ExportTensor> tensors;
  const uint32_t final_module = static_cast<uint32_t>(dims.n_layer + 1);
  tensors.push_back({"transformer.wte.weight", 0, 0, false});
  tensors.push_back({"transformer.wpe.weight", 0, 1, false});
  for (int l = 0; l < dims.n_layer; ++l) {
    for (size_t p = 0; p < model::kBlockParams; ++p) {
      auto [name, conv] = hf_block_name(l, p);
      tensors.push_back({name, static_cast<uint32_t>(l + 1), p, conv});
    }
  }
  tensors.push_back({"transformer.ln_f.weight", final_module, 0, false});
  tensors.push_back({"transformer.ln_f.bias", final_module, 1, false});
  const nlohmann::json meta = {{"zoe_export", "hf-gpt2"}};
  ZOE_RETURN_IF_ERROR(
      detail::write_safetensors(r, dir.path() + "/model.safetensors", dtype, tensors, meta, o.piece_bytes));
  const std::string config = hf_gpt2_config(dims, o.n_head, dtype).dump(2) + "\n";
  ZOE_RETURN_IF_ERROR(write_output_file(dir.path() + "/config.json", config, "output file")
                          .with_context("writing the hf-gpt2 config of checkpoint " + r.path()));
  return dir.commit();
}

}  // namespace zoe::ckpt
