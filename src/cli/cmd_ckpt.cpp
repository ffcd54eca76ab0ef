// `zoe ckpt`: inspect, verify, consolidate (safetensors, Hugging Face GPT-2) and evaluate
// checkpoints written by Engine::save.
#include <sys/stat.h>
#include <filesystem>

#include <cinttypes>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/units.h"
#include "export/hf_gpt2.h"
#include "export/hf_torch.h"
#include "model/corpus.h"
#include "model/gpt.h"
#include "zoe/cli.h"
#include "zoe/files.h"

namespace zoe::cli {
namespace {

using nlohmann::json;

uint64_t file_bytes(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Bytes of the .safetensors files in dir (an hf export's shards).
uint64_t safetensors_bytes(const std::string& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") bytes += file_bytes(e.path().string());
  }
  return bytes;
}

json describe(const ckpt::Reader& r) {
  const ckpt::Manifest& m = r.manifest();
  json j;
  j["path"] = r.path();
  j["format_version"] = m.format_version;
  j["world_size"] = m.world_size;
  j["stage"] = m.stage;
  j["step"] = m.step;
  uint64_t params = 0, elements = 0;
  json mods = json::array();
  for (const auto& mod : m.modules) {
    uint64_t e = 0;
    for (const auto& p : mod.params) e += p.numel;
    params += mod.params.size();
    elements += e;
    mods.push_back(
        {{"name", mod.name}, {"params", mod.params.size()}, {"elements", e}, {"padded", mod.padded}});
  }
  j["modules"] = mods;
  j["params"] = params;
  j["elements"] = elements;
  json files = json::array();
  json mf = {{"name", ckpt::kManifestName}, {"bytes", file_bytes(r.path() + "/" + ckpt::kManifestName)}};
  if (!r.manifest_xxh64().empty()) mf["xxh64"] = r.manifest_xxh64();  // checked by Reader::open
  files.push_back(mf);
  uint64_t total = 0;
  for (const auto& f : m.files) {
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", f.xxh64}});
    total += f.bytes;
  }
  j["files"] = files;
  j["bytes"] = total;
  std::map<int, std::pair<uint64_t, uint64_t>> per_rank;  // rank -> tensors, bytes
  std::map<std::string, uint64_t> kinds;
  json states = json::array();  // per (kind, dtype): elements and bytes as stored
  std::map<std::pair<std::string, std::string>, std::pair<uint64_t, uint64_t>> by_dtype;
  for (const auto& t : m.tensors) {
    per_rank[t.rank].first++;
    per_rank[t.rank].second += t.bytes;
    kinds[t.kind] += t.count;
    by_dtype[{t.kind, t.dtype}].first += t.count;
    by_dtype[{t.kind, t.dtype}].second += t.bytes;
  }
  for (const auto& [key, v] : by_dtype) {
    states.push_back(
        {{"kind", key.first}, {"dtype", key.second}, {"elements", v.first}, {"bytes", v.second}});
  }
  json ranks = json::array();
  for (int rank = 0; rank < m.world_size; ++rank) {
    ranks.push_back({{"rank", rank}, {"tensors", per_rank[rank].first}, {"bytes", per_rank[rank].second}});
  }
  j["ranks"] = ranks;
  j["kinds"] = kinds;
  j["states"] = states;
  j["engine"] = m.engine;
  j["trainer"] = m.trainer;
  return j;
}

void print_inspect(const json& j) {
  printf("checkpoint  %s\n", j["path"].get<std::string>().c_str());
  printf("format      version %d, world size %d, ZeRO stage %d, step %" PRId64 "\n",
         j["format_version"].get<int>(), j["world_size"].get<int>(), j["stage"].get<int>(),
         j["step"].get<int64_t>());
  printf("modules     %zu (%" PRIu64 " parameters, %" PRIu64 " elements)\n", j["modules"].size(),
         j["params"].get<uint64_t>(), j["elements"].get<uint64_t>());
  std::string kinds;
  for (auto& [k, v] : j["kinds"].items()) kinds += (kinds.empty() ? "" : ", ") + k;
  printf("states      %s\n\n", kinds.c_str());
  Table files({{"file", "", 18, true}, {"size", "bytes", 14}, {"xxh64", "", 18}});
  files.print_header(stdout);
  for (const auto& f : j["files"]) {
    files.print_row(stdout, {f["name"].get<std::string>(), format_bytes(f["bytes"].get<uint64_t>()),
                             f.value("xxh64", std::string("-"))});
  }
  printf("\n");
  Table states(
      {{"state", "", 12, true}, {"dtype", "", 10, true}, {"elements", "", 16}, {"size", "bytes", 14}});
  states.print_header(stdout);
  for (const auto& st : j["states"]) {
    states.print_row(
        stdout, {st["kind"].get<std::string>(), st["dtype"].get<std::string>(),
                 std::to_string(st["elements"].get<uint64_t>()), format_bytes(st["bytes"].get<uint64_t>())});
  }
  printf("\n");
  Table ranks({{"rank", "", 6}, {"tensors", "", 9}, {"size", "bytes", 14}});
  ranks.print_header(stdout);
  for (const auto& r : j["ranks"]) {
    ranks.print_row(stdout,
                    {std::to_string(r["rank"].get<int>()), std::to_string(r["tensors"].get<uint64_t>()),
                     format_bytes(r["bytes"].get<uint64_t>())});
  }
}

void add_inspect(CLI::App& ckpt) {
  struct Opts {
    std::string dir;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = ckpt.add_subcommand("inspect",
                                      "Show a checkpoint: files and sizes, world size, stage, step, "
                                      "modules and parameters, tensors per rank");
  cmd->add_option("dir", o->dir, "A save directory (its `latest`) or a checkpoint directory")->required();
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    auto r = value_or_fail(ckpt::Reader::open(o->dir));
    json j = describe(*r);
    if (o->json)
      print_json(j);
    else
      print_inspect(j);
  });
}

void add_verify(CLI::App& ckpt) {
  struct Opts {
    std::string dir;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = ckpt.add_subcommand("verify",
                                      "Check that a checkpoint's manifest lists every tensor a --resume "
                                      "loads, re-read every file and check its xxh64; exit 1 naming the "
                                      "first missing tensor or the first file that does not match");
  cmd->add_option("dir", o->dir, "A save directory (its `latest`) or a checkpoint directory")->required();
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    auto r = value_or_fail(ckpt::Reader::open(o->dir));
    const auto& files = r->manifest().files;
    json jf = json::array();
    // The structure first (what --resume refuses, verify refuses), then every byte.
    Status first = r->check_complete();
    uint64_t bytes = 0;
    for (size_t i = 0; i < files.size(); ++i) {
      Status s = r->verify_file(i);
      json e = {
          {"name", files[i].name}, {"bytes", files[i].bytes}, {"xxh64", files[i].xxh64}, {"ok", s.is_ok()}};
      if (!s.is_ok()) e["error"] = s.message();
      jf.push_back(e);
      bytes += files[i].bytes;
      if (!o->json) {
        printf("%-6s %-18s %12s  %s\n", s.is_ok() ? "OK" : "FAILED", files[i].name.c_str(),
               format_bytes(files[i].bytes).c_str(), files[i].xxh64.c_str());
      }
      if (!s.is_ok() && first.is_ok()) first = s;
    }
    if (o->json) {
      print_json(nlohmann::json{{"path", r->path()},
                                {"ok", first.is_ok()},
                                {"bytes", bytes},
                                {"files", jf},
                                {"complete", r->check_complete().is_ok()}});
    } else if (first.is_ok()) {
      printf("verified %zu files, %s: OK\n", files.size(), format_bytes(bytes).c_str());
    }
    if (!first.is_ok()) fail(first);
  });
}

// The attention heads the checkpoint records: its trainer state's model.heads, else its preset's
// (when the preset's dimensions are the model's). 0 when it records none; *why says where it
// looked.
int recorded_heads(const ckpt::Reader& r, const ckpt::GptDims& dims, std::string* why) {
  const json& t = r.manifest().trainer;
  const std::string where = "checkpoint " + r.path();
  if (t.is_object() && t.contains("model") && t["model"].is_object() && t["model"].contains("heads")) {
    int heads = 0;
    Status s = ckpt::JsonFields(t["model"], where, "trainer.model").get("heads", &heads);
    if (!s.is_ok()) fail(s);
    *why = "its trainer state's model.heads";
    return heads;
  }
  std::string preset;
  if (t.is_object() && t.contains("preset") && t["preset"].is_string())
    preset = t["preset"].get<std::string>();
  // The presets' head counts (the parameter shapes do not tell the heads).
  for (const auto& p : model::gpt_presets()) {
    if (preset != p.name) continue;
    if (p.layers == dims.n_layer && p.d_model == dims.n_embd && p.context == dims.n_positions) {
      *why = "its trainer state's preset '" + preset + "'";
      return p.heads;
    }
    *why = "its trainer state says preset '" + preset + "' (" + std::to_string(p.layers) + " layers, d " +
           std::to_string(p.d_model) + ", " + std::to_string(p.context) + " positions), but the model has " +
           std::to_string(dims.n_layer) + " layers, d " + std::to_string(dims.n_embd) + ", " +
           std::to_string(dims.n_positions) + " positions (overridden when training)";
    return 0;
  }
  *why = "the number of attention heads is in neither trainer.model.heads nor a known trainer.preset ('" +
         preset + "')";
  return 0;
}

// The model's attention heads: the checkpoint's (see recorded_heads), or --n-head where it records
// none. A --n-head that contradicts the checkpoint, or does not divide the width, is refused: the
// export would compute another function.
int resolve_heads(const ckpt::Reader& r, const ckpt::GptDims& dims, int flag) {
  const std::string where = "checkpoint " + r.path();
  std::string why;
  const int recorded = recorded_heads(r, dims, &why);
  if (flag > 0 && recorded > 0 && flag != recorded) {
    fail(
        invalid_argument("--n-head %d contradicts %s: %s says %d heads, and the model was trained with "
                         "them; drop --n-head (or pass --n-head %d)",
                         flag, where.c_str(), why.c_str(), recorded, recorded));
  }
  const int heads = flag > 0 ? flag : recorded;
  if (heads == 0) fail(invalid_argument("%s: %s: pass --n-head", where.c_str(), why.c_str()));
  if (dims.n_embd % heads != 0) {
    fail(invalid_argument("--n-head %d does not divide the model's width %d (%s): pass a divisor of it",
                          heads, dims.n_embd, where.c_str()));
  }
  return heads;
}

void add_consolidate(CLI::App& ckpt) {
  struct Opts {
    std::string dir, out, dtype = "fp32", format = "safetensors";
    int n_head = 0;
    uint64_t max_shard = 50'000'000'000ull;
    bool json = false, with_moments = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = ckpt.add_subcommand("consolidate",
                                      "Write the full parameters (master weights, else the compute copy) as "
                                      "one safetensors file, as a Hugging Face GPT-2 directory (--format "
                                      "hf-gpt2: model.safetensors + config.json), or as the folder "
                                      "engine.save_pretrained() writes for a checkpoint of a transformers "
                                      "model the PyTorch front-end saved (--format hf), streaming and "
                                      "checking every checksum");
  cmd->add_option("dir", o->dir, "A save directory (its `latest`) or a checkpoint directory")->required();
  cmd->add_option(
         "--out", o->out,
         "The .safetensors file to write (replaced atomically); with --format hf-gpt2 or hf, the directory")
      ->required();
  cmd->add_option("--dtype", o->dtype, "fp32|bf16|fp16 (default fp32)");
  cmd->add_option("--format", o->format,
                  "safetensors (zoe's names: <module>.<param>), hf-gpt2 (zoe's reference GPT as "
                  "GPT2LMHeadModel's names and layouts) or hf (a transformers model the PyTorch front-end "
                  "saved: its own names, config.json; shards with model.safetensors.index.json above "
                  "--max-shard-size)")
      ->capture_default_str();
  int_range(cmd->add_option("--n-head", o->n_head,
                            "hf-gpt2: attention heads (default: from the checkpoint's trainer state)"),
            1, kMaxWidth);
  int_range(cmd->add_option("--max-shard-size", o->max_shard,
                            "hf: bytes of tensors per safetensors file before sharding (default "
                            "50000000000, transformers' 50GB)"),
            1, int64_t{1} << 50);
  cmd->add_flag("--with-moments", o->with_moments,
                "safetensors: also the optimizer's states, <module>.<param>.exp_avg and .exp_avg_sq (AdamW), "
                ".exp_avg (Lion) or .sum (Adagrad), in --dtype (packed int8/int4 states dequantized)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    if (o->format != "safetensors" && o->format != "hf-gpt2" && o->format != "hf") {
      fail(invalid_argument("--format %s: expected safetensors, hf-gpt2 or hf", o->format.c_str()));
    }
    if (o->with_moments && o->format != "safetensors") {
      fail(invalid_argument("--with-moments: only with --format safetensors (not %s)", o->format.c_str()));
    }
    if (o->format == "safetensors") check_output_flag("--out", o->out);
    if (o->format != "safetensors") {
      Status ds = check_output_dir(o->out, "--out");
      if (!ds.is_ok()) fail(ds);
    }
    auto r = value_or_fail(ckpt::Reader::open(o->dir));
    uint64_t params = 0;  // tensors written: each parameter and, with --with-moments, its states
    uint64_t states = 0;  // AdamW's m and v, Lion's m or Adagrad's sum (ckpt::consolidate)
    const json& eng = r->manifest().engine;
    if (o->with_moments)
      states = eng.is_object() && eng.contains("optimizer") && eng["optimizer"] != "AdamW" ? 1 : 2;
    for (const auto& m : r->manifest().modules) {
      params += m.params.size() * (1 + (m.frozen ? 0 : states));
    }
    std::string file = o->out;
    json extra = json::object();
    if (o->format == "hf-gpt2") {
      const ckpt::GptDims dims = value_or_fail(ckpt::gpt_dims(r->manifest(), "checkpoint " + r->path()));
      ckpt::HfGpt2Options ho;
      ho.n_head = resolve_heads(*r, dims, o->n_head);
      ho.dtype = o->dtype;
      Status s = ckpt::export_hf_gpt2(*r, o->out, ho);
      if (!s.is_ok()) fail(s);
      file = o->out + "/model.safetensors";
      extra = ckpt::hf_gpt2_config(dims, ho.n_head, o->dtype);
    } else if (o->format == "hf") {
      ckpt::HfTorchOptions ho;
      ho.dtype = o->dtype;
      ho.max_shard_bytes = o->max_shard;
      Status s = ckpt::export_hf_torch(*r, o->out, ho);
      if (!s.is_ok()) fail(s);
      file.clear();
    } else {
      Status s = ckpt::consolidate(*r, o->out, o->dtype, ckpt::kConsolidatePiece, o->with_moments);
      if (!s.is_ok()) fail(s);
    }
    uint64_t bytes = file.empty() ? safetensors_bytes(o->out) : file_bytes(file);
    if (o->json) {
      json j = {{"path", r->path()}, {"out", o->out},     {"format", o->format},
                {"dtype", o->dtype}, {"tensors", params}, {"bytes", bytes}};
      if (o->format == "hf-gpt2") j["config"] = extra;
      print_json(j);
    } else {
      printf("wrote %s: %" PRIu64 " tensors, %s (%s, %s) from %s\n", o->out.c_str(), params,
             format_bytes(bytes).c_str(), o->format.c_str(), o->dtype.c_str(), r->path().c_str());
    }
  });
}

constexpr uint64_t kMaxTokensFileBytes = 256ull << 20;

// Token ids from a JSON file (at most kMaxTokensFileBytes): an array of equally long rows of ids; each row of
// T + 1 ids gives the inputs row[0..T) and the targets row[1..T].
void read_token_rows(const std::string& path, int vocab, int positions, std::vector<int32_t>* tokens,
                     std::vector<int32_t>* targets, int* batch, int* T) {
  const std::string text = value_or_fail(read_input_file(path, "--tokens", kMaxTokensFileBytes));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array() || j.empty() || !j[0].is_array()) {
    fail(invalid_argument("--tokens %s: expected a JSON array of rows of token ids, e.g. [[72, 105, 10]]",
                          path.c_str()));
  }
  const size_t len = j[0].size();
  if (len < 2 || len > static_cast<size_t>(positions) + 1) {
    fail(invalid_argument("--tokens %s: row 0 has %zu ids; expected 2 .. %d (the model's positions + 1)",
                          path.c_str(), len, positions + 1));
  }
  *batch = static_cast<int>(j.size());
  *T = static_cast<int>(len - 1);
  for (size_t b = 0; b < j.size(); ++b) {
    if (!j[b].is_array() || j[b].size() != len) {
      fail(invalid_argument("--tokens %s: row %zu is not an array of %zu ids like row 0", path.c_str(), b,
                            len));
    }
    for (size_t t = 0; t < len; ++t) {
      const json& v = j[b][t];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
        fail(invalid_argument("--tokens %s: row %zu, position %zu: %s is not a token id in [0, %d)",
                              path.c_str(), b, t, v.dump().c_str(), vocab));
      }
      const auto id = static_cast<int32_t>(v.get<int64_t>());
      if (t + 1 < len) tokens->push_back(id);
      if (t > 0) targets->push_back(id);
    }
  }
}

void add_eval(CLI::App& ckpt) {
  struct Opts {
    std::string dir, tokens, data, state;
    int train_batch = 0, micro_batch = 8, seq = 0, n_head = 0, threads = 0;
    uint64_t seed = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = ckpt.add_subcommand(
      "eval",
      "The reference GPT's mean cross-entropy, with a checkpoint's weights, on given token ids (--tokens) or "
      "on the batch `zoe train --data FILE` draws at a step (--data FILE --train-batch N); every checksum "
      "is checked first");
  cmd->add_option("dir", o->dir, "A save directory (its `latest`) or a checkpoint directory")->required();
  cmd->add_option("--tokens", o->tokens,
                  "JSON file: rows of T + 1 token ids (inputs row[:-1], targets row[1:])");
  cmd->add_option("--data", o->data, "The text file `zoe train --data` trained on");
  int_range(
      cmd->add_option("--train-batch", o->train_batch,
                      "With --data: the batch of training step N (1-based, as zoe train counts; rank 0, "
                      "micro-batch 0)"),
      1, INT32_MAX);
  int_range(
      cmd->add_option("--micro-batch", o->micro_batch, "With --data: sequences per batch, as zoe train's"), 1,
      kMaxMicroBatch)
      ->capture_default_str();
  int_range(
      cmd->add_option("--seq", o->seq, "With --data: tokens per sequence (default: the model's positions)"),
      2, kMaxContext);
  int_range(
      cmd->add_option("--seed", o->seed, "With --data: zoe train's --seed (default or 0: the checkpoint's)"),
      0, INT64_MAX);
  cmd->add_option("--state", o->state, "master or param (default: master when saved, as consolidate)");
  int_range(cmd->add_option("--n-head", o->n_head,
                            "Attention heads (default: from the checkpoint's trainer state)"),
            1, kMaxWidth);
  int_range(cmd->add_option("--threads", o->threads, "CPU threads (0: all)"), 0, kMaxThreads);
  cmd->add_flag("--json", o->json, "Print one JSON object (with the tokens and targets evaluated)");
  cmd->callback([o] {
    if (o->tokens.empty() == o->data.empty())
      fail(invalid_argument("zoe ckpt eval: give --tokens or --data"));
    if (!o->data.empty() && o->train_batch < 1) {
      fail(invalid_argument(
          "--data needs --train-batch N (N >= 1: the training step whose batch to evaluate)"));
    }
    auto r = value_or_fail(ckpt::Reader::open(o->dir));
    const ckpt::Manifest& m = r->manifest();
    const ckpt::GptDims dims = value_or_fail(ckpt::gpt_dims(m, "checkpoint " + r->path()));
    model::GptConfig c;
    c.vocab = dims.vocab;
    c.seq = dims.n_positions;
    c.d_model = dims.n_embd;
    c.layers = dims.n_layer;
    c.heads = resolve_heads(*r, dims, o->n_head);
    Status cs = c.validate();
    if (!cs.is_ok()) fail(cs);
    const std::string state = o->state.empty() ? (r->has_kind("master") ? "master" : "param") : o->state;
    if (state != "master" && state != "param")
      fail(invalid_argument("--state %s: expected master or param", state.c_str()));

    std::vector<int32_t> tokens, targets;
    int batch = 0, T = 0;
    if (!o->tokens.empty()) {
      read_token_rows(o->tokens, c.vocab, c.seq, &tokens, &targets, &batch, &T);
    } else {
      batch = o->micro_batch;
      T = o->seq ? o->seq : c.seq;
      if (batch < 1 || T < 2 || T > c.seq) {
        fail(invalid_argument("--micro-batch %d, --seq %d: expected >= 1 and 2 .. %d", batch, T, c.seq));
      }
      uint64_t seed = o->seed;
      if (seed == 0) {
        Status s = ckpt::JsonFields(m.trainer, "checkpoint " + r->path(), "trainer").get("seed", &seed);
        if (!s.is_ok()) fail(s.with_context("reading the seed of the run (or pass --seed)"));
      }
      data::Corpus corpus = value_or_fail(data::load_text_file(o->data, static_cast<size_t>(T)));
      data::sample_batch(corpus.train, batch, T, seed, static_cast<uint64_t>(o->train_batch - 1), 0, 0,
                         &tokens, &targets);
    }

    // Every byte checked before it is used; then each parameter as fp32.
    Status vs = r->verify();
    if (!vs.is_ok()) fail(vs);
    std::vector<std::vector<float>> w;
    std::vector<std::vector<const float*>> ptrs(m.modules.size());
    for (uint32_t mi = 0; mi < m.modules.size(); ++mi) {
      for (const auto& p : m.modules[mi].params) {
        w.emplace_back(p.numel);
        Status s = r->read_range(mi, state, p.offset, p.numel, "f32", w.back().data());
        if (!s.is_ok()) fail(s.with_context("reading " + m.modules[mi].name + "." + p.name));
        ptrs[mi].push_back(w.back().data());
      }
    }
    auto gpt = value_or_fail(model::GptCpu::create(c, batch, T, o->threads));
    gpt->embed_forward(tokens.data(), ptrs[0].data());
    for (int l = 0; l < c.layers; ++l) gpt->block_forward(l, ptrs[static_cast<size_t>(l) + 1].data());
    const float loss = gpt->head_forward(ptrs.back().data(), ptrs[0].data(), targets.data());
    if (o->json) {
      json jt = json::array(), jg = json::array();
      for (int b = 0; b < batch; ++b) {
        const auto at = static_cast<size_t>(b) * static_cast<size_t>(T);
        jt.push_back(std::vector<int32_t>(tokens.begin() + at, tokens.begin() + at + T));
        jg.push_back(std::vector<int32_t>(targets.begin() + at, targets.begin() + at + T));
      }
      print_json(nlohmann::json{{"path", r->path()},
                                {"step", m.step},
                                {"state", state},
                                {"heads", c.heads},
                                {"batch", batch},
                                {"seq", T},
                                {"loss", loss},
                                {"tokens", jt},
                                {"targets", jg}});
    } else {
      printf("loss %.6f over %d x %d tokens (%s of %s, step %" PRId64 ")\n", static_cast<double>(loss), batch,
             T, state.c_str(), r->path().c_str(), m.step);
    }
  });
}

}  // namespace

static void add_ckpt_command(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Checkpoints: inspect, verify, consolidate, eval");
  ckpt->require_subcommand(1);
  add_inspect(*ckpt);
  add_verify(*ckpt);
  add_consolidate(*ckpt);
  add_eval(*ckpt);
}

// Joins every program this file is linked into (the `zoe` program links all of src/cli).
static const CommandRegistrar kRegister(30, "", "", add_ckpt_command);

}  // namespace zoe::cli
