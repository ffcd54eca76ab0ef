// `zoe train`: trains the reference GPT through the engine on a text file or the built-in
// arithmetic corpus, with the engine's placement from a DeepSpeed-style config (or flags). A thin
// CLI over model::GptTrainer and the public API: flags -> zoe::Config (its Builder and setters).
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "model/corpus.h"
#include "model/gpt_trainer.h"
#include "tools/stop_signals.h"
#include "tools/train_flags.h"
#include "tools/train_support.h"
#include "zoe/cli.h"
#include "zoe/zoe.h"

namespace zoe::cli {
namespace {

using nlohmann::json;

// The host buffers the engine sized, as one line ("" with no offload to NVMe); "(zoe's)" marks
// the sizes zoe picked because the config does not give them.
std::string buffers_line(const BufferSizes& b) {
  if (b.swap_buffer_count == 0 && b.staging_count == 0) return "";
  auto mine = [&](const char* key) {
    return std::find(b.chosen.begin(), b.chosen.end(), key) != b.chosen.end() ? " (zoe's)" : "";
  };
  std::string line = "host buffers:";
  if (b.swap_buffer_count) {
    line += fmt(" optimizer swapper %zu x %s%s + %zu write buffers;", b.swap_buffer_count,
                format_bytes(b.swap_buffer_bytes).c_str(),
                mine("zero_optimization.offload_optimizer.buffer_count"), b.swap_async_buffers);
  }
  if (b.staging_count) {
    line += fmt(" staging %zu x %s%s; partition cache %s%s;", b.staging_count,
                format_bytes(b.staging_bytes).c_str(), mine("zero_optimization.offload_param.buffer_size"),
                format_bytes(b.host_cache_bytes).c_str(), mine("zero_optimization.offload_param.max_in_cpu"));
  }
  if (b.host_share) line += fmt(" within %s of host memory", format_bytes(b.host_share).c_str());
  return line;
}

json buffers_json(const BufferSizes& b) {
  return {{"host_share", b.host_share},
          {"swap_buffer_count", b.swap_buffer_count},
          {"swap_buffer_bytes", b.swap_buffer_bytes},
          {"swap_async_buffers", b.swap_async_buffers},
          {"staging_count", b.staging_count},
          {"staging_bytes", b.staging_bytes},
          {"host_cache_bytes", b.host_cache_bytes},
          {"chosen", b.chosen}};
}

// The bytes per parameter one step moved, per link (a row of the JSON's step_bytes_per_param).
json link_json(double nvme_read, double nvme_write, double h2d, double d2h) {
  return json{
      {"nvme->host", nvme_read}, {"host->nvme", nvme_write}, {"host->device", h2d}, {"device->host", d2h}};
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One `zoe train` run: the state its phases share. Members are declared in the order the run
// builds them, so they are released in the reverse order (the trainer and model before the
// engine, the engine before the runtime).
struct TrainRun {
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
  void plot(const json& j) const;
  void print_summary(const json& j) const;
  void print_samples() const;
  void print_bytes_table(const json& j) const;
};

// --seq: at most the model's positions (the default is all of them).
void TrainRun::check_seq() {
  T = o.seq ? o.seq : mc.seq;
  if (T > mc.seq) {
    usage_fail(
        invalid_argument("--seq %d is longer than the model allows: it has %d positions (set --context, or a "
                         "smaller --seq)",
                         T, mc.seq));
  }
}

// The runtime (this rank), and --plot's tools checked before any training.
void TrainRun::start_runtime() {
  rt = value_or_fail(Runtime::init());
  lead = rt->rank() == 0;
  stop.set_rank(rt->rank(), rt->world_size());
  if (!o.plot.empty() && lead) {
    Status ps = plot_available();
    if (!ps.is_ok()) fail(ps.with_context("checking for --plot " + o.plot + " before training"));
  }
}

// The engine's config: a file (flags given override its keys, and say so), or the flags.
void TrainRun::build_config() {
  if (!o.config.empty()) {
    cfg = value_or_fail(Config::load(o.config, rt->world_size()));
    apply_overrides(o, &cfg, lead);
  } else {
    std::vector<std::string>& dirs = nvme_dirs;
    dirs = o.nvme_path;
    if (dirs.empty()) {
      const char* env = getenv("ZOE_SCRATCH");
      dirs.push_back(env && *env ? env : "/var/tmp");
    }
    const bool on_nvme = o.offload == "nvme" || o.activation_offload == "nvme";
    if (!o.nvme_path.empty() && !on_nvme && lead) {
      fprintf(stderr, "zoe: --nvme-path has no effect without --offload nvme or --activation-offload nvme\n");
    }
    // Each --nvme-path as the user wrote it (the config's check below names the key and the expansion).
    for (const std::string& d : on_nvme ? o.nvme_path : std::vector<std::string>{}) {
      Result<std::string> dir = check_nvme_dir("--nvme-path", d);
      if (!dir.is_ok()) fail(dir.status());
    }
    auto c = flags_config(o, dirs, rt->world_size());
    if (!c.is_ok()) fail(c.status().with_context("the config built from the flags"));
    cfg = std::move(c).value();
    // The directories are the flag's (or the default's): the error names it, not only the key.
    Status paths = cfg.check_paths();
    if (!paths.is_ok()) {
      fail(paths.with_context(o.nvme_path.empty() ? "the default NVMe directory ($ZOE_SCRATCH or /var/tmp) "
                                                    "of --offload nvme; give --nvme-path"
                                                  : "--nvme-path of --offload nvme"));
    }
  }
  setup_activations();
  // From here on the config's values are the run's (bounded by Config::parse).
  o.micro_batch = static_cast<int>(cfg.micro_batch());
  check_host_memory(cfg, mc, o.micro_batch, T, ckpt);
  if (!o.save_dir.empty()) prepare_save_dir(o.save_dir);
}

// Activation checkpointing: --activation-checkpointing, or the config's activation_checkpointing
// section. --activation-offload and --activation-host-budget override zoe.activation_offload and
// zoe.activation_host_budget (with --config, said on stderr); without --config, NVMe activations go
// to the --nvme-path directories. Offload without checkpointing and NVMe without a directory are
// refused here, naming the flag or the key.
void TrainRun::setup_activations() {
  ckpt = o.activation_checkpointing || cfg.activation_checkpointing().given;
  auto check = [&](const char* flag, Status s) {
    if (!s.is_ok())
      usage_fail(
          s.with_context(o.config.empty() ? std::string(flag) : flag + (" with --config " + o.config)));
  };
  if (o.config.empty() && o.activation_offload == "nvme") {  // the directory first: the offload checks it
    std::string dirs = "[";
    for (const std::string& d : nvme_dirs) dirs += (dirs.size() > 1 ? "," : "") + json(d).dump();
    check("--nvme-path", cfg.set("zoe.activation_nvme_path", dirs + "]"));
  }
  if (o.has("--activation-offload")) {
    if (!o.config.empty() && lead) {
      fprintf(stderr, "zoe: --activation-offload %s overrides zoe.activation_offload (%s in %s)\n",
              o.activation_offload.c_str(), activation_offload_name(cfg.activation_offload()),
              o.config.c_str());
    }
    check("--activation-offload",
          cfg.set_activation_offload(parse_activation_offload(o.activation_offload).value()));
  }
  if (o.has("--activation-host-budget")) {
    if (!o.config.empty() && lead) {
      fprintf(stderr,
              "zoe: --activation-host-budget %s overrides zoe.activation_host_budget (%llu bytes in %s)\n",
              o.activation_host_budget.c_str(), static_cast<unsigned long long>(cfg.activation_host_budget()),
              o.config.c_str());
    }
    check("--activation-host-budget",
          cfg.set_activation_host_budget(parse_bytes(o.activation_host_budget).value()));
  }
  const ActivationOffload off = cfg.activation_offload();
  const std::string what = o.has("--activation-offload")
                               ? "--activation-offload " + o.activation_offload
                               : std::string("zoe.activation_offload ") + activation_offload_name(off) +
                                     " (or activation_checkpointing.cpu_checkpointing) in " + o.config;
  if (off != ActivationOffload::kNone && !ckpt) {
    usage_fail(invalid_argument(
        "%s needs activation checkpointing: give --activation-checkpointing (or an activation_checkpointing "
        "section in the config); only checkpointed activations (each block's input) are offloaded",
        what.c_str()));
  }
  if (o.has("--activation-host-budget") && off == ActivationOffload::kNone) {
    usage_fail(
        invalid_argument("--activation-host-budget %s has no effect without activation offload: give "
                         "--activation-offload cpu or nvme",
                         o.activation_host_budget.c_str()));
  }
  if (ckpt && o.config.empty()) check("--activation-checkpointing", flags_activation_share(off));
  if (off != ActivationOffload::kNvme) return;
  if (cfg.activation_nvme_paths().empty()) {
    usage_fail(invalid_argument(
        "%s has no directory for the activations: set zoe.activation_nvme_path (or an offload nvme_path) in "
        "--config %s",
        what.c_str(), o.config.c_str()));
  }
  Status paths = cfg.check_paths();
  if (!paths.is_ok()) fail(paths.with_context(what + ": its NVMe directory"));
}

// Without --config, the device's activation share (zoe.activation_device_budget), kept out of the
// placement's budget: every block input of a micro-batch without offload (or without
// --device-budget); with offload, a quarter of --device-budget, at least one block input (the last
// one never leaves the device) and at most all of them.
Status TrainRun::flags_activation_share(ActivationOffload off) {
  const double all = model::checkpoint_bytes_estimate(mc, o.micro_batch, T), one = all / mc.layers;
  double share = all;
  if (off != ActivationOffload::kNone && o.has("--device-budget")) {
    const double budget = static_cast<double>(parse_bytes(o.device_budget).value());
    if (one >= budget)
      return one_input_too_big(
          one, "is all of --device-budget " + o.device_budget + " and leaves nothing for the model");
    share = std::min(all, std::max(one, budget / 4));
  }
  if (share >= 9.0e18) return invalid_argument("block inputs of %.3g bytes per micro-batch", all);
  activation_share = share;
  return cfg.set("zoe.activation_device_budget", std::to_string(static_cast<uint64_t>(share)));
}

// In the flags' terms: one block's input, which never leaves the device (the last one saved stays
// there while the backward begins), does not fit beside what the model needs there.
Status TrainRun::one_input_too_big(double one, const std::string& why) const {
  const uint64_t b = static_cast<uint64_t>(one);
  return out_of_budget(
      "--activation-checkpointing with --activation-offload: one block's input is %llu bytes (%s: "
      "--micro-batch "
      "%d x --seq %d x width %d x 4 bytes) and must stay on the device (the last one saved is kept there), "
      "which %s; raise --device-budget (zoe plan with the same "
      "flags shows what the placement needs beside it) or lower --micro-batch or --seq",
      static_cast<unsigned long long>(b), format_bytes(b).c_str(), o.micro_batch, T, mc.d_model, why.c_str());
}

// Data next: a missing file is reported before the engine allocates anything.
void TrainRun::load_data() {
  if (!o.data.empty()) {
    // The corpus is held twice while it loads: at most a quarter of the available memory, 1 GiB.
    const uint64_t avail = host_memory_available();
    const size_t cap =
        static_cast<size_t>(std::min<uint64_t>(uint64_t{1} << 30, avail ? avail / 4 : uint64_t{1} << 30));
    auto c = data::load_text_file(o.data, static_cast<size_t>(T), 0.05, cap);
    if (!c.is_ok()) {
      // The cap explained where it was the reason; "--data" otherwise.
      const bool over_cap = c.status().message().find("more than the") != std::string::npos;
      fail(c.status().with_context(
          over_cap ? fmt("--data: the limit is a quarter of the host's available memory (%s), at most 1 GiB",
                         format_bytes(avail).c_str())
                   : std::string("--data")));
    }
    corpus = std::move(c).value();
  } else {
    corpus = data::make_arithmetic(o.seed, 200000, o.task == "add2" ? 2 : o.task == "add1" ? 1 : 3);
  }
}

// The engine, the model's modules registered and initialised from --seed.
void TrainRun::build_engine() {
  eng = value_or_fail(Engine::create(*rt, cfg));
  // A second job saving into the same --save-dir is refused now, not at its first save.
  if (!o.save_dir.empty()) {
    Status cs = eng->claim_save_dir(o.save_dir);
    if (!cs.is_ok()) fail(cs);
  }
  // The outputs, checked once --save-dir is claimed (none may lie inside it), before training.
  const std::string suffix = rt->world_size() > 1 ? "." + std::to_string(rt->rank()) : "";
  dump.emplace(o.dump_batches.empty() ? "" : o.dump_batches + suffix);
  if (!o.trace.empty()) check_output_flag("--trace", o.trace + suffix);
  if (lead) check_output_flag("--plot", o.plot);
  if (!o.trace.empty()) eng->enable_trace(true);
  {
    Status s = model::add_gpt_modules(*eng, mc);
    if (!s.is_ok()) fail(s);
  }
  progress.emplace(lead && !o.quiet);
  progress->update(fmt("initialising %llu parameters (%s of model state per rank)",
                       static_cast<unsigned long long>(mc.num_params()),
                       format_bytes(eng->model_state_bytes()).c_str()));
  const uint64_t t0 = clock_ns();
  Status s = eng->initialize(
      [&](size_t m, size_t p, float* x, size_t n) { model::gpt_init(mc, o.seed, m, p, x, n); });
  init_s = static_cast<double>(clock_ns() - t0) * 1e-9;
  if (!s.is_ok() && activation_share > 0 && o.has("--device-budget") &&
      (s.code() == StatusCode::kOutOfBudget || s.message().find("zoe.activation_device_budget") == 0)) {
    // The share the flags chose left the placement too little: said in the flags' terms.
    const double one = model::checkpoint_bytes_estimate(mc, o.micro_batch, T) / mc.layers;
    fail(one_input_too_big(one, "as the activations' share of " +
                                    format_bytes(static_cast<uint64_t>(activation_share)) +
                                    " (one input, or a quarter of --device-budget " + o.device_budget +
                                    " when more) leaves the model's placement less than it needs"));
  }
  if (!s.is_ok()) fail(s.with_context("initialising the model"));
  const std::string sizes = buffers_line(eng->buffer_sizes());
  if (!sizes.empty() && lead && !o.quiet) {
    progress->done();
    fprintf(stderr, "%s\n", sizes.c_str());
  }
}

// Resume: restore every state, continue at the saved step (--steps counts the whole run).
void TrainRun::resume() {
  if (o.resume.empty()) return;
  std::string from = o.resume == "-" ? o.save_dir : o.resume;
  if (from.empty()) fail(invalid_argument("--resume needs a directory, or --save-dir"));
  progress->update("resuming from " + from);
  std::string ts = value_or_fail(eng->load(from));
  uint64_t seed = o.seed;
  Status ts_ok = model::parse_trainer_state(ts, from, &start_step, &seed);
  if (!ts_ok.is_ok()) fail(ts_ok);
  if (seed != o.seed) {
    fail(invalid_argument("checkpoint %s was trained with --seed %llu, not %llu: the data order would differ",
                          from.c_str(), static_cast<unsigned long long>(seed),
                          static_cast<unsigned long long>(o.seed)));
  }
  if (start_step >= o.steps) {
    fail(invalid_argument(
        "checkpoint %s is at step %d; --steps %d leaves nothing to train (--steps counts the whole run)",
        from.c_str(), start_step, o.steps));
  }
}

// The model and its trainer, and the first sample from --prompt.
void TrainRun::build_model() {
  gpt = value_or_fail(model::GptCpu::create(mc, o.micro_batch, T, o.threads, ckpt));
  trainer.emplace(*eng, *gpt, mc, T);
  check_address_space(gpt->threads());
  sample_n = o.sample >= 0 ? o.sample : (o.data.empty() ? 0 : 160);
  if (sample_n > 0) take_sample(start_step);
}

// A sample from --prompt (a collective: every rank draws the same), and how many of its words
// occur in the training text.
void TrainRun::take_sample(int at_step) {
  progress->update(fmt("sampling %d bytes from the weights after step %d", sample_n, at_step));
  std::string text = value_or_fail(trainer->sample(o.prompt, sample_n, o.temperature, o.seed, o.micro_batch));
  size_t words = 0;
  const double known = data::known_word_fraction(text, corpus.train, &words);
  samples.push_back(
      {{"step", at_step}, {"text", escape_bytes(o.prompt + text)}, {"words", words}, {"known_words", known}});
}

// The held-out loss over --eval-batches, and on the arithmetic corpus the exact-match accuracy
// (a line counts when every answer token is the argmax), both averaged over the ranks.
void TrainRun::evaluate() {
  double sum = 0;
  int n = 0;
  int correct = 0, total = 0;
  for (int b = 0; b < o.eval_batches; ++b) {
    std::vector<int32_t> tk, tg, line;
    if (corpus.arithmetic) {
      data::arithmetic_eval_batch(corpus.eval, o.micro_batch, T, static_cast<size_t>(b * o.micro_batch * 4),
                                  &tk, &tg, &line);
    } else {
      data::sample_batch(corpus.eval, o.micro_batch, T, o.seed ^ 0xe7a1, static_cast<uint64_t>(b), 0, 0, &tk,
                         &tg);
    }
    float l = value_or_fail(trainer->forward(tk, tg));
    sum += l;
    ++n;
    if (corpus.arithmetic) {
      const float* logits = gpt->logits();
      std::vector<int> ok(tk.size(), 1);
      int lines = 0;
      for (size_t i = 0; i < line.size(); ++i) {
        if (line[i] < 0) continue;
        lines = std::max(lines, line[i] + 1);
        const float* row = logits + i * static_cast<size_t>(mc.vocab);
        int arg = static_cast<int>(std::max_element(row, row + mc.vocab) - row);
        if (arg != tg[i]) ok[static_cast<size_t>(line[i])] = 0;
      }
      for (int k = 0; k < lines; ++k) correct += ok[static_cast<size_t>(k)];
      total += lines;
    }
  }
  eval_loss = mean_over_ranks(*rt, sum / std::max(1, n));
  if (corpus.arithmetic && total > 0) accuracy = mean_over_ranks(*rt, static_cast<double>(correct) / total);
}

// A checkpoint after step `done`, tagged step-NNNNNN, with the trainer's state (step, seed, data).
void TrainRun::save_after(int done, bool async) {
  json ts = {{"step", done}, {"seed", o.seed}, {"data", corpus.name}, {"preset", o.preset}};
  char tag[32];
  snprintf(tag, sizeof(tag), "step-%06d", done);
  progress->update(std::string("saving ") + tag + " to " + o.save_dir);
  Status ss = eng->save(o.save_dir, tag, ts.dump(), async);
  if (!ss.is_ok()) {
    progress->done();
    fail(ss.with_context("saving a checkpoint after step " + std::to_string(done)));
  }
  saved_step = done;
}

// SIGINT/SIGTERM stop the run at the next step boundary; SIGTERM saves a final checkpoint
// first when there is a --save-dir. Unwinding destroys the engine, which removes swap files.
// Several ranks agree at each boundary (agree_on_stop): a signal to one rank alone (a batch
// system signals them one at a time) stops every rank after the same step, together.
void TrainRun::stop_if_asked(int done) {
  std::string which;
  const int sig = rt->world_size() > 1 ? agree_on_stop(&which) : stop.requested();
  if (sig == 0) return;
  stop.stopping();
  std::string saved;
  if (sig == SIGTERM && !o.save_dir.empty() && done > start_step && saved_step != done) {
    save_after(done, false);
    saved = fmt("; checkpoint step-%06d saved in %s", done, o.save_dir.c_str());
  }
  Status fs = eng->finish_save();
  progress->done();
  if (!fs.is_ok()) fail(fs.with_context("the last checkpoint, while stopping"));
  dump->close();  // the batches of the steps that ran
  eng.reset();
  throw CommandError{Status(StatusCode::kCancelled,
                            fmt("stopped by %s after step %d of %d%s%s", sig == SIGINT ? "SIGINT" : "SIGTERM",
                                done, o.steps, which.c_str(), saved.c_str())),
                     128 + sig};
}

// The stop every rank agrees on at a step boundary: each rank's signal (0: none) summed over the
// ranks, one slot per rank. SIGTERM when any rank got one (it saves a checkpoint), else SIGINT,
// else 0. `which` names the ranks that got a signal when not all of them did ("" otherwise). The
// collective is one value per rank, a few microseconds against a step.
int TrainRun::agree_on_stop(std::string* which) {
  const int world = rt->world_size();
  std::vector<double> got(static_cast<size_t>(world), 0.0);
  got[static_cast<size_t>(rt->rank())] = stop.requested();
  Status s = rt->sum(&got);
  if (!s.is_ok()) fail(s.with_context("agreeing over the ranks whether a signal stops the run"));
  std::vector<int> ranks;
  int sig = 0;
  for (int r = 0; r < world; ++r) {
    const int g = static_cast<int>(got[static_cast<size_t>(r)]);
    if (g == 0) continue;
    ranks.push_back(r);
    if (sig != SIGTERM) sig = g;
  }
  which->clear();
  if (sig == 0 || static_cast<int>(ranks.size()) == world) return sig;
  std::string list;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) list += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) list += fmt(" and %zu more", ranks.size() - 8);
  *which = fmt(" (the signal reached rank%s %s of %d; every rank stops after this step)",
               ranks.size() > 1 ? "s" : "", list.c_str(), world);
  return sig;
}

// The training loop: --save-initial, the evaluation of the starting weights (with --eval-every),
// then the steps.
void TrainRun::train() {
  accum = static_cast<int>(std::max<int64_t>(1, cfg.gradient_accumulation_steps()));
  t_start = clock_ns();
  stderr_tty = isatty(STDERR_FILENO) != 0;
  progress_every = std::max(1, (o.steps - start_step) / 10);
  last_line_s = now_s();
  if (o.save_initial) save_after(0, false);
  // With --eval-every, the first evaluation is of the weights the run starts from.
  if (o.eval_every > 0) {
    progress->update("evaluating the initial weights");
    evaluate();
    json ev = {{"step", start_step}, {"eval_loss", eval_loss}};
    if (!std::isnan(accuracy)) ev["accuracy"] = accuracy;
    evals.push_back(ev);
    accuracy_start = accuracy;
    eval_loss_start = eval_loss;
  }
  for (int step = start_step; step < o.steps; ++step) train_step(step);
}

// One step: the micro-batches' forward and backward, the optimizer step, its statistics, the
// evaluation and checkpoint it is due, and its progress line.
void TrainRun::train_step(int step) {
  stop_if_asked(step);
  const double step_t0 = now_s();
  double loss_sum = 0;
  for (int micro = 0; micro < accum; ++micro) {
    data::sample_batch(corpus.train, o.micro_batch, T, o.seed, static_cast<uint64_t>(step), rt->rank(), micro,
                       &tokens, &targets);
    dump->write(step, rt->rank(), micro, o.micro_batch, T, tokens, targets);
    auto l = trainer->forward_backward(tokens, targets);
    if (!l.is_ok()) {
      progress->done();
      fail(l.status().with_context("training step " + std::to_string(step + 1)));
    }
    loss_sum += l.value();
  }
  auto st = eng->step();
  if (!st.is_ok()) {
    progress->done();
    fail(st.status().with_context("optimizer step " + std::to_string(step + 1)));
  }
  last = st.value();
  const double step_wall = now_s() - step_t0;
  double loss = mean_over_ranks(*rt, loss_sum / accum);
  losses.push_back(loss);
  record_step(step_wall);
  stop_if_not_finite(step, loss);
  if (o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps)) {
    evaluate();
    json ev = {{"step", step + 1}, {"eval_loss", eval_loss}};
    if (!std::isnan(accuracy)) ev["accuracy"] = accuracy;
    evals.push_back(ev);
  }
  if (o.save_every > 0 && (step + 1) % o.save_every == 0) save_after(step + 1, o.save_async);
  progress_line(step, loss);
}

// A step whose loss or gradient norm is NaN or inf stops the run (exit 1): without fp16's dynamic
// loss scaler, which skips such a step and lowers the scale, the update has already spread it into
// the weights and every later step would report it, rc 0. Every rank sees the same values.
void TrainRun::stop_if_not_finite(int step, double loss) {
  if (std::isfinite(loss) && std::isfinite(last.grad_norm)) return;
  const auto static_scale = cfg.get_double("fp16.loss_scale");
  const bool dynamic_scaler =
      cfg.precision() == ComputeDType::kF16 && static_scale.is_ok() && static_scale.value() == 0;
  if (dynamic_scaler && last.skipped) return;
  progress->done();
  fail(invalid_argument(
      "zoe train stopped at step %d of %d: the loss is %g and the gradient norm %g, not finite numbers (%s); "
      "check optimizer.params (lr, weight_decay), gradient_clipping and the data",
      step + 1, o.steps, loss, last.grad_norm,
      dynamic_scaler ? "the fp16 loss scaler did not skip the step"
                     : "no fp16 dynamic loss scaler (fp16.enabled with loss_scale 0) skips such steps"));
}

// The step's statistics kept for the JSON: learning rate, gradient norm, times, bytes per parameter.
void TrainRun::record_step(double step_wall) {
  lrs.push_back(last.lr);
  grad_norms.push_back(last.grad_norm);
  step_times.push_back({{"compute", last.t_compute},
                        {"comm", last.t_comm},
                        {"io_stall", last.t_io_stall},
                        {"optimizer", last.t_optimizer},
                        {"wall", step_wall}});
  per_param.push_back(link_json(last.per_param_nvme_read, last.per_param_nvme_write,
                                last.per_param_host_to_device, last.per_param_device_to_host));
  comm_steps.push_back(last.t_comm);
  t_compute += last.t_compute;
  t_comm += last.t_comm;
  t_io += last.t_io_stall;
  t_opt += last.t_optimizer;
}

// The step's progress line: loss, tokens/s, NVMe rate, I/O stall share, ETA and the last
// evaluation. On a terminal every step; otherwise only the steps due.
void TrainRun::progress_line(int step, double loss) {
  double elapsed = static_cast<double>(clock_ns() - t_start) * 1e-9;
  double step_time = elapsed / (step + 1 - start_step);
  stop.note_step(step_time);
  double tokens_s =
      static_cast<double>(o.micro_batch) * T * accum * rt->world_size() / std::max(step_time, 1e-9);
  uint64_t nvme = last.bytes_nvme_read + last.bytes_nvme_write;
  double nvme_gbps = static_cast<double>(nvme - last_nvme) / std::max(step_time, 1e-9) * 1e-9;
  last_nvme = nvme;
  double wall_step = last.t_compute + last.t_comm + last.t_io_stall + last.t_optimizer;
  double stall = wall_step > 0 ? 100.0 * last.t_io_stall / wall_step : 0;
  std::string line =
      fmt("step %d/%d  loss %.4f  %.0f tok/s  nvme %.2f GB/s  stall %.0f%%  eta %s", step + 1, o.steps, loss,
          tokens_s, nvme_gbps, stall, fmt_eta(step_time * (o.steps - step - 1)).c_str());
  if (!std::isnan(eval_loss)) line += fmt("  eval %.4f", eval_loss);
  if (!std::isnan(accuracy)) line += fmt(" acc %.1f%%", 100 * accuracy);
  // Not a terminal (a log, CI): one line every progress_every steps and the last, not one per step.
  // The first steps show at once (the first result), then every progress_every steps, and at
  // least one line every 10 s of a long run.
  const bool due = (step + 1 - start_step) <= 3 || (step + 1) % progress_every == 0 || step + 1 == o.steps ||
                   now_s() - last_line_s >= 10.0;
  if (stderr_tty || due) {
    progress->update(line);
    last_line_s = now_s();
  }
}

// Every rank's t_comm per step, to every rank: a rank waiting for a slower one counts that wait
// as communication, so the ranks' times differ.
void TrainRun::gather_comm() {
  // One row of --steps per rank, the same size on every rank whatever steps each ran.
  const size_t w = static_cast<size_t>(rt->world_size());
  const size_t row = static_cast<size_t>(std::max(o.steps, 1));
  const size_t n = std::min(comm_steps.size(), row);
  std::vector<double> all(row * w, 0.0);
  std::copy(comm_steps.begin(), comm_steps.begin() + static_cast<ptrdiff_t>(n),
            all.begin() + static_cast<ptrdiff_t>(row * rt->rank()));
  Status s = rt->sum(&all);
  if (!s.is_ok()) fail(s.with_context("gathering every rank's communication time"));
  for (size_t r = 0; r < w; ++r)
    comm_by_rank.push_back(std::vector<double>(all.begin() + static_cast<ptrdiff_t>(row * r),
                                               all.begin() + static_cast<ptrdiff_t>(row * r + n)));
}

// After the last step: the pending checkpoint, the final evaluation and sample, --trace.
void TrainRun::finish() {
  gather_comm();
  Status fs = eng->finish_save();
  if (!fs.is_ok()) fail(fs.with_context("the last checkpoint"));
  progress->done();
  dump->close();
  if (o.eval_every <= 0) evaluate();
  if (sample_n > 0) take_sample(o.steps);
  if (!o.trace.empty()) {
    Status ts = eng->write_trace(o.trace + (rt->world_size() > 1 ? "." + std::to_string(rt->rank()) : ""));
    if (!ts.is_ok()) fail(ts.with_context("--trace"));
  }
}

// The run's JSON (--json, and --plot's input).
json TrainRun::summary_json() const {
  json j;
  j["params"] = mc.num_params();
  j["model"] = {
      {"layers", mc.layers}, {"d_model", mc.d_model}, {"heads", mc.heads}, {"context", mc.seq}, {"seq", T}};
  j["world_size"] = rt->world_size();
  j["stage"] = cfg.stage();
  j["offload"] = {{"optimizer", offload_name(cfg.offload_optimizer())},
                  {"param", offload_name(cfg.offload_param())}};
  j["precision"] = dtype_name(cfg.precision());
  j["micro_batch"] = o.micro_batch;
  j["gradient_accumulation_steps"] = accum;
  j["lr"] = cfg.lr();
  j["data"] = corpus.name;
  j["model_state_bytes"] = eng->model_state_bytes();
  j["device_budget_bytes"] = eng->device_budget_bytes();
  j["state_to_budget"] =
      static_cast<double>(eng->model_state_bytes()) / static_cast<double>(eng->device_budget_bytes());
  j["buffers"] = buffers_json(eng->buffer_sizes());
  j["high_water_bytes"] = {
      {"device", last.high_water[0]}, {"host", last.high_water[1]}, {"nvme", last.high_water[2]}};
  j["bytes_moved"] = {{"nvme->host", last.bytes_nvme_read},
                      {"host->nvme", last.bytes_nvme_write},
                      {"host->device", last.bytes_host_to_device},
                      {"device->host", last.bytes_device_to_host}};
  // The last step's (the steady state: the first steps record the fetch order and fill caches).
  j["bytes_per_param_per_step"] = per_param.empty() ? json::object() : per_param.back();
  j["step_bytes_per_param"] = per_param;
  j["time_s"] = {{"compute", t_compute}, {"comm", t_comm},   {"io_stall", t_io},
                 {"optimizer", t_opt},   {"total", total_s}, {"initialize", init_s}};
  j["losses"] = losses;
  j["lrs"] = lrs;
  j["grad_norms"] = grad_norms;
  j["step_time_s"] = step_times;
  j["comm_s_by_rank"] = comm_by_rank;
  // The last step's StepStats, every field (zoe/step_stats.h).
  j["step_stats"] = json::parse(step_stats_json(last));
  add_activation_json(&j);
  j["eval_loss"] = eval_loss;
  if (!std::isnan(accuracy)) j["accuracy"] = accuracy;
  j["evals"] = evals;
  if (sample_n > 0) {
    j["samples"] = samples;
    j["prompt"] = escape_bytes(o.prompt);
    j["temperature"] = o.temperature;
  }
  const model::CpuKernelSet ks = model::cpu_kernel_set();
  j["kernels"] = {{"simd", ks.simd}, {"blas", ks.blas}};
  j["steps"] = o.steps;
  j["start_step"] = start_step;
  j["tokens_per_s"] =
      static_cast<double>(o.steps - start_step) * o.micro_batch * T * accum * rt->world_size() / total_s;
  return j;
}

// The activation store's figures: the checkpointed bytes of a micro-batch (wherever they live),
// its high-water marks per tier, its bytes per link and its stall over the run (0 without
// checkpointing).
void TrainRun::add_activation_json(json* j) const {
  const ActivationStats a = eng->activations().stats();
  (*j)["activation_checkpoint_bytes"] = a.checkpoint_bytes;
  (*j)["high_water_bytes"]["activation_device"] = a.high_water_device;
  (*j)["high_water_bytes"]["activation_host"] = a.high_water_host;
  (*j)["high_water_bytes"]["activation_nvme"] = a.high_water_nvme;
  (*j)["activation_bytes_moved"] = {{"device->host", a.bytes_device_to_host},
                                    {"host->device", a.bytes_host_to_device},
                                    {"host->nvme", a.bytes_nvme_write},
                                    {"nvme->host", a.bytes_nvme_read}};
  (*j)["time_s"]["activation_stall"] = a.t_stall;
}

// --plot: the run's curves drawn from its JSON.
void TrainRun::plot(const json& j) const {
  if (o.plot.empty()) return;
  Progress plotting(!o.quiet);
  plotting.update("plotting " + o.plot);
  Status ps = write_plot("train", j.dump(), o.plot);
  plotting.done();
  if (!ps.is_ok()) fail(ps.with_context("--plot " + o.plot));
}

// The text summary: what was trained, the loss and accuracy it reached, the samples, the bytes.
void TrainRun::print_summary(const json& j) const {
  printf("# zoe train: %s, %llu parameters (%d layers, d %d, %d heads), seq %d, %s, world %d\n",
         corpus.name.c_str(), static_cast<unsigned long long>(mc.num_params()), mc.layers, mc.d_model,
         mc.heads, T, j["precision"].get<std::string>().c_str(), rt->world_size());
  printf("loss            %.4f -> %.4f over steps %d-%d; eval loss %.4f", losses.front(), losses.back(),
         start_step + 1, o.steps, eval_loss);
  if (!std::isnan(accuracy)) printf("; exact-match accuracy %.1f%%", 100 * accuracy);
  printf("\n");
  if (!std::isnan(accuracy) && !std::isnan(accuracy_start)) {
    printf(
        "learned         exact-match accuracy on held-out additions %.1f%% -> %.1f%% in %d steps (%.0fs)\n",
        100 * accuracy_start, 100 * accuracy, o.steps - start_step, total_s);
  }
  if (sample_n > 0) print_samples();
  printf("\n");
  print_bytes_table(j);
}

// Each sample's text, and (on a text corpus) how many of its words the text has, first to last.
void TrainRun::print_samples() const {
  for (const json& sm : samples) {
    printf("sample          after step %d (temperature %g", sm["step"].get<int>(), o.temperature);
    if (!corpus.arithmetic) {
      printf("; %.0f%% of its %zu words occur in the text", 100 * sm["known_words"].get<double>(),
             sm["words"].get<size_t>());
    }
    printf("):\n");
    print_indented(sm["text"].get<std::string>(), "                | ");
  }
  const json &a = samples.front(), &b = samples.back();
  if (!corpus.arithmetic)
    printf("learned         words of a sample found in the text %.0f%% -> %.0f%%",
           100 * a["known_words"].get<double>(), 100 * b["known_words"].get<double>());
  if (!corpus.arithmetic) {
    if (!std::isnan(eval_loss_start)) printf("; eval loss %.3f -> %.3f", eval_loss_start, eval_loss);
    printf(" in %d steps (%.0fs)\n", o.steps - start_step, total_s);
  }
}

// The memory and traffic table, bytes per parameter of the last step, and where the time went.
void TrainRun::print_bytes_table(const json& j) const {
  Table t({{"", "", 22, true}, {"bytes", "", 14}, {"", "", 10}});
  t.print_header(stdout);
  auto row = [&](const std::string& name, uint64_t v) {
    t.print_row(stdout, {name, std::to_string(v), format_bytes(v)});
  };
  row("model state / rank", eng->model_state_bytes());
  row("device budget", eng->device_budget_bytes());
  row("device high water", last.high_water[0]);
  row("host high water", last.high_water[1]);
  row("nvme high water", last.high_water[2]);
  row("moved nvme->host", last.bytes_nvme_read);
  row("moved host->nvme", last.bytes_nvme_write);
  row("moved host->device", last.bytes_host_to_device);
  if (ckpt) {  // the activation store
    const ActivationStats a = eng->activations().stats();
    row("checkpoints / micro", a.checkpoint_bytes);
    row("activation dev hw", a.high_water_device);
    row("activation host hw", a.high_water_host);
    row("activation nvme hw", a.high_water_nvme);
    row("activations to nvme", a.bytes_nvme_write);
    printf("activation checkpointing, offload %s: stall %.2fs over the run\n",
           activation_offload_name(eng->activations().offload()), a.t_stall);
  }
  printf(
      "\nbytes per parameter in the last step: nvme->host %.2f, host->nvme %.2f, host->device %.2f, "
      "device->host %.2f",
      last.per_param_nvme_read, last.per_param_nvme_write, last.per_param_host_to_device,
      last.per_param_device_to_host);
  printf(
      "\nstate / device budget = %.1fx; time: compute %.1fs, comm %.1fs, I/O stall %.1fs, optimizer %.1fs, "
      "total %.1fs\n",
      j["state_to_budget"].get<double>(), t_compute, t_comm, t_io, t_opt, total_s);
}

void run(TrainOpts o) {
  check_flags(o);
  TrainRun r(std::move(o));
  r.check_seq();
  r.start_runtime();
  r.build_config();
  r.load_data();
  r.build_engine();
  r.resume();
  r.build_model();
  r.train();
  r.finish();
  if (!r.lead) return;
  r.total_s = static_cast<double>(clock_ns() - r.t_start) * 1e-9;
  const json j = r.summary_json();
  r.plot(j);
  if (r.o.json) {
    print_json(j);
    return;
  }
  r.print_summary(j);
}

}  // namespace

static void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOpts>();
  CLI::App* cmd = add_train_options(app, o.get());
  cmd->callback([o, cmd] {
    for (const CLI::Option* opt : cmd->get_options()) {
      if (opt->count() > 0) o->given.insert(opt->get_name());
    }
    run(*o);
  });
}

// Joins the program this file is linked into (the `zoe` program).
static const CommandRegistrar kRegister(20, "", "", add_train_command);

}  // namespace zoe::cli
