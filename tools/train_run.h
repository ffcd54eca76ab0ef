// `zoe train`'s run: the state its phases share, and the phases, implemented by concept in
// train_setup.cpp (the runtime, config, data, engine and model), train_loop.cpp (the steps, the
// evaluations, checkpoints and stops) and train_report.cpp (the JSON and the text summary).
#pragma once

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/corpus.h"
#include "model/gpt_trainer.h"
#include "tools/stop_signals.h"
#include "tools/train_flags.h"
#include "tools/train_support.h"
#include "zoe/cli.h"
#include "zoe/zoe.h"

namespace zoe::cli {

// One `zoe train` run: the state its phases share. Members are declared in the order the run
// builds them, so they are released in the reverse order (the trainer and model before the
// engine, the engine before the runtime).
struct TrainRun {
  using json = nlohmann::json;

  TrainOpts o;
  StopSignals stop;
  model::GptConfig mc;
  int T = 0;
  bool ckpt = false;                   // activation checkpointing (the flag, or the config's section)
  std::vector<std::string> nvme_dirs;  // without --config: --nvme-path, or the default directory
  std::unique_ptr<Runtime> rt;
  bool lead = false;
  Config cfg;
  data::Corpus corpus;
  std::optional<BatchDump> dump;
  std::unique_ptr<Engine> eng;
  std::optional<Progress> progress;
  int start_step = 0;
  std::unique_ptr<model::GptCpu> gpt;
  std::vector<std::unique_ptr<model::GptCpu>> more_gpts;  // layer-major: micro-batches 1..G-1's models
  std::vector<model::GptCpu*> models;                     // gpt, then more_gpts
  std::optional<model::GptTrainer> trainer;
  int sample_n = 0;
  json samples = json::array();
  int accum = 1;
  std::vector<int32_t> tokens, targets;
  std::vector<double> losses, lrs, grad_norms;
  json step_times = json::array();
  std::vector<double> comm_steps;     // this rank's t_comm per step
  json comm_by_rank = json::array();  // every rank's t_comm per step (finish())
  json per_param = json::array();     // bytes per parameter moved in each step, per link
  std::vector<uint64_t>
      nvme_written_steps;       // this rank's NVMe bytes written in each step (states, activations)
  double nvme_written_all = 0;  // every rank's NVMe bytes written (finish())
  json evals = json::array();
  double t_compute = 0, t_comm = 0, t_io = 0, t_opt = 0;
  StepStats last;
  uint64_t t_start = 0;
  uint64_t last_nvme = 0;
  double eval_loss = NAN, accuracy = NAN;
  int saved_step = -1;
  bool stderr_tty = false;
  int progress_every = 1;
  double last_line_s = 0;
  double accuracy_start = NAN, eval_loss_start = NAN;
  double total_s = 0;
  double init_s = 0;  // Engine::initialize(): the initial states placed in their homes

  explicit TrainRun(TrainOpts opts) : o(std::move(opts)), mc(model_config(o)) {}

  void check_seq();
  double micro_batches(int step);
  void gather_comm();
  void start_runtime();
  void build_config();
  void setup_activations();
  Status flags_activation_share(ActivationOffload off);
  Status one_input_too_big(double one, const std::string& why) const;
  double activation_share = 0;  // zoe.activation_device_budget as the flags chose it (0: not chosen)
  void load_data();
  void build_engine();
  void resume();
  void build_model();
  void take_sample(int at_step);
  void evaluate();
  void save_after(int done, bool async);
  void stop_if_asked(int done);
  int agree_on_stop(std::string* which);
  void train();
  void train_step(int step);
  void record_step(double step_wall);
  void stop_if_not_finite(int step, double loss);
  void progress_line(int step, double loss);
  void finish();
  json summary_json() const;
  void add_activation_json(json* j) const;
  uint64_t nvme_written() const;
  double drive_tbw() const;
  void add_wear_json(json* j) const;
  void print_wear() const;
  void plot(const json& j) const;
  void print_summary(const json& j) const;
  void print_samples() const;
  void print_bytes_table(const json& j) const;
};

}  // namespace zoe::cli
