// `zoe bench swap`: one full optimizer step over N parameters whose states live on NVMe, with the
// real CPU AdamW, against the same I/O alone and the same compute alone (states in memory).
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/units.h"
#include "io/checksum.h"
#include "io/io_engine.h"
#include "io/swap_file.h"
#include "offload/optimizer_swapper.h"
#include "offload/swap_store.h"
#include "optim/adam.h"
#include "zoe/cli.h"

namespace zoe::cli {
namespace {

using nlohmann::json;

struct BenchSwapOpts {
  std::string params = "256M";
  std::vector<std::string> paths;
  std::string sub_group = "1e8";
  size_t buffers = 12;
  std::string buffer_size = "16MiB";
  std::string grad_dtype = "bf16";
  int threads = 0;
  int repeats = 5;
  uint32_t qd = 32;
  std::string trace;
  bool json = false;
  bool checksum = false;
};

uint64_t parse_count(const std::string& s, const char* flag) {
  std::string t = s;
  // Counts take the same suffixes as sizes, read as decimal multipliers (256M = 256e6)...
  if (!t.empty() && (t.back() == 'M' || t.back() == 'G' || t.back() == 'K')) {
    double mul = t.back() == 'K' ? 1e3 : t.back() == 'M' ? 1e6 : 1e9;
    t.pop_back();
    char* end = nullptr;
    double v = strtod(t.c_str(), &end);
    if (end == t.c_str() || *end || v <= 0)
      fail(invalid_argument("%s %s is not a count (e.g. 256M, 1G, 5e8)", flag, s.c_str()));
    return static_cast<uint64_t>(v * mul);
  }
  auto r = parse_bytes(s);  // ...and plain numbers or 1e9 work as they do for sizes
  if (!r.is_ok() || r.value() == 0)
    fail(invalid_argument("%s %s is not a count (e.g. 256M, 1G, 5e8)", flag, s.c_str()));
  return r.value();
}

uint64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void run(const BenchSwapOpts& o) {
  const uint64_t n = parse_count(o.params, "--params");
  const uint64_t sub = parse_count(o.sub_group, "--sub-group");
  const uint64_t buf_bytes = value_or_fail(parse_bytes(o.buffer_size));
  DType gdt;
  if (o.grad_dtype == "bf16")
    gdt = DType::kBF16;
  else if (o.grad_dtype == "fp16")
    gdt = DType::kF16;
  else if (o.grad_dtype == "fp32")
    gdt = DType::kF32;
  else
    fail(invalid_argument("--grad-dtype %s: expected bf16, fp16 or fp32", o.grad_dtype.c_str()));
  if (o.repeats < 1) fail(invalid_argument("--repeats must be >= 1"));
  std::vector<std::string> paths = o.paths;
  if (paths.empty()) {
    const char* env = getenv("ZOE_SCRATCH");
    paths.push_back(env && *env ? env : "/var/tmp");
  }
  for (const auto& p : paths) {
    struct stat st;
    if (stat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      fail(not_found("--path %s is not an existing directory", p.c_str()));
  }

  io::IoEngineOptions eo;
  eo.queue_depth = o.qd;
  auto engine = value_or_fail(io::IoEngine::create(eo));
  io::SwapFileOptions so;
  so.dirs = paths;
  so.name = "zoe-bench-swap";
  so.grow_bytes = 1u << 30;
  so.checksum = o.checksum;
  auto swap = value_or_fail(io::SwapFile::create(so));
  (void)swap->register_files(*engine);
  offload::SwapStore store(swap.get(), engine.get(), 0);
  TraceRecorder trace(!o.trace.empty());
  offload::SwapperOptions sopts;
  sopts.states = {{offload::StateKind::kMaster, 4, true},
                  {offload::StateKind::kAdamM, 4, true},
                  {offload::StateKind::kAdamV, 4, true},
                  {offload::StateKind::kGrad, static_cast<uint32_t>(dtype_size(gdt)), false}};
  sopts.buffer_count = o.buffers;
  sopts.buffer_bytes = buf_bytes;
  sopts.trace = &trace;
  auto sw = value_or_fail(offload::OptimizerSwapper::create(&store, sopts));
  optim::CpuPool::Options po;
  po.threads = o.threads;
  auto pool = value_or_fail(optim::CpuPool::create(po));
  optim::Exec exec;
  exec.pool = pool.get();

  Progress progress(true, 5.0);  // not a terminal: one line per 5 s
  // A pass with its share done so far on the progress line (the update runs chunk after chunk).
  const double total_elems = static_cast<double>(n);
  auto with_progress = [&](const std::string& what, const offload::ChunkUpdate& fn) {
    struct Count {
      uint64_t elems = 0;
      int pct = -1;
    };
    auto done = std::make_shared<Count>();
    const uint64_t t0 = now_ns();
    return offload::ChunkUpdate([&progress, what, fn, done, t0, total_elems](const offload::ChunkView& c) {
      Status s = fn(c);
      done->elems += c.n;
      // At most 100 lines a pass: the printing stays out of the timed update.
      const int pct = static_cast<int>(100.0 * static_cast<double>(done->elems) / total_elems);
      if (pct != done->pct) {
        done->pct = pct;
        progress.update(fmt("%s %3d%%  %.1fs", what.c_str(), pct, static_cast<double>(now_ns() - t0) * 1e-9));
      }
      return s;
    });
  };
  progress.update("registering " + std::to_string(n) + " parameters (" +
                  format_bytes(n * (12 + dtype_size(gdt))) + " of states) on " +
                  std::to_string(paths.size()) + " path(s)");
  std::vector<size_t> group_sizes;
  for (uint64_t g = 0, done = 0; done < n; ++g) {
    size_t s = static_cast<size_t>(std::min<uint64_t>(sub, n - done));
    Status st = sw->add_group(g, s);
    if (!st.is_ok()) fail(st);
    group_sizes.push_back(s);
    done += s;
  }
  // Initial states, written through the pipeline itself (no N-sized host array).
  Status st = sw->step(with_progress("writing initial states",
                                     [&](const offload::ChunkView& c) {
                                       auto* p = static_cast<float*>(c.data[0]);
                                       for (size_t i = 0; i < c.n; ++i)
                                         p[i] = 0.02f * std::sin(static_cast<float>(c.begin + i));
                                       memset(c.data[1], 0, c.n * 4);
                                       memset(c.data[2], 0, c.n * 4);
                                       std::vector<float> g(c.n);
                                       for (size_t i = 0; i < c.n; ++i)
                                         g[i] = 1e-3f * std::cos(0.37f * static_cast<float>(c.begin + i));
                                       auto r = optim::convert_with_norm(g.data(), DType::kF32, c.data[3],
                                                                         gdt, c.n, false);
                                       return r.is_ok() ? Status::ok() : r.status();
                                     }),
                       /*write_all=*/true);
  if (!st.is_ok()) fail(st.with_context("writing the initial optimizer states"));
  optim::AdamParams ap;
  ap.lr = 1e-4f;
  ap.weight_decay = 0.01f;
  int64_t step_no = 0;
  auto adam = [&](const offload::ChunkView& c) -> Status {
    optim::AdamArgs a;
    a.buf.n = c.n;
    a.buf.param = static_cast<float*>(c.data[0]);
    a.buf.exp_avg = c.data[1];
    a.buf.exp_avg_sq = c.data[2];
    a.buf.grad = c.data[3];
    a.buf.grad_dtype = gdt;
    a.params = ap;
    a.step.step = step_no;
    return optim::adam_step(a, exec);
  };
  auto noop = [](const offload::ChunkView&) { return Status::ok(); };

  // Compute alone: the same chunks from memory. Four chunk-sized sets of states, used in turn,
  // are far larger than any cache, so this streams from DRAM as a real in-memory step would,
  // while host memory stays independent of --params.
  const size_t ce = sw->chunk_elems();
  constexpr int kSets = 4;
  std::vector<std::vector<float>> mp(kSets), mm(kSets), mv(kSets);
  std::vector<std::vector<char>> mg(kSets);
  for (int k = 0; k < kSets; ++k) {
    mp[k].assign(ce, 0.01f);
    mm[k].assign(ce, 0.0f);
    mv[k].assign(ce, 0.0f);
    mg[k].assign(ce * dtype_size(gdt), 1);
  }
  auto compute_only = [&]() {
    uint64_t t0 = now_ns();
    int k = 0;
    for (size_t gs : group_sizes) {
      for (size_t b = 0; b < gs; b += ce, k = (k + 1) % kSets) {
        void* data[4] = {mp[k].data(), mm[k].data(), mv[k].data(), mg[k].data()};
        Status s = adam(offload::ChunkView{0, b, std::min(ce, gs - b), data});
        if (!s.is_ok()) fail(s);
      }
    }
    return static_cast<double>(now_ns() - t0) * 1e-9;
  };

  std::vector<double> t_step, t_io, t_comp, overlaps;
  offload::SwapperStats last{};
  for (int r = 0; r < o.repeats; ++r) {
    ++step_no;
    trace.clear();
    const std::string what = fmt("repeat %d/%d: optimizer step (states on NVMe)", r + 1, o.repeats);
    st = sw->step(with_progress(what, adam));
    if (!st.is_ok()) fail(st.with_context("optimizer step"));
    last = sw->last_stats();
    t_step.push_back(static_cast<double>(last.step_ns) * 1e-9);
    if (!o.trace.empty()) {
      Status ts = trace.write_chrome_json(o.trace);
      if (!ts.is_ok()) fail(ts);
    }
    st = sw->step(with_progress(fmt("repeat %d/%d: I/O only", r + 1, o.repeats), noop));
    if (!st.is_ok()) fail(st.with_context("I/O-only pass"));
    t_io.push_back(static_cast<double>(sw->last_stats().step_ns) * 1e-9);
    progress.update(fmt("repeat %d/%d: compute only", r + 1, o.repeats));
    t_comp.push_back(compute_only());
    // The disk's speed drifts: compare each step with the I/O pass measured right after it.
    overlaps.push_back(std::max(t_io.back(), t_comp.back()) / t_step.back());
  }
  progress.done();
  double ts = median(t_step), ti = median(t_io), tc = median(t_comp);
  double overlap = median(overlaps);
  uint64_t rss = peak_rss_bytes();
  double io_gbps = ts > 0 ? static_cast<double>(last.bytes_read + last.bytes_written) / ts * 1e-9 : 0;
  json j = {{"params", n},
            {"sub_group", sub},
            {"groups", group_sizes.size()},
            {"buffers", o.buffers},
            {"buffer_bytes", buf_bytes},
            {"chunk_elems", ce},
            {"grad_dtype", o.grad_dtype},
            {"threads", pool->threads()},
            {"kernel", optim::kernel_path_name(exec)},
            {"repeats", o.repeats},
            {"checksum", o.checksum ? io::swap_checksum_name() : "off"},
            {"t_step", ts},
            {"t_io_only", ti},
            {"t_compute_only", tc},
            {"overlap", overlap},
            {"overlap_all", overlaps},
            {"target_overlap", 0.90},
            {"bytes_read", last.bytes_read},
            {"bytes_written", last.bytes_written},
            {"io_gbps", io_gbps},
            {"buffers_total_bytes", sw->buffer_bytes_total()},
            {"peak_rss_bytes", rss},
            {"t_step_all", t_step},
            {"t_io_only_all", t_io},
            {"t_compute_only_all", t_comp}};
  if (o.json) {
    print_json(j);
    return;
  }
  printf(
      "# zoe bench swap: %llu params in %zu sub-group(s), states on %s (%s), %zu buffers of %s, grads %s, %d "
      "thread(s) (%s)\n",
      static_cast<unsigned long long>(n), group_sizes.size(), paths[0].c_str(),
      format_bytes(store.used_bytes()).c_str(), o.buffers, format_bytes(buf_bytes).c_str(),
      o.grad_dtype.c_str(), pool->threads(), optim::kernel_path_name(exec));
  printf("checksums       %s\n", o.checksum ? io::swap_checksum_name() : "off");
  printf("t_step          %8.3f s   (median of %d; read %s, write %s, %.2f GB/s)\n", ts, o.repeats,
         format_bytes(last.bytes_read).c_str(), format_bytes(last.bytes_written).c_str(), io_gbps);
  printf("t_io_only       %8.3f s\n", ti);
  printf("t_compute_only  %8.3f s\n", tc);
  printf(
      "overlap         %8.3f     median over repeats of max(t_io_only, t_compute_only) / t_step; target >= "
      "0.90: %s\n",
      overlap, overlap >= 0.90 ? "OK" : "BELOW");
  printf("peak RSS        %s  (buffers %s)\n", format_bytes(rss).c_str(),
         format_bytes(sw->buffer_bytes_total()).c_str());
}

}  // namespace

static void add_bench_swap_command(CLI::App& bench) {
  auto o = std::make_shared<BenchSwapOpts>();
  CLI::App* cmd = bench.add_subcommand(
      "swap",
      "One full optimizer step (CPU AdamW) over --params parameters whose fp32 master weights, Adam m and v\n"
      "and gradients live on NVMe, pipelined through --buffers buffers (read ahead / update / write\n"
      "behind). Reports t_step, t_io_only (same I/O, no compute), t_compute_only (same compute, states\n"
      "in memory), overlap = max(t_io_only, t_compute_only) / t_step, and peak RSS, which stays flat\n"
      "as --params grows. The swap files are removed afterwards.");
  cmd->add_option("--params", o->params, "Parameters, e.g. 256M, 1G, 5e8")->capture_default_str();
  cmd->add_option("--path", o->paths,
                  "Directory for the swap files; repeat to stripe (default $ZOE_SCRATCH or /var/tmp)");
  cmd->add_option("--sub-group", o->sub_group, "Elements per optimizer sub-group (sub_group_size)")
      ->capture_default_str();
  cmd->add_option("--buffers", o->buffers, "Pinned buffers in all (4 per pipeline slot)")
      ->capture_default_str();
  cmd->add_option("--buffer-size", o->buffer_size, "Bytes per buffer")->capture_default_str();
  cmd->add_option("--grad-dtype", o->grad_dtype, "bf16, fp16 or fp32")->capture_default_str();
  cmd->add_option("--threads", o->threads, "Optimizer threads (0: all)")->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "Repeats of each measurement (medians reported)")
      ->capture_default_str();
  cmd->add_option("--qd", o->qd, "I/O queue depth")->capture_default_str();
  cmd->add_option("--trace", o->trace, "Write a Chrome-trace timeline of the last step to this file");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->add_flag("--checksum", o->checksum,
                "Checksum every swap write and verify every read (xxh3 per 1 MiB piece; off by default: "
                "run with and without to see what it costs)");
  cmd->callback([o] { run(*o); });
}

// Joins every program this file is linked into (the `zoe` program links all of src/cli).
static const CommandRegistrar kRegister(
    52, "bench",
    "Benchmarks: drive swap bandwidth (io), CPU Adam (adam), NVMe optimizer step (swap), engine (engine)",
    add_bench_swap_command);

}  // namespace zoe::cli
