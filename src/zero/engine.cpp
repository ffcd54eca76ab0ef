// Engine: flat groups partitioned over ranks, ZeRO stages 0-3, placement of every state in its
// tier, gradient reduction and accumulation, and the step (norm, loss scale, clip, AdamW).
#include "zoe/engine.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>

#include "comm/communicator.h"
#include "config/config.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/trace.h"
#include "core/units.h"
#include "device/device.h"
#include "io/io_engine.h"
#include "io/swap_file.h"
#include "offload/optimizer_swapper.h"
#include "offload/swap_store.h"
#include "offload/tier_manager.h"
#include "optim/adam.h"
#include "zero/loss_scaler.h"
#include "zero/engine_impl.h"

namespace zoe {

using config::OffloadDevice;
using offload::Tier;

// ---------------------------------------------------------------------------------------------
// Runtime

Result<std::unique_ptr<Runtime>> Runtime::init(bool force_local) {
  std::unique_ptr<Runtime> rt(new Runtime());
  if (!force_local && comm::launched_by_mpi()) {
    ZOE_ASSIGN_OR_RETURN(rt->comm_, comm::create_mpi_comm());
  } else {
    rt->comm_ = comm::create_local_comm();
  }
  return rt;
}

Runtime::~Runtime() = default;
int Runtime::rank() const { return comm_->rank(); }
int Runtime::world_size() const { return comm_->size(); }

// ---------------------------------------------------------------------------------------------
// Engine internals

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  if (!impl_) return;
  Status s = finish_save();
  if (!s.is_ok()) ZOE_LOG_ERROR("asynchronous checkpoint: %s", s.to_string().c_str());
  for (auto& p : impl_->pending) (void)p.h.wait();
  for (auto& mod : impl_->modules) {
    if (mod.gather_pending) (void)mod.gather.wait();
  }
  impl_->swapper.reset();
  impl_->tm.reset();
  impl_->free_device_memory();
}

Result<std::unique_ptr<Engine>> Engine::create(Runtime& rt, const config::Config& cfg) {
  auto impl = std::make_unique<Impl>();
  impl->rt = &rt;
  impl->comm = &rt.comm();
  impl->rank = rt.rank();
  impl->world = rt.world_size();
  impl->cfg = std::make_unique<config::Config>(cfg);
  impl->stage = cfg.zero.stage;
  impl->opt_off = cfg.zero.offload_optimizer.device;
  impl->param_off = cfg.zero.offload_param.device;
  impl->cdt = cfg.bf16 ? DType::kBF16 : cfg.fp16.enabled ? DType::kF16 : DType::kF32;
  if (impl->stage < 0 || impl->stage > 3) return invalid_argument("zero_optimization.stage %d is not 0-3", impl->stage);
  if (impl->param_off != OffloadDevice::kNone && impl->stage != 3) {
    return invalid_argument("zero_optimization.offload_param needs stage 3 (stage is %d)", impl->stage);
  }
  if (impl->opt_off != OffloadDevice::kNone && impl->stage == 0) {
    return invalid_argument("zero_optimization.offload_optimizer needs stage 1, 2 or 3");
  }
  uint64_t budget = static_cast<uint64_t>(cfg.zoe.device_budget_bytes);
  if (budget == 0) budget = 64ull << 30;
  optim::CpuPool::Options po;
  po.threads = static_cast<int>(cfg.zoe.optimizer_threads);
  ZOE_ASSIGN_OR_RETURN(impl->pool, optim::CpuPool::create(po));
  if (cfg.zoe.device == "cuda") {
    // The GPU of this rank's local rank; device-buffer collectives over NCCL (bootstrapped
    // through the runtime's communicator), host ones over the runtime's.
    std::string why;
    const int count = device::cuda_device_count(&why);
    if (count <= 0) {
      return unsupported("zoe.device \"cuda\": no usable GPU (%s); use \"cpu\"", why.empty() ? "none found" : why.c_str());
    }
    const int ordinal = rt.comm().local_rank() % count;
    ZOE_ASSIGN_OR_RETURN(impl->dev, device::create_cuda_device(ordinal, budget));
    ZOE_ASSIGN_OR_RETURN(impl->ops, zero::make_cuda_ops(ordinal));
    ZOE_ASSIGN_OR_RETURN(impl->own_dcomm, comm::create_nccl_comm(rt.comm(), ordinal));
    impl->dcomm = impl->own_dcomm.get();
  } else {
    ZOE_ASSIGN_OR_RETURN(impl->dev, device::create_cpu_device(budget));
    impl->ops = zero::make_cpu_ops(impl->pool.get());
    impl->dcomm = impl->comm;
  }
  zero::LossScaler::Options lo;
  lo.static_scale = cfg.fp16.enabled ? cfg.fp16.loss_scale : 1.0;
  lo.initial_scale_power = cfg.fp16.initial_scale_power;
  lo.window = std::max(1, cfg.fp16.loss_scale_window);
  lo.hysteresis = cfg.fp16.hysteresis;
  lo.consecutive_hysteresis = cfg.fp16.consecutive_hysteresis;
  lo.min_scale = cfg.fp16.min_loss_scale;
  impl->scaler = zero::LossScaler(lo);
  ZOE_RETURN_IF_ERROR(impl->setup_io());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

size_t Engine::num_modules() const { return impl_->modules.size(); }
const std::string& Engine::module_name(size_t m) const { return impl_->modules.at(m).name; }
ComputeDType Engine::compute_dtype() const {
  return impl_->cdt == DType::kF32 ? ComputeDType::kF32 : impl_->cdt == DType::kBF16 ? ComputeDType::kBF16 : ComputeDType::kF16;
}
double Engine::loss_scale() const { return impl_->cdt == DType::kF16 ? impl_->scaler.scale() : 1.0; }

Status Engine::add_module(const std::string& name, const std::vector<ParamSpec>& params) {
  Impl& I = *impl_;
  if (I.initialized) return invalid_argument("add_module(%s) after initialize()", name.c_str());
  if (params.empty()) return invalid_argument("module %s has no parameters", name.c_str());
  Impl::Module mod;
  mod.name = name;
  mod.specs = params;
  for (const auto& p : params) {
    size_t n = 1;
    for (int64_t d : p.shape) {
      if (d <= 0) return invalid_argument("module %s parameter %s: dimension %lld", name.c_str(), p.name.c_str(), static_cast<long long>(d));
      n *= static_cast<size_t>(d);
    }
    mod.offset.push_back(mod.total);
    mod.numel.push_back(n);
    mod.total += n;
  }
  size_t unit = kPartAlign * static_cast<size_t>(I.world);
  mod.padded = (mod.total + unit - 1) / unit * unit;
  mod.part = mod.padded / static_cast<size_t>(I.world);
  mod.partitioned_params =
      I.stage == 3 && static_cast<int64_t>(mod.total) >= I.cfg->zero.stage3_param_persistence_threshold;
  I.modules.push_back(std::move(mod));
  return Status::ok();
}

Status Engine::initialize(const std::function<void(size_t, size_t, float*, size_t)>& init) {
  Impl& I = *impl_;
  if (I.initialized) return invalid_argument("initialize() called twice");
  if (I.modules.empty()) return invalid_argument("initialize(): no modules registered");
  const size_t es = I.esize();
  // The device must hold one gathered module with its gradients and their reduction.
  for (const auto& mod : I.modules) {
    uint64_t need = static_cast<uint64_t>(mod.padded) * es * 2 + static_cast<uint64_t>(mod.part) * es;
    if (need > I.dev->budget_bytes()) {
      return out_of_budget("module %s has %zu parameters and needs %llu bytes (%s) on the device (gathered parameters, "
                           "gradients and their reduction), more than the device budget of %llu bytes (%s); raise "
                           "zoe.device_budget or split the module",
                           mod.name.c_str(), mod.total, static_cast<unsigned long long>(need), format_bytes(need).c_str(),
                           static_cast<unsigned long long>(I.dev->budget_bytes()), format_bytes(I.dev->budget_bytes()).c_str());
    }
  }
  // Where each module's optimizer states live. Partial offload (zoe.offload_ratio r < 1): the
  // first modules, in registration order, up to the fraction r of this rank's optimizer
  // elements, go to the offload device; the others stay on the device. The split depends only
  // on the model and the config, so every rank makes the same one.
  {
    uint64_t total = 0, off = 0;
    for (auto& mod : I.modules) {
      I.owned_range(mod, &mod.opt_begin, &mod.opt_n);
      total += mod.opt_n;
    }
    const double want = I.cfg->zoe.offload_ratio * static_cast<double>(total);
    for (auto& mod : I.modules) {
      const bool offload = I.opt_off != OffloadDevice::kNone &&
                           static_cast<double>(off) + static_cast<double>(mod.opt_n) / 2.0 < want;
      mod.opt_home = offload ? I.opt_off : OffloadDevice::kNone;
      if (offload) off += mod.opt_n;
    }
  }
  // NVMe space for everything that lives there, checked before anything is written.
  if (I.swap) {
    uint64_t need = 0;
    const uint64_t sb = I.cfg->zoe.bf16_optimizer_states ? 2 : 4;
    for (const auto& mod : I.modules) {
      // fp32 master, m and v, and the fp32 gradient accumulator.
      if (mod.opt_home == OffloadDevice::kNvme) need += static_cast<uint64_t>(mod.opt_n) * (4 + 2 * sb + 4);
      if (I.param_off == OffloadDevice::kNvme) need += static_cast<uint64_t>(mod.part) * es;
    }
    uint64_t free_b = 0;
    std::string where;
    for (const auto& f : I.swap->files()) {
      auto fb = io::free_bytes_at(f->path());
      if (fb.is_ok()) free_b += fb.value() / I.swap->files().size();  // files may share a file system
      where += (where.empty() ? "" : ", ") + f->path();
    }
    if (need > free_b) {
      return no_space("the model needs %llu bytes (%s) of NVMe swap space on this rank but only %llu bytes (%s) are free "
                      "at %s", static_cast<unsigned long long>(need), format_bytes(need).c_str(),
                      static_cast<unsigned long long>(free_b), format_bytes(free_b).c_str(), where.c_str());
    }
  }
  // Device memory kept free for a gathered module, its gradients and their reduction, and the cost
  // per element of a gathered module queued ahead of use (the module and a copy of the partition).
  size_t biggest = 0;
  for (const auto& m : I.modules) biggest = std::max(biggest, m.padded);
  const uint64_t reserve = 4ull * biggest * es;
  const uint64_t per_elem = es + (es + static_cast<uint64_t>(I.world) - 1) / static_cast<uint64_t>(I.world);
  // Tiers for stage-3 parameter partitions.
  bool any_partitioned = std::any_of(I.modules.begin(), I.modules.end(), [](const Impl::Module& m) { return m.partitioned_params; });
  if (any_partitioned) {
    offload::TierManagerOptions to;
    to.device = I.dev.get();
    // The device holds partitions for the prefetch window (plus the one in use); the rest of
    // the budget is for a gathered module, its gradients and their reduction.
    uint64_t db = I.dev->budget_bytes();
    const uint64_t bucket = static_cast<uint64_t>(std::max<int64_t>(0, I.cfg->zero.stage3_prefetch_bucket_size));
    const uint64_t avail = db > reserve * 2 ? db - reserve : db / 2;
    // Gathered modules queued ahead of use: up to stage3_prefetch_bucket_size elements, in at
    // most half of what is left.
    const uint64_t gather_bytes = std::min<uint64_t>(bucket * per_elem, avail / 2);
    I.gather_window = static_cast<size_t>(gather_bytes / per_elem);  // lowered below to what is left
    // The rest holds partitions moving towards the device (their window and the one in use).
    uint64_t window = bucket * es / I.world + 2ull * (biggest / I.world) * es;
    to.device_budget = std::min<uint64_t>(window, avail - gather_bytes);
    if (I.param_off == OffloadDevice::kNone) {
      // The partitions live on the device: all of them count in the tier's budget.
      for (const auto& m : I.modules) to.device_budget += m.partitioned_params ? m.part * es : 0;
    }
    to.nvme = I.store.get();
    to.pin = I.cfg->zero.offload_param.pin_memory ? io::PinMode::kDevice : io::PinMode::kNone;
    to.staging_bytes = 1u << 20;
    to.staging_count = 4;
    to.policy = offload::EvictionPolicyKind::kTrace;
    // A fetch that finds the device tier full of prefetches still loading waits for them to
    // land (then evicts) instead of failing; pins are only ever held for one fetch's gather.
    to.wait_for_unpin_ms = 60000;
    to.trace = &I.trace;
    ZOE_ASSIGN_OR_RETURN(I.tm, offload::TierManager::create(to));
  }
  if (std::any_of(I.modules.begin(), I.modules.end(), [](const Impl::Module& m) { return m.opt_home == OffloadDevice::kNvme; })) {
    offload::SwapperOptions so;
    uint32_t sb = I.cfg->zoe.bf16_optimizer_states ? 2 : 4;
    // Order: Impl::kMasterState, kAvgState, kAvgSqState, kGradState (read-only in the step).
    so.states = {{offload::StateKind::kMaster, 4, true}, {offload::StateKind::kAdamM, sb, true},
                 {offload::StateKind::kAdamV, sb, true}, {offload::StateKind::kGrad, 4, false}};
    // At least three pipeline slots (read ahead, update, write back) of one buffer per state.
    so.buffer_count = std::max<size_t>(static_cast<size_t>(std::max<int64_t>(1, I.cfg->zero.offload_optimizer.buffer_count)),
                                       3 * so.states.size());
    // A chunk of the pipeline: sub_group_size elements (DeepSpeed's unit of the optimizer step),
    // a multiple of optim::kChunkElems, at most 1 Mi elements (4 MiB buffers).
    const int64_t sub = std::clamp<int64_t>(I.cfg->zero.sub_group_size, 1, int64_t{1} << 20);
    const size_t chunk = (static_cast<size_t>(sub) + optim::kChunkElems - 1) / optim::kChunkElems * optim::kChunkElems;
    so.buffer_bytes = chunk * 4;
    so.pin = I.cfg->zero.offload_optimizer.pin_memory ? io::PinMode::kDevice : io::PinMode::kNone;
    so.trace = &I.trace;
    ZOE_ASSIGN_OR_RETURN(I.swapper, offload::OptimizerSwapper::create(I.store.get(), so));
  }
  std::vector<float> full;
  for (size_t m = 0; m < I.modules.size(); ++m) {
    Impl::Module& mod = I.modules[m];
    full.assign(mod.padded, 0.0f);
    for (size_t p = 0; p < mod.specs.size(); ++p) init(m, p, full.data() + mod.offset[p], mod.numel[p]);
    const float* own = full.data() + mod.opt_begin;
    // Compute parameters.
    std::vector<char> cbuf(mod.padded * es);
    store_compute(cbuf.data(), full.data(), I.cdt, mod.padded);
    if (!mod.partitioned_params) {
      ZOE_ASSIGN_OR_RETURN(mod.full, I.dalloc(mod.padded * es));
      ZOE_RETURN_IF_ERROR(I.ops->to_device(mod.full, cbuf.data(), cbuf.size()));
    } else {
      Tier home = I.param_off == OffloadDevice::kNone ? Tier::kDevice : I.param_off == OffloadDevice::kCpu ? Tier::kHost : Tier::kNvme;
      ZOE_RETURN_IF_ERROR_CTX(I.tm->add_item(m, mod.part * es, home), "placing the parameters of module " + mod.name);
      ZOE_RETURN_IF_ERROR(I.tm->write(m, cbuf.data() + static_cast<size_t>(I.rank) * mod.part * es));
    }
    // Optimizer states and gradient accumulator of the owned range.
    size_t sbytes = mod.opt_n * (I.cfg->zoe.bf16_optimizer_states ? 2 : 4);
    switch (mod.opt_home) {
      case OffloadDevice::kNone:
      case OffloadDevice::kCpu: {
        // Device memory, or host memory with cpu offload; the same update runs on either.
        auto alloc = [&](size_t bytes) { return mod.opt_home == OffloadDevice::kNone ? I.dalloc(bytes) : I.halloc(bytes); };
        ZOE_ASSIGN_OR_RETURN(mod.master, alloc(mod.opt_n * 4));
        ZOE_ASSIGN_OR_RETURN(mod.exp_avg, alloc(sbytes));
        ZOE_ASSIGN_OR_RETURN(mod.exp_avg_sq, alloc(sbytes));
        ZOE_ASSIGN_OR_RETURN(void* g, alloc(mod.opt_n * 4));
        mod.grad_acc = static_cast<float*>(g);
        ZOE_RETURN_IF_ERROR(I.ops->put(mod.master, mod.opt_home == OffloadDevice::kNone, own, false, mod.opt_n * 4));
        break;
      }
      case OffloadDevice::kNvme: {
        ZOE_RETURN_IF_ERROR_CTX(I.swapper->add_group(m, mod.opt_n), "placing the optimizer states of module " + mod.name);
        ZOE_RETURN_IF_ERROR(I.swapper->write_state(m, Impl::kMasterState, own));
        std::vector<char> zeros(sbytes, 0);
        ZOE_RETURN_IF_ERROR(I.swapper->write_state(m, Impl::kAvgState, zeros.data()));
        ZOE_RETURN_IF_ERROR(I.swapper->write_state(m, Impl::kAvgSqState, zeros.data()));
        // The gradient accumulator lives on NVMe too (written by the first reduction of a step).
        break;
      }
    }
  }
  if (I.tm) {
    // Device memory the states took (persistent modules, device-resident optimizer states)
    // comes out of the gather window too: keep the tier's budget and the reserve free.
    const uint64_t db = I.dev->budget_bytes(), used = I.dev->used_bytes() + I.tm->stats().budget[0];
    const uint64_t room = db > used + reserve ? (db - used - reserve) / per_elem : 0;
    I.gather_window = std::min<size_t>(I.gather_window, static_cast<size_t>(room));
    // Queued gathers run a host task on the communicator's stream: host-memory devices only.
    if (!I.ops->host_addressable() || I.dcomm != I.comm) I.gather_window = 0;
  }
  I.initialized = true;
  I.last_step_ns = now_ns();
  if (I.tm) I.tm->begin_trace();
  return Status::ok();
}

Result<ModuleParams> Engine::fetch(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.t_engine);
  if (!I.initialized) return invalid_argument("fetch() before initialize()");
  if (m >= I.modules.size()) return invalid_argument("fetch(%zu): there are %zu modules", m, I.modules.size());
  Impl::Module& mod = I.modules[m];
  if (I.recording) I.order.push_back(m);
  ZOE_RETURN_IF_ERROR(I.follow_order(m));
  if (mod.partitioned_params && !mod.fetched && mod.gather_pending) {
    // Prefetched: the gather was queued when an earlier module was fetched.
    ZOE_RETURN_IF_ERROR(I.finish_gather(m));
    I.gathers_prefetched++;
    ZOE_RETURN_IF_ERROR(I.prefetch_after(m));
  } else if (mod.partitioned_params && !mod.fetched) {
    int64_t cap = I.cfg->zero.stage3_max_live_parameters;
    if (static_cast<int64_t>(I.live_elems + mod.padded) > cap) ZOE_RETURN_IF_ERROR(I.discard_gathers());
    if (static_cast<int64_t>(I.live_elems + mod.padded) > cap) {
      return invalid_argument("fetching module %s would gather %zu parameters, above stage3_max_live_parameters %lld: "
                              "release modules before fetching more", mod.name.c_str(), I.live_elems + mod.padded,
                              static_cast<long long>(cap));
    }
    void* part;
    {
      Timer t(&I.t_io);
      ZOE_ASSIGN_OR_RETURN(part, I.tm->fetch(m, Tier::kDevice).wait());
    }
    ZOE_ASSIGN_OR_RETURN(mod.full, I.dalloc(mod.padded * I.esize()));
    {
      Timer t(&I.t_comm);
      Status s = I.dcomm->all_gather(part, mod.full, mod.part, to_comm(I.cdt)).wait();
      I.tm->unpin(m, Tier::kDevice);
      if (!s.is_ok()) return s.with_context("gathering the parameters of module " + mod.name);
    }
    I.live_elems += mod.padded;
    I.gathers_on_demand++;
    ZOE_RETURN_IF_ERROR(I.prefetch_after(m));
  }
  if (!I.recording && !I.order.empty()) I.cursor = (I.cursor + 1) % I.order.size();
  mod.fetched = true;
  return I.views(mod, mod.full);
}

Status Engine::release(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.t_engine);
  if (m >= I.modules.size()) return invalid_argument("release(%zu): there are %zu modules", m, I.modules.size());
  Impl::Module& mod = I.modules[m];
  if (!mod.fetched) return invalid_argument("release(%s) of a module that is not fetched", mod.name.c_str());
  mod.fetched = false;
  if (mod.partitioned_params) {
    I.dev->free(mod.full);
    mod.full = nullptr;
    I.live_elems -= mod.padded;
  }
  return Status::ok();
}

Result<ModuleParams> Engine::grads(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.t_engine);
  if (m >= I.modules.size()) return invalid_argument("grads(%zu): there are %zu modules", m, I.modules.size());
  Impl::Module& mod = I.modules[m];
  if (!mod.grad_buf) {
    ZOE_ASSIGN_OR_RETURN(mod.grad_buf, I.dalloc(mod.padded * I.esize()));
  }
  return I.views(mod, mod.grad_buf);
}

Status Engine::reduce_grads(size_t m) {
  Impl& I = *impl_;
  Timer te(&I.t_engine);
  if (m >= I.modules.size()) return invalid_argument("reduce_grads(%zu): there are %zu modules", m, I.modules.size());
  Impl::Module& mod = I.modules[m];
  if (!mod.grad_buf) return invalid_argument("reduce_grads(%s) without grads()", mod.name.c_str());
  ZOE_RETURN_IF_ERROR(I.complete_pending(false));
  Impl::Pending p;
  p.m = m;
  p.send = mod.grad_buf;
  mod.grad_buf = nullptr;
  const comm::CommType ct = to_comm(I.cdt);
  const size_t es = I.esize();
  // Buckets of at most reduce_bucket_size elements; the communicator runs them in order, so the
  // last handle completes after all of them.
  const size_t bucket = static_cast<size_t>(std::max<int64_t>(I.world, I.cfg->zero.reduce_bucket_size));
  if (I.stage >= 2) {
    ZOE_ASSIGN_OR_RETURN(p.recv, I.dalloc(mod.part * es));
    p.recv_offset = 0;
    const size_t per_rank = std::max<size_t>(1, bucket / static_cast<size_t>(I.world));
    if (per_rank >= mod.part) {
      p.h = I.dcomm->reduce_scatter(p.send, p.recv, mod.part, ct, comm::ReduceOp::kSum);
    } else {
      // A bucket holds the same slice of every rank's part: pack each bucket rank-major.
      ZOE_ASSIGN_OR_RETURN(void* packed, I.dalloc(mod.padded * es));
      auto* src = static_cast<char*>(p.send);
      auto* dst = static_cast<char*>(packed);
      for (size_t b = 0; b < mod.part; b += per_rank) {
        const size_t n = std::min(per_rank, mod.part - b);
        char* pack = dst + b * es * static_cast<size_t>(I.world);
        for (int r = 0; r < I.world; ++r) {
          ZOE_RETURN_IF_ERROR(
              I.ops->copy(pack + static_cast<size_t>(r) * n * es, src + (static_cast<size_t>(r) * mod.part + b) * es, n * es));
        }
        p.h = I.dcomm->reduce_scatter(pack, static_cast<char*>(p.recv) + b * es, n, ct, comm::ReduceOp::kSum);
      }
      I.dev->free(p.send);
      p.send = packed;
    }
  } else {
    ZOE_ASSIGN_OR_RETURN(p.recv, I.dalloc(mod.padded * es));
    p.recv_offset = mod.opt_begin;
    for (size_t b = 0; b < mod.padded; b += bucket) {
      const size_t n = std::min(bucket, mod.padded - b);
      p.h = I.dcomm->all_reduce(static_cast<char*>(p.send) + b * es, static_cast<char*>(p.recv) + b * es, n, ct,
                               comm::ReduceOp::kSum);
    }
  }
  // The reduction runs on the communicator's stream while the caller computes the next module;
  // its buffers are freed when it is accumulated (at the latest in step()).
  I.pending.push_back(p);
  return Status::ok();
}

Result<StepStats> Engine::step() {
  Impl& I = *impl_;
  uint64_t t_enter = now_ns();
  if (!I.initialized) return invalid_argument("step() before initialize()");
  // An asynchronous checkpoint still reading the states must finish before they change.
  ZOE_RETURN_IF_ERROR_CTX(finish_save(), "finishing the asynchronous checkpoint");
  ZOE_RETURN_IF_ERROR(I.complete_pending(true));
  ZOE_RETURN_IF_ERROR(I.discard_gathers());  // none in a regular loop: prefetch stops at the order's end
  // Moves still in flight (prefetches) finish before the update rewrites the partitions they read.
  if (I.tm) ZOE_RETURN_IF_ERROR_CTX(I.tm->drain(), "finishing the parameter moves before the step");
  for (const auto& mod : I.modules) {
    if (mod.grad_buf) return invalid_argument("step(): module %s has gradients that were not reduced", mod.name.c_str());
    if (mod.fetched && mod.partitioned_params) return invalid_argument("step(): module %s is still fetched", mod.name.c_str());
  }
  if (I.recording) {
    I.recording = false;
    I.cursor = 0;
    if (I.tm) I.tm->end_trace();
  }
  uint64_t t_opt0 = now_ns();
  optim::Exec exec;
  exec.pool = I.pool.get();
  // 1. Global gradient norm: this rank's owned ranges, summed over ranks (stage 0 owns all).
  // The accumulation pass left a sum of squares per chunk; they are added in one fixed order.
  optim::NormResult local;
  for (size_t m = 0; m < I.modules.size(); ++m) {
    Impl::Module& mod = I.modules[m];
    if (mod.acc_count == 0) ZOE_RETURN_IF_ERROR_CTX(I.zero_grads(m), "zeroing the gradients of module " + mod.name);
    double sum = 0.0;
    for (double p : mod.norm_parts) sum += p;
    local.sum_sq += sum;
    local.finite = local.finite && std::isfinite(sum);
  }
  double sums[1] = {local.finite ? local.sum_sq : INFINITY};
  if (I.stage >= 1 && I.world > 1) {
    Timer t(&I.t_comm);
    double out[1];
    ZOE_RETURN_IF_ERROR_CTX(I.comm->all_reduce(sums, out, 1, comm::CommType::kF64, comm::ReduceOp::kSum).wait(),
                            "all-reducing the gradient norm");
    sums[0] = out[0];
  }
  optim::NormResult global;
  global.sum_sq = sums[0];
  global.finite = std::isfinite(sums[0]);
  // Gradients were summed over ranks and micro-batches with the loss scale: average and unscale.
  const double micro = static_cast<double>(std::max<int64_t>(1, I.cfg->gradient_accumulation_steps));
  double divisor = static_cast<double>(I.world) * micro * (I.cdt == DType::kF16 ? I.scaler.scale() : 1.0);
  optim::StepScale sc = optim::compute_step_scale(global, static_cast<float>(divisor),
                                                  static_cast<float>(I.cfg->gradient_clipping));
  StepStats st;
  st.grad_norm = sc.grad_norm;
  st.lr = I.cfg->lr_at(I.steps + 1);
  if (sc.overflow) {
    st.skipped = true;
  } else {
    I.steps++;
    optim::AdamParams ap;
    ap.lr = static_cast<float>(st.lr);
    ap.beta1 = static_cast<float>(I.cfg->optimizer.beta1);
    ap.beta2 = static_cast<float>(I.cfg->optimizer.beta2);
    ap.eps = static_cast<float>(I.cfg->optimizer.eps);
    ap.weight_decay = static_cast<float>(I.cfg->optimizer.weight_decay);
    ap.adamw = I.cfg->optimizer.adam_w_mode;
    optim::AdamStep as;
    as.step = I.steps;
    as.grad_scale = sc.grad_scale;
    const DType sdt = I.cfg->zoe.bf16_optimizer_states ? DType::kBF16 : DType::kF32;
    // The chunk update: fp32 master, m, v at [begin, begin+n) of module m's owned range.
    // States on the device (opt_home none) run the device's kernel; offloaded ones the CPU's.
    // The new compute parameters go to `out` (device memory, or the host tier's copy of a stage-3
    // partition), through a staging buffer where the kernel's memory and out's differ.
    std::vector<char> out_stage;
    auto update = [&](size_t m, size_t begin, size_t n, float* master, void* ea, void* eas, const float* grad,
                      void* out) -> Status {
      const bool kernel_dev = I.modules[m].opt_home == OffloadDevice::kNone;
      const bool out_dev = I.owned_on_device(m);
      const bool direct = I.ops->host_addressable() || kernel_dev == out_dev;
      char* dst = static_cast<char*>(out) + begin * I.esize();
      void* dev_stage = nullptr;
      optim::AdamArgs a;
      a.buf.n = n;
      a.buf.param = master;
      a.buf.grad = grad;
      a.buf.grad_dtype = DType::kF32;
      a.buf.exp_avg = ea;
      a.buf.exp_avg_sq = eas;
      a.buf.state_dtype = sdt;
      if (I.cdt != DType::kF32) {
        if (direct) {
          a.buf.param_out = dst;
        } else if (kernel_dev) {
          ZOE_ASSIGN_OR_RETURN(dev_stage, I.dalloc(n * I.esize()));
          a.buf.param_out = dev_stage;
        } else {
          out_stage.resize(n * I.esize());
          a.buf.param_out = out_stage.data();
        }
        a.buf.param_out_dtype = I.cdt;
      }
      a.params = ap;
      a.step = as;
      Status us = kernel_dev ? I.ops->adam_step(a) : optim::adam_step(a, exec);
      if (us.is_ok() && I.cdt == DType::kF32) {
        us = I.ops->put(dst, out_dev, master, kernel_dev, n * 4);
      } else if (us.is_ok() && !direct) {
        us = I.ops->put(dst, out_dev, a.buf.param_out, kernel_dev, n * I.esize());
      }
      if (dev_stage) I.dev->free(dev_stage);
      return us;
    };
    // Where each module's new compute parameters go, fetched when its first chunk is updated and
    // given back (written home, host copy dropped) when the update moves on: a stage-3 partition
    // offloaded to NVMe is in host memory one module at a time, whatever the model size.
    std::vector<void*> outs(I.modules.size(), nullptr);
    auto open_out = [&](size_t m) -> Result<void*> {
      if (!outs[m]) {
        ZOE_ASSIGN_OR_RETURN(outs[m], I.owned_compute(m));
      }
      return outs[m];
    };
    auto close_out = [&](size_t m) {
      if (!outs[m]) return;
      I.unpin_owned(m);
      outs[m] = nullptr;
    };
    Status s;
    if (I.swapper) {
      size_t open = SIZE_MAX;  // the module whose chunks are being updated (groups come in order)
      s = I.swapper->step([&](const offload::ChunkView& c) -> Status {
        if (c.group != open) {
          if (open != SIZE_MAX) close_out(open);
          open = c.group;
        }
        ZOE_ASSIGN_OR_RETURN(void* out, open_out(c.group));
        return update(c.group, c.begin, c.n, static_cast<float*>(c.data[Impl::kMasterState]), c.data[Impl::kAvgState],
                      c.data[Impl::kAvgSqState], static_cast<const float*>(c.data[Impl::kGradState]), out);
      });
      if (open != SIZE_MAX) close_out(open);
    }
    // Modules whose states live on the device or in host RAM.
    for (size_t m = 0; m < I.modules.size() && s.is_ok(); ++m) {
      Impl::Module& mod = I.modules[m];
      if (mod.opt_home == OffloadDevice::kNvme) continue;
      auto out = open_out(m);
      s = out.is_ok() ? update(m, 0, mod.opt_n, static_cast<float*>(mod.master), mod.exp_avg, mod.exp_avg_sq,
                               mod.grad_acc, out.value())
                      : out.status();
      close_out(m);
    }
    for (size_t m = 0; m < I.modules.size(); ++m) close_out(m);  // after an error
    if (I.tm) {
      Status ds = I.tm->drain();
      if (s.is_ok()) s = ds;
    }
    if (!s.is_ok()) return s.with_context("optimizer step " + std::to_string(I.steps));
    // Stage 1/2 (and persistent stage-3 modules): gather the updated partitions.
    if (I.stage >= 1) {
      Timer t(&I.t_comm);
      for (auto& mod : I.modules) {
        if (mod.partitioned_params) continue;
        ZOE_ASSIGN_OR_RETURN(void* tmp, I.dalloc(mod.part * I.esize()));
        Status gs = I.ops->copy(tmp, static_cast<char*>(mod.full) + mod.opt_begin * I.esize(), mod.part * I.esize());
        if (gs.is_ok()) gs = I.dcomm->all_gather(tmp, mod.full, mod.part, to_comm(I.cdt)).wait();
        I.dev->free(tmp);
        if (!gs.is_ok()) return gs.with_context("gathering the updated parameters of module " + mod.name);
      }
    }
  }
  if (I.cdt == DType::kF16) I.scaler.update(sc.overflow);
  for (auto& mod : I.modules) mod.acc_count = 0;  // the next reduction overwrites the accumulator
  I.t_opt += static_cast<double>(now_ns() - t_opt0) * 1e-9;
  uint64_t now = now_ns();
  double wall = static_cast<double>(now - I.last_step_ns) * 1e-9;
  double in_engine = I.t_engine + static_cast<double>(now - t_enter) * 1e-9;
  st.step = I.steps;
  st.loss_scale = loss_scale();
  st.t_comm = I.t_comm;
  st.t_io_stall = I.t_io;
  st.t_optimizer = I.t_opt;
  st.t_compute = std::max(0.0, wall - in_engine);
  st.high_water[0] = I.dev->high_water_bytes();
  uint64_t host = I.host_bytes + (I.swapper ? I.swapper->buffer_bytes_total() : 0);
  if (I.tm) host += I.tm->stats().high_water[1];
  st.high_water[1] = host;
  st.high_water[2] = I.store ? I.store->high_water_bytes() : 0;
  if (I.io) {
    io::IoStatsSnapshot ios = I.io->stats();
    st.bytes_nvme_read = ios.read_bytes;
    st.bytes_nvme_write = ios.write_bytes;
  }
  if (I.tm) {
    offload::TierStats ts = I.tm->stats();
    st.bytes_host_to_device = ts.host_to_device.bytes + ts.nvme_to_device.bytes;
    st.bytes_device_to_host = ts.device_to_host.bytes + ts.device_to_nvme.bytes;
  }
  st.gathers_prefetched = I.gathers_prefetched;
  st.gathers_on_demand = I.gathers_on_demand;
  I.gathers_prefetched = I.gathers_on_demand = 0;
  I.t_comm = I.t_io = I.t_opt = I.t_engine = 0;
  I.last_step_ns = now;
  return st;
}

uint64_t Engine::num_params() const {
  uint64_t n = 0;
  for (const auto& mod : impl_->modules) n += mod.total;
  return n;
}

uint64_t Engine::model_state_bytes() const {
  const Impl& I = *impl_;
  uint64_t n = num_params(), w = static_cast<uint64_t>(I.world);
  uint64_t params = (I.stage == 3 ? n / w : n) * I.esize();
  uint64_t grads = (I.stage >= 2 ? n / w : n) * 4;
  uint64_t optim = (I.stage >= 1 ? n / w : n) * (4 + 2 * (I.cfg->zoe.bf16_optimizer_states ? 2 : 4));
  return params + grads + optim;
}

uint64_t Engine::device_budget_bytes() const { return impl_->dev->budget_bytes(); }

Status Engine::write_trace(const std::string& path) const { return impl_->trace.write_chrome_json(path); }
void Engine::enable_trace(bool on) { impl_->trace.set_enabled(on); }
void Engine::record_compute(const std::string& name, uint64_t begin_ns, uint64_t end_ns) {
  impl_->trace.record(name, "compute", begin_ns, end_ns);
}

Status Engine::read_master(size_t m, size_t p, float* out) {
  Impl& I = *impl_;
  if (m >= I.modules.size() || p >= I.modules[m].specs.size()) return invalid_argument("read_master(%zu, %zu): no such parameter", m, p);
  Impl::Module& mod = I.modules[m];
  std::vector<float> own(mod.opt_n);
  if (mod.opt_home == OffloadDevice::kNvme) {
    ZOE_RETURN_IF_ERROR(I.swapper->read_state(m, Impl::kMasterState, own.data()));
  } else {
    ZOE_RETURN_IF_ERROR(I.ops->put(own.data(), false, mod.master, mod.opt_home == OffloadDevice::kNone, mod.opt_n * 4));
  }
  std::vector<float> full(mod.padded);
  if (I.stage == 0) {
    full = own;
  } else {
    ZOE_RETURN_IF_ERROR(I.comm->all_gather(own.data(), full.data(), mod.part, comm::CommType::kF32).wait());
  }
  memcpy(out, full.data() + mod.offset[p], mod.numel[p] * 4);
  return Status::ok();
}

}  // namespace zoe

