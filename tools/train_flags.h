// The flags of `zoe train`: their values, their checks, and the engine config they give (built
// with the public Config::Builder, or a config file with the flags given as overrides).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "model/gpt.h"
#include "zoe/cli.h"
#include "zoe/zoe.h"

namespace zoe::cli {

struct TrainOpts {
  std::string config;
  std::string preset = "small";
  int layers = 0, d_model = 0, heads = 0, context = 0;  // 0 when not given: the preset's
  int seq = 0;          // tokens per training sequence (default: the model's context)
  int micro_batch = 8;  // without --config (a config without the key gives 1), or given
  int steps = 100;
  double lr = 1e-3;           // without --config, or given: optimizer.params.lr
  double weight_decay = 0.0;  // without --config only: optimizer.params.weight_decay
  int warmup = 100;           // without --config only: linear warm-up updates (0: none)
  std::string seed_text = "1";
  uint64_t seed = 1;  // parsed from seed_text
  int eval_every = 0;
  int eval_batches = 4;
  std::string device_budget;
  std::string host_budget;       // zoe.host_budget ("" where not given)
  std::string optimizer;         // optimizer.type: adamw, lion, adagrad ("" where not given: AdamW)
  std::string optimizer_states;  // zoe.optimizer_states: fp32, bf16, int8, int4 ("" where not given)
  std::string master_weights;    // zoe.master_weights: fp32, bf16 ("" where not given)
  std::string schedule;          // zoe.schedule: micro-batch, layer-major ("" where not given)
  std::string offload;  // none|cpu|nvme: both parameter (stage 3) and optimizer offload, when no --config
  std::vector<std::string> nvme_path;
  std::string precision = "bf16";
  std::string data;
  std::string task = "add";  // without --data: add (3-digit operands), add2 (2-digit) or add1 (1-digit)
  int sample = -1;           // bytes generated before and after training (-1: 160 with --data, else 0)
  std::string prompt = "The ";
  double temperature = 0.8;
  std::string trace;
  std::string plot;  // a PNG of the loss and eval curves and the time per step
  int threads = 0;
  int save_every = 0;
  bool save_async = false;
  bool save_initial = false;  // a checkpoint step-000000 of the initial weights in --save-dir
  std::string save_dir;
  std::string dump_batches;  // JSON Lines of every micro-batch's token ids (docs/train-json.md)
  std::string resume;        // a save directory or checkpoint; "-" for --resume without a value
  // Activation checkpointing (also on when --config has an activation_checkpointing section) and
  // where the activation store may keep the block inputs: flags override zoe.activation_offload
  // and zoe.activation_host_budget ("" where not given).
  bool activation_checkpointing = false;
  std::string activation_offload;
  std::string activation_host_budget;
  bool json = false;
  bool quiet = false;
  // The flags given on the command line ("--micro-batch"): a flag overrides the config only then.
  std::set<std::string> given;
  bool has(const char* flag) const { return given.count(flag) != 0; }
};

// Sane bounds of the flags (the messages give them); the others are zoe/cli.h's.
constexpr int kMaxEvalBatches = 1 << 20;

// The model's shape from --preset and the shape flags (exits 2 naming a bad one).
model::GptConfig model_config(const TrainOpts& o);
ComputeDType precision_flag(const std::string& p);
// The engine's config when there is no --config, from the flags.
Result<Config> flags_config(const TrainOpts& o, const std::vector<std::string>& nvme_dirs, int world_size);
// Every flag is in range and takes effect, or the run stops here (exit 2) saying why.
void check_flags(TrainOpts& o);
// The config file's values that flags given on the command line replace, each said on stderr.
void apply_overrides(const TrainOpts& o, Config* cfg, bool lead);
// Adds `train` to app with its options bound to *o; the caller sets the callback.
CLI::App* add_train_options(CLI::App& app, TrainOpts* o);

}  // namespace zoe::cli
