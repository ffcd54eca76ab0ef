// Hugging Face config.json -> ModelDesc with the exact parameter count of the transformers
// implementation (model_type gpt2, llama, mistral, qwen2, gpt_neox), split into engine modules
// the way a zoe trainer registers a decoder: "embed", "block.i", "final" (+ "head" when the
// output projection is not tied to the token embedding).
#pragma once

#include <string>
#include <vector>

#include "plan/model_desc.h"
#include "zoe/status.h"

namespace zoe::plan {

// The model_types hf_model() understands.
const std::vector<std::string>& hf_model_types();

// From the text of a config.json; `where` names it in errors (a path). Errors name the file, the
// key and the bad value: not JSON, no model_type, a model_type not supported (listing those that
// are), a missing or non-positive dimension, heads that do not divide the width.
Result<ModelDesc> hf_model_from_json(const std::string& text, const std::string& where);
// Reads the file first (zoe/files.h's read_input_file, capped as a --config file is): a missing
// file, one too large, or anything but a regular file is an error naming --hf-config and the path.
Result<ModelDesc> hf_model(const std::string& path);

}  // namespace zoe::plan
