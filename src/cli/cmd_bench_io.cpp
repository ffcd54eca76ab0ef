// `zoe bench io`: the swap-bandwidth profiler (engines x block sizes x queue depths x read/write).
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/dir_check.h"
#include "core/log.h"
#include "core/units.h"
#include "io/io_bench.h"
#include "io/swap_file.h"
#include "zoe/cli.h"

namespace zoe::cli {
namespace {

using nlohmann::json;

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

struct BenchIoOpts {
  std::vector<std::string> paths;
  std::string size = "1GiB";
  std::string bs = "1MiB";
  std::string qd = "1,8,32";
  std::string engines = "uring";
  std::string rw = "read,write";
  std::string direct = "prefer";
  std::string stripe = "1MiB";
  int loops = 2;
  int warmup = 1;
  bool validate = false;
  bool keep = false;
  bool sqpoll = false;
  bool no_fixed = false;
  bool json = false;
  bool csv = false;
  std::string plot;  // a PNG of GB/s against block size and queue depth
};

// Progress when stderr is not a terminal: one line per this many seconds.
constexpr double kProgressEvery = 5.0;

std::string default_scratch() {
  const char* env = getenv("ZOE_SCRATCH");
  return env && *env ? env : "/var/tmp";
}

json row_json(const io::IoBenchRow& r) {
  return {{"engine", r.engine},
          {"bs", r.bs},
          {"qd", r.qd},
          {"rw", io::io_op_name(r.op)},
          {"gbps", r.gbps},
          {"iops", r.iops},
          {"p50_us", r.p50_us},
          {"p99_us", r.p99_us},
          {"wrong_bytes", r.validated ? json(r.wrong_bytes) : json(nullptr)},
          {"bytes", r.bytes},
          {"seconds", r.seconds}};
}

// The flags, read and checked: the directories, sizes, block sizes (multiples of 4096), queue
// depths (at most 4096), engines, directions and the O_DIRECT mode.
struct IoArgs {
  std::vector<std::string> paths;
  uint64_t size = 0;
  std::vector<uint64_t> bss, qds;
  uint64_t stripe = 0;
  std::vector<io::IoBackend> engines;
  std::vector<io::IoOp> ops;
  io::DirectMode dm = io::DirectMode::kPrefer;
};

// --direct: prefer (or on), require, off.
io::DirectMode parse_direct(const std::string& direct) {
  if (direct == "prefer" || direct == "on") return io::DirectMode::kPrefer;
  if (direct == "require") return io::DirectMode::kRequire;
  if (direct == "off") return io::DirectMode::kOff;
  fail(invalid_argument("--direct: '%s' is not prefer, require or off", direct.c_str()));
}

// A size flag's value; an error names the flag.
uint64_t size_flag(const char* flag, const std::string& text) {
  auto r = parse_bytes(text);
  if (!r.is_ok()) fail(invalid_argument("%s: %s", flag, r.status().message().c_str()));
  return r.value();
}

IoArgs parse_io_args(const BenchIoOpts& o) {
  IoArgs a;
  a.paths = o.paths.empty() ? std::vector<std::string>{default_scratch()} : o.paths;
  a.size = size_flag("--size", o.size);
  a.bss = value_or_fail(parse_bytes_list(o.bs, "--bs"));
  a.qds = value_or_fail(parse_uint_list(o.qd, "--qd"));
  a.stripe = size_flag("--stripe", o.stripe);
  for (const auto& e : value_or_fail(split_list(o.engines, "--engine")))
    a.engines.push_back(value_or_fail(io::parse_io_backend(e)));
  for (const auto& r : value_or_fail(split_list(o.rw, "--rw"))) {
    if (r == "read")
      a.ops.push_back(io::IoOp::kRead);
    else if (r == "write")
      a.ops.push_back(io::IoOp::kWrite);
    else
      fail(invalid_argument("--rw: '%s' is not read or write", r.c_str()));
  }
  a.dm = parse_direct(o.direct);
  if (a.size < 4096 || a.size % 4096)
    fail(invalid_argument("--size %s must be a multiple of 4096 bytes", o.size.c_str()));
  for (uint64_t b : a.bss) {
    if (b < 4096 || b % 4096)
      fail(invalid_argument("--bs %s: each block size must be a multiple of 4096", o.bs.c_str()));
  }
  for (uint64_t q : a.qds) {
    if (q > 4096) fail(invalid_argument("--qd %llu is above 4096", static_cast<unsigned long long>(q)));
  }
  if (o.loops < 1 || o.warmup < 0) fail(invalid_argument("--loops must be >= 1 and --warmup >= 0"));
  for (const auto& p : a.paths) {
    Status s = check_dir_holds_files("--path", p);
    if (!s.is_ok()) fail(s);
  }
  if (!o.plot.empty()) {
    check_output_flag("--plot", o.plot);
    Status ps = plot_available();
    if (!ps.is_ok()) fail(ps.with_context("checking for --plot " + o.plot + " before the benchmark"));
  }
  return a;
}

// A new file (or --validate): written with the known pattern and synced before any pass.
void lay_out(io::SwapFile& sf, const io::Extent& ext, const IoArgs& a, Progress& progress) {
  progress.update("laying out " + format_bytes(a.size) + " over " + std::to_string(a.paths.size()) +
                  " file(s)" + (sf.direct() ? "" : " (buffered: no O_DIRECT)"));
  Status s = io::write_pattern(sf, ext, 0x5eed);
  if (!s.is_ok()) fail(s.with_context("laying out the benchmark file"));
  for (const auto& f : sf.files()) {
    Status ss = f->sync();
    if (!ss.is_ok()) fail(ss);
  }
}

// One measured case's row, as CSV or as a table row (--json prints nothing per row).
void print_io_row(const BenchIoOpts& o, const io::IoBenchRow& row, const Table& table) {
  std::string wrong = row.validated ? std::to_string(row.wrong_bytes) : "-";
  if (o.csv) {
    printf("%s,%s,%zu,%u,%.4f,%.1f,%.1f,%.1f,%s\n", row.engine.c_str(), io::io_op_name(row.op), row.bs,
           row.qd, row.gbps, row.iops, row.p50_us, row.p99_us, row.validated ? wrong.c_str() : "");
    fflush(stdout);
  } else {
    table.print_row(stdout, {row.engine, io::io_op_name(row.op), std::to_string(row.bs),
                             std::to_string(row.qd), fmt("%.3f", row.gbps), fmt("%.0f", row.iops),
                             fmt("%.0f", row.p50_us), fmt("%.0f", row.p99_us), wrong});
  }
}

// The sweep's shared state: the file, its extent, the progress line and the rows measured.
struct IoSweep {
  const BenchIoOpts& o;
  io::SwapFile* sf;
  io::Extent ext;
  Progress& progress;
  uint64_t t_start;
  std::vector<io::IoBenchRow> rows;

  // One case (engine, block size, queue depth, direction), `label` on the progress line.
  io::IoBenchRow run_case(const io::IoBenchCase& c, const std::string& label) {
    io::IoBenchConfig cfg;
    cfg.file = sf;
    cfg.extent = ext;
    cfg.loops = o.loops;
    cfg.warmup = o.warmup;
    cfg.validate = o.validate;
    cfg.fixed = !o.no_fixed;
    cfg.sqpoll = o.sqpoll;
    cfg.stop = &g_stop;
    cfg.on_pass = [&](int pass, int passes) {
      const double el = static_cast<double>(now_ns() - t_start) * 1e-9;
      progress.update(label +
                      fmt(" pass %d/%d%s  %.0fs", pass + 1, passes, pass < o.warmup ? " (warmup)" : "", el));
    };
    auto r = io::run_io_bench(cfg, c);
    if (!r.is_ok()) {
      progress.done();
      if (r.status().code() == StatusCode::kCancelled) fail(r.status().with_context("zoe bench io (Ctrl-C)"));
      fail(r.status().with_context(label));
    }
    return r.value();
  }
};

// The fastest read and write rows, and the bytes read back wrong over all rows.
struct IoBest {
  const io::IoBenchRow* best[2] = {nullptr, nullptr};
  uint64_t wrong_total = 0;
};

IoBest best_rows(const std::vector<io::IoBenchRow>& rows) {
  IoBest b;
  for (const auto& r : rows) {
    auto i = static_cast<int>(r.op);
    if (!b.best[i] || r.gbps > b.best[i]->gbps) b.best[i] = &r;
    b.wrong_total += r.wrong_bytes;
  }
  return b;
}

// The JSON (--json, and --plot's input): the configuration, every row, the best, ok.
json io_json(const BenchIoOpts& o, const IoArgs& a, bool direct, const std::vector<io::IoBenchRow>& rows,
             const IoBest& b) {
  json j;
  j["config"] = {
      {"paths", a.paths},  {"size", a.size},     {"stripe", a.stripe},     {"direct", direct},
      {"loops", o.loops},  {"warmup", o.warmup}, {"validate", o.validate}, {"fixed_buffers", !o.no_fixed},
      {"sqpoll", o.sqpoll}};
  json jr = json::array();
  for (const auto& r : rows) jr.push_back(row_json(r));
  j["rows"] = jr;
  j["best"] = {{"read", b.best[0] ? row_json(*b.best[0]) : json(nullptr)},
               {"write", b.best[1] ? row_json(*b.best[1]) : json(nullptr)}};
  j["ok"] = b.wrong_total == 0;
  return j;
}

// The text report's end: the best read and write, and the validation's verdict.
void print_best(const BenchIoOpts& o, const IoBest& b) {
  for (int i = 0; i < 2; ++i) {
    if (!b.best[i]) continue;
    printf("# best %-5s: %.3f GB/s  (%s, bs %s, qd %u, p99 %.0f us)\n", i == 0 ? "read" : "write",
           b.best[i]->gbps, b.best[i]->engine.c_str(), format_bytes(b.best[i]->bs).c_str(), b.best[i]->qd,
           b.best[i]->p99_us);
  }
  if (o.validate)
    printf("# validation: %s (%llu wrong bytes)\n", b.wrong_total ? "FAILED" : "OK",
           static_cast<unsigned long long>(b.wrong_total));
}

void run(const BenchIoOpts& o) {
  const IoArgs a = parse_io_args(o);

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  io::SwapFileOptions so;
  so.dirs = a.paths;
  so.name = "zoe-bench";
  so.stripe_bytes = a.stripe;
  so.direct = a.dm;
  so.keep = o.keep;
  so.reuse = o.keep;
  so.grow_bytes = 0;
  auto sf = value_or_fail(io::SwapFile::create(so));
  bool fresh = sf->capacity() < a.size;
  auto ext = value_or_fail(sf->allocate(a.size));
  Progress progress(true, kProgressEvery);
  IoSweep sweep{o, sf.get(), ext, progress, now_ns(), {}};
  if (fresh || o.validate) lay_out(*sf, ext, a, progress);

  size_t total = a.engines.size() * a.bss.size() * a.qds.size() * a.ops.size(), k = 0;
  Table table({{"engine", "", 8, true},
               {"rw", "", 6, true},
               {"bs", "(B)", 9},
               {"qd", "", 5},
               {"bw", "(GB/s)", 8},
               {"iops", "", 9},
               {"p50", "(us)", 9},
               {"p99", "(us)", 9},
               {"#wrong", "(B)", 8}});
  if (!o.json && !o.csv) {
    printf("# zoe bench io: %s over %zu path(s) (%s), O_DIRECT %s, loops %d, warmup %d%s\n",
           format_bytes(a.size).c_str(), a.paths.size(), a.paths[0].c_str(), sf->direct() ? "on" : "off",
           o.loops, o.warmup, o.validate ? ", validating" : "");
    table.print_header(stdout);
  } else if (o.csv) {
    printf("engine,rw,bs,qd,gbps,iops,p50_us,p99_us,wrong_bytes\n");
  }
  for (auto be : a.engines) {
    for (uint64_t b : a.bss) {
      for (uint64_t q : a.qds) {
        for (auto op : a.ops) {
          ++k;
          std::string label =
              fmt("[%zu/%zu] %s %s bs=%s qd=%llu", k, total, io::io_backend_name(be), io::io_op_name(op),
                  format_bytes(b).c_str(), static_cast<unsigned long long>(q));
          io::IoBenchCase c{be, static_cast<size_t>(b), static_cast<uint32_t>(q), op};
          sweep.rows.push_back(sweep.run_case(c, label));
          if (o.json) continue;
          progress.done();
          print_io_row(o, sweep.rows.back(), table);
        }
      }
    }
  }
  progress.done();
  const IoBest best = best_rows(sweep.rows);
  json j = io_json(o, a, sf->direct(), sweep.rows, best);
  if (!o.plot.empty()) {
    progress.update("plotting " + o.plot);
    Status ps = write_plot("bench-io", j.dump(), o.plot);
    progress.done();
    if (!ps.is_ok()) fail(ps);
    if (!o.json && !o.csv) printf("# plot: %s\n", o.plot.c_str());
  }
  if (o.json) {
    print_json(j);
  } else if (!o.csv) {
    print_best(o, best);
  }
  if (best.wrong_total)
    fail(corruption("%llu bytes read back differ from what was written",
                    static_cast<unsigned long long>(best.wrong_total)));
}

}  // namespace

static void add_bench_io_command(CLI::App& bench) {
  auto o = std::make_shared<BenchIoOpts>();
  CLI::App* cmd = bench.add_subcommand(
      "io",
      "Measure the swap bandwidth of drives through zoe's I/O engine: sequential passes over a file\n"
      "(striped over every --path), for each engine x block size x queue depth x read/write.\n"
      "Prints a table (or --json / --csv) with GB/s, IOPS and p50/p99 latency; the file is removed\n"
      "afterwards unless --keep. Compare with fio using bench/io_vs_fio.sh.");
  cmd->add_option("--path", o->paths,
                  "Directory for the benchmark file; repeat to stripe over drives "
                  "(default: $ZOE_SCRATCH or /var/tmp)");
  cmd->add_option("--size", o->size, "Bytes per file pass, e.g. 4GiB")->capture_default_str();
  cmd->add_option("--bs", o->bs, "Block size(s), comma separated, e.g. 128KiB,1MiB")->capture_default_str();
  cmd->add_option("--qd", o->qd, "Queue depth(s), comma separated")->capture_default_str();
  cmd->add_option("--engine", o->engines, "I/O engine(s): uring, threads (comma separated)")
      ->capture_default_str();
  cmd->add_option("--rw", o->rw, "read, write, or both (comma separated)")->capture_default_str();
  int_range(cmd->add_option("--loops", o->loops, "Timed passes per row"), 1, kMaxRepeats)
      ->capture_default_str();
  int_range(cmd->add_option("--warmup", o->warmup, "Untimed passes before them"), 0, kMaxRepeats)
      ->capture_default_str();
  cmd->add_option("--direct", o->direct,
                  "O_DIRECT: prefer (fall back to buffered with a warning), require, off")
      ->capture_default_str();
  cmd->add_option("--stripe", o->stripe, "Striping unit across several --path")->capture_default_str();
  cmd->add_flag("--validate", o->validate, "Write a known pattern, check every byte read, count wrong bytes");
  cmd->add_flag("--keep", o->keep, "Keep <path>/zoe-bench.<i>.swap (and reuse it next time)");
  cmd->add_flag("--sqpoll", o->sqpoll, "io_uring: use a kernel submission-polling thread");
  cmd->add_flag("--no-fixed", o->no_fixed, "io_uring: do not register buffers and files");
  cmd->add_flag("--json", o->json,
                "Print one JSON object (rows with engine, bs, qd, rw, gbps, iops, p50_us, "
                "p99_us, wrong_bytes)");
  cmd->add_flag("--csv", o->csv, "Print CSV rows");
  cmd->add_option("--plot", o->plot,
                  "Also draw GB/s against block size and queue depth into this PNG "
                  "(python3 + matplotlib, scripts/zoe_plot.py)");
  cmd->callback([o] { run(*o); });
}

// Joins every program this file is linked into (the `zoe` program links all of src/cli).
static const CommandRegistrar kRegister(
    50, "bench",
    "Benchmarks: drive swap bandwidth (io), CPU Adam (adam), NVMe optimizer step (swap), engine (engine), "
    "collectives across the ranks (comm)",
    add_bench_io_command);

}  // namespace zoe::cli
