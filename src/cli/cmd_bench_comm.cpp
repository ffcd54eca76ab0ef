// `zoe bench comm`: the collectives zoe uses, swept over sizes across the ranks of the launch, in
// nccl-tests' columns (comm/comm_bench.h), on the communicator zoe trains with.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "comm/comm_bench.h"
#include "comm/communicator.h"
#include "core/units.h"
#include "device/device.h"
#include "zoe/cli.h"

namespace zoe::cli {
namespace {

using nlohmann::json;
namespace cb = comm::bench;

constexpr uint64_t kMaxBytes = uint64_t{16} << 30;

struct Opts {
  std::string ops = "allreduce,reducescatter,allgather,broadcast";
  std::string sizes = "1KiB..64MiB";
  std::string backend = "auto";
  int iters = 20;
  int warmup = 5;
  bool json = false;
};

// The communicator the engine's device collectives would use: NCCL over the local rank's GPU
// where every rank has one (and zoe was built with NCCL), else the host communicator itself.
struct Comms {
  std::unique_ptr<comm::Communicator> host;
  std::unique_ptr<device::Device> dev;
  std::unique_ptr<device::Stream> stream;
  std::unique_ptr<comm::Communicator> nccl;
  comm::Communicator& bench() { return nccl ? *nccl : *host; }
};

// This rank's GPU (the local rank's, as the engine picks it) and a stream for the collectives.
Status open_gpu(Comms* c, int* ordinal) {
  std::string why;
  const int gpus = device::cuda_device_count(&why);
  if (gpus <= 0) return unsupported("no usable GPU (%s)", why.empty() ? "none found" : why.c_str());
  *ordinal = c->host->local_rank() % gpus;
  ZOE_ASSIGN_OR_RETURN(c->dev, device::create_cuda_device(*ordinal, kMaxBytes * 2 + (64u << 20)));
  ZOE_ASSIGN_OR_RETURN(c->stream, c->dev->create_stream());
  return Status::ok();
}

Status open_nccl(Comms* c) {
  int ordinal = 0;
  Status local = open_gpu(c, &ordinal);
  // Every rank learns whether all have a GPU, so that all choose the same backend and none is left
  // waiting in NCCL's setup.
  int64_t failed = local.is_ok() ? 0 : 1;
  ZOE_RETURN_IF_ERROR(
      c->host->all_reduce(&failed, &failed, 1, comm::CommType::kI64, comm::ReduceOp::kMax).wait());
  if (!local.is_ok()) return local.with_context("--backend nccl");
  if (failed != 0) return unsupported("--backend nccl: another rank has no usable GPU");
  ZOE_ASSIGN_OR_RETURN(c->nccl, comm::create_nccl_comm(*c->host, ordinal, c->stream->native_handle()));
  return Status::ok();
}

Comms open_comms(const std::string& backend) {
  if (backend != "auto" && backend != "host" && backend != "nccl")
    usage_fail(invalid_argument("--backend %s: expected auto, host or nccl", backend.c_str()));
  Comms c;
  c.host = value_or_fail(comm::create_launcher_comm());  // MPI, gloo under torchrun, or one rank
  if (backend == "host") return c;
  Status s = open_nccl(&c);
  if (!s.is_ok()) {
    if (backend == "nccl") fail(s);
    c.nccl.reset();
    c.stream.reset();
    c.dev.reset();
  }
  return c;
}

cb::Memory device_memory(device::Device& dev) {
  cb::Memory m;
  m.allocate = [&dev](size_t bytes) { return dev.allocate(bytes); };
  m.release = [&dev](void* p) { dev.free(p); };
  m.upload = [&dev](void* dst, const void* src, size_t bytes) { return dev.copy_to_device(dst, src, bytes); };
  m.download = [&dev](void* dst, const void* src, size_t bytes) { return dev.copy_to_host(dst, src, bytes); };
  return m;
}

json to_json(const cb::Report& r, const cb::Config& c) {
  json rows = json::array();
  for (const cb::Row& row : r.rows) {
    rows.push_back({{"op", cb::op_name(row.op)},
                    {"bytes", row.bytes},
                    {"count", row.count},
                    {"time_us", row.time_us},
                    {"algbw_gbps", row.algbw_gbps},
                    {"busbw_gbps", row.busbw_gbps},
                    {"wrong", row.wrong}});
  }
  return json{{"ranks", r.ranks},   {"nodes", r.nodes}, {"backend", r.backend}, {"hosts", r.hosts},
              {"dtype", "float32"}, {"iters", c.iters}, {"warmup", c.warmup},   {"rows", rows}};
}

// The average busbw of `op`'s rows (nccl-tests' "Avg bus bandwidth").
double average_busbw(const cb::Report& r, cb::Op op) {
  double sum = 0;
  int n = 0;
  for (const cb::Row& row : r.rows) {
    if (row.op != op) continue;
    sum += row.busbw_gbps;
    ++n;
  }
  return n > 0 ? sum / n : 0;
}

void print_human(const cb::Report& r, const cb::Config& c) {
  std::string hosts;
  for (const std::string& h : r.hosts) {
    if (hosts.find(h) == std::string::npos) hosts += (hosts.empty() ? "" : ", ") + h;
  }
  printf("# zoe bench comm: %d rank(s) on %d node(s) (%s), backend %s\n", r.ranks, r.nodes, hosts.c_str(),
         r.backend.c_str());
  printf("#   float32 sum, broadcast from rank 0; %d timed iterations after %d warm-up; time: the slowest\n",
         c.iters, c.warmup);
  printf("#   rank's mean; busbw = algbw x 2(n-1)/n (allreduce), (n-1)/n (reducescatter, allgather), 1\n");
  printf("#   (broadcast)\n#\n");
  Table t({{"op", "", 13, true},
           {"size", "(B)", 12},
           {"count", "(elements)", 12},
           {"type", "", 7},
           {"redop", "", 5},
           {"root", "", 5},
           {"time", "(us)", 10},
           {"algbw", "(GB/s)", 8},
           {"busbw", "(GB/s)", 8},
           {"#wrong", "", 7}});
  t.print_header(stdout);
  uint64_t wrong = 0;
  for (const cb::Row& row : r.rows) {
    const bool reduces = row.op == cb::Op::kAllReduce || row.op == cb::Op::kReduceScatter;
    t.print_row(stdout,
                {cb::op_name(row.op), std::to_string(row.bytes), std::to_string(row.count), "float",
                 reduces ? "sum" : "none", row.op == cb::Op::kBroadcast ? "0" : "-", fmt("%.1f", row.time_us),
                 fmt("%.3f", row.algbw_gbps), fmt("%.3f", row.busbw_gbps), std::to_string(row.wrong)});
    wrong += row.wrong;
  }
  printf("#\n");
  for (cb::Op op : c.ops)
    printf("# Avg bus bandwidth, %-13s: %.3f GB/s\n", cb::op_name(op), average_busbw(r, op));
  printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(wrong),
         wrong == 0 ? "OK" : "FAILED");
}

void run(const Opts& o) {
  cb::Config c;
  auto ops = cb::parse_ops(o.ops);
  if (!ops.is_ok()) usage_fail(ops.status());
  auto sizes = cb::parse_sizes(o.sizes, kMaxBytes);
  if (!sizes.is_ok()) usage_fail(sizes.status());
  c.ops = std::move(ops).value();
  c.sizes = std::move(sizes).value();
  c.iters = o.iters;
  c.warmup = o.warmup;
  Comms comms = open_comms(o.backend);
  Progress prog(comms.host->rank() == 0, 1.0);
  c.on_point = [&](cb::Op op, uint64_t bytes, size_t i, size_t n) {
    prog.update(
        fmt("bench comm: %s of %s (%zu/%zu)", cb::op_name(op), format_bytes(bytes).c_str(), i + 1, n));
  };
  const cb::Memory mem = comms.dev ? device_memory(*comms.dev) : cb::host_memory();
  cb::Report r = value_or_fail(cb::run(comms.bench(), *comms.host, mem, c));
  prog.done();
  uint64_t wrong = 0;
  for (const cb::Row& row : r.rows) wrong += row.wrong;
  if (comms.host->rank() == 0) {
    if (o.json)
      print_json(to_json(r, c));
    else
      print_human(r, c);
  }
  if (wrong > 0)
    fail(make_status(StatusCode::kInternal, "bench comm: %llu element(s) differ from the expected result",
                     static_cast<unsigned long long>(wrong)));
}

}  // namespace

static void add_bench_comm_command(CLI::App& bench) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = bench.add_subcommand(
      "comm",
      "The collectives zoe uses (all-reduce, reduce-scatter, all-gather, broadcast) swept over sizes\n"
      "across the ranks of the launch (mpirun -np N / srun; one rank without a launcher), with\n"
      "nccl-tests' columns: size, count, time, algbw, busbw, #wrong. busbw is the rate `zoe plan\n"
      "--net-gbps` (across nodes) and `--intra-gbps` (inside one) take. Exit code 1 when any element\n"
      "differs from the expected result.");
  cmd->add_option("--ops", o->ops,
                  "Collectives, comma-separated: allreduce,reducescatter,allgather,broadcast")
      ->capture_default_str();
  cmd->add_option(
         "--sizes", o->sizes,
         "Bytes of the whole buffer: A..B (powers of two from A to B), one size, or a list (4KiB,1MiB)")
      ->capture_default_str();
  cmd->add_option("--backend", o->backend,
                  "auto (NCCL where every rank has a GPU, else the host communicator: MPI under a "
                  "launcher), host or nccl")
      ->capture_default_str();
  int_range(cmd->add_option("--iters", o->iters, "Timed iterations per size (default 20)"), 1, kMaxRepeats);
  int_range(cmd->add_option("--warmup", o->warmup, "Untimed iterations per size before them (default 5)"), 0,
            kMaxRepeats);
  cmd->add_flag("--json", o->json,
                "Print one JSON object {\"ranks\", \"nodes\", \"rows\": [{\"op\", \"bytes\", \"count\", "
                "\"time_us\", \"algbw_gbps\", \"busbw_gbps\", \"wrong\"}]} (rank 0)");
  cmd->callback([o] { run(*o); });
}

// Joins every program this file is linked into (the `zoe` program links all of src/cli).
static const CommandRegistrar kRegister(
    54, "bench",
    "Benchmarks: drive swap bandwidth (io), CPU Adam (adam), NVMe optimizer step (swap), engine (engine), "
    "collectives across the ranks (comm)",
    add_bench_comm_command);

}  // namespace zoe::cli
