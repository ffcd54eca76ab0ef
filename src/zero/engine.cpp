// Engine: its lifetime and the setup of its resources. create() (the config's paths expanded and
// checked, the CPU pool, the device with its ops and collectives, the loss scaler, the I/O engine
// and swap file), add_module(), initialize() (the placement the planner computed, executed: NVMe
// space checked on every rank, the tier manager and optimizer swapper, every module's initial
// values written to their homes while the next module's are computed), the context's memory
// (views, device and host allocations), teardown and the accessors (sizes, memory, buffers,
// trace). The test hooks (I/O faults, deferred device ops) and ZOE_IO_STALL live here too.
// The other parts: engine_calls.cpp (fetch/release, gradients), engine_step.cpp (the step),
// engine_checkpoint.cpp (save/load), engine_activations.cpp (the activation store) and
// public_api.cpp (the public types over the engine).
#include "zoe/engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "comm/heartbeat.h"
#include "config/paths.h"
#include "config/value_used.h"
#include "core/cpu.h"
#include "core/log.h"
#include "core/units.h"
#include "io/fault_injector.h"
#include "optim/adam.h"
#include "zero/config_agreement.h"
#include "zero/engine_impl.h"
#include "zero/engine_internal.h"
#include "zero/test_hooks.h"

namespace zoe {

namespace zero {
namespace {
io::FaultInjector* g_io_faults = nullptr;
std::atomic<bool> g_deferred_ops{false};
}  // namespace
void set_engine_io_faults(io::FaultInjector* f) { g_io_faults = f; }
io::FaultInjector* engine_io_faults() { return g_io_faults; }
void set_deferred_device_ops(bool on) { g_deferred_ops.store(on); }
bool deferred_device_ops() { return g_deferred_ops.load(); }
}  // namespace zero
using offload::Tier;

// ---------------------------------------------------------------------------------------------
// Memory and setup

Result<zero::ModuleId> Engine::Impl::module_id(const char* what, size_t m) const {
  if (!modules.valid(m)) return invalid_argument("%s(%zu): there are %zu modules", what, m, modules.size());
  return zero::ModuleId(m);
}

void Engine::Impl::shutdown() {
  if (asleep) {  // the bytes are not needed: the device's memory only has to be freed
    (void)ctx.dev->resume();
    drop_sleep_copies();
    asleep = false;
  }
  if (update) update->shutdown();  // an overlapped update still running behind (no collectives here)
  if (grads) grads->shutdown();
  if (gather) gather->shutdown();
  ctx.acts.reset();  // waits for its I/O in flight
  // The parts go before the resources they hold handles of.
  gather.reset();
  grads.reset();
  update.reset();
  ctx.swapper.reset();
  ctx.tm.reset();
  if (homes) homes->free_device_memory();
  homes.reset();
}

void Engine::Impl::build_parts() {
  using zero::ParamHomes, zero::Updater, zero::GradReducer, zero::ParamGather;
  const zero::Placement& pl = ctx.placement;
  ParamHomes::Resources hr;
  hr.mem = ctx.mem.get();
  hr.ops = ctx.ops.get();
  hr.dcomm = ctx.dcomm;
  hr.tm = ctx.tm.get();
  hr.param_offload = ctx.param_off;
  homes = std::make_unique<ParamHomes>(ctx.shape, modules, clock, hr);
  Updater::Resources ur;
  ur.mem = ctx.mem.get();
  ur.ops = ctx.ops.get();
  ur.pool = ctx.pool.get();
  ur.comm = ctx.comm;
  ur.swapper = ctx.swapper.get();
  ur.trace = &ctx.trace;
  ur.cfg = ctx.cfg.get();
  ur.optimizer = pl.optimizer;
  ur.states = pl.state_format;
  ur.master = pl.master_format;
  ur.master_in_compute = pl.master_in_compute;
  ur.hold_grad_sums = pl.grad_hold_bytes > 0;
  update = std::make_unique<Updater>(ctx.shape, modules, *homes, clock, ur, zero::LossScaler(scaler_options));
  GradReducer::Resources gr;
  gr.mem = ctx.mem.get();
  gr.ops = ctx.ops.get();
  gr.dcomm = ctx.dcomm;
  gr.reduce_bucket = pl.reduce_bucket;
  gr.micro_batches = ctx.cfg->gradient_accumulation_steps;
  grads = std::make_unique<GradReducer>(ctx.shape, modules, *update, clock, gr);
  ParamGather::Resources pr;
  pr.mem = ctx.mem.get();
  pr.dcomm = ctx.dcomm;
  pr.trace = &ctx.trace;
  pr.window = pl.gather_window;
  pr.max_live = pl.max_live_parameters;
  pr.in_place_pins = pl.in_place_pins;
  // Served in place (world size 1), the bucket is the moves ahead alone: as the plan fit it.
  pr.prefetch_bucket = ctx.shape.world == 1 ? pl.prefetch_bucket : ctx.cfg->zero.stage3_prefetch_bucket_size;
  gather = std::make_unique<ParamGather>(ctx.shape, modules, *homes, update->gate(), clock, pr);
}

namespace {

// ZOE_IO_STALL=RANK:NTH:SECONDS holds rank RANK's NTH I/O completion for SECONDS: a long NVMe stall
// on demand, for testing that the other ranks wait for it (the lost-rank heartbeat keeps beating).
io::FaultInjector* io_stall_from_env(int rank) {
  const char* env = getenv("ZOE_IO_STALL");
  if (env == nullptr || *env == '\0') return nullptr;
  int r = -1;
  unsigned long long nth = 0;
  double seconds = 0;
  char extra = 0;
  if (sscanf(env, "%d:%llu:%lf%c", &r, &nth, &seconds, &extra) != 3 || nth == 0 || !(seconds >= 0) ||
      seconds > 3600) {
    ZOE_LOG_WARN("ZOE_IO_STALL=%s is not RANK:NTH:SECONDS (NTH >= 1, SECONDS in [0, 3600]); no stall", env);
    return nullptr;
  }
  if (r != rank) return nullptr;
  static io::FaultInjector stall;  // the process's; the engine's I/O may outlive any scope here
  auto seen = std::make_shared<std::atomic<uint64_t>>(0);
  stall.set_completion_hook([seen, nth, seconds, rank](io::IoOp) {
    if (seen->fetch_add(1) + 1 != nth) return;
    fprintf(stderr, "zoe: rank %d: ZOE_IO_STALL: holding I/O completion %llu for %.1f s\n", rank, nth,
            seconds);
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  });
  return &stall;
}

}  // namespace

Status Engine::Impl::setup_io() {
  const config::Config& cfg = *ctx.cfg;
  std::vector<std::string> dirs;
  auto add_dirs = [&](const config::OffloadConfig& o) {
    if (o.device != Offload::kNvme) return;
    for (const auto& d : o.nvme_path) {
      if (std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
    }
  };
  add_dirs(cfg.zero.offload_optimizer);
  add_dirs(cfg.zero.offload_param);
  if (dirs.empty()) return Status::ok();
  io::IoEngineOptions eo;
  eo.queue_depth = static_cast<uint32_t>(
      config::value_clamped("aio.queue_depth", cfg.aio.queue_depth, 1, 65536, "the I/O engine's range"));
  eo.block_size = static_cast<size_t>(config::aio_block_size_used(cfg.aio.block_size));
  eo.faults = zero::engine_io_faults();
  if (eo.faults == nullptr) eo.faults = io_stall_from_env(ctx.shape.rank);
  ZOE_ASSIGN_OR_RETURN(ctx.io, io::IoEngine::create(eo));
  io::SwapFileOptions so;
  so.dirs = dirs;
  so.name = "zoe-swap-r" + std::to_string(ctx.shape.rank) + "-" + std::to_string(getpid());
  so.checksum = cfg.zoe.swap_checksum;
  so.hole_check = cfg.zoe.swap_hole_check;
  ZOE_ASSIGN_OR_RETURN(ctx.swap, io::SwapFile::create(so));
  (void)ctx.swap->register_files(*ctx.io);
  ctx.store = std::make_unique<offload::SwapStore>(ctx.swap.get(), ctx.io.get(), 0);
  return Status::ok();
}

// The tier manager (stage-3 partitions) and the optimizer swapper (NVMe-resident states), as
// the placement sized them.
Status Engine::Impl::setup_tiers() {
  const zero::Placement& pl = ctx.placement;
  const config::Config& cfg = *ctx.cfg;
  if (pl.tier_manager) {
    offload::TierManagerOptions to;
    to.device = ctx.dev.get();
    to.device_budget = pl.tm_device_budget;
    to.host_budget = pl.tm_host_budget;
    to.nvme = ctx.store.get();
    to.pin = cfg.zero.offload_param.pin_memory ? io::PinMode::kDevice : io::PinMode::kNone;
    to.staging_bytes = pl.tm_staging_bytes;
    to.staging_count = pl.tm_staging_count;
    to.policy = offload::EvictionPolicyKind::kTrace;
    // A fetch that finds the device tier full of prefetches still loading waits for them to
    // land (then evicts) instead of failing; pins are only ever held for one fetch's gather.
    to.wait_for_unpin_ms = 60000;
    to.trace = &ctx.trace;
    ZOE_ASSIGN_OR_RETURN(ctx.tm, offload::TierManager::create(to));
  }
  if (pl.swapper) {
    offload::SwapperOptions so;
    so.states =
        zero::Updater::swapped_states(pl.optimizer, pl.state_format, pl.master_format, pl.master_in_compute);
    so.buffer_count = pl.swap_buffer_count;
    so.buffer_bytes = pl.swap_buffer_bytes;
    so.async_buffers = pl.swap_async_buffers;
    so.pin = cfg.zero.offload_optimizer.pin_memory ? io::PinMode::kDevice : io::PinMode::kNone;
    so.trace = &ctx.trace;
    ZOE_ASSIGN_OR_RETURN(ctx.swapper, offload::OptimizerSwapper::create(ctx.store.get(), so));
  }
  return Status::ok();
}

Status Engine::Impl::PlaceScratch::allocate(size_t elems, size_t compute_bytes) {
  auto aligned = [](size_t bytes) {
    return std::aligned_alloc(4096, std::max<size_t>(4096, (bytes + 4095) & ~size_t{4095}));
  };
  full_mem.reset(static_cast<float*>(aligned(elems * 4)));
  cbuf_mem.reset(static_cast<char*>(aligned(elems * compute_bytes)));
  full = full_mem.get();
  cbuf = cbuf_mem.get();
  if (!full || !cbuf)
    return out_of_budget("initialising: no host memory for a module's initial values (%zu elements)", elems);
  return Status::ok();
}

// Module m's initial values: the caller's init writes every element it is given; the padding is
// zeroed here. The scratch is reused module after module (no fresh pages to fault in and clear per
// module). The compute-dtype copy is made by store_module, on the placing thread.
Status Engine::Impl::fill_values(zero::ModuleId m,
                                 const std::function<void(size_t, size_t, float*, size_t)>& init,
                                 PlaceScratch* s) {
  const zero::ModuleLayout& mod = modules[m];
  float* full = s->full;
  for (size_t p = 0; p < mod.specs.size(); ++p) init(m.index, p, full + mod.offset[p], mod.numel[p]);
  std::fill(full + mod.total, full + mod.padded, 0.0f);
  return Status::ok();
}

// The compute-dtype copy of module m's values in s.
Status Engine::Impl::compute_copy(zero::ModuleId m, const PlaceScratch& s) {
  const zero::ModuleLayout& mod = modules[m];
  if (ctx.shape.cdt == DType::kF32) {
    memcpy(s.cbuf, s.full, mod.padded * 4);
    return Status::ok();
  }
  // The SIMD conversion, in software RNE (the bits zero::store_compute gives).
  optim::Exec ex;
  ex.hw_bf16 = false;
  return optim::convert_with_norm(s.full, DType::kF32, s.cbuf, ctx.shape.cdt, mod.padded, false, ex).status();
}

// Module m's values (fill_values) into their homes: its compute parameters and the optimizer
// states and gradient accumulator of its owned range (a frozen module has none).
Status Engine::Impl::store_module(zero::ModuleId m, const PlaceScratch& s) {
  const zero::ModuleLayout& mod = modules[m];
  zero::OpsFence fence(*ctx.ops);  // the copies below read s's buffers
  // The optimizer's share first: its NVMe writes (from s.full) run while the compute copy is made.
  ZOE_RETURN_IF_ERROR(update->place(m, s.full + mod.opt_begin));
  ZOE_RETURN_IF_ERROR(compute_copy(m, s));
  ZOE_RETURN_IF_ERROR(homes->place(m, s.cbuf));
  // The masters on NVMe are written from s.full itself (Updater::place): done before s is reused.
  ZOE_RETURN_IF_ERROR_CTX(update->wait_placed(), "writing the initial optimizer states of " + mod.name);
  return fence.wait();
}

// A pipeline of two: the caller's thread computes module i+1's values (the caller's init runs on
// the caller's thread only) while a placing thread writes module i's to their homes, so the
// initial writes to NVMe (the parameters' partitions and the fp32 masters: most of a large
// model's initialisation) overlap the values' computation instead of following it. Only the
// placing thread touches the engine's state (ops, tiers, swapper); the two share nothing but the
// scratch each hands over. Costs a second scratch of the largest module for the initialisation.
Status Engine::Impl::place_all(const std::function<void(size_t, size_t, float*, size_t)>& init) {
  size_t most = 0;
  for (const auto& mod : modules.all()) most = std::max(most, mod.padded);
  PlaceScratch scratch[2];
  for (PlaceScratch& s : scratch) ZOE_RETURN_IF_ERROR(s.allocate(most, ctx.shape.esize()));
  struct Placer {  // joined on every exit path (an init that throws included)
    std::thread t;
    Status status = Status::ok();
    Status join() {
      if (t.joinable()) t.join();
      return status;
    }
    ~Placer() { (void)join(); }
  } placer;
  size_t i = 0;
  for (zero::ModuleId m : modules.ids()) {
    PlaceScratch& s = scratch[i++ % 2];  // the other one is the placing thread's
    const Status filled = fill_values(m, init, &s);
    ZOE_RETURN_IF_ERROR(placer.join());
    ZOE_RETURN_IF_ERROR(filled);
    placer.t = std::thread([this, m, &s, st = &placer.status]() {
      const Status b = ctx.ops->bind_thread();
      *st = b.is_ok() ? store_module(m, s) : b;
    });
  }
  return placer.join();
}

namespace {

// One rank's NVMe needs, as every rank sees them: its host, the file system of its swap files, the
// bytes it needs there and the bytes free.
struct NvmeNeed {
  char host[64];
  char where[176];
  uint64_t fs;  // st_dev of the first swap file
  uint64_t need, free;
};

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

// NVMe space for everything that lives there, checked before anything is written: each rank's own
// files, then each node's (its ranks' files on one file system share its free space). Every rank
// learns of a node that lacks space, and every rank's error names it.
Status Engine::Impl::check_nvme_space() const {
  if (!ctx.swap) return Status::ok();
  NvmeNeed mine{};
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  std::memcpy(mine.host, host, sizeof mine.host);
  mine.need = ctx.placement.nvme_bytes();
  // Through each file's descriptor, not its path: a SIGINT while the model initialises unlinks the
  // swap files at once (the run stops at its first step boundary), and a path would then say
  // nothing. A file system that cannot say counts as large enough.
  std::string where;
  bool unknown = false;
  for (const auto& f : ctx.swap->files()) {
    auto fb = f->free_bytes();
    if (fb.is_ok()) {
      mine.free += fb.value() / ctx.swap->files().size();  // files may share a file system
    } else {
      unknown = true;
    }
    where += (where.empty() ? "" : ", ") + f->path();
  }
  if (unknown) mine.free = UINT64_MAX;
  if (!ctx.swap->files().empty()) {
    auto dev = ctx.swap->files()[0]->device();
    if (dev.is_ok()) mine.fs = dev.value();
  }
  snprintf(mine.where, sizeof mine.where, "%s", where.c_str());
  std::vector<NvmeNeed> all(static_cast<size_t>(ctx.shape.world));
  ZOE_RETURN_IF_ERROR(ctx.comm->all_gather(&mine, all.data(), sizeof mine, comm::CommType::kU8).wait());
  for (int r = 0; r < ctx.shape.world; ++r) {
    const NvmeNeed& a = all[r];
    // The ranks on a's node and file system (each group is judged once, at its first rank).
    std::vector<int> ranks;
    uint64_t need = 0, free_b = a.free;
    bool first = true;
    for (int q = 0; q < ctx.shape.world; ++q) {
      if (strncmp(all[q].host, a.host, sizeof a.host) != 0 || all[q].fs != a.fs) continue;
      if (q < r) first = false;
      ranks.push_back(q);
      need += all[q].need;
      free_b = std::max(free_b, all[q].free);
    }
    const bool alone = ranks.size() == 1;
    if (!first || (alone ? a.need <= a.free : need <= free_b)) continue;
    if (alone) need = a.need;
    return no_space(
        "NVMe swap space: node %.64s lacks it: %s %s %llu bytes (%s) at %.176s but only %llu bytes (%s) are "
        "free there",
        a.host, alone ? "rank" : "its ranks", ranks_text(ranks).c_str(),
        static_cast<unsigned long long>(need), format_bytes(need).c_str(), a.where,
        static_cast<unsigned long long>(free_b), format_bytes(free_b).c_str());
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Engine

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Engine> EngineAccess::make(std::unique_ptr<Engine::Impl> impl) {
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::~Engine() {
  if (!impl_) return;
  Status s = finish_save();
  if (!s.is_ok()) ZOE_LOG_ERROR("asynchronous checkpoint: %s", s.to_string().c_str());
  impl_->shutdown();
}
Result<std::unique_ptr<Engine>> Engine::create(Runtime& rt, const Config& cfg) {
  return zero::create_engine(rt, ConfigAccess::get(cfg));
}

Result<std::unique_ptr<Engine>> zero::create_engine(Runtime& rt, const config::Config& given) {
  using Impl = Engine::Impl;
  // nvme_path's placeholders ({rank}, {local_rank}, {host}, $VAR) for this rank, then the file system,
  // checked here rather than while parsing: NVMe directories exist and are writable.
  // Every rank's config the same (only the NVMe directories may differ): checked first, so that
  // ranks that disagree fail alike instead of queueing different collectives.
  ZOE_RETURN_IF_ERROR(zero::check_ranks_agree(zero::runtime_comm(rt), given));
  config::Config cfg = given;
  config::PathVars vars = config::process_path_vars();
  vars.rank = rt.rank();
  vars.local_rank = rt.local_rank();
  ZOE_RETURN_IF_ERROR(config::expand_paths(&cfg, vars));
  ZOE_RETURN_IF_ERROR(config::check_paths(cfg, given));
  // The lost-rank timeout the config gives (without the key: ZOE_COMM_TIMEOUT_S, or the default).
  if (cfg.given("zoe.comm_timeout_s")) comm::set_comm_timeout(cfg.zoe.comm_timeout_s);
  auto impl = std::make_unique<Impl>();
  impl->ctx.rt = &rt;
  impl->ctx.comm = &zero::runtime_comm(rt);
  impl->ctx.shape.rank = rt.rank();
  impl->ctx.shape.world = rt.world_size();
  impl->ctx.cfg = std::make_unique<config::Config>(cfg);
  impl->ctx.shape.stage = cfg.zero.stage;
  impl->ctx.opt_off = zero::offload_tier(cfg.zero.offload_optimizer.device);
  impl->ctx.param_off = zero::offload_tier(cfg.zero.offload_param.device);
  impl->ctx.shape.cdt = cfg.bf16 ? DType::kBF16 : cfg.fp16.enabled ? DType::kF16 : DType::kF32;
  if (impl->ctx.shape.stage < 0 || impl->ctx.shape.stage > 3)
    return invalid_argument("zero_optimization.stage %d is not 0-3", impl->ctx.shape.stage);
  if (impl->ctx.param_off != Tier::kDevice && impl->ctx.shape.stage != 3) {
    return invalid_argument("zero_optimization.offload_param needs stage 3 (stage is %d)",
                            impl->ctx.shape.stage);
  }
  if (impl->ctx.opt_off != Tier::kDevice && impl->ctx.shape.stage == 0) {
    return invalid_argument("zero_optimization.offload_optimizer needs stage 1, 2 or 3");
  }
  uint64_t budget = static_cast<uint64_t>(cfg.zoe.device_budget_bytes);
  if (budget == 0) budget = 64ull << 30;
  optim::CpuPool::Options po;
  po.threads = static_cast<int>(cfg.zoe.optimizer_threads);
  ZOE_ASSIGN_OR_RETURN(impl->ctx.pool, optim::CpuPool::create(po));
  if (cfg.zoe.device == "cuda") {
    // The GPU of this rank's local rank; device-buffer collectives over NCCL (bootstrapped
    // through the runtime's communicator), host ones over the runtime's.
    std::string why;
    const int count = device::cuda_device_count(&why);
    if (count <= 0) {
      return unsupported("zoe.device \"cuda\": no usable GPU (%s); use \"cpu\"",
                         why.empty() ? "none found" : why.c_str());
    }
    const int ordinal = impl->ctx.comm->local_rank() % count;
    ZOE_ASSIGN_OR_RETURN(impl->ctx.dev, device::create_cuda_device(ordinal, budget));
    // Every stream comes from the device: the kernels' (inside the ops) and the collectives'.
    ZOE_ASSIGN_OR_RETURN(impl->ctx.ops, zero::make_cuda_ops(*impl->ctx.dev, ordinal));
    ZOE_ASSIGN_OR_RETURN(impl->ctx.comm_stream, impl->ctx.dev->create_stream());
    ZOE_ASSIGN_OR_RETURN(impl->ctx.own_dcomm, comm::create_nccl_comm(*impl->ctx.comm, ordinal,
                                                                     impl->ctx.comm_stream->native_handle()));
    impl->ctx.dcomm = impl->ctx.own_dcomm.get();
  } else {
    ZOE_ASSIGN_OR_RETURN(impl->ctx.dev, device::create_cpu_device(budget));
    impl->ctx.ops = zero::make_cpu_ops(impl->ctx.pool.get(), zero::deferred_device_ops());
    impl->ctx.dcomm = impl->ctx.comm;
  }
  impl->ctx.mem = std::make_unique<zero::DeviceMemory>(*impl->ctx.dev, *impl->ctx.ops, impl->ctx.shape.cdt);
  zero::LossScaler::Options& lo = impl->scaler_options;
  lo.static_scale = cfg.fp16.enabled ? cfg.fp16.loss_scale : 1.0;
  lo.initial_scale_power = cfg.fp16.initial_scale_power;
  lo.window = std::max(1, cfg.fp16.loss_scale_window);
  lo.hysteresis = cfg.fp16.hysteresis;
  lo.consecutive_hysteresis = cfg.fp16.consecutive_hysteresis;
  lo.min_scale = cfg.fp16.min_loss_scale;
  ZOE_RETURN_IF_ERROR(impl->setup_io());
  return EngineAccess::make(std::move(impl));
}

Status Engine::add_module(const std::string& name, const std::vector<ParamSpec>& params) {
  return add_module(name, params, ModuleOptions());
}

bool Engine::module_frozen(size_t m) const { return impl_->modules.all().at(m).frozen; }

Status Engine::add_module(const std::string& name, const std::vector<ParamSpec>& params,
                          const ModuleOptions& opts) {
  Impl& I = *impl_;
  if (I.initialized) return invalid_argument("add_module(%s) after initialize()", name.c_str());
  if (params.empty()) return invalid_argument("module %s has no parameters", name.c_str());
  zero::ModuleLayout mod;
  mod.name = name;
  mod.specs = params;
  mod.frozen = opts.frozen;
  mod.held = opts.held;
  for (const auto& p : params) {
    size_t n = 1;
    for (int64_t d : p.shape) {
      if (d <= 0 || static_cast<uint64_t>(d) > (uint64_t{1} << 40) / n) {
        return invalid_argument(
            "module %s parameter %s: dimension %lld (a parameter holds 1 to 2^40 elements)", name.c_str(),
            p.name.c_str(), static_cast<long long>(d));
      }
      n *= static_cast<size_t>(d);
    }
    mod.offset.push_back(mod.total);
    mod.numel.push_back(n);
    mod.total += n;
  }
  I.modules.add(std::move(mod));
  return Status::ok();
}

uint64_t zero::engine_host_memory(int world) {
  return host_memory().total_bytes / static_cast<uint64_t>(std::max(1, world));
}

namespace {

// The layout the placement gave each module, into the module table.
void apply_layout(const zero::Placement& pl, zero::ModuleTable* modules) {
  for (zero::ModuleId m : modules->ids()) {
    const zero::ModulePlacement& mp = pl.modules[m.index];
    zero::ModuleLayout& mod = (*modules)[m];
    mod.padded = mp.padded;
    mod.part = mp.part;
    mod.partitioned_params = mp.partitioned_params;
    mod.opt_begin = mp.opt_begin;
    mod.opt_n = mp.opt_n;
    mod.frozen = mp.frozen;
    mod.opt_home = mp.opt_home;
    mod.param_home = mp.param_home;
  }
}

}  // namespace

Status Engine::initialize(const std::function<void(size_t, size_t, float*, size_t)>& init) {
  Impl& I = *impl_;
  zero::EngineContext& ctx = I.ctx;
  if (I.initialized) return invalid_argument("initialize() called twice");
  if (I.modules.empty()) return invalid_argument("initialize(): no modules registered");
  // 1. The plan: every decision about where bytes live.
  std::vector<zero::ModuleShape> shapes;
  for (const auto& mod : I.modules.all())
    shapes.push_back({mod.name, mod.numel, mod.frozen, mod.held, mod.specs});
  zero::PlanTarget target;
  target.device_budget = ctx.dev->budget_bytes();
  // Queued gathers run a host task on the communicator's stream: host-memory devices only.
  target.queued_gathers = ctx.ops->host_addressable() && ctx.dcomm == ctx.comm;
  target.host_addressable = ctx.ops->host_addressable();
  // The buffers the config leaves to zoe are sized from this host's memory, shared by the ranks
  // (the job's size bounds how many of them share this host).
  target.host_memory = zero::engine_host_memory(ctx.shape.world);
  ZOE_ASSIGN_OR_RETURN(ctx.placement, I.plan_beside_activations(shapes, target));
  apply_layout(ctx.placement, &I.modules);
  // 2. NVMe space for everything that lives there, checked before anything is written.
  ZOE_RETURN_IF_ERROR(I.check_nvme_space());
  // 3. Tiers and swapper, then every state in its home.
  ZOE_RETURN_IF_ERROR(I.setup_tiers());
  I.build_parts();
  ZOE_RETURN_IF_ERROR(I.place_all(init));
  // The optimizer states written behind the placing (Updater::place): on NVMe before training.
  ZOE_RETURN_IF_ERROR_CTX(I.update->wait_placed(), "writing the initial optimizer states");
  ZOE_CHECK_MSG(ctx.dev->used_bytes() == ctx.placement.resident.device,
                "placement: the device holds %llu bytes after initialize(), the plan said %llu",
                static_cast<unsigned long long>(ctx.dev->used_bytes()),
                static_cast<unsigned long long>(ctx.placement.resident.device));
  ZOE_RETURN_IF_ERROR(I.setup_activations());
  I.initialized = true;
  I.clock.last_step_ns = now_ns();
  I.homes->begin_trace();
  return Status::ok();
}

size_t Engine::num_modules() const { return impl_->modules.size(); }
const std::string& Engine::module_name(size_t m) const { return impl_->modules.all().at(m).name; }
ComputeDType Engine::compute_dtype() const { return public_dtype(impl_->ctx.shape.cdt); }
double Engine::loss_scale() const {
  if (impl_->ctx.shape.cdt != DType::kF16) return 1.0;
  return impl_->update ? impl_->update->scaler().scale() : zero::LossScaler(impl_->scaler_options).scale();
}

uint64_t Engine::num_params() const {
  uint64_t n = 0;
  for (const auto& mod : impl_->modules.all()) n += mod.total;
  return n;
}

uint64_t Engine::model_state_bytes() const {
  const zero::EngineContext& c = impl_->ctx;
  // Frozen modules hold their compute parameters only.
  uint64_t trained = 0;
  for (const auto& mod : impl_->modules.all()) trained += mod.frozen ? 0 : mod.total;
  const uint64_t n = num_params(), w = static_cast<uint64_t>(c.shape.world);
  const uint64_t params = (c.shape.stage == 3 ? n / w : n) * c.shape.esize();
  const uint64_t grads = (c.shape.stage >= 2 ? trained / w : trained) * 4;
  // A bf16 master stored in the compute copy (Placement::master_in_compute) is counted once, in `params`.
  const double per = optimizer_state_bytes_per_param() - (c.placement.master_in_compute ? 2.0 : 0.0);
  const auto optim =
      static_cast<uint64_t>(static_cast<double>(c.shape.stage >= 1 ? trained / w : trained) * per);
  return params + grads + optim;
}

namespace {
// The config's formats (checked when it was read).
std::pair<optim::StateFormat, optim::MasterFormat> formats(const config::Config& c) {
  auto s = optim::parse_state_format(c.zoe.optimizer_states);
  auto m = optim::parse_master_format(c.zoe.master_weights);
  return {s.is_ok() ? s.value() : optim::StateFormat::kF32,
          m.is_ok() ? m.value() : optim::MasterFormat::kF32};
}
}  // namespace

double Engine::optimizer_state_bytes_per_param() const {
  const auto [s, m] = formats(*impl_->ctx.cfg);
  auto k = optim::parse_optimizer_kind(impl_->ctx.cfg->optimizer.type);
  return optim::optimizer_state_bytes_per_param(
      m, s, optim::optimizer_state_count(k.is_ok() ? k.value() : optim::OptimizerKind::kAdamW));
}
std::string Engine::optimizer() const {
  auto k = optim::parse_optimizer_kind(impl_->ctx.cfg->optimizer.type);
  return optim::optimizer_kind_name(k.is_ok() ? k.value() : optim::OptimizerKind::kAdamW);
}
std::string Engine::optimizer_states() const {
  return optim::state_format_name(formats(*impl_->ctx.cfg).first);
}
std::string Engine::master_weights() const {
  return optim::master_format_name(formats(*impl_->ctx.cfg).second);
}

std::string Engine::schedule() const { return impl_->ctx.cfg->zoe.schedule; }

uint64_t Engine::device_budget_bytes() const { return impl_->ctx.dev->budget_bytes(); }

MemoryUse Engine::memory_in_use() const {
  const zero::EngineContext& c = impl_->ctx;
  // An update still running behind the last step() (zoe.overlap_step) holds partitions and
  // buffers: wait for it, so that the figures are those between steps. Its error, if any, stays
  // for the next call that reports errors (Updater::join keeps it).
  if (impl_->update) (void)impl_->update->join();
  MemoryUse u;
  u.device = c.dev->used_bytes();
  u.host = (impl_->update ? impl_->update->host_bytes() : 0) + impl_->sleep_host_bytes;
  u.nvme = c.store ? c.store->used_bytes() : 0;
  if (c.tm) {
    const offload::TierStats ts = c.tm->stats();
    u.device_partitions = ts.used[0];
    u.host += ts.used[1];
    for (zero::ModuleId m : impl_->modules.ids()) u.partition_pins += impl_->homes->pins(m);
  }
  return u;
}

BufferSizes Engine::buffer_sizes() const {
  const zero::Placement& pl = impl_->ctx.placement;
  BufferSizes b;
  if (!impl_->initialized) return b;
  b.host_share = pl.host_share;
  if (pl.swapper) {
    b.swap_buffer_count = pl.swap_buffer_count;
    b.swap_buffer_bytes = pl.swap_buffer_bytes;
    b.swap_async_buffers = pl.swap_async_buffers;
  }
  if (impl_->ctx.tm && impl_->ctx.store) {
    b.staging_count = pl.tm_staging_count + 1;  // the moves' and the synchronous one
    b.staging_bytes = pl.tm_staging_bytes;
  }
  b.host_cache_bytes = pl.tm_host_cache;
  b.chosen = pl.chosen;
  return b;
}

Status Engine::write_trace(const std::string& path) const { return impl_->ctx.trace.write_chrome_json(path); }
void Engine::enable_trace(bool on) { impl_->ctx.trace.set_enabled(on); }
void Engine::record_compute(const std::string& name, uint64_t begin_ns, uint64_t end_ns) {
  impl_->ctx.trace.record(name, "compute", begin_ns, end_ns, 0, kLaneCompute);
}

}  // namespace zoe
