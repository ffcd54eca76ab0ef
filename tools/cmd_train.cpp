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
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "data/corpus.h"
#include "model/gpt_trainer.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/plot_util.h"
#include "zoe/zoe.h"

namespace zoe::cli {
namespace {

using nlohmann::json;

struct TrainOpts {
  std::string config;
  std::string preset = "small";
  int layers = 0, d_model = 0, heads = 0, context = 0;  // 0 when not given: the preset's
  int seq = 0;          // tokens per training sequence (default: the model's context)
  int micro_batch = 8;  // without --config, or given: train_micro_batch_size_per_gpu
  int steps = 100;
  double lr = 1e-3;           // without --config, or given: optimizer.params.lr
  double weight_decay = 0.0;  // without --config only: optimizer.params.weight_decay
  std::string seed_text = "1";
  uint64_t seed = 1;  // parsed from seed_text
  int eval_every = 0;
  int eval_batches = 4;
  std::string device_budget;
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
  bool json = false;
  bool quiet = false;
  // The flags given on the command line ("--micro-batch"): a flag overrides the config only then.
  std::set<std::string> given;
  bool has(const char* flag) const { return given.count(flag) != 0; }
};

// Sane bounds of the flags (the messages give them).
constexpr int kMaxLayers = 4096, kMaxWidth = 1 << 16, kMaxContext = 1 << 20, kMaxMicroBatch = 1 << 20;
constexpr int kMaxThreads = 4096, kMaxEvalBatches = 1 << 20;

// Bytes as printable ASCII: control bytes other than a line break and bytes >= 0x7f as \xNN
// (an untrained model's sample is mostly such bytes; JSON needs valid UTF-8).
std::string escape_bytes(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if ((ch >= 0x20 && ch < 0x7f) || ch == '\n') {
      out.push_back(static_cast<char>(ch));
    } else {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\x%02x", ch);
      out += buf;
    }
  }
  return out;
}

// Each line of text after `prefix`.
void print_indented(const std::string& text, const char* prefix) {
  size_t at = 0;
  while (at <= text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    printf("%s%s\n", prefix, text.substr(at, nl - at).c_str());
    at = nl + 1;
  }
}

model::GptConfig model_config(const TrainOpts& o) {
  model::GptConfig c;
  std::string names;
  const model::GptPreset* p = model::find_gpt_preset(o.preset, &names);
  if (!p) {
    usage_fail(invalid_argument("--preset %s is not one of %s", o.preset.c_str(), names.c_str()));
  }
  // A flag given replaces the preset's value, 0 included (refused here, never ignored).
  auto shape = [&](const char* flag, int v, int preset, int max) {
    if (!o.has(flag)) return preset;
    check_flag_range(flag, v, 1, max);
    return v;
  };
  c.layers = shape("--layers", o.layers, p->layers, kMaxLayers);
  c.d_model = shape("--d-model", o.d_model, p->d_model, kMaxWidth);
  c.heads = shape("--heads", o.heads, p->heads, kMaxWidth);
  c.seq = shape("--context", o.context, p->context, kMaxContext);
  c.vocab = 256;
  Status s = c.validate();
  if (!s.is_ok()) {
    usage_fail(s.with_context("the model shape of --preset " + o.preset +
                              " with --layers/--d-model/--heads/--context"));
  }
  return c;
}

ComputeDType precision_flag(const std::string& p) {
  return p == "bf16" ? ComputeDType::kBF16 : p == "fp16" ? ComputeDType::kF16 : ComputeDType::kF32;
}

// The engine's config when there is no --config, from the flags: ZeRO-3, every module
// partitioned, parameters and optimizer states where --offload says.
Result<Config> flags_config(const TrainOpts& o, const std::vector<std::string>& nvme_dirs, int world_size) {
  const Offload off = o.offload == "cpu"    ? Offload::kCpu
                      : o.offload == "nvme" ? Offload::kNvme
                                            : Offload::kNone;
  Config::Builder b;
  b.micro_batch(o.micro_batch)
      .lr(o.lr)
      .weight_decay(o.weight_decay)
      .stage(3)
      .param_persistence_threshold(0)
      .offload_optimizer(off, nvme_dirs)
      .offload_param(off, nvme_dirs)
      .precision(precision_flag(o.precision));
  if (o.has("--threads")) b.optimizer_threads(o.threads);
  if (o.has("--device-budget")) b.device_budget(parse_bytes(o.device_budget).value());
  return b.build(world_size);
}

// Checks every flag's value on its own (before anything is read or allocated): an error names the
// flag and the value, exit code 2.
void check_flags(TrainOpts& o) {
  o.seed = parse_uint_flag("--seed", o.seed_text);
  check_flag_range("--micro-batch", o.micro_batch, 1, kMaxMicroBatch);
  check_flag_range("--steps", o.steps, 1, std::numeric_limits<int>::max());
  check_flag_range("--eval-every", o.eval_every, 0, std::numeric_limits<int>::max());
  check_flag_range("--eval-batches", o.eval_batches, 1, kMaxEvalBatches);
  check_flag_range("--threads", o.threads, 0, kMaxThreads);
  check_flag_range("--save-every", o.save_every, 0, std::numeric_limits<int>::max());
  if (o.has("--seq")) check_flag_range("--seq", o.seq, 2, kMaxContext);
  // Adam computes in fp32: the rate must be a finite float; 0 is legal (nothing moves).
  if (!std::isfinite(o.lr) || o.lr < 0 || o.lr > FLT_MAX || (o.lr != 0 && o.lr < FLT_MIN)) {
    usage_fail(invalid_argument("--lr %g is not a learning rate (expected 0 or a number in [%g, %g])", o.lr,
                                static_cast<double>(FLT_MIN), static_cast<double>(FLT_MAX)));
  }
  if (o.precision != "fp32" && o.precision != "bf16" && o.precision != "fp16") {
    usage_fail(invalid_argument("--precision %s is not fp32, bf16 or fp16", o.precision.c_str()));
  }
  if (o.has("--offload") && o.offload != "none" && o.offload != "cpu" && o.offload != "nvme") {
    usage_fail(invalid_argument("--offload %s is not none, cpu or nvme", o.offload.c_str()));
  }
  if (o.has("--device-budget")) {
    auto b = parse_bytes(o.device_budget);
    if (!b.is_ok() || b.value() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      usage_fail(invalid_argument("--device-budget %s is not a byte size (expected e.g. 256MiB, 4GiB)",
                                  o.device_budget.c_str()));
    }
  }
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0 || o.weight_decay > FLT_MAX) {
    usage_fail(
        invalid_argument("--weight-decay %g is not a weight decay (expected a number >= 0)", o.weight_decay));
  }
  if (!o.config.empty()) {
    // Placement comes from the config file: these flags would be silently ignored.
    if (o.has("--weight-decay")) {
      usage_fail(
          invalid_argument("--weight-decay cannot be combined with --config %s: set "
                           "optimizer.params.weight_decay in the config instead",
                           o.config.c_str()));
    }
    for (const char* f : {"--offload", "--nvme-path"}) {
      if (o.has(f)) {
        usage_fail(
            invalid_argument("%s cannot be combined with --config %s: set zero_optimization."
                             "offload_optimizer / offload_param in the config instead",
                             f, o.config.c_str()));
      }
    }
  }
  if (o.task != "add" && o.task != "add2" && o.task != "add1") {
    usage_fail(invalid_argument("--task %s is not add, add2 or add1", o.task.c_str()));
  }
  if (o.has("--task") && !o.data.empty()) {
    usage_fail(
        invalid_argument("--task %s cannot be combined with --data %s: the task is the built-in "
                         "corpus, --data replaces it",
                         o.task.c_str(), o.data.c_str()));
  }
  if (o.has("--sample")) check_flag_range("--sample", o.sample, 0, 1 << 16);
  if (!(o.temperature >= 0 && o.temperature <= 100)) {
    usage_fail(
        invalid_argument("--temperature %g is outside [0, 100] (0: the most likely byte)", o.temperature));
  }
  if (o.prompt.empty()) usage_fail(invalid_argument("--prompt is empty: give the text a sample continues"));
  for (const char* f : {"--prompt", "--temperature"}) {
    if (o.has(f) && (o.sample == 0 || (o.sample < 0 && o.data.empty()))) {
      usage_fail(
          invalid_argument("%s has no effect without a sample: give --sample N (by default only "
                           "--data samples)",
                           f));
    }
  }
  if (o.save_every > 0 && o.save_dir.empty()) {
    usage_fail(invalid_argument("--save-every %d needs --save-dir", o.save_every));
  }
  if (o.save_initial && o.save_dir.empty()) {
    usage_fail(invalid_argument("--save-initial needs --save-dir (where step-000000 is written)"));
  }
  if (o.save_initial && !o.resume.empty()) {
    usage_fail(
        invalid_argument("--save-initial cannot be combined with --resume %s: the run does not start "
                         "from the initial weights",
                         o.resume.c_str()));
  }
}

// The config file's values that flags given on the command line replace, each said in one line
// on stderr (rank 0); flags not given leave the file's values alone.
void apply_overrides(const TrainOpts& o, Config* cfg, bool lead) {
  auto say = [&](const std::string& flag, const std::string& key, const std::string& was) {
    if (lead) {
      fprintf(stderr, "zoe: %s overrides %s (%s in %s)\n", flag.c_str(), key.c_str(), was.c_str(),
              o.config.c_str());
    }
  };
  auto check = [&](const std::string& flag, Status s) {
    if (!s.is_ok()) usage_fail(s.with_context(flag + " with --config " + o.config));
  };
  if (o.has("--micro-batch")) {
    say(fmt("--micro-batch %d", o.micro_batch), "train_micro_batch_size_per_gpu",
        std::to_string(cfg->micro_batch()));
    check("--micro-batch", cfg->set_micro_batch(o.micro_batch));
  }
  if (o.has("--lr")) {
    if (!cfg->scheduler_type().empty()) {
      usage_fail(
          invalid_argument("--lr %g has no effect with --config %s: its scheduler %s sets the learning "
                           "rate (scheduler.params.warmup_max_lr); remove --lr or the scheduler",
                           o.lr, o.config.c_str(), cfg->scheduler_type().c_str()));
    }
    say(fmt("--lr %g", o.lr), "optimizer.params.lr", fmt("%g", cfg->lr()));
    check("--lr", cfg->set_lr(o.lr));
  }
  if (o.has("--precision")) {
    say("--precision " + o.precision, "bf16.enabled / fp16.enabled", dtype_name(cfg->precision()));
    check("--precision", cfg->set_precision(precision_flag(o.precision)));
  }
  if (o.has("--threads")) {
    say(fmt("--threads %d", o.threads), "zoe.optimizer_threads", std::to_string(cfg->optimizer_threads()));
    check("--threads", cfg->set_optimizer_threads(o.threads));
  }
  if (o.has("--device-budget")) {
    say("--device-budget " + o.device_budget, "zoe.device_budget",
        std::to_string(cfg->device_budget()) + " bytes");
    check("--device-budget", cfg->set_device_budget(parse_bytes(o.device_budget).value()));
  }
}

// SIGINT and SIGTERM during a run. The first one asks the loop to stop at the next step
// boundary; a second SIGINT ends the process at once (exit 130). They are blocked in the threads
// created from here on (the engine's: no syscall of theirs fails with EINTR) and taken by one
// thread of their own in sigwait; threads that existed before (a BLAS pool started at load time)
// may still receive them, so a handler (SA_RESTART) does the same there.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    // Detached: it waits for the process's life; a signal after the run finds nobody asking.
    std::thread([set] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) continue;
        const bool first = requested_.load() == 0;
        on_signal(sig);
        if (first) unlink_swap_files(sig);
      }
    }).detach();
    // The watchdog: a stop asked for whose step never ends (the step waits in a collective for a
    // rank that was lost: mpirun then ends the job with SIGTERM, and later SIGKILL) removes this
    // rank's swap files and exits, saying so, instead of being killed with them left behind.
    std::thread([] {
      uint64_t asked_ns = 0;
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const int sig = requested_.load();
        if (sig == 0) continue;
        unlink_swap_files(sig);  // (a signal that reached another thread's handler)
        if (stopping_.load()) continue;
        const uint64_t now = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                       std::chrono::steady_clock::now().time_since_epoch())
                                                       .count());
        if (asked_ns == 0) asked_ns = now;
        const double grace = std::max(kMinGraceS, 3.0 * static_cast<double>(step_ns_.load()) * 1e-9);
        if (static_cast<double>(now - asked_ns) * 1e-9 < grace) continue;
        const size_t n = remove_swap_files_now();
        fprintf(
            stderr,
            "zoe: rank %d: %s, but the step in progress did not end within %.0f s (it waits for the other "
            "ranks: one of them was probably lost; mpirun names it); removed %zu swap file(s); exiting\n",
            rank_.load(), sig == SIGINT ? "SIGINT" : "SIGTERM", grace, n);
        _exit(128 + sig);
      }
    }).detach();
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal asked for (SIGINT or SIGTERM), or 0.
  int requested() const { return requested_.load(); }
  // The loop reached a step boundary and is stopping (the watchdog stands down).
  void stopping() { stopping_.store(true); }
  // The duration of the last step (the watchdog waits three of them, at least kMinGraceS).
  void note_step(double seconds) { step_ns_.store(static_cast<uint64_t>(seconds * 1e9)); }
  void set_rank(int r) { rank_.store(r); }

 private:
  // Async-signal-safe: a lock-free atomic, write(2) and _exit(2).
  static void on_signal(int sig) {
    if (sig == SIGINT && requested_.load() != 0) {
      static const char kMsg[] = "zoe: second SIGINT: exiting at once\n";
      (void)!write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
      _exit(128 + SIGINT);
    }
    int none = 0;
    requested_.compare_exchange_strong(none, sig);  // the first one decides
  }
  // At the first signal: the swap files' names go at once (the engine keeps using the open files,
  // a final checkpoint included), so a SIGKILL that follows (mpirun's, after a lost rank, comes
  // within a second) leaves nothing behind. Once per process.
  static void unlink_swap_files(int sig) {
    if (unlinked_.exchange(true)) return;
    const size_t n = remove_swap_files_now();
    fprintf(stderr, "zoe: rank %d: %s: stopping at the next step boundary (%zu swap file(s) unlinked now)\n",
            rank_.load(), sig == SIGINT ? "SIGINT" : "SIGTERM", n);
  }
  static constexpr double kMinGraceS = 10.0;
  static inline std::atomic<bool> unlinked_{false};
  static inline std::atomic<int> requested_{0};
  static inline std::atomic<bool> stopping_{false};
  static inline std::atomic<uint64_t> step_ns_{0};
  static inline std::atomic<int> rank_{0};
};

// Refuses a run whose host allocations cannot fit before making them: the activations, and the
// optimizer swapper's pinned buffers with NVMe optimizer offload (the engine's sizing:
// max(buffer_count, 12) buffers of min(sub_group_size, 1Mi) fp32 elements).
void check_host_memory(const Config& cfg, const model::GptConfig& mc, int micro, int T) {
  const uint64_t avail = host_memory_available();
  if (avail == 0) return;  // unknown
  const double act = model::activation_bytes_estimate(mc, micro, T);
  double swap = 0;
  if (cfg.offload_optimizer() == Offload::kNvme) {
    const double chunk = static_cast<double>(std::min<int64_t>(cfg.sub_group_size(), int64_t{1} << 20));
    swap = static_cast<double>(std::max<int64_t>(cfg.offload_optimizer_buffer_count(), 12)) * chunk * 4;
  }
  if (act + swap <= static_cast<double>(avail)) return;
  auto bytes = [](double b) {
    return b >= 1.8e19 ? fmt("%.3g bytes", b) : format_bytes(static_cast<uint64_t>(b));
  };
  std::string what =
      fmt("activations of %d layers x --micro-batch %d x --seq %d (context %d, d_model %d, %d heads): %s",
          mc.layers, micro, T, mc.seq, mc.d_model, mc.heads, bytes(act).c_str());
  if (swap > 0) {
    what += fmt("; optimizer swap buffers (zero_optimization.offload_optimizer.buffer_count %lld): %s",
                static_cast<long long>(cfg.offload_optimizer_buffer_count()), bytes(swap).c_str());
  }
  fail(out_of_budget("the run needs about %s of host memory (%s) but the host has %s available",
                     bytes(act + swap).c_str(), what.c_str(), format_bytes(avail).c_str()));
}

// Creates --save-dir (and its parents) and proves it writable with a probe file, so that the
// first checkpoint cannot fail after hours of training.
void prepare_save_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail(sys_error("mkdir -p --save-dir", dir, ec.value()));
  if (!std::filesystem::is_directory(dir, ec))
    fail(invalid_argument("--save-dir %s is not a directory", dir.c_str()));
  std::string probe = dir + "/.zoe-write-test-XXXXXX";
  int fd = mkstemp(probe.data());
  if (fd < 0)
    fail(sys_error("create a file in --save-dir", dir, errno).with_context("--save-dir is not writable"));
  close(fd);
  unlink(probe.c_str());
}

// The loss (or any value) averaged over the ranks.
double mean_over_ranks(Runtime& rt, double v) {
  auto r = rt.average(v);
  if (!r.is_ok()) fail(r.status().with_context("averaging the loss over ranks"));
  return r.value();
}

// --dump-batches: one JSON object per line for each micro-batch trained on, in order, so that
// another framework can feed the same tokens (format in docs/train-json.md).
class BatchDump {
 public:
  // path "" writes nothing. Errors name the file.
  explicit BatchDump(const std::string& path) : path_(path) {
    if (path.empty()) return;
    f_ = fopen(path.c_str(), "w");
    if (!f_) fail(sys_error("create --dump-batches file", path, errno));
  }
  ~BatchDump() {
    if (f_) fclose(f_);
  }
  BatchDump(const BatchDump&) = delete;
  BatchDump& operator=(const BatchDump&) = delete;
  void write(int step, int rank, int micro, int batch, int T, const std::vector<int32_t>& tokens,
             const std::vector<int32_t>& targets) {
    if (!f_) return;
    fprintf(f_, "{\"step\":%d,\"rank\":%d,\"micro\":%d,\"batch\":%d,\"seq\":%d", step, rank, micro, batch, T);
    auto rows = [&](const char* key, const std::vector<int32_t>& v) {
      fprintf(f_, ",\"%s\":[", key);
      for (int b = 0; b < batch; ++b) {
        fputs(b ? ",[" : "[", f_);
        for (int t = 0; t < T; ++t) {
          fprintf(f_, t ? ",%d" : "%d", v[static_cast<size_t>(b) * static_cast<size_t>(T) + t]);
        }
        fputc(']', f_);
      }
      fputc(']', f_);
    };
    rows("tokens", tokens);
    rows("targets", targets);
    fputs("}\n", f_);
    if (ferror(f_)) fail(sys_error("write --dump-batches file", path_, errno));
  }
  void close() {
    if (!f_) return;
    const bool bad = ferror(f_) != 0;
    const int rc = fclose(f_);
    f_ = nullptr;
    if (bad || rc != 0) fail(sys_error("write --dump-batches file", path_, errno));
  }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

std::string fmt_eta(double s) {
  if (s < 60) return fmt("%.0fs", s);
  if (s < 3600) return fmt("%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return fmt("%dh%02dm", static_cast<int>(s) / 3600, (static_cast<int>(s) / 60) % 60);
}

void run(TrainOpts o) {
  check_flags(o);
  StopSignals stop;
  model::GptConfig mc = model_config(o);
  const int T = o.seq ? o.seq : mc.seq;
  if (T > mc.seq) {
    usage_fail(
        invalid_argument("--seq %d is longer than the model allows: it has %d positions (set --context, or a "
                         "smaller --seq)",
                         T, mc.seq));
  }
  auto rt = value_or_fail(Runtime::init());
  const bool lead = rt->rank() == 0;
  stop.set_rank(rt->rank());
  if (!o.plot.empty() && lead) {
    Status ps = plot_available();
    if (!ps.is_ok()) fail(ps.with_context("checking for --plot " + o.plot + " before training"));
  }

  // The engine's config: a file (flags given override its keys, and say so), or the flags.
  Config cfg;
  if (!o.config.empty()) {
    cfg = value_or_fail(Config::load(o.config, rt->world_size()));
    apply_overrides(o, &cfg, lead);
  } else {
    std::vector<std::string> dirs = o.nvme_path;
    if (dirs.empty()) {
      const char* env = getenv("ZOE_SCRATCH");
      dirs.push_back(env && *env ? env : "/var/tmp");
    }
    if (!o.nvme_path.empty() && o.offload != "nvme" && lead) {
      fprintf(stderr, "zoe: --nvme-path has no effect without --offload nvme\n");
    }
    auto c = flags_config(o, dirs, rt->world_size());
    if (!c.is_ok()) fail(c.status().with_context("the config built from the flags"));
    cfg = std::move(c).value();
  }
  // From here on the config's values are the run's (bounded by Config::parse).
  o.micro_batch = static_cast<int>(cfg.micro_batch());
  check_host_memory(cfg, mc, o.micro_batch, T);
  if (!o.save_dir.empty()) prepare_save_dir(o.save_dir);

  // Data next: a missing file is reported before the engine allocates anything.
  data::Corpus corpus;
  if (!o.data.empty()) {
    // The corpus is held twice while it loads: at most a quarter of the available memory, 1 GiB.
    const uint64_t avail = host_memory_available();
    const size_t cap =
        static_cast<size_t>(std::min<uint64_t>(uint64_t{1} << 30, avail ? avail / 4 : uint64_t{1} << 30));
    auto c = data::load_text_file(o.data, static_cast<size_t>(T), 0.05, cap);
    if (!c.is_ok()) {
      fail(c.status().with_context(
          fmt("--data: the limit is a quarter of the host's available memory (%s), at most 1 GiB",
              format_bytes(avail).c_str())));
    }
    corpus = std::move(c).value();
  } else {
    corpus = data::make_arithmetic(o.seed, 200000, o.task == "add2" ? 2 : o.task == "add1" ? 1 : 3);
  }

  BatchDump dump(o.dump_batches.empty()
                     ? ""
                     : o.dump_batches + (rt->world_size() > 1 ? "." + std::to_string(rt->rank()) : ""));
  auto eng = value_or_fail(Engine::create(*rt, cfg));
  // A second job saving into the same --save-dir is refused now, not at its first save.
  if (!o.save_dir.empty()) {
    Status cs = eng->claim_save_dir(o.save_dir);
    if (!cs.is_ok()) fail(cs);
  }
  if (!o.trace.empty()) eng->enable_trace(true);
  {
    Status s = model::add_gpt_modules(*eng, mc);
    if (!s.is_ok()) fail(s);
  }
  Progress progress(lead && !o.quiet);
  progress.update(fmt("initialising %llu parameters (%s of model state per rank)",
                      static_cast<unsigned long long>(mc.num_params()),
                      format_bytes(eng->model_state_bytes()).c_str()));
  Status s = eng->initialize(
      [&](size_t m, size_t p, float* x, size_t n) { model::gpt_init(mc, o.seed, m, p, x, n); });
  if (!s.is_ok()) fail(s.with_context("initialising the model"));
  // Resume: restore every state, continue at the saved step (--steps counts the whole run).
  int start_step = 0;
  if (!o.resume.empty()) {
    std::string from = o.resume == "-" ? o.save_dir : o.resume;
    if (from.empty()) fail(invalid_argument("--resume needs a directory, or --save-dir"));
    progress.update("resuming from " + from);
    std::string ts = value_or_fail(eng->load(from));
    uint64_t seed = o.seed;
    Status ts_ok = model::parse_trainer_state(ts, from, &start_step, &seed);
    if (!ts_ok.is_ok()) fail(ts_ok);
    if (seed != o.seed) {
      fail(invalid_argument(
          "checkpoint %s was trained with --seed %llu, not %llu: the data order would differ", from.c_str(),
          static_cast<unsigned long long>(seed), static_cast<unsigned long long>(o.seed)));
    }
    if (start_step >= o.steps) {
      fail(invalid_argument(
          "checkpoint %s is at step %d; --steps %d leaves nothing to train (--steps counts the whole run)",
          from.c_str(), start_step, o.steps));
    }
  }
  auto model = value_or_fail(model::GptCpu::create(mc, o.micro_batch, T, o.threads));
  model::GptTrainer trainer(*eng, *model, mc, T);
  // Samples from --prompt before and after training (a collective: every rank draws the same).
  const int sample_n = o.sample >= 0 ? o.sample : (o.data.empty() ? 0 : 160);
  json samples = json::array();
  auto take_sample = [&](int at_step) {
    progress.update(fmt("sampling %d bytes from the weights after step %d", sample_n, at_step));
    std::string text =
        value_or_fail(trainer.sample(o.prompt, sample_n, o.temperature, o.seed, o.micro_batch));
    size_t words = 0;
    const double known = data::known_word_fraction(text, corpus.train, &words);
    samples.push_back({{"step", at_step},
                       {"text", escape_bytes(o.prompt + text)},
                       {"words", words},
                       {"known_words", known}});
  };
  if (sample_n > 0) take_sample(start_step);

  const int accum = static_cast<int>(std::max<int64_t>(1, cfg.gradient_accumulation_steps()));
  std::vector<int32_t> tokens, targets;
  std::vector<double> losses, lrs, grad_norms;
  json step_times = json::array();
  json evals = json::array();
  double t_compute = 0, t_comm = 0, t_io = 0, t_opt = 0;
  StepStats last;
  const uint64_t t_start = clock_ns();
  uint64_t last_nvme = 0;
  double eval_loss = NAN, accuracy = NAN;

  auto evaluate = [&]() {
    double sum = 0;
    int n = 0;
    int correct = 0, total = 0;
    for (int b = 0; b < o.eval_batches; ++b) {
      std::vector<int32_t> tk, tg, line;
      if (corpus.arithmetic) {
        data::arithmetic_eval_batch(corpus.eval, o.micro_batch, T, static_cast<size_t>(b * o.micro_batch * 4),
                                    &tk, &tg, &line);
      } else {
        data::sample_batch(corpus.eval, o.micro_batch, T, o.seed ^ 0xe7a1, static_cast<uint64_t>(b), 0, 0,
                           &tk, &tg);
      }
      float l = value_or_fail(trainer.forward(tk, tg));
      sum += l;
      ++n;
      if (corpus.arithmetic) {
        const float* logits = model->logits();
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
  };

  int saved_step = -1;
  auto save_after = [&](int done, bool async) {
    json ts = {{"step", done}, {"seed", o.seed}, {"data", corpus.name}, {"preset", o.preset}};
    char tag[32];
    snprintf(tag, sizeof(tag), "step-%06d", done);
    progress.update(std::string("saving ") + tag + " to " + o.save_dir);
    Status ss = eng->save(o.save_dir, tag, ts.dump(), async);
    if (!ss.is_ok()) {
      progress.done();
      fail(ss.with_context("saving a checkpoint after step " + std::to_string(done)));
    }
    saved_step = done;
  };
  // SIGINT/SIGTERM stop the run at the next step boundary; SIGTERM saves a final checkpoint
  // first when there is a --save-dir. Unwinding destroys the engine, which removes swap files.
  auto stop_if_asked = [&](int done) {
    const int sig = stop.requested();
    if (sig == 0) return;
    stop.stopping();
    std::string saved;
    if (sig == SIGTERM && !o.save_dir.empty() && done > start_step && saved_step != done) {
      save_after(done, false);
      saved = fmt("; checkpoint step-%06d saved in %s", done, o.save_dir.c_str());
    }
    Status fs = eng->finish_save();
    progress.done();
    if (!fs.is_ok()) fail(fs.with_context("the last checkpoint, while stopping"));
    eng.reset();
    throw CommandError{Status(StatusCode::kCancelled,
                              fmt("stopped by %s after step %d of %d%s", sig == SIGINT ? "SIGINT" : "SIGTERM",
                                  done, o.steps, saved.c_str())),
                       128 + sig};
  };
  const bool stderr_tty = isatty(STDERR_FILENO) != 0;
  const int progress_every = std::max(1, (o.steps - start_step) / 10);
  auto now_s = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  double last_line_s = now_s();
  if (o.save_initial) save_after(0, false);
  // With --eval-every, the first evaluation is of the weights the run starts from.
  double accuracy_start = NAN, eval_loss_start = NAN;
  if (o.eval_every > 0) {
    progress.update("evaluating the initial weights");
    evaluate();
    json ev = {{"step", start_step}, {"eval_loss", eval_loss}};
    if (!std::isnan(accuracy)) ev["accuracy"] = accuracy;
    evals.push_back(ev);
    accuracy_start = accuracy;
    eval_loss_start = eval_loss;
  }
  for (int step = start_step; step < o.steps; ++step) {
    stop_if_asked(step);
    double loss_sum = 0;
    for (int micro = 0; micro < accum; ++micro) {
      data::sample_batch(corpus.train, o.micro_batch, T, o.seed, static_cast<uint64_t>(step), rt->rank(),
                         micro, &tokens, &targets);
      dump.write(step, rt->rank(), micro, o.micro_batch, T, tokens, targets);
      auto l = trainer.forward_backward(tokens, targets);
      if (!l.is_ok()) {
        progress.done();
        fail(l.status().with_context("training step " + std::to_string(step + 1)));
      }
      loss_sum += l.value();
    }
    auto st = eng->step();
    if (!st.is_ok()) {
      progress.done();
      fail(st.status().with_context("optimizer step " + std::to_string(step + 1)));
    }
    last = st.value();
    double loss = mean_over_ranks(*rt, loss_sum / accum);
    losses.push_back(loss);
    lrs.push_back(last.lr);
    grad_norms.push_back(last.grad_norm);
    step_times.push_back({{"compute", last.t_compute},
                          {"comm", last.t_comm},
                          {"io_stall", last.t_io_stall},
                          {"optimizer", last.t_optimizer}});
    t_compute += last.t_compute;
    t_comm += last.t_comm;
    t_io += last.t_io_stall;
    t_opt += last.t_optimizer;
    if (o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps)) {
      evaluate();
      json ev = {{"step", step + 1}, {"eval_loss", eval_loss}};
      if (!std::isnan(accuracy)) ev["accuracy"] = accuracy;
      evals.push_back(ev);
    }
    if (o.save_every > 0 && (step + 1) % o.save_every == 0) save_after(step + 1, o.save_async);
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
        fmt("step %d/%d  loss %.4f  %.0f tok/s  nvme %.2f GB/s  stall %.0f%%  eta %s", step + 1, o.steps,
            loss, tokens_s, nvme_gbps, stall, fmt_eta(step_time * (o.steps - step - 1)).c_str());
    if (!std::isnan(eval_loss)) line += fmt("  eval %.4f", eval_loss);
    if (!std::isnan(accuracy)) line += fmt(" acc %.1f%%", 100 * accuracy);
    // Not a terminal (a log, CI): one line every progress_every steps and the last, not one per step.
    // The first steps show at once (the first result), then every progress_every steps, and at
    // least one line every 10 s of a long run.
    const bool due = (step + 1 - start_step) <= 3 || (step + 1) % progress_every == 0 ||
                     step + 1 == o.steps || now_s() - last_line_s >= 10.0;
    if (stderr_tty || due) {
      progress.update(line);
      last_line_s = now_s();
    }
  }
  Status fs = eng->finish_save();
  if (!fs.is_ok()) fail(fs.with_context("the last checkpoint"));
  progress.done();
  dump.close();
  if (o.eval_every <= 0) evaluate();
  if (sample_n > 0) take_sample(o.steps);
  if (!o.trace.empty()) {
    Status ts = eng->write_trace(o.trace + (rt->world_size() > 1 ? "." + std::to_string(rt->rank()) : ""));
    if (!ts.is_ok()) fail(ts);
  }
  if (!lead) return;
  double total_s = static_cast<double>(clock_ns() - t_start) * 1e-9;
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
  j["high_water_bytes"] = {
      {"device", last.high_water[0]}, {"host", last.high_water[1]}, {"nvme", last.high_water[2]}};
  j["bytes_moved"] = {{"nvme->host", last.bytes_nvme_read},
                      {"host->nvme", last.bytes_nvme_write},
                      {"host->device", last.bytes_host_to_device},
                      {"device->host", last.bytes_device_to_host}};
  j["time_s"] = {
      {"compute", t_compute}, {"comm", t_comm}, {"io_stall", t_io}, {"optimizer", t_opt}, {"total", total_s}};
  j["losses"] = losses;
  j["lrs"] = lrs;
  j["grad_norms"] = grad_norms;
  j["step_time_s"] = step_times;
  j["eval_loss"] = eval_loss;
  if (!std::isnan(accuracy)) j["accuracy"] = accuracy;
  j["evals"] = evals;
  if (sample_n > 0) {
    j["samples"] = samples;
    j["prompt"] = escape_bytes(o.prompt);
    j["temperature"] = o.temperature;
  }
  j["steps"] = o.steps;
  j["start_step"] = start_step;
  j["tokens_per_s"] =
      static_cast<double>(o.steps - start_step) * o.micro_batch * T * accum * rt->world_size() / total_s;
  if (!o.plot.empty()) {
    Progress plotting(!o.quiet);
    plotting.update("plotting " + o.plot);
    Status ps = write_plot("train", j.dump(), o.plot);
    plotting.done();
    if (!ps.is_ok()) fail(ps.with_context("--plot " + o.plot));
  }
  if (o.json) {
    print_json(j);
    return;
  }
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
  if (sample_n > 0) {
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
    if (!corpus.arithmetic) printf("learned         words of a sample found in the text %.0f%% -> %.0f%%",
           100 * a["known_words"].get<double>(), 100 * b["known_words"].get<double>());
    if (!corpus.arithmetic) {
      if (!std::isnan(eval_loss_start)) printf("; eval loss %.3f -> %.3f", eval_loss_start, eval_loss);
      printf(" in %d steps (%.0fs)\n", o.steps - start_step, total_s);
    }
  }
  printf("\n");
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
  printf(
      "\nstate / device budget = %.1fx; time: compute %.1fs, comm %.1fs, I/O stall %.1fs, optimizer %.1fs, "
      "total %.1fs\n",
      j["state_to_budget"].get<double>(), t_compute, t_comm, t_io, t_opt, total_s);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOpts>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train the reference GPT (byte-level) through the engine. Without --data it trains on a built-in\n"
      "corpus of additions (\"4821+377=5198\") generated from --seed and reports exact-match accuracy.\n"
      "Placement comes from --config (DeepSpeed-style JSON) or from --offload/--nvme-path (ZeRO-3).\n"
      "Optimizer without --config: AdamW (decoupled decay), lr 1e-3, betas (0.9, 0.999), eps 1e-8,\n"
      "weight decay 0, no clipping, no schedule: DeepSpeed's defaults for optimizer.params. zoe keeps\n"
      "DeepSpeed's weight decay 0 so that a DeepSpeed config and these flags train alike; torch.optim.AdamW\n"
      "defaults to 0.01 (pass --weight-decay 0.01 to match it).\n"
      "Progress goes to stderr; the summary (or --json) to stdout. Runs under mpirun -np N too.");
  cmd->add_option("--config", o->config, "Engine config (DeepSpeed-compatible JSON)");
  cmd->add_option("--preset", o->preset, "Model size: tiny, small, demo, medium, large, 2b")
      ->capture_default_str();
  cmd->add_option("--layers", o->layers, "Transformer blocks (overrides the preset)");
  cmd->add_option("--d-model", o->d_model, "Width (overrides the preset)");
  cmd->add_option("--heads", o->heads, "Attention heads (overrides the preset)");
  cmd->add_option("--context", o->context, "Positions the model has (overrides the preset)");
  cmd->add_option("--seq", o->seq, "Tokens per training sequence (default: the model's context)");
  cmd->add_option(
      "--micro-batch", o->micro_batch,
      "Sequences per micro-batch per rank (default 8, or the config's train_micro_batch_size_per_gpu)");
  cmd->add_option("--steps", o->steps, "Optimizer steps")->capture_default_str();
  cmd->add_option("--lr", o->lr,
                  "Learning rate (default: the config's, or 1e-3 as DeepSpeed's optimizer.params.lr; 0 is "
                  "legal)");
  cmd->add_option("--weight-decay", o->weight_decay,
                  "Without --config: AdamW's decoupled weight decay (default 0, DeepSpeed's "
                  "optimizer.params.weight_decay; torch.optim.AdamW's default is 0.01)");
  cmd->add_option("--seed", o->seed_text, "Seed of the initial weights, the data and the sampling")
      ->capture_default_str();
  cmd->add_option("--eval-every", o->eval_every,
                  "Evaluate on the held-out part every N steps (0: at the end)");
  cmd->add_option("--eval-batches", o->eval_batches, "Batches per evaluation")->capture_default_str();
  cmd->add_option("--device-budget", o->device_budget,
                  "Device memory budget, e.g. 256MiB (overrides the config)");
  cmd->add_option("--offload", o->offload,
                  "Without --config: none, cpu or nvme for parameters and optimizer states");
  cmd->add_option(
      "--nvme-path", o->nvme_path,
      "Without --config: directory for NVMe offload, repeatable (default $ZOE_SCRATCH or /var/tmp)");
  cmd->add_option("--precision", o->precision, "fp32, bf16 or fp16 (default bf16, or the config's)");
  cmd->add_option("--data", o->data, "Train on this text file (bytes are tokens)");
  cmd->add_option("--task", o->task,
                  "Without --data: the built-in additions, add (operands below 1000), add2 (below 100) "
                  "or add1 (below 10: learned in a few minutes, the demo's task)")
      ->capture_default_str();
  cmd->add_option("--sample", o->sample,
                  "Generate N bytes from --prompt before and after training and print them, with the share "
                  "of their words found in the training text (default 160 with --data, else 0)");
  cmd->add_option("--prompt", o->prompt, "The text a sample continues")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0: always the most likely byte)")
      ->capture_default_str();
  cmd->add_option("--trace", o->trace, "Write a Chrome-trace timeline of every transfer and kernel here");
  cmd->add_option("--threads", o->threads, "CPU threads for the optimizer and the model (0: all)");
  cmd->add_option("--save-every", o->save_every, "Save a checkpoint every N steps (needs --save-dir)");
  cmd->add_flag("--save-async", o->save_async,
                "Write checkpoints in the background, overlapping the next step's "
                "forward and backward");
  cmd->add_flag("--save-initial", o->save_initial,
                "Save the initial weights as checkpoint step-000000 in --save-dir before the first step");
  cmd->add_option("--dump-batches", o->dump_batches,
                  "Write the token ids of every micro-batch here, one JSON object a line (see "
                  "docs/train-json.md)");
  cmd->add_option("--save-dir", o->save_dir,
                  "Directory for checkpoints (D/step-NNNNNN, D/latest); created if missing");
  cmd->add_option("--resume", o->resume,
                  "Resume from this save directory or checkpoint (no value: --save-dir)")
      ->expected(0, 1)
      ->default_str("-");
  cmd->add_option("--plot", o->plot,
                  "Draw the loss and eval curves and the time per step into this PNG (python3-matplotlib)");
  cmd->add_flag("--quiet", o->quiet, "No progress on stderr");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o, cmd] {
    for (const CLI::Option* opt : cmd->get_options()) {
      if (opt->count() > 0) o->given.insert(opt->get_name());
    }
    run(*o);
  });
}

}  // namespace zoe::cli
