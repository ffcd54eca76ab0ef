// `zoe train`'s run helpers.
#include "tools/train_support.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

namespace zoe::cli {

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

// Refuses a run whose host allocations cannot fit before making them: the activations, and the
// optimizer swapper's pinned buffers with NVMe optimizer offload (the engine's sizing).
void check_host_memory(const Config& cfg, const model::GptConfig& mc, int micro, int T, bool ckpt) {
  const uint64_t avail = host_memory_available();
  if (avail == 0) return;  // unknown
  double act = model::activation_bytes_estimate(mc, micro, T, ckpt);
  if (ckpt) {
    double kept = model::checkpoint_bytes_estimate(mc, micro, T);
    if (cfg.activation_offload() == ActivationOffload::kNvme && cfg.activation_host_budget() > 0)
      kept = std::min(kept, static_cast<double>(cfg.activation_host_budget()));
    act += kept;
  }
  double swap = 0;
  if (cfg.offload_optimizer() == Offload::kNvme) {
    swap = static_cast<double>(cfg.optimizer_swap_buffer_bytes());
  }
  if (act + swap <= static_cast<double>(avail)) return;
  auto bytes = [](double b) {
    return b >= 1.8e19 ? fmt("%.3g bytes", b) : format_bytes(static_cast<uint64_t>(b));
  };
  std::string what = fmt(
      "activations of %d layers x --micro-batch %d x --seq %d (context %d, d_model %d, %d heads%s): %s",
      mc.layers, micro, T, mc.seq, mc.d_model, mc.heads, ckpt ? ", checkpointed" : "", bytes(act).c_str());
  if (swap > 0) {
    what += fmt("; optimizer swap buffers (zero_optimization.offload_optimizer.buffer_count %lld): %s",
                static_cast<long long>(cfg.offload_optimizer_buffer_count()), bytes(swap).c_str());
  }
  fail(out_of_budget("the run needs about %s of host memory (%s) but the host has %s available",
                     bytes(act + swap).c_str(), what.c_str(), format_bytes(avail).c_str()));
}

namespace {

// The process's mapped address space now (VmSize), 0 when unknown.
uint64_t address_space_in_use() {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (fgets(line, sizeof line, f) != nullptr) {
    if (sscanf(line, "VmSize: %llu kB", &kib) == 1) break;
  }
  fclose(f);
  return static_cast<uint64_t>(kib) * 1024;
}

}  // namespace

void check_address_space(int threads) {
  struct rlimit lim {};
  if (getrlimit(RLIMIT_AS, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return;
  const uint64_t used = address_space_in_use();
  if (used == 0) return;  // unknown
  // A step maps more than the model and the engine hold before it: OpenBLAS's GEMM buffer in each
  // thread that runs a GEMM (mapped at its first one, and retried without end when the map fails),
  // the allocator's arenas, the stacks of threads that start in the step. Measured on the presets:
  // 210-345 MiB for one thread, about 130 MiB more per thread.
  const uint64_t per_thread = uint64_t{128} << 20;
  const uint64_t margin = (uint64_t{256} << 20) + per_thread * static_cast<uint64_t>(std::max(1, threads));
  const uint64_t limit = static_cast<uint64_t>(lim.rlim_cur);
  if (used + margin <= limit) return;
  fail(out_of_budget(
      "the address-space limit (ulimit -v %llu, %s) is too small for this run: it needs about %s (%s mapped "
      "by the engine and the model before step 0, and %s for the step's GEMM buffers and threads); raise "
      "ulimit -v to at least %llu, or run fewer --threads or a smaller model",
      static_cast<unsigned long long>(limit / 1024), format_bytes(limit).c_str(),
      format_bytes(used + margin).c_str(), format_bytes(used).c_str(), format_bytes(margin).c_str(),
      static_cast<unsigned long long>((used + margin + 1023) / 1024)));
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

std::string fmt_eta(double s) {
  if (s < 60) return fmt("%.0fs", s);
  if (s < 3600) return fmt("%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return fmt("%dh%02dm", static_cast<int>(s) / 3600, (static_cast<int>(s) / 60) % 60);
}

}  // namespace zoe::cli
