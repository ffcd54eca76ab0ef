// `zoe verify`: trust a placement in one command. Trains the reference GPT K steps twice, on the
// same batches from the same initial weights: in the placement the config asks for, and in a
// reference placement (ZeRO stage 0, nothing offloaded, no device budget, no activation offload,
// the micro-batch schedule; the same precision, optimizer, state formats, batch and clipping), and
// compares the losses, the gradient norms and the master weights after every step, then every
// optimizer state (master, Adam's m and v) from each run's checkpoint, bit for bit. zoe's
// placements give the same bits on one rank, so any difference is a wrong result: the verdict
// names the first step and tensor that differ.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "model/corpus.h"
#include "model/gpt_trainer.h"
#include "tools/stop_signals.h"
#include "zoe/checkpoint.h"
#include "zoe/cli.h"
#include "zoe/zoe.h"

namespace zoe::cli {
namespace {

using nlohmann::json;

struct VerifyOpts {
  std::string config;
  std::string hf_config;
  std::string preset = "small";
  int steps = 4;
  int seq = 0;
  uint64_t seed = 1;
  int threads = 0;
  std::string work_dir;
  bool json = false;
};

// One of the two runs: its engine, model and trainer.
struct Run {
  std::unique_ptr<Engine> eng;
  std::unique_ptr<model::GptCpu> gpt;
  std::vector<std::unique_ptr<model::GptCpu>> more;  // layer-major: micro-batches 1..G-1's models
  std::vector<model::GptCpu*> models;
  std::unique_ptr<model::GptTrainer> trainer;
  int64_t accum = 1;  // micro-batches a step
  // The samples of its micro-batch j of a step: those of rank (first_rank + j / per_rank) and
  // micro-batch j % per_rank of a run of that many micro-batches per rank (the configured run:
  // its own rank's; the one-rank reference of a multi-rank run: every rank's, in rank order).
  int first_rank = 0;
  int64_t per_rank = 1;
  Runtime* rt = nullptr;  // the configured run's, to average its loss over the ranks
  std::vector<double> losses, grad_norms;
};

// The reference placement of `cfg`: everything on the device of one rank, in the plain schedule.
Config reference_config(const Config& cfg) {
  Config ref = cfg;
  for (const auto& [key, value] : std::vector<std::pair<const char*, const char*>>{
           {"zero_optimization.offload_optimizer", "{\"device\": \"none\"}"},
           {"zero_optimization.offload_param", "{\"device\": \"none\"}"},
           {"zero_optimization.stage", "0"},
           {"zoe.device_budget", "0"},
           {"zoe.host_budget", "0"},
           {"zoe.activation_offload", "\"none\""},
           {"zoe.schedule", "\"micro-batch\""}}) {
    Status s = ref.set(key, value);
    if (!s.is_ok()) fail(s.with_context("making the reference placement"));
  }
  return ref;
}

Run build(Runtime& rt, const Config& cfg, const model::GptConfig& mc, int T, const VerifyOpts& o, bool ckpt,
          const std::string& what) {
  Run r;
  r.eng = value_or_fail(Engine::create(rt, cfg));
  Status s = model::add_gpt_modules(*r.eng, mc);
  if (s.is_ok()) {
    s = r.eng->initialize(
        [&](size_t m, size_t p, float* x, size_t n) { model::gpt_init(mc, o.seed, m, p, x, n); });
  }
  if (!s.is_ok()) fail(s.with_context("zoe verify: the " + what + " run"));
  const int batch = static_cast<int>(cfg.micro_batch());
  r.gpt = value_or_fail(model::GptCpu::create(mc, batch, T, o.threads, ckpt));
  r.models = {r.gpt.get()};
  if (r.eng->schedule() == "layer-major") {
    for (int64_t g = 1; g < cfg.gradient_accumulation_steps(); ++g) {
      r.more.push_back(value_or_fail(model::GptCpu::create(mc, batch, T, o.threads, ckpt)));
      r.models.push_back(r.more.back().get());
    }
  }
  r.trainer = std::make_unique<model::GptTrainer>(*r.eng, *r.gpt, mc, T);
  return r;
}

// One step of `r` on step k's micro-batches (the same for both runs); its loss and norm recorded.
void step(Run& r, const data::Corpus& corpus, int batch, int T, int k, uint64_t seed,
          const std::string& what) {
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(r.accum)), targets(tokens.size());
  for (int64_t j = 0; j < r.accum; ++j) {
    data::sample_batch(corpus.train, batch, T, seed, static_cast<uint64_t>(k),
                       r.first_rank + static_cast<int>(j / r.per_rank), static_cast<int>(j % r.per_rank),
                       &tokens[static_cast<size_t>(j)], &targets[static_cast<size_t>(j)]);
  }
  double loss = 0;
  if (r.models.size() > 1) {
    auto l = r.trainer->forward_backward_layer_major(tokens, targets, r.models);
    if (!l.is_ok())
      fail(l.status().with_context("zoe verify: the " + what + " run, step " + std::to_string(k + 1)));
    for (float x : l.value()) loss += x;
  } else {
    for (size_t j = 0; j < tokens.size(); ++j) {
      auto l = r.trainer->forward_backward(tokens[j], targets[j]);
      if (!l.is_ok())
        fail(l.status().with_context("zoe verify: the " + what + " run, step " + std::to_string(k + 1)));
      loss += l.value();
    }
  }
  auto st = r.eng->step();
  if (!st.is_ok())
    fail(st.status().with_context("zoe verify: the " + what + " run, step " + std::to_string(k + 1)));
  loss /= static_cast<double>(r.accum);
  if (r.rt != nullptr && r.rt->world_size() > 1) loss = value_or_fail(r.rt->average(loss));
  r.losses.push_back(loss);
  r.grad_norms.push_back(st.value().grad_norm);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The first tensor whose values differ beyond the tolerance, as "<module>.<param>.<kind>", and how
// many elements differ ("" when none). Masters through the engines (after a step); every state
// from the checkpoints.
struct Diff {
  std::string tensor;
  uint64_t elements = 0;
  uint64_t numel = 0;
  double max_abs = 0;
};

// What counts as the same. One rank against its reference: the same bits. A multi-rank run against
// its one-rank reference sums the gradients in another order, so it cannot match bit for bit:
// losses and gradient norms within rel_scalar of the reference's; Adam's moments with each
// tensor's largest difference within rel_tensor of its largest magnitude; masters within
// master_lr_per_step x lr x the steps taken of the reference's (Adam's normalised update turns a
// rounding difference in a near-zero gradient into a difference of a fraction of lr: measured
// 0.004 lr at fp32, where a wrong gradient element moves its weight by up to 2 lr). The verdict
// is then "within_tolerance". Notes the first bitwise difference either way.
struct Checker {
  bool tolerant = false;
  double rel_scalar = 0, rel_tensor = 0, master_lr_per_step = 0, lr = 0;
  json first_bits = nullptr;

  double master_tol(int step) const { return master_lr_per_step * lr * step; }

  void note(int step, const std::string& name) {
    if (first_bits.is_null()) first_bits = {{"step", step}, {"tensor", name}};
  }
  bool scalar_over(int step, const char* name, double a, double b) {
    if (std::memcmp(&a, &b, sizeof(double)) == 0) return false;
    note(step, name);
    return !tolerant || !(std::fabs(a - b) <= rel_scalar * std::fabs(b));
  }
  // abs_tol >= 0: an absolute tolerance instead of rel_tensor.
  Diff tensor(int step, const std::string& name, const std::vector<float>& a, const std::vector<float>& b,
              double abs_tol = -1) {
    Diff d;
    if (same_bits(a, b)) return d;
    note(step, name);
    double scale = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
      if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
      ++d.elements;
      const double diff = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
      d.max_abs = std::isnan(diff) ? INFINITY : std::max(d.max_abs, diff);
    }
    const double tol = abs_tol >= 0 ? abs_tol : rel_tensor * scale;
    if (!tolerant || a.size() != b.size() || !(d.max_abs <= tol)) {
      d.tensor = name;
      d.numel = a.size();
    }
    return d;
  }
};

Diff compare_masters(Run& a, Run& b, const std::vector<model::ModuleSpec>& specs, Checker& c, int step) {
  for (size_t m = 0; m < specs.size(); ++m) {
    for (size_t p = 0; p < specs[m].params.size(); ++p) {
      std::vector<float> x(specs[m].params[p].numel()), y(x.size());
      if (Status s = a.eng->read_master(m, p, x.data()); !s.is_ok()) fail(s);
      if (Status s = b.eng->read_master(m, p, y.data()); !s.is_ok()) fail(s);
      Diff d =
          c.tensor(step, specs[m].name + "." + specs[m].params[p].name + ".master", x, y, c.master_tol(step));
      if (!d.tensor.empty()) return d;
    }
  }
  return {};
}

// Every state of every parameter in the two checkpoints (Adam's m and v where both hold them).
Diff compare_checkpoints(const std::string& da, const std::string& db, Checker& c, int step) {
  auto ra = value_or_fail(CheckpointReader::open(da));
  auto rb = value_or_fail(CheckpointReader::open(db));
  for (size_t i = 0; i < ra->params().size(); ++i) {
    const CheckpointParam& p = ra->params()[i];
    for (const char* kind : {"master", "exp_avg", "exp_avg_sq"}) {
      std::vector<float> x(p.numel), y(p.numel);
      Status sa = ra->read_state_f32(i, kind, x.data()), sb = rb->read_state_f32(i, kind, y.data());
      if (sa.code() == StatusCode::kNotFound && sb.code() == StatusCode::kNotFound) continue;
      if (!sa.is_ok()) fail(sa);
      if (!sb.is_ok()) fail(sb);
      Diff d = c.tensor(step, p.full_name() + "." + kind, x, y,
                        std::strcmp(kind, "master") == 0 ? c.master_tol(step) : -1.0);
      if (!d.tensor.empty()) return d;
    }
  }
  return {};
}

void save(Run& r, const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  Status s = r.eng->save(dir, "verify", "{}");
  if (!s.is_ok()) fail(s.with_context("zoe verify: saving the " + what + " run's states"));
}

// The two runs trained and compared: the first difference beyond the checker's tolerance.
struct Outcome {
  json first = nullptr;
  Diff diff;
};

Outcome train_and_compare(Run& a, Run& b, const VerifyOpts& o, const model::GptConfig& mc, int T, int batch,
                          const std::string& work, int rank, Checker& c, StopSignals& stop,
                          Progress& progress) {
  const data::Corpus corpus = data::make_arithmetic(o.seed, 20000);
  const std::vector<model::ModuleSpec> specs = model::gpt_modules(mc);
  Outcome out;
  for (int k = 0; k < o.steps && out.first.is_null(); ++k) {
    if (const int sig = stop.requested(); sig != 0) {
      stop.stopping();
      progress.done();
      throw CommandError{
          Status(StatusCode::kCancelled, fmt("zoe verify stopped by %s after step %d of %d: no "
                                             "verdict",
                                             sig == SIGINT ? "SIGINT" : "SIGTERM", k, o.steps)),
          128 + sig};
    }
    progress.update(fmt("zoe verify: step %d of %d", k + 1, o.steps));
    step(a, corpus, batch, T, k, o.seed, "configured");
    step(b, corpus, batch, T, k, o.seed, "reference");
    if (c.scalar_over(k + 1, "loss", a.losses[k], b.losses[k])) {
      out.first = {{"step", k + 1}, {"tensor", "loss"}};
    } else if (c.scalar_over(k + 1, "grad_norm", a.grad_norms[k], b.grad_norms[k])) {
      out.first = {{"step", k + 1}, {"tensor", "grad_norm"}};
    } else if (out.diff = compare_masters(a, b, specs, c, k + 1); !out.diff.tensor.empty()) {
      out.first = {{"step", k + 1}, {"tensor", out.diff.tensor}};
    }
  }
  if (out.first.is_null()) {
    progress.update("zoe verify: comparing every optimizer state");
    save(a, work + "/configured", "configured");  // every rank's share
    const std::string mine = work + "/reference-" + std::to_string(rank);
    save(b, mine, "reference");
    out.diff = compare_checkpoints(work + "/configured", mine, c, o.steps);
    if (!out.diff.tensor.empty()) out.first = {{"step", o.steps}, {"tensor", out.diff.tensor}};
  }
  return out;
}

void report(const VerifyOpts& o, const Outcome& out, const Checker& c, const Run& a, const Run& b,
            uint64_t params, int world) {
  const std::string verdict =
      !out.first.is_null() ? "diverged" : (c.first_bits.is_null() ? "identical" : "within_tolerance");
  json j = {{"verdict", verdict},
            {"first_divergence", out.first},
            {"first_difference", c.first_bits},
            {"steps", o.steps},
            {"world_size", world},
            {"config", o.config},
            {"preset", o.preset},
            {"params", params},
            {"losses", {{"configured", a.losses}, {"reference", b.losses}}},
            {"grad_norms", {{"configured", a.grad_norms}, {"reference", b.grad_norms}}},
            {"compared",
             "losses, gradient norms and masters after every step; master, exp_avg and exp_avg_sq "
             "of every parameter at the end"},
            {"tolerance", c.tolerant ? json{{"loss_and_grad_norm_relative", c.rel_scalar},
                                            {"moment_max_difference_relative_to_its_largest", c.rel_tensor},
                                            {"master_max_difference_in_lr_per_step", c.master_lr_per_step}}
                                     : json("bit for bit")}};
  if (!out.diff.tensor.empty()) {
    j["differing_elements"] = out.diff.elements;
    j["tensor_elements"] = out.diff.numel;
    j["max_abs_difference"] = out.diff.max_abs;
  }
  if (o.json) {
    print_json(j);
  } else if (verdict == "identical") {
    printf(
        "zoe verify: identical. %d steps of %s in %s and in the reference placement (stage 0, nothing "
        "offloaded, one rank) gave the same losses, gradient norms and optimizer states, bit for bit.\n",
        o.steps, o.preset.c_str(), o.config.c_str());
  } else if (verdict == "within_tolerance") {
    printf(
        "zoe verify: within tolerance. %d steps of %s in %s on %d ranks and in the one-rank reference "
        "placement agree within the tolerance (losses and gradient norms %g relative; Adam's moments %g of "
        "each tensor's largest value; masters %g lr a step); the first bitwise difference (expected: the %d "
        "ranks sum the gradients in another order) is %s at step %d.\n",
        o.steps, o.preset.c_str(), o.config.c_str(), world, c.rel_scalar, c.rel_tensor, c.master_lr_per_step,
        world, c.first_bits["tensor"].get<std::string>().c_str(), c.first_bits["step"].get<int>());
  } else {
    printf("zoe verify: DIVERGED at step %d: %s differs from the reference placement's",
           out.first["step"].get<int>(), out.first["tensor"].get<std::string>().c_str());
    if (!out.diff.tensor.empty()) {
      printf(" (%llu of %llu elements, max |difference| %g)",
             static_cast<unsigned long long>(out.diff.elements),
             static_cast<unsigned long long>(out.diff.numel), out.diff.max_abs);
    }
    printf(".\n");
  }
}

void run(const VerifyOpts& o) {
  // SIGINT/SIGTERM: the swap files go at once and the run stops at the next step boundary, with no
  // verdict (as zoe train stops); before any engine thread starts, so that they inherit the mask.
  StopSignals stop;
  auto rt = value_or_fail(Runtime::init());
  const int world = rt->world_size(), rank = rt->rank();
  const Config cfg = value_or_fail(Config::load(o.config, world));
  // Under mpirun the reference is one rank all the same (a local runtime on every rank, each
  // computing it alike): it runs every rank's micro-batches, rank after rank, as its own.
  std::unique_ptr<Runtime> local = world > 1 ? value_or_fail(Runtime::init(true)) : nullptr;
  Config ref = reference_config(cfg);
  if (world > 1) {
    if (Status s = ref.set_gradient_accumulation_steps(cfg.gradient_accumulation_steps() * world); !s.is_ok())
      fail(s.with_context("making the one-rank reference of a " + std::to_string(world) + "-rank run"));
  }
  std::string names;
  const model::GptPreset* pr = model::find_gpt_preset(o.preset, &names);
  if (pr == nullptr)
    usage_fail(invalid_argument("--preset %s is not one of %s", o.preset.c_str(), names.c_str()));
  model::GptConfig mc;
  mc.layers = pr->layers;
  mc.d_model = pr->d_model;
  mc.heads = pr->heads;
  mc.seq = pr->context;
  if (Status s = mc.validate(); !s.is_ok()) fail(s);
  const int T = o.seq > 0 ? std::min(o.seq, mc.seq) : mc.seq;
  // One work directory for all ranks (the configured run's checkpoint is written by every rank):
  // rank 0's name, removed by rank 0 once every rank is done with it.
  uint64_t pid = static_cast<uint64_t>(getpid());
  if (Status s = rt->broadcast(&pid, sizeof(pid), 0); !s.is_ok()) fail(s);
  const std::string work =
      o.work_dir.empty()
          ? (std::filesystem::temp_directory_path() / ("zoe-verify-" + std::to_string(pid))).string()
          : o.work_dir;
  // The temporary directory goes however the run ends (a verdict, an error, a signal).
  struct RemoveAtExit {
    std::string dir;
    ~RemoveAtExit() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } remove_at_exit{o.work_dir.empty() && rank == 0 ? work : std::string()};
  Progress progress(!o.json && rank == 0);
  Run a = build(*rt, cfg, mc, T, o, cfg.activation_checkpointing().given, "configured");
  a.accum = std::max<int64_t>(1, cfg.gradient_accumulation_steps());
  a.per_rank = a.accum;
  a.first_rank = rank;
  a.rt = rt.get();
  Run b = build(local ? *local : *rt, ref, mc, T, o, false, "reference");
  b.accum = a.accum * world;
  b.per_rank = a.accum;
  Checker c;
  c.tolerant = world > 1;
  const bool fp32 = cfg.precision() == ComputeDType::kF32;
  c.rel_scalar = fp32 ? 1e-4 : 2e-2;
  c.rel_tensor = fp32 ? 1e-4 : 2e-2;
  c.master_lr_per_step = fp32 ? 0.1 : 2.0;
  c.lr = cfg.lr();
  const Outcome out =
      train_and_compare(a, b, o, mc, T, static_cast<int>(cfg.micro_batch()), work, rank, c, stop, progress);
  progress.done();
  if (Status s = rt->barrier(); !s.is_ok()) fail(s);  // every rank has read the checkpoints
  if (rank == 0) report(o, out, c, a, b, mc.num_params(), world);
  if (!out.first.is_null()) {
    fail(internal_error(
        "the placement in %s trains differently from the reference placement (first at step %d, "
        "%s): a wrong result in zoe; please report it with the config",
        o.config.c_str(), out.first["step"].get<int>(), out.first["tensor"].get<std::string>().c_str()));
  }
}

// --hf-config: a Hugging Face model runs through zoe's Python package (zoe.verification), in the
// interpreter ZOE_PYTHON names (the pip-installed `zoe` command sets it to its own) or python3.
[[noreturn]] void run_hf(const VerifyOpts& o) {
  const char* env = std::getenv("ZOE_PYTHON");
  const std::string py = env != nullptr && *env != '\0' ? env : "python3";
  // A Python without zoe or transformers says what to do instead of a bare ModuleNotFoundError.
  const std::string boot =
      "import sys\n"
      "try:\n"
      "    from zoe.verification import main\n"
      "    import transformers\n"
      "except ImportError as e:\n"
      "    sys.stderr.write(f'zoe verify: error: --hf-config needs zoe and transformers in {sys.executable} "
      "({e}): "
      "pip install . there, or set ZOE_PYTHON to a Python that has them\\n')\n"
      "    sys.exit(2)\n"
      "sys.exit(main(sys.argv[1:]))\n";
  std::vector<std::string> args = {py,
                                   "-c",
                                   boot,
                                   "--config",
                                   o.config,
                                   "--hf-config",
                                   o.hf_config,
                                   "--steps",
                                   std::to_string(o.steps),
                                   "--seed",
                                   std::to_string(o.seed)};
  if (o.seq > 0) args.insert(args.end(), {"--seq", std::to_string(o.seq)});
  if (!o.work_dir.empty()) args.insert(args.end(), {"--work-dir", o.work_dir});
  if (o.json) args.emplace_back("--json");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  fflush(stdout);
  execvp(py.c_str(), argv.data());
  const int err = errno;
  fail(make_status(
      StatusCode::kNotFound,
      "--hf-config runs the Hugging Face model through zoe's Python package, and %s could not be "
      "started (%s): set ZOE_PYTHON to a Python with zoe and transformers installed (pip install .), "
      "or run the `zoe` command that pip installed",
      py.c_str(), std::strerror(err)));
}

}  // namespace

static void add_verify_command(CLI::App& app) {
  auto o = std::make_shared<VerifyOpts>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "Trust a placement: train the reference GPT --steps steps in the placement --config asks for and in a\n"
      "reference placement (ZeRO stage 0, nothing offloaded, no device budget; the same precision, "
      "optimizer,\n"
      "state formats and batch), on the same batches from the same weights, and compare the losses, "
      "gradient\n"
      "norms and masters after every step and every optimizer state (master, Adam's m and v) at the end,\n"
      "bit for bit. zoe's placements give the same bits on one rank: a difference is a wrong result, and "
      "the\n"
      "verdict names the first step and tensor that differ (exit code 1). Under mpirun the configured run\n"
      "takes the ranks and the reference stays one rank (each rank's micro-batches in turn): they sum in\n"
      "another order, so they agree within a tolerance (\"within_tolerance\"; fp32: losses and gradient\n"
      "norms 1e-4 relative, Adam's moments 1e-4 of each tensor's largest value, masters 0.1 lr a step;\n"
      "bf16/fp16: 2e-2, 2e-2 and 2 lr, coarse: it catches gross errors, not one wrong element).\n"
      "The work directory must then be one every rank reaches (--work-dir on a shared file system across\n"
      "nodes). With --hf-config, a\n"
      "Hugging Face causal LM from its config instead of the reference GPT (through zoe's Python package).");
  cmd->add_option("--config", o->config, "The DeepSpeed-style config to verify")->required();
  CLI::Option* preset =
      cmd->add_option("--preset", o->preset, "Model size: tiny, small, demo, medium, large, 2b")
          ->capture_default_str();
  cmd->add_option(
         "--hf-config", o->hf_config,
         "A Hugging Face causal LM instead of the reference GPT: a transformers config.json, a folder\n"
         "holding one, or a model name in the local cache (random weights and tokens, dropout kept;\n"
         "run through zoe's Python package: ZOE_PYTHON or python3 with zoe and transformers)")
      ->excludes(preset);
  cmd->add_option("--steps", o->steps, "Optimizer steps of each run")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--seq", o->seq, "Tokens per sequence (default: the preset's context)")
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--seed", o->seed, "Initial weights and batches")->capture_default_str();
  cmd->add_option("--threads", o->threads, "Compute threads (0: all cores)")->check(CLI::Range(0, 4096));
  cmd->add_option(
      "--work-dir", o->work_dir,
      "Where the two runs' checkpoints are written and kept (default: a temporary directory, removed)");
  cmd->add_flag("--json", o->json,
                "Print one JSON object {verdict: identical|within_tolerance|diverged, first_divergence: "
                "{step, tensor} | "
                "null, first_difference (the first bitwise one), ...}");
  cmd->callback([o] {
    if (!o->hf_config.empty()) run_hf(*o);
    run(*o);
  });
}

// Joins the program this file is linked into (the `zoe` program).
static const CommandRegistrar kRegister(25, "", "", add_verify_command);

}  // namespace zoe::cli
