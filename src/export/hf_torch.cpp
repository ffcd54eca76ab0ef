// export_hf_torch: a front-end checkpoint of a transformers model as a from_pretrained folder.
#include "export/hf_torch.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "checkpoint/file_util.h"
#include "checkpoint/safetensors_export.h"
#include "export/export_dir.h"
#include "zoe/files.h"

namespace zoe::ckpt {
namespace {

using nlohmann::json;

size_t export_elem_bytes(const std::string& dtype) { return dtype == "fp32" ? 4 : 2; }

const char* torch_dtype_name(const std::string& dtype) {
  return dtype == "fp32" ? "float32" : dtype == "bf16" ? "bfloat16" : "float16";
}

// The stored front-end section, checked: its names map and its Hugging Face configs.
Result<const json*> front_end_section(const Reader& r) {
  const json& t = r.manifest().trainer;
  const json* zt = t.is_object() && t.contains("zoe_torch") ? &t["zoe_torch"] : nullptr;
  if (zt == nullptr || !zt->is_object() || !zt->contains("names") || !(*zt)["names"].is_object()) {
    return invalid_argument(
        "hf export of %s: the checkpoint was not written by zoe's PyTorch front-end (its trainer state has "
        "no "
        "zoe_torch.names): --format hf needs engine.save_checkpoint() of a transformers model",
        r.path().c_str());
  }
  if (!zt->contains("hf") || !(*zt)["hf"].is_object() || !(*zt)["hf"].contains("config") ||
      !(*zt)["hf"]["config"].is_object()) {
    return invalid_argument(
        "hf export of %s: the checkpoint holds no Hugging Face config (zoe_torch.hf.config): its model was "
        "not "
        "a transformers model, or it was saved before zoe kept the config there; use --format safetensors",
        r.path().c_str());
  }
  return zt;
}

}  // namespace

Status export_hf_torch(const Reader& r, const std::string& out_dir, const HfTorchOptions& o) {
  const std::string dtype = o.dtype == "f32" ? "fp32" : o.dtype == "f16" ? "fp16" : o.dtype;
  if (dtype != "fp32" && dtype != "bf16" && dtype != "fp16") {
    return invalid_argument("hf export: dtype '%s': expected fp32, bf16 or fp16", o.dtype.c_str());
  }
  ZOE_ASSIGN_OR_RETURN(const json* zt, front_end_section(r));
  const json& names = (*zt)["names"];
  const Manifest& m = r.manifest();
  // Every zoe parameter under the model's name, in the checkpoint's order, cut into shards.
  std::vector<std::vector<detail::ExportTensor>> shards(1);
  std::vector<uint64_t> shard_bytes(1, 0);
  uint64_t total = 0;
  for (uint32_t mi = 0; mi < m.modules.size(); ++mi) {
    for (size_t pi = 0; pi < m.modules[mi].params.size(); ++pi) {
      const std::string key = m.modules[mi].name + "." + m.modules[mi].params[pi].name;
      if (!names.contains(key) || !names[key].is_string()) {
        return invalid_argument("hf export of %s: zoe parameter %s has no model name in zoe_torch.names",
                                r.path().c_str(), key.c_str());
      }
      uint64_t numel = 1;
      for (int64_t d : m.modules[mi].params[pi].shape) numel *= static_cast<uint64_t>(d);
      const uint64_t bytes = numel * export_elem_bytes(dtype);
      if (shard_bytes.back() > 0 && shard_bytes.back() + bytes > o.max_shard_bytes) {
        shards.emplace_back();
        shard_bytes.push_back(0);
      }
      shards.back().push_back({names[key].get<std::string>(), mi, pi, false});
      shard_bytes.back() += bytes;
      total += bytes;
    }
  }
  ZOE_ASSIGN_OR_RETURN(ExportDir dir, ExportDir::open(out_dir, "hf export: --out", "hf"));
  const json meta = {{"format", "pt"}};
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char file[64];
    if (shards.size() == 1) {
      std::snprintf(file, sizeof file, "model.safetensors");
    } else {
      std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    }
    ZOE_RETURN_IF_ERROR(
        detail::write_safetensors(r, dir.path() + "/" + file, dtype, shards[s], meta, o.piece_bytes));
    for (const auto& t : shards[s]) weight_map[t.name] = file;
  }
  if (shards.size() > 1) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    ZOE_RETURN_IF_ERROR(
        write_output_file(dir.path() + "/model.safetensors.index.json", index.dump(2) + "\n", "output file"));
  }
  json config = (*zt)["hf"]["config"];
  config[config.contains("torch_dtype") && !config.contains("dtype") ? "torch_dtype" : "dtype"] =
      torch_dtype_name(dtype);
  ZOE_RETURN_IF_ERROR(write_output_file(dir.path() + "/config.json", config.dump(2) + "\n", "output file")
                          .with_context("writing the config of checkpoint " + r.path()));
  if ((*zt)["hf"].contains("generation_config") && (*zt)["hf"]["generation_config"].is_object()) {
    ZOE_RETURN_IF_ERROR(write_output_file(dir.path() + "/generation_config.json",
                                          (*zt)["hf"]["generation_config"].dump(2) + "\n", "output file"));
  }
  return dir.commit();
}

}  // namespace zoe::ckpt
