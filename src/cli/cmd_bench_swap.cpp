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
#include "core/dir_check.h"
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
  bool no_hole_check = false;
};

uint64_t parse_count(const std::string& s, const char* flag) {
  std::string t = s;
  // Counts take the single-letter suffixes of sizes, read as decimal multipliers (256M = 256e6,
  // up to E = 1e18)...
  const char* kSuffixes = "KMGTPE";
  const char* at = t.empty() ? nullptr : strchr(kSuffixes, t.back());
  if (at != nullptr && *at != '\0') {
    const double mul = std::pow(1e3, static_cast<double>(at - kSuffixes + 1));
    t.pop_back();
    char* end = nullptr;
    double v = strtod(t.c_str(), &end);
    if (end == t.c_str() || *end || !(v > 0))
      fail(invalid_argument("%s %s is not a count (e.g. 256M, 1G, 5e8)", flag, s.c_str()));
    if (!(v * mul < 0x1p64))
      fail(invalid_argument("%s %s is out of range (at most 2^64 - 1)", flag, s.c_str()));
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

// The flags, read and checked: the parameter and sub-group counts, the buffer size, the
// gradient dtype and the directories (each must exist; default $ZOE_SCRATCH or /var/tmp).
struct SwapArgs {
  uint64_t n = 0, sub = 0, buf_bytes = 0;
  DType gdt = DType::kF32;
  std::vector<std::string> paths;
};

// The states' bytes on each --path (master, m and v in fp32 and the gradient, striped over the
// paths), checked against its free space before anything is written: a benchmark that does not fit
// is refused instead of filling the file system.
void check_swap_space(const SwapArgs& a) {
  const uint64_t per_elem = 12 + dtype_size(a.gdt);
  const uint64_t n_paths = a.paths.size();
  const unsigned __int128 total = static_cast<unsigned __int128>(a.n) * per_elem;
  const unsigned __int128 share = total / n_paths + (64ull << 20);  // the file's growth step's slack
  for (const auto& p : a.paths) {
    auto fb = io::free_bytes_at(p);
    if (!fb.is_ok() || share <= fb.value()) continue;
    const uint64_t need = share > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(share);
    const uint64_t fits = (fb.value() > (64ull << 20) ? fb.value() - (64ull << 20) : 0) * n_paths / per_elem;
    fail(
        no_space("--params %llu: the optimizer states need %llu bytes (%s) on --path %s, but %llu bytes (%s) "
                 "are free there; lower --params (at most about %llu fit) or pass a --path with room",
                 static_cast<unsigned long long>(a.n), static_cast<unsigned long long>(need),
                 format_bytes(need).c_str(), p.c_str(), static_cast<unsigned long long>(fb.value()),
                 format_bytes(fb.value()).c_str(), static_cast<unsigned long long>(fits)));
  }
}

SwapArgs parse_swap_args(const BenchSwapOpts& o) {
  SwapArgs a;
  a.n = parse_count(o.params, "--params");
  a.sub = parse_count(o.sub_group, "--sub-group");
  auto buf = parse_bytes(o.buffer_size);
  if (!buf.is_ok()) fail(invalid_argument("--buffer-size: %s", buf.status().message().c_str()));
  a.buf_bytes = buf.value();
  if (o.grad_dtype == "bf16")
    a.gdt = DType::kBF16;
  else if (o.grad_dtype == "fp16")
    a.gdt = DType::kF16;
  else if (o.grad_dtype == "fp32")
    a.gdt = DType::kF32;
  else
    fail(invalid_argument("--grad-dtype %s: expected bf16, fp16 or fp32", o.grad_dtype.c_str()));
  if (o.repeats < 1) fail(invalid_argument("--repeats must be >= 1"));
  a.paths = o.paths;
  if (a.paths.empty()) {
    const char* env = getenv("ZOE_SCRATCH");
    a.paths.push_back(env && *env ? env : "/var/tmp");
  }
  for (const auto& p : a.paths) {
    Status s = check_dir_holds_files("--path", p);
    if (!s.is_ok()) fail(s);
  }
  check_swap_space(a);
  return a;
}

// What the benchmark runs on, built in this order (and released in the reverse one): the I/O
// engine, the swap file on --path, its store, the trace, the optimizer swapper (master, m, v and
// the gradient of each element on NVMe) and the CPU Adam's thread pool.
struct SwapRig {
  std::unique_ptr<io::IoEngine> engine;
  std::unique_ptr<io::SwapFile> swap;
  offload::SwapStore store;
  TraceRecorder trace;
  std::unique_ptr<offload::OptimizerSwapper> sw;
  std::unique_ptr<optim::CpuPool> pool;
  optim::Exec exec;

  SwapRig(const BenchSwapOpts& o, const SwapArgs& a)
      : engine(make_engine(o)),
        swap(make_swap_file(o, a, engine.get())),
        store(swap.get(), engine.get(), 0),
        trace(!o.trace.empty()),
        sw(make_swapper(o, a, &store, &trace)),
        pool(make_pool(o)) {
    exec.pool = pool.get();
  }

  static std::unique_ptr<io::IoEngine> make_engine(const BenchSwapOpts& o) {
    io::IoEngineOptions eo;
    eo.queue_depth = o.qd;
    return value_or_fail(io::IoEngine::create(eo));
  }
  static std::unique_ptr<io::SwapFile> make_swap_file(const BenchSwapOpts& o, const SwapArgs& a,
                                                      io::IoEngine* engine) {
    io::SwapFileOptions so;
    so.dirs = a.paths;
    so.name = "zoe-bench-swap";
    so.grow_bytes = 1u << 30;
    so.checksum = o.checksum;
    so.hole_check = !o.no_hole_check;
    auto swap = value_or_fail(io::SwapFile::create(so));
    (void)swap->register_files(*engine);
    return swap;
  }
  static std::unique_ptr<offload::OptimizerSwapper> make_swapper(const BenchSwapOpts& o, const SwapArgs& a,
                                                                 offload::SwapStore* store,
                                                                 TraceRecorder* trace) {
    offload::SwapperOptions sopts;
    sopts.states = {{offload::StateKind::kMaster, 4, true},
                    {offload::StateKind::kAdamM, 4, true},
                    {offload::StateKind::kAdamV, 4, true},
                    {offload::StateKind::kGrad, static_cast<uint32_t>(dtype_size(a.gdt)), false}};
    sopts.buffer_count = o.buffers;
    sopts.buffer_bytes = a.buf_bytes;
    sopts.trace = trace;
    return value_or_fail(offload::OptimizerSwapper::create(store, sopts));
  }
  static std::unique_ptr<optim::CpuPool> make_pool(const BenchSwapOpts& o) {
    optim::CpuPool::Options po;
    po.threads = o.threads;
    return value_or_fail(optim::CpuPool::create(po));
  }
};

// A pass with its share done so far on the progress line (the update runs chunk after chunk).
offload::ChunkUpdate with_progress(Progress& progress, double total_elems, const std::string& what,
                                   const offload::ChunkUpdate& fn) {
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
}

// The sub-groups of --sub-group elements (the last one shorter) registered with the swapper.
std::vector<size_t> add_groups(offload::OptimizerSwapper* sw, uint64_t n, uint64_t sub) {
  std::vector<size_t> group_sizes;
  for (uint64_t g = 0, done = 0; done < n; ++g) {
    size_t s = static_cast<size_t>(std::min<uint64_t>(sub, n - done));
    Status st = sw->add_group(offload::GroupId{g}, s);
    if (!st.is_ok()) fail(st);
    group_sizes.push_back(s);
    done += s;
  }
  return group_sizes;
}

// The initial states of a chunk: parameters 0.02 sin(i), zero moments, gradients 1e-3 cos(0.37 i).
Status initial_states(const offload::ChunkView& c, DType gdt) {
  auto* p = static_cast<float*>(c.data[0]);
  for (size_t i = 0; i < c.n; ++i) p[i] = 0.02f * std::sin(static_cast<float>(c.begin + i));
  memset(c.data[1], 0, c.n * 4);
  memset(c.data[2], 0, c.n * 4);
  std::vector<float> g(c.n);
  for (size_t i = 0; i < c.n; ++i) g[i] = 1e-3f * std::cos(0.37f * static_cast<float>(c.begin + i));
  auto r = optim::convert_with_norm(g.data(), DType::kF32, c.data[3], gdt, c.n, false);
  return r.is_ok() ? Status::ok() : r.status();
}

// Compute alone: the same chunks from memory. Four chunk-sized sets of states, used in turn,
// are far larger than any cache, so this streams from DRAM as a real in-memory step would,
// while host memory stays independent of --params.
struct InMemoryStates {
  static constexpr int kSets = 4;
  size_t ce;
  std::vector<std::vector<float>> mp, mm, mv;
  std::vector<std::vector<char>> mg;

  InMemoryStates(size_t chunk_elems, DType gdt)
      : ce(chunk_elems), mp(kSets), mm(kSets), mv(kSets), mg(kSets) {
    for (int k = 0; k < kSets; ++k) {
      mp[k].assign(ce, 0.01f);
      mm[k].assign(ce, 0.0f);
      mv[k].assign(ce, 0.0f);
      mg[k].assign(ce * dtype_size(gdt), 1);
    }
  }
  // Seconds for `adam` over every group's chunks.
  double time(const offload::ChunkUpdate& adam, const std::vector<size_t>& group_sizes) {
    uint64_t t0 = now_ns();
    int k = 0;
    for (size_t gs : group_sizes) {
      for (size_t b = 0; b < gs; b += ce, k = (k + 1) % kSets) {
        void* data[4] = {mp[k].data(), mm[k].data(), mv[k].data(), mg[k].data()};
        Status s = adam(offload::ChunkView{offload::GroupId{0}, b, std::min(ce, gs - b), data});
        if (!s.is_ok()) fail(s);
      }
    }
    return static_cast<double>(now_ns() - t0) * 1e-9;
  }
};

// Every repeat's times (the step, the I/O alone, the compute alone, their overlap), their
// medians, and what the report shows beside them.
struct SwapReport {
  std::vector<double> t_step, t_io, t_comp, overlaps;
  offload::SwapperStats last{};
  double ts = 0, ti = 0, tc = 0, overlap = 0, io_gbps = 0;
  uint64_t rss = 0;
  size_t groups = 0, chunk_elems = 0;
  int threads = 0;
  const char* kernel = "";
  uint64_t buffers_total = 0;
};

json swap_json(const BenchSwapOpts& o, const SwapArgs& a, const SwapReport& r) {
  return {{"params", a.n},
          {"sub_group", a.sub},
          {"groups", r.groups},
          {"buffers", o.buffers},
          {"buffer_bytes", a.buf_bytes},
          {"chunk_elems", r.chunk_elems},
          {"grad_dtype", o.grad_dtype},
          {"threads", r.threads},
          {"kernel", r.kernel},
          {"repeats", o.repeats},
          {"checksum", o.checksum ? io::swap_checksum_name() : "off"},
          {"hole_check", !o.no_hole_check},
          {"t_step", r.ts},
          {"t_io_only", r.ti},
          {"t_compute_only", r.tc},
          {"overlap", r.overlap},
          {"overlap_all", r.overlaps},
          {"target_overlap", 0.90},
          {"bytes_read", r.last.bytes_read},
          {"bytes_written", r.last.bytes_written},
          {"io_gbps", r.io_gbps},
          {"buffers_total_bytes", r.buffers_total},
          {"peak_rss_bytes", r.rss},
          {"t_step_all", r.t_step},
          {"t_io_only_all", r.t_io},
          {"t_compute_only_all", r.t_comp}};
}

// The text report: the medians and the overlap against its 0.90 target.
void print_swap(const BenchSwapOpts& o, const SwapArgs& a, const SwapReport& r, uint64_t store_bytes) {
  printf(
      "# zoe bench swap: %llu params in %zu sub-group(s), states on %s (%s), %zu buffers of %s, grads %s, %d "
      "thread(s) (%s)\n",
      static_cast<unsigned long long>(a.n), r.groups, a.paths[0].c_str(), format_bytes(store_bytes).c_str(),
      o.buffers, format_bytes(a.buf_bytes).c_str(), o.grad_dtype.c_str(), r.threads, r.kernel);
  printf("checksums       %s, hole checks %s\n", o.checksum ? io::swap_checksum_name() : "off",
         o.no_hole_check ? "off" : "on");
  printf("t_step          %8.3f s   (median of %d; read %s, write %s, %.2f GB/s)\n", r.ts, o.repeats,
         format_bytes(r.last.bytes_read).c_str(), format_bytes(r.last.bytes_written).c_str(), r.io_gbps);
  printf("t_io_only       %8.3f s\n", r.ti);
  printf("t_compute_only  %8.3f s\n", r.tc);
  printf(
      "overlap         %8.3f     median over repeats of max(t_io_only, t_compute_only) / t_step; target >= "
      "0.90: %s\n",
      r.overlap, r.overlap >= 0.90 ? "OK" : "BELOW");
  printf("peak RSS        %s  (buffers %s)\n", format_bytes(r.rss).c_str(),
         format_bytes(r.buffers_total).c_str());
}

void run(const BenchSwapOpts& o) {
  const SwapArgs a = parse_swap_args(o);
  const uint64_t n = a.n;
  const DType gdt = a.gdt;

  SwapRig rig(o, a);
  offload::OptimizerSwapper* sw = rig.sw.get();
  TraceRecorder& trace = rig.trace;

  Progress progress(true, 5.0);  // not a terminal: one line per 5 s
  const double total_elems = static_cast<double>(n);
  progress.update("registering " + std::to_string(n) + " parameters (" +
                  format_bytes(n * (12 + dtype_size(gdt))) + " of states) on " +
                  std::to_string(a.paths.size()) + " path(s)");
  const std::vector<size_t> group_sizes = add_groups(sw, n, a.sub);
  // Initial states, written through the pipeline itself (no N-sized host array).
  Status st = sw->step(with_progress(progress, total_elems, "writing initial states",
                                     [&](const offload::ChunkView& c) { return initial_states(c, gdt); }),
                       /*write_all=*/true);
  if (!st.is_ok()) fail(st.with_context("writing the initial optimizer states"));
  optim::AdamParams ap;
  ap.lr = 1e-4f;
  ap.weight_decay = 0.01f;
  int64_t step_no = 0;
  auto adam = [&](const offload::ChunkView& c) -> Status {
    optim::AdamArgs aa;
    aa.buf.n = c.n;
    aa.buf.param = static_cast<float*>(c.data[0]);
    aa.buf.exp_avg = c.data[1];
    aa.buf.exp_avg_sq = c.data[2];
    aa.buf.grad = c.data[3];
    aa.buf.grad_dtype = gdt;
    aa.params = ap;
    aa.step.step = step_no;
    return optim::adam_step(aa, rig.exec);
  };
  auto noop = [](const offload::ChunkView&) { return Status::ok(); };
  InMemoryStates mem(sw->chunk_elems(), gdt);

  SwapReport r;
  for (int i = 0; i < o.repeats; ++i) {
    ++step_no;
    trace.clear();
    const std::string what = fmt("repeat %d/%d: optimizer step (states on NVMe)", i + 1, o.repeats);
    st = sw->step(with_progress(progress, total_elems, what, adam));
    if (!st.is_ok()) fail(st.with_context("optimizer step"));
    r.last = sw->last_stats();
    r.t_step.push_back(static_cast<double>(r.last.step_ns) * 1e-9);
    if (!o.trace.empty()) {
      Status ts = trace.write_chrome_json(o.trace);
      if (!ts.is_ok()) fail(ts);
    }
    st =
        sw->step(with_progress(progress, total_elems, fmt("repeat %d/%d: I/O only", i + 1, o.repeats), noop));
    if (!st.is_ok()) fail(st.with_context("I/O-only pass"));
    r.t_io.push_back(static_cast<double>(sw->last_stats().step_ns) * 1e-9);
    progress.update(fmt("repeat %d/%d: compute only", i + 1, o.repeats));
    r.t_comp.push_back(mem.time(adam, group_sizes));
    // The disk's speed drifts: compare each step with the I/O pass measured right after it.
    r.overlaps.push_back(std::max(r.t_io.back(), r.t_comp.back()) / r.t_step.back());
  }
  progress.done();
  r.ts = median(r.t_step), r.ti = median(r.t_io), r.tc = median(r.t_comp);
  r.overlap = median(r.overlaps);
  r.rss = peak_rss_bytes();
  r.io_gbps = r.ts > 0 ? static_cast<double>(r.last.bytes_read + r.last.bytes_written) / r.ts * 1e-9 : 0;
  r.groups = group_sizes.size();
  r.chunk_elems = mem.ce;
  r.threads = rig.pool->threads();
  r.kernel = optim::kernel_path_name(rig.exec);
  r.buffers_total = sw->buffer_bytes_total();
  if (o.json) {
    print_json(swap_json(o, a, r));
    return;
  }
  print_swap(o, a, r, rig.store.used_bytes());
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
  int_range(cmd->add_option("--buffers", o->buffers, "Pinned buffers in all (4 per pipeline slot)"), 1, 4096)
      ->capture_default_str();
  cmd->add_option("--buffer-size", o->buffer_size, "Bytes per buffer")->capture_default_str();
  cmd->add_option("--grad-dtype", o->grad_dtype, "bf16, fp16 or fp32")->capture_default_str();
  int_range(cmd->add_option("--threads", o->threads, "Optimizer threads (0: all)"), 0, kMaxThreads)
      ->capture_default_str();
  int_range(cmd->add_option("--repeats", o->repeats, "Repeats of each measurement (medians reported)"), 1,
            kMaxRepeats)
      ->capture_default_str();
  int_range(cmd->add_option("--qd", o->qd, "I/O queue depth"), 1, 4096)->capture_default_str();
  cmd->add_option("--trace", o->trace, "Write a Chrome-trace timeline of the last step to this file");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->add_flag("--checksum", o->checksum,
                "Checksum every swap write and verify every read (xxh3 per 1 MiB piece; off by default: "
                "run with and without to see what it costs)");
  cmd->add_flag("--no-hole-check", o->no_hole_check,
                "Skip the hole checks (on by default: each read's fstat also checks that the swap file "
                "kept its disk blocks; run with and without to see what they cost)");
  cmd->callback([o] {
    check_output_flag("--trace", o->trace);
    run(*o);
  });
}

// Joins every program this file is linked into (the `zoe` program links all of src/cli).
static const CommandRegistrar kRegister(
    52, "bench",
    "Benchmarks: drive swap bandwidth (io), CPU Adam (adam), NVMe optimizer step (swap), engine (engine), "
    "collectives across the ranks (comm)",
    add_bench_swap_command);

}  // namespace zoe::cli
