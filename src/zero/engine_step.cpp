// Engine, the optimizer step: the global gradient norm (from the per-chunk sums the accumulation
// left), loss scaling and clipping folded into one scale, AdamW over this rank's states wherever
// they live (NVMe states through the swapper's pipeline, device states with the device's kernel,
// host states with the CPU's), the new compute parameters written to their home, and at stage
// 1/2 the all-gather of the updated partitions. Then the step's statistics.
//
// Contract: step() needs every gradient buffer reduced and, at stage 3, every module released.
// It waits for an asynchronous checkpoint and for the reductions and moves still in flight
// first. After an error the engine is destructible; its states may be half-updated.
#include <algorithm>
#include <cmath>

#include "zero/engine_impl.h"
#include "zero/test_hooks.h"

namespace zoe {

using config::OffloadDevice;
using zero::Timer;
using zero::to_comm;

namespace {

// The update of one range of module m's owned elements: fp32 master, m, v at [begin, begin+n).
// States on the device (opt_home none) run the device's kernel; offloaded ones the CPU's. The
// new compute parameters go to `out` (device memory, or the host tier's copy of a stage-3
// partition), through a staging buffer where the kernel's memory and out's differ. `ops` and
// `exec.pool` are the running thread's own (the caller's, or the overlapped update's).
struct ChunkUpdater {
  Engine::Impl& I;
  zero::DeviceOps* ops;
  optim::AdamParams ap;
  optim::AdamStep as;
  DType sdt;
  optim::Exec exec;
  std::vector<char> out_stage;
  bool out_host = false;  // `out` is host memory whatever the module's home (a speculative update's)

  Status operator()(size_t m, size_t begin, size_t n, float* master, void* ea, void* eas, const float* grad,
                    void* out) {
    const bool kernel_dev = I.modules[m].opt_home == OffloadDevice::kNone;
    const bool out_dev = !out_host && I.owned_on_device(m);
    const bool direct = ops->host_addressable() || kernel_dev == out_dev;
    char* dst = static_cast<char*>(out) + begin * I.esize();
    device::DeviceBuffer dev_stage;
    // The results are handed on (written home, the chunk's buffers reused) once this returns;
    // on an error path too, no op may still use dev_stage.
    zero::OpsFence fence(*ops);
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
        // The kernel writes every element: no zeroing (and no use of the caller's ops).
        ZOE_ASSIGN_OR_RETURN(dev_stage, device::DeviceBuffer::allocate(*I.dev, n * I.esize()));
        a.buf.param_out = dev_stage.get();
      } else {
        out_stage.resize(n * I.esize());
        a.buf.param_out = out_stage.data();
      }
      a.buf.param_out_dtype = I.cdt;
    }
    a.params = ap;
    a.step = as;
    ZOE_RETURN_IF_ERROR(kernel_dev ? ops->adam_step(a) : optim::adam_step(a, exec));
    if (I.cdt == DType::kF32) {
      ZOE_RETURN_IF_ERROR(ops->put(dst, out_dev, master, kernel_dev, n * 4));
    } else if (!direct) {
      ZOE_RETURN_IF_ERROR(ops->put(dst, out_dev, a.buf.param_out, kernel_dev, n * I.esize()));
    }
    return fence.wait();
  }
};

// The update's arguments for step `step_no` at learning rate `lr` and gradient scale `scale`, on
// `ops` with `pool`'s threads.
ChunkUpdater make_updater(Engine::Impl& I, zero::DeviceOps* ops, optim::CpuPool* pool, double lr,
                          int64_t step_no, float scale) {
  ChunkUpdater up{I,  ops, {},   {}, I.cfg->zoe.bf16_optimizer_states ? DType::kBF16 : DType::kF32,
                  {}, {},  false};
  up.exec.pool = pool;
  up.ap.lr = static_cast<float>(lr);
  up.ap.beta1 = static_cast<float>(I.cfg->optimizer.beta1);
  up.ap.beta2 = static_cast<float>(I.cfg->optimizer.beta2);
  up.ap.eps = static_cast<float>(I.cfg->optimizer.eps);
  up.ap.weight_decay = static_cast<float>(I.cfg->optimizer.weight_decay);
  up.ap.adamw = I.cfg->optimizer.adam_w_mode;
  up.as.step = step_no;
  up.as.grad_scale = scale;
  return up;
}

// What the step divides the summed gradients by: ranks x micro-batches (x the fp16 loss scale).
double grad_divisor(const Engine::Impl& I) {
  const double micro = static_cast<double>(std::max<int64_t>(1, I.cfg->gradient_accumulation_steps));
  return static_cast<double>(I.world) * micro * (I.cdt == DType::kF16 ? I.scaler.scale() : 1.0);
}

// Marks module m's update done (no-op for a serial step).
void mark_done(Engine::Impl& I, size_t m) {
  {
    std::lock_guard<std::mutex> lock(I.update.mu);
    if (I.update.done.empty()) return;
    I.update.done[m] = 1;
  }
  I.update.cv.notify_all();
}

// AdamW over every module's owned range, in forward order: NVMe-resident modules through the
// swapper's pipeline, then those on the device or in host RAM (with partial offload the
// offloaded ones are the first modules, so this is forward order). Each module is marked done
// once its new compute parameters are home. No collective runs here.
Status run_update(Engine::Impl& I, ChunkUpdater& update, double* t_io) {
  // Where each module's new compute parameters go, fetched when its first chunk is updated and
  // given back (written home, host copy dropped) when the update moves on: a stage-3 partition
  // offloaded to NVMe is in host memory one module at a time, whatever the model size.
  std::vector<void*> outs(I.modules.size(), nullptr);
  auto open_out = [&](size_t m) -> Result<void*> {
    if (!outs[m]) {
      ZOE_ASSIGN_OR_RETURN(outs[m], I.owned_compute(m, t_io));
    }
    return outs[m];
  };
  auto close_out = [&](size_t m) -> Status {
    if (!outs[m]) return Status::ok();
    outs[m] = nullptr;
    Status s = I.unpin_owned(m, t_io);
    mark_done(I, m);
    return s;
  };
  Status s;
  if (I.swapper) {
    size_t open = SIZE_MAX;  // the module whose chunks are being updated (groups come in order)
    s = I.swapper->step([&](const offload::ChunkView& c) -> Status {
      if (c.group != open) {
        if (open != SIZE_MAX) ZOE_RETURN_IF_ERROR(close_out(open));
        open = c.group;
      }
      ZOE_ASSIGN_OR_RETURN(void* out, open_out(c.group));
      return update(c.group, c.begin, c.n, static_cast<float*>(c.data[Engine::Impl::kMasterState]),
                    c.data[Engine::Impl::kAvgState], c.data[Engine::Impl::kAvgSqState],
                    static_cast<const float*>(c.data[Engine::Impl::kGradState]), out);
    });
    if (open != SIZE_MAX) {
      Status cs = close_out(open);
      if (s.is_ok()) s = cs;
    }
  }
  for (size_t m = 0; m < I.modules.size() && s.is_ok(); ++m) {
    Engine::Impl::Module& mod = I.modules[m];
    if (mod.opt_home == OffloadDevice::kNvme) continue;
    auto out = open_out(m);
    if (out.is_ok() && mod.speculated) {
      // Updated during the backward and confirmed by the norm: its compute parameters go home.
      mod.speculated = false;
      s = update.ops->put(out.value(), I.owned_on_device(m), mod.spec_out, false, mod.opt_n * I.esize());
      if (s.is_ok()) s = update.ops->synchronize();
    } else {
      s = out.is_ok() ? update(m, 0, mod.opt_n, static_cast<float*>(mod.master), mod.exp_avg, mod.exp_avg_sq,
                               mod.grad_acc, out.value())
                      : out.status();
    }
    Status cs = close_out(m);
    if (s.is_ok()) s = cs;
  }
  for (size_t m = 0; m < I.modules.size(); ++m) (void)close_out(m);  // after an error
  I.wait_writebacks();
  if (I.tm) {
    Status ds = I.tm->drain();
    if (s.is_ok()) s = ds;
  }
  return s;
}

}  // namespace

Status Engine::Impl::speculate(size_t m) {
  Module& mod = modules[m];
  if (mod.speculated) unspeculate(m);
  if (mod.opt_home != OffloadDevice::kCpu || !mod.spec_save || mod.opt_n == 0) return Status::ok();
  const size_t n = mod.opt_n, sbytes = n * (cfg->zoe.bf16_optimizer_states ? 2 : 4);
  char* save = static_cast<char*>(mod.spec_save);
  memcpy(save, mod.master, n * 4);
  memcpy(save + n * 4, mod.exp_avg, sbytes);
  memcpy(save + n * 4 + sbytes, mod.exp_avg_sq, sbytes);
  // The scale step() computes when the norm neither clips nor overflows (clip coefficient 1).
  optim::NormResult unclipped;
  unclipped.sum_sq = 0.0;
  unclipped.finite = true;
  spec_scale = optim::compute_step_scale(unclipped, static_cast<float>(grad_divisor(*this)), 0.0f).grad_scale;
  ChunkUpdater up = make_updater(*this, ops.get(), pool.get(), cfg->lr_at(steps + 1), steps + 1, spec_scale);
  up.out_host = true;
  const uint64_t t0 = now_ns();
  Status s =
      up(m, 0, n, static_cast<float*>(mod.master), mod.exp_avg, mod.exp_avg_sq, mod.grad_acc, mod.spec_out);
  if (trace.enabled())
    trace.record("update " + mod.name + " (speculative)", "optimizer", t0, now_ns(), 0, kLaneOptimizer);
  mod.speculated = true;  // also after an error: its states may be half-updated, the saved ones are whole
  if (!s.is_ok()) {
    unspeculate(m);
    return s.with_context("the speculative update of module " + mod.name);
  }
  return Status::ok();
}

void Engine::Impl::unspeculate(size_t m) {
  Module& mod = modules[m];
  if (!mod.speculated) return;
  const size_t n = mod.opt_n, sbytes = n * (cfg->zoe.bf16_optimizer_states ? 2 : 4);
  const char* save = static_cast<const char*>(mod.spec_save);
  memcpy(mod.master, save, n * 4);
  memcpy(mod.exp_avg, save + n * 4, sbytes);
  memcpy(mod.exp_avg_sq, save + n * 4 + sbytes, sbytes);
  mod.speculated = false;
  spec_undone++;
}

void Engine::Impl::unspeculate_all() {
  for (size_t m = 0; m < modules.size(); ++m) unspeculate(m);
}

bool Engine::Impl::update_done(size_t m) {
  std::lock_guard<std::mutex> lock(update.mu);
  return update.done.empty() || update.done[m] != 0;
}

Status Engine::Impl::wait_module_updated(size_t m) {
  std::unique_lock<std::mutex> lock(update.mu);
  update.cv.wait(lock, [&] { return update.done.empty() || update.done[m] != 0; });
  if (!update.status.is_ok()) return update.status;
  return Status::ok();
}

Status Engine::Impl::join_update() {
  if (!update.running) return Status::ok();
  update.thread.join();
  update.running = false;
  t_opt_overlapped += update.t_opt;
  std::lock_guard<std::mutex> lock(update.mu);
  update.done.clear();
  Status s = std::move(update.status);
  update.status = Status::ok();
  if (!s.is_ok()) update_error = s;
  return update_error;
}

Status Engine::Impl::finish_update() {
  ZOE_RETURN_IF_ERROR(join_update());
  for (size_t m = 0; m < gather_owed.size(); ++m) {
    if (!gather_owed[m]) continue;
    gather_owed[m] = 0;
    ZOE_RETURN_IF_ERROR(gather_updated(m));
  }
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
  // The previous step's update (if it still runs behind) and the gathers it left owed.
  {
    zero::Timer t(&I.t_opt);
    ZOE_RETURN_IF_ERROR_CTX(I.finish_update(), "the previous optimizer step");
  }
  // Moves still in flight (prefetches) finish before the update rewrites the partitions they read.
  if (I.tm) ZOE_RETURN_IF_ERROR_CTX(I.tm->drain(), "finishing the parameter moves before the step");
  for (const auto& mod : I.modules) {
    if (mod.grad_buf)
      return invalid_argument("step(): module %s has gradients that were not reduced", mod.name.c_str());
    if (mod.fetched && mod.partitioned_params) {
      return invalid_argument("step(): module %s is still fetched", mod.name.c_str());
    }
  }
  if (I.recording) {
    I.recording = false;
    I.cursor = 0;
    if (I.tm) I.tm->end_trace();
  }
  uint64_t t_opt0 = now_ns();
  // 1. Global gradient norm: this rank's owned ranges, summed over ranks (stage 0 owns all).
  // The accumulation pass left a sum of squares per chunk; they are added in one fixed order.
  optim::NormResult local;
  for (size_t m = 0; m < I.modules.size(); ++m) {
    Impl::Module& mod = I.modules[m];
    if (mod.acc_count == 0)
      ZOE_RETURN_IF_ERROR_CTX(I.zero_grads(m), "zeroing the gradients of module " + mod.name);
    double sum = 0.0;
    for (double p : mod.norm_parts) sum += p;
    local.sum_sq += sum;
    local.finite = local.finite && std::isfinite(sum);
  }
  double sums[1] = {local.finite ? local.sum_sq : INFINITY};
  if (I.stage >= 1 && I.world > 1) {
    Timer t(&I.t_comm);
    double out[1];
    ZOE_RETURN_IF_ERROR_CTX(
        I.comm->all_reduce(sums, out, 1, comm::CommType::kF64, comm::ReduceOp::kSum).wait(),
        "all-reducing the gradient norm");
    sums[0] = out[0];
  }
  optim::NormResult global;
  global.sum_sq = sums[0];
  global.finite = std::isfinite(sums[0]);
  // 2. Gradients were summed over ranks and micro-batches with the loss scale: average, unscale
  //    and clip in one scale.
  optim::StepScale sc = optim::compute_step_scale(global, static_cast<float>(grad_divisor(I)),
                                                  static_cast<float>(I.cfg->gradient_clipping));
  StepStats st;
  st.grad_norm = sc.grad_norm;
  st.lr = I.cfg->lr_at(I.steps + 1);
  I.preload_started = false;
  // zoe.speculative_step: the updates run during the backward stand when this step updates with
  // the scale they assumed (no clip, no overflow); otherwise their states go back and the update
  // below (or the skip) starts from the states before them.
  if (sc.overflow || sc.grad_scale != I.spec_scale) I.unspeculate_all();
  for (const auto& mod : I.modules) I.spec_kept += mod.speculated ? 1 : 0;
  st.speculative_kept = I.spec_kept;
  st.speculative_undone = I.spec_undone;
  I.spec_kept = I.spec_undone = 0;
  if (sc.overflow) {
    st.skipped = true;
    // No update reads them: the chunks read ahead (and the gradients handed to them) go.
    if (I.swapper) ZOE_RETURN_IF_ERROR_CTX(I.swapper->drop_preloaded(), "dropping the chunks read ahead");
  } else {
    I.steps++;
    // 3. AdamW over every module's owned range: behind the caller's next forward when the
    //    device's memory is host memory (zoe.overlap_step), else here.
    const bool overlap = I.cfg->zoe.overlap_step && I.ops->host_addressable();
    if (overlap && !I.update_pool) {
      optim::CpuPool::Options po;
      po.threads = static_cast<int>(I.cfg->zoe.optimizer_threads);
      ZOE_ASSIGN_OR_RETURN(I.update_pool, optim::CpuPool::create(po));
      I.update_ops = zero::make_cpu_ops(I.update_pool.get(), zero::deferred_device_ops());
    }
    ChunkUpdater up =
        make_updater(I, overlap ? I.update_ops.get() : I.ops.get(),
                     overlap ? I.update_pool.get() : I.pool.get(), st.lr, I.steps, sc.grad_scale);
    if (overlap) {
      {
        std::lock_guard<std::mutex> lock(I.update.mu);
        I.update.done.assign(I.modules.size(), 0);
        I.update.status = Status::ok();
      }
      I.update.t_opt = I.update.t_io = 0;
      // Stage 1/2 (and persistent stage-3 modules): the updated partitions are gathered by the
      // caller's thread at each module's next fetch (or the next sync point).
      I.gather_owed.assign(I.modules.size(), 0);
      for (size_t m = 0; m < I.modules.size(); ++m) {
        if (I.stage >= 1 && !I.modules[m].partitioned_params) I.gather_owed[m] = 1;
      }
      const int64_t step_no = I.steps;
      I.update.running = true;
      I.update.thread = std::thread([&I, up, step_no]() mutable {
        const uint64_t t0 = now_ns();
        Status s = run_update(I, up, &I.update.t_io);
        if (!s.is_ok()) s = s.with_context("optimizer step " + std::to_string(step_no));
        I.update.t_opt = static_cast<double>(now_ns() - t0) * 1e-9;
        {
          std::lock_guard<std::mutex> lock(I.update.mu);
          I.update.status = s;
          std::fill(I.update.done.begin(), I.update.done.end(), 1);  // wake every waiter, also on error
        }
        I.update.cv.notify_all();
      });
    } else {
      Status s = run_update(I, up, &I.t_io);
      if (!s.is_ok()) return s.with_context("optimizer step " + std::to_string(I.steps));
      // 4. Stage 1/2 (and persistent stage-3 modules): gather the updated partitions.
      if (I.stage >= 1) {
        for (size_t m = 0; m < I.modules.size(); ++m) {
          if (!I.modules[m].partitioned_params) ZOE_RETURN_IF_ERROR(I.gather_updated(m));
        }
      }
    }
  }
  if (I.cdt == DType::kF16) I.scaler.update(sc.overflow);
  for (auto& mod : I.modules) mod.acc_count = 0;  // the next reduction overwrites the accumulator
  I.t_opt += static_cast<double>(now_ns() - t_opt0) * 1e-9;

  // 5. Statistics (an overlapped update's bytes and time count at the next step).
  uint64_t now = now_ns();
  double wall = static_cast<double>(now - I.last_step_ns) * 1e-9;
  double in_engine = I.t_engine + static_cast<double>(now - t_enter) * 1e-9;
  st.step = I.steps;
  st.loss_scale = loss_scale();
  st.t_comm = I.t_comm;
  st.t_io_stall = I.t_io;
  st.t_optimizer = I.t_opt;
  st.t_update_overlapped = I.t_opt_overlapped;
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
  {
    const uint64_t now_bytes[4] = {st.bytes_nvme_read, st.bytes_nvme_write, st.bytes_host_to_device,
                                   st.bytes_device_to_host};
    uint64_t* step_bytes[4] = {&st.step_bytes_nvme_read, &st.step_bytes_nvme_write,
                               &st.step_bytes_host_to_device, &st.step_bytes_device_to_host};
    double* per_param[4] = {&st.per_param_nvme_read, &st.per_param_nvme_write, &st.per_param_host_to_device,
                            &st.per_param_device_to_host};
    const double params = static_cast<double>(std::max<uint64_t>(1, num_params()));
    for (int k = 0; k < 4; ++k) {
      *step_bytes[k] = now_bytes[k] - I.last_link_bytes[k];
      *per_param[k] = static_cast<double>(*step_bytes[k]) / params;
      I.last_link_bytes[k] = now_bytes[k];
    }
  }
  st.gathers_prefetched = I.gathers_prefetched;
  st.gathers_on_demand = I.gathers_on_demand;
  I.gathers_prefetched = I.gathers_on_demand = 0;
  I.t_comm = I.t_io = I.t_opt = I.t_engine = I.t_opt_overlapped = 0;
  I.last_step_ns = now;
  return st;
}

Status Engine::read_master(size_t m, size_t p, float* out) {
  Impl& I = *impl_;
  ZOE_RETURN_IF_ERROR(I.finish_update());
  I.unspeculate_all();  // the states before this step's update, which step() has not taken yet
  if (m >= I.modules.size() || p >= I.modules[m].specs.size())
    return invalid_argument("read_master(%zu, %zu): no such parameter", m, p);
  Impl::Module& mod = I.modules[m];
  std::vector<float> own(mod.opt_n);
  if (mod.opt_home == OffloadDevice::kNvme) {
    ZOE_RETURN_IF_ERROR(I.swapper->read_state(m, Impl::kMasterState, own.data()));
  } else {
    ZOE_RETURN_IF_ERROR(
        I.ops->put(own.data(), false, mod.master, mod.opt_home == OffloadDevice::kNone, mod.opt_n * 4));
    ZOE_RETURN_IF_ERROR(I.ops->synchronize());
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
