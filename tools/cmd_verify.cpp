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
    data::sample_batch(corpus.train, batch, T, seed, static_cast<uint64_t>(k), 0, static_cast<int>(j),
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
  r.losses.push_back(loss / static_cast<double>(r.accum));
  r.grad_norms.push_back(st.value().grad_norm);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The first tensor whose values differ, as "<module>.<param>.<kind>", and how many elements do
// ("" when none). Masters through the engines (after a step); every state from the checkpoints.
struct Diff {
  std::string tensor;
  uint64_t elements = 0;
  uint64_t numel = 0;
  double max_abs = 0;
};

Diff compare(const std::string& name, const std::vector<float>& a, const std::vector<float>& b) {
  Diff d;
  if (same_bits(a, b)) return d;
  d.tensor = name;
  d.numel = a.size();
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    ++d.elements;
    d.max_abs = std::max(d.max_abs, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return d;
}

Diff compare_masters(Run& a, Run& b, const std::vector<model::ModuleSpec>& specs) {
  for (size_t m = 0; m < specs.size(); ++m) {
    for (size_t p = 0; p < specs[m].params.size(); ++p) {
      std::vector<float> x(specs[m].params[p].numel()), y(x.size());
      if (Status s = a.eng->read_master(m, p, x.data()); !s.is_ok()) fail(s);
      if (Status s = b.eng->read_master(m, p, y.data()); !s.is_ok()) fail(s);
      Diff d = compare(specs[m].name + "." + specs[m].params[p].name + ".master", x, y);
      if (!d.tensor.empty()) return d;
    }
  }
  return {};
}

// Every state of every parameter in the two checkpoints (Adam's m and v where both hold them).
Diff compare_checkpoints(const std::string& da, const std::string& db) {
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
      Diff d = compare(p.full_name() + "." + kind, x, y);
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

void run(const VerifyOpts& o) {
  // SIGINT/SIGTERM: the swap files go at once and the run stops at the next step boundary, with no
  // verdict (as zoe train stops); before any engine thread starts, so that they inherit the mask.
  StopSignals stop;
  auto rt = value_or_fail(Runtime::init());
  if (rt->world_size() != 1) {
    usage_fail(
        invalid_argument("zoe verify runs on one rank (its reference is one rank): run it without mpirun; "
                         "%d ranks were started",
                         rt->world_size()));
  }
  const Config cfg = value_or_fail(Config::load(o.config, 1));
  const Config ref = reference_config(cfg);
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
  const bool ckpt = cfg.activation_checkpointing().given;
  const int batch = static_cast<int>(cfg.micro_batch());
  const data::Corpus corpus = data::make_arithmetic(o.seed, 20000);
  const std::string work =
      o.work_dir.empty()
          ? (std::filesystem::temp_directory_path() / ("zoe-verify-" + std::to_string(getpid()))).string()
          : o.work_dir;
  // The temporary directory goes however the run ends (a verdict, an error, a signal).
  struct RemoveAtExit {
    std::string dir;
    ~RemoveAtExit() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } remove_at_exit{o.work_dir.empty() ? work : std::string()};
  Progress progress(!o.json);
  Run a = build(*rt, cfg, mc, T, o, ckpt, "configured");
  a.accum = std::max<int64_t>(1, cfg.gradient_accumulation_steps());
  Run b = build(*rt, ref, mc, T, o, false, "reference");
  b.accum = a.accum;
  const std::vector<model::ModuleSpec> specs = model::gpt_modules(mc);
  json first = nullptr;
  Diff diff;
  for (int k = 0; k < o.steps && first.is_null(); ++k) {
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
    if (std::memcmp(&a.losses[k], &b.losses[k], sizeof(double)) != 0) {
      first = {{"step", k + 1}, {"tensor", "loss"}};
    } else if (std::memcmp(&a.grad_norms[k], &b.grad_norms[k], sizeof(double)) != 0) {
      first = {{"step", k + 1}, {"tensor", "grad_norm"}};
    } else if (diff = compare_masters(a, b, specs); !diff.tensor.empty()) {
      first = {{"step", k + 1}, {"tensor", diff.tensor}};
    }
  }
  if (first.is_null()) {
    progress.update("zoe verify: comparing every optimizer state");
    save(a, work + "/configured", "configured");
    save(b, work + "/reference", "reference");
    diff = compare_checkpoints(work + "/configured", work + "/reference");
    if (!diff.tensor.empty()) first = {{"step", o.steps}, {"tensor", diff.tensor}};
  }
  progress.done();
  const std::string verdict = first.is_null() ? "identical" : "diverged";
  json j = {{"verdict", verdict},
            {"first_divergence", first},
            {"steps", o.steps},
            {"config", o.config},
            {"preset", o.preset},
            {"params", mc.num_params()},
            {"losses", {{"configured", a.losses}, {"reference", b.losses}}},
            {"grad_norms", {{"configured", a.grad_norms}, {"reference", b.grad_norms}}},
            {"compared",
             "losses, gradient norms and masters after every step; master, exp_avg and exp_avg_sq "
             "of every parameter at the end"}};
  if (!diff.tensor.empty()) {
    j["differing_elements"] = diff.elements;
    j["tensor_elements"] = diff.numel;
    j["max_abs_difference"] = diff.max_abs;
  }
  if (o.json) {
    print_json(j);
  } else if (first.is_null()) {
    printf(
        "zoe verify: identical. %d steps of %s in %s and in the reference placement (stage 0, nothing "
        "offloaded) gave the same losses, gradient norms and optimizer states, bit for bit.\n",
        o.steps, o.preset.c_str(), o.config.c_str());
  } else {
    printf("zoe verify: DIVERGED at step %d: %s differs from the reference placement's",
           first["step"].get<int>(), first["tensor"].get<std::string>().c_str());
    if (!diff.tensor.empty()) {
      printf(" (%llu of %llu elements, max |difference| %g)", static_cast<unsigned long long>(diff.elements),
             static_cast<unsigned long long>(diff.numel), diff.max_abs);
    }
    printf(".\n");
  }
  if (!first.is_null()) {
    fail(internal_error(
        "the placement in %s trains differently from the reference placement (first at step %d, "
        "%s): a wrong result in zoe; please report it with the config",
        o.config.c_str(), first["step"].get<int>(), first["tensor"].get<std::string>().c_str()));
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
      "verdict names the first step and tensor that differ (exit code 1). One rank. With --hf-config, a\n"
      "Hugging Face causal LM from its config instead of the reference GPT (through zoe's Python package).");
  cmd->add_option("--config", o->config, "The DeepSpeed-style config to verify")->required();
  CLI::Option* preset =
      cmd->add_option("--preset", o->preset, "Model size: tiny, small, demo, medium, large, 2b")
          ->capture_default_str();
  cmd->add_option(
         "--hf-config", o->hf_config,
         "A Hugging Face causal LM instead of the reference GPT: a transformers config.json, a folder\n"
         "holding one, or a model name in the local cache (random weights and tokens, dropout set to 0;\n"
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
  cmd->add_flag(
      "--json", o->json,
      "Print one JSON object {verdict: identical|diverged, first_divergence: {step, tensor} | null, ...}");
  cmd->callback([o] {
    if (!o->hf_config.empty()) run_hf(*o);
    run(*o);
  });
}

// Joins the program this file is linked into (the `zoe` program).
static const CommandRegistrar kRegister(25, "", "", add_verify_command);

}  // namespace zoe::cli
