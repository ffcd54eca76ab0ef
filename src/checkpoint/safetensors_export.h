// Writing safetensors files from a checkpoint: any selection of its parameters, renamed, some
// transposed, streamed from every rank file and checksummed on the way. Private to src/checkpoint;
// consolidate() and export_hf_gpt2() are its callers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"

namespace zoe::ckpt::detail {

// One tensor of the output file: parameter `param` of module `module`, stored under `name`.
// transpose: the parameter is a row-major matrix [rows, cols] and is written as [cols, rows]
// (the output's shape is then {cols, rows}); otherwise it is written as stored, with its shape.
// kind: the state written ("exp_avg", ...); empty: the parameter's values ("master", else "param").
struct ExportTensor {
  ExportTensor(std::string n, uint32_t m, size_t p, bool t, std::string k = "")
      : name(std::move(n)), module(m), param(p), transpose(t), kind(std::move(k)) {}
  std::string name;
  uint32_t module = 0;
  size_t param = 0;
  bool transpose = false;
  std::string kind;
};

// Writes out_path as a safetensors file holding `tensors` in that order, in dtype ("fp32"/"f32",
// "bf16", "fp16"/"f16"), from the "master" state (else "param") or the tensor's own kind, with
// `metadata` (string values) as its __metadata__. Packed records (optim/lowbit.h's formats) are
// dequantized: once their file's scan has checked it, they are read again through
// Reader::read_range in bounded pieces. Every rank file is read once, start to end, through
// Reader::scan_file: each tensor's and each file's xxh64 are checked as the bytes go by, so a damaged
// checkpoint fails (kCorruption naming the file and the tensor) instead of producing a corrupt model. Memory:
// one read piece of piece_bytes, plus scratch of at most 1 MiB for conversions and transposes, plus the JSON
// header. Written through zoe/files.h's OutputFile (a temporary beside out_path, fsynced, renamed over it):
// on failure the temporary is removed and out_path is untouched; out_path must be a regular file or nothing,
// outside every checkpoint save directory. Errors: a bad dtype or name, a transposed parameter that is not
// 2-D, a parameter element in no rank's file (kNotFound), I/O errors naming the file.
Status write_safetensors(const Reader& r, const std::string& out_path, const std::string& dtype,
                         const std::vector<ExportTensor>& tensors, const nlohmann::json& metadata,
                         size_t piece_bytes);

}  // namespace zoe::ckpt::detail
