// The update: see updater.h (the states, and the updates each parameter sat out: updater_states.cpp).
#include "zero/updater.h"

#include <algorithm>
#include <cstring>

#include "zero/test_hooks.h"
#include "zero/updater_keep.h"

namespace zoe::zero {

using offload::Tier;

namespace {

// The element ranges [first, second) of [lo, lo + n) (module-relative) held by the parameters
// flagged in `untouched`, relative to lo.
std::vector<std::pair<size_t, size_t>> untouched_ranges(const ModuleLayout& mod,
                                                        const std::vector<uint8_t>& untouched, size_t lo,
                                                        size_t n) {
  std::vector<std::pair<size_t, size_t>> r;
  for (size_t p = 0; p < untouched.size() && p < mod.numel.size(); ++p) {
    if (!untouched[p]) continue;
    const size_t b = std::max(lo, mod.offset[p]), e = std::min(lo + n, mod.offset[p] + mod.numel[p]);
    if (b < e) r.emplace_back(b - lo, e - lo);
  }
  return r;
}

}  // namespace

// The update of one range of module m's owned elements: the master and the optimizer's states
// (AdamW's m and v, Lion's m, Adagrad's sum: ea, and eas for AdamW only) at [begin, begin+n).
// States on the device (opt_home none) run the device's kernel; offloaded ones the CPU's (Lion's
// and Adagrad's are CPU kernels: on the CPU device's ops, or the CPU's directly). Packed
// states or a bf16 master (lowbit) run adam_step_lowbit on the CPU, in host-addressable memory
// (Updater::place_on_device refuses them on a GPU). The new compute parameters go to `out`
// (device memory, or the host tier's copy of a stage-3 partition), through a staging buffer
// where the kernel's memory and out's differ. `ops` and `exec.pool` are the running thread's own
// (the caller's, or the overlapped update's).
struct Updater::ChunkUpdater {
  const RunShape* shape;
  device::Device* dev;
  const ModuleTable* modules;
  const UpdateTarget* homes;
  DeviceOps* ops;
  optim::AdamParams ap;
  optim::AdamStep as;
  optim::StateFormat states = optim::StateFormat::kF32;
  optim::MasterFormat master_fmt = optim::MasterFormat::kF32;
  bool lowbit = false;  // adam_step_lowbit (packed states or a bf16 master)
  // The master is the compute copy's owned range (Placement::master_in_compute): updated in place
  // in `out` (host memory), no param_out.
  bool master_in_out = false;
  optim::OptimizerKind kind = optim::OptimizerKind::kAdamW;
  optim::LionParams lp;     // kLion's (the step's lr)
  optim::AdagradParams gp;  // kAdagrad's
  optim::MuonParams mp;     // kMuon's matrices (their gradient sums hold Muon's O: muon_prepass)
  optim::AdamParams aux;    // kMuon's other parameters (the auxiliary AdamW)
  const std::vector<std::vector<uint8_t>>* muon = nullptr;  // Updater::muon_
  const std::vector<AdamMiniModule>* mini = nullptr;        // kAdamMini's blocks (Updater::mini_)
  optim::AdamMiniParams xp;                                 // kAdamMini's
  optim::Exec exec;
  std::vector<char> out_stage;
  bool out_host = false;  // `out` is host memory whatever the module's home (a speculative update's)
  // Per module: the parameters that got no gradient this step (empty: none), left as they are.
  std::vector<std::vector<uint8_t>> untouched;
  // Per module, per parameter: the updates it sat out (Updater::skipped_steps(); empty: none).
  // AdamW's bias correction of parameter p takes as.step - skipped[p].
  std::vector<std::vector<int64_t>> skipped;

  // Calls fn(a, b, step) over the chunk [0, n) of module m's owned range from `begin`, in runs of
  // parameters that share one AdamW step count (one run when no parameter sat out an update; the
  // padding after the last parameter goes with the last run). A parameter this step leaves
  // untouched joins whichever run spans it: its update is undone (restore_untouched).
  template <class F>
  Status for_step_runs(ModuleId m, size_t begin, size_t n, F&& fn) const {
    const std::vector<int64_t>* sk = m.index < skipped.size() ? &skipped[m.index] : nullptr;
    if (!sk || std::all_of(sk->begin(), sk->end(), [](int64_t k) { return k == 0; }))
      return fn(0, n, as.step);
    static const std::vector<uint8_t> none;
    const std::vector<uint8_t>& ut = m.index < untouched.size() ? untouched[m.index] : none;
    const ModuleLayout& mod = (*modules)[m];
    const size_t lo = mod.opt_begin + begin;
    size_t from = 0;
    int64_t step = as.step;
    bool open = false;
    for (size_t q = 0; q < mod.numel.size(); ++q) {
      const size_t b = std::max(lo, mod.offset[q]), e = std::min(lo + n, mod.offset[q] + mod.numel[q]);
      if (b >= e || (q < ut.size() && ut[q])) continue;
      const int64_t s = as.step - (q < sk->size() ? (*sk)[q] : 0);
      if (open && s != step) {
        ZOE_RETURN_IF_ERROR(fn(from, b - lo, step));
        from = b - lo;
      }
      step = s;
      open = true;
    }
    return fn(from, n, step);
  }

  DType sdt() const { return states == optim::StateFormat::kBF16 ? DType::kBF16 : DType::kF32; }
  DType mdt() const { return master_fmt == optim::MasterFormat::kBF16 ? DType::kBF16 : DType::kF32; }
  size_t block() const { return optim::state_block_elems(states); }
  size_t nstates() const { return static_cast<size_t>(optim::optimizer_state_count(kind)); }

  // The states of the untouched ranges of a chunk, kept across the kernel and put back; their
  // compute parameters rewritten from the kept master (the value they had). eas is AdamW's only
  // (nstates() 2). Packed m and v are
  // kept as whole blocks; a block shared with updated parameters is merged value by value and
  // quantized again (its untouched values keep their value up to that block's new scale).
  using Keep = UntouchedKeep;

  Status keep_untouched(ModuleId m, size_t begin, size_t n, void* master, void* ea, void* eas, bool dev,
                        Keep* k) {
    if (m.index >= untouched.size() || untouched[m.index].empty()) return Status::ok();
    const ModuleLayout& mod = (*modules)[m];
    k->ranges = untouched_ranges(mod, untouched[m.index], mod.opt_begin + begin, n);
    const size_t mb = dtype_size(mdt()), sb = block() == 1 ? dtype_size(sdt()) : 0, ns = nstates();
    size_t total = 0;
    for (const auto& r : k->ranges) total += r.second - r.first;
    k->saved.resize(total * (mb + ns * sb));
    char* at = k->saved.data();
    for (const auto& [b, e] : k->ranges) {
      const size_t len = e - b;
      ZOE_RETURN_IF_ERROR(ops->put(at, false, static_cast<char*>(master) + b * mb, dev, len * mb));
      if (sb) {
        ZOE_RETURN_IF_ERROR(ops->put(at + len * mb, false, static_cast<char*>(ea) + b * sb, dev, len * sb));
        if (ns == 2) {
          ZOE_RETURN_IF_ERROR(
              ops->put(at + len * (mb + sb), false, static_cast<char*>(eas) + b * sb, dev, len * sb));
        }
      }
      at += len * (mb + ns * sb);
    }
    if (block() > 1) keep_packed_blocks(states, n, ea, eas, k);  // host memory (lowbit)
    return ops->synchronize();                                   // before the kernel changes them
  }

  Status restore_untouched(size_t n, void* master, void* ea, void* eas, bool dev, void* param_out,
                           bool param_out_dev, Keep* k) {
    const size_t mb = dtype_size(mdt()), sb = block() == 1 ? dtype_size(sdt()) : 0, es = shape->esize(),
                 ns = nstates();
    const char* at = k->saved.data();
    for (const auto& [b, e] : k->ranges) {
      const size_t len = e - b;
      ZOE_RETURN_IF_ERROR(ops->put(static_cast<char*>(master) + b * mb, dev, at, false, len * mb));
      if (sb) {
        ZOE_RETURN_IF_ERROR(ops->put(static_cast<char*>(ea) + b * sb, dev, at + len * mb, false, len * sb));
        if (ns == 2) {
          ZOE_RETURN_IF_ERROR(
              ops->put(static_cast<char*>(eas) + b * sb, dev, at + len * (mb + sb), false, len * sb));
        }
      }
      at += len * (mb + ns * sb);
    }
    const optim::StateKind kinds[2] = {state_kind(0), state_kind(1)};
    if (block() > 1) ZOE_RETURN_IF_ERROR(restore_packed_blocks(states, kinds, n, ea, eas, at, *k));
    if (shape->cdt == DType::kF32 || !param_out) return Status::ok();  // the caller copies the master out
    size_t total = 0;
    for (const auto& r : k->ranges) total += r.second - r.first;
    k->conv.resize(total * es);
    at = k->saved.data();
    char* c = k->conv.data();
    for (const auto& [b, e] : k->ranges) {
      const size_t len = e - b;
      ZOE_RETURN_IF_ERROR(optim::convert_with_norm(at, mdt(), c, shape->cdt, len, false).status());
      ZOE_RETURN_IF_ERROR(
          ops->put(static_cast<char*>(param_out) + b * es, param_out_dev, c, false, len * es));
      at += len * (mb + ns * sb);
      c += len * es;
    }
    return Status::ok();
  }

  // Lion's or Adagrad's kernel over the chunk: the state in ea, an fp32 master (the config refuses
  // the low-bit formats with them).
  Status one_state_kernel(size_t n, void* master, void* ea, const float* grad, void* param_out,
                          bool kernel_dev) {
    optim::OneStateBuffers b;
    b.n = n;
    b.param = static_cast<float*>(master);
    b.grad = grad;
    b.grad_dtype = DType::kF32;
    b.state = ea;
    b.state_dtype = sdt();
    b.param_out = param_out;
    b.param_out_dtype = shape->cdt;
    if (kind == optim::OptimizerKind::kLion) {
      const optim::LionArgs a{b, lp, as};
      return kernel_dev ? ops->lion_step(a) : optim::lion_step(a, exec);
    }
    const optim::AdagradArgs a{b, gp, as};
    return kernel_dev ? ops->adagrad_step(a) : optim::adagrad_step(a, exec);
  }

  // Muon's chunk (host memory: the placement keeps Muon's states off a GPU): its matrices' elements
  // p = p*(1 - lr*wd) - lr*O (O in `grad`, from muon_prepass), the others the auxiliary AdamW, each
  // run of consecutive parameters of one kind in one call.
  Status muon_kernel(ModuleId m, size_t begin, size_t n, void* master, void* ea, void* eas, const float* grad,
                     void* param_out) {
    const ModuleLayout& mod = (*modules)[m];
    const std::vector<uint8_t>& flags = (*muon)[m.index];
    const size_t lo = mod.opt_begin + begin, es = shape->esize();
    float* p = static_cast<float*>(master);
    auto run = [&](size_t a, size_t b, bool is_muon) -> Status {
      if (a >= b) return Status::ok();
      void* out = param_out ? static_cast<char*>(param_out) + a * es : nullptr;
      if (is_muon) {
        optim::muon_apply(p + a, grad + a, b - a, mp);
        if (!out) return Status::ok();
        return optim::convert_with_norm(p + a, DType::kF32, out, shape->cdt, b - a, false).status();
      }
      // The AdamW part of [a, b), in runs of one step count (for_step_runs over the whole chunk).
      return for_step_runs(m, begin, n, [&](size_t r0, size_t r1, int64_t step) -> Status {
        const size_t c0 = std::max(a, r0), c1 = std::min(b, r1);
        if (c0 >= c1) return Status::ok();
        optim::AdamArgs x;
        x.buf.n = c1 - c0;
        x.buf.param = p + c0;
        x.buf.grad = grad + c0;
        x.buf.grad_dtype = DType::kF32;
        x.buf.exp_avg = static_cast<float*>(ea) + c0;
        x.buf.exp_avg_sq = static_cast<float*>(eas) + c0;
        x.buf.state_dtype = DType::kF32;
        x.buf.param_out = param_out ? static_cast<char*>(param_out) + c0 * es : nullptr;
        x.buf.param_out_dtype = shape->cdt;
        x.params = aux;
        x.step = as;
        x.step.step = step;
        return optim::adam_step(x, exec);
      });
    };
    size_t adam_from = 0;  // the start of the AdamW run not yet updated
    for (size_t q = 0; q < mod.specs.size(); ++q) {
      const size_t b = std::max(lo, mod.offset[q]), e = std::min(lo + n, mod.offset[q] + mod.numel[q]);
      if (b >= e || !flags[q]) continue;
      ZOE_RETURN_IF_ERROR(run(adam_from, b - lo, false));
      ZOE_RETURN_IF_ERROR(run(b - lo, e - lo, true));
      adam_from = e - lo;
    }
    return run(adam_from, n, false);  // and the padding after the last parameter
  }

  // Which map state s takes when packed: Adagrad's sum and AdamW's v are >= 0 (optim/lowbit.h).
  optim::StateKind state_kind(int s) const {
    return s == 1 || kind == optim::OptimizerKind::kAdagrad ? optim::StateKind::kExpAvgSq
                                                            : optim::StateKind::kExpAvg;
  }

  // Lion's, Adagrad's or Adam-mini's one state packed (int8/int4, host memory): in block-aligned
  // pieces of 4096 elements over the pool's threads, each decoded into an fp32 scratch (16 KiB: it
  // stays in cache), updated by the fp32 kernel and encoded back with its blocks' new scales.
  // Adam-mini's arguments for [begin, begin + n) of module m's owned range.
  AdamMiniChunk mini_chunk(ModuleId m, size_t begin, size_t n, float* master, float* mom,
                           const float* grad) const {
    const ModuleLayout& mod = (*modules)[m];
    const std::vector<int64_t>* sk = m.index < skipped.size() ? &skipped[m.index] : nullptr;
    return {&mod, &(*mini)[m.index], mod.opt_begin + begin, n, master, mom, grad, as.grad_scale, as.step, sk,
            xp};
  }

  // Muon's two states packed (its momentum or the auxiliary AdamW's m, and that AdamW's v): the same
  // pieces, one after another (muon_kernel's AdamW spreads over the pool itself).
  Status packed_muon(ModuleId m, size_t begin, size_t n, void* master, void* ea, void* eas, const float* grad,
                     void* param_out) {
    constexpr size_t kPiece = 4096;
    const size_t B = block(), bb = optim::state_block_bytes(states), es = shape->esize();
    std::vector<float> s0(kPiece), s1(kPiece);
    for (size_t a = 0; a < n; a += kPiece) {
      const size_t len = std::min(kPiece, n - a);
      char* p0 = static_cast<char*>(ea) + a / B * bb;
      char* p1 = static_cast<char*>(eas) + a / B * bb;
      ZOE_RETURN_IF_ERROR(optim::dequantize_state(state_kind(0), states, p0, s0.data(), len));
      ZOE_RETURN_IF_ERROR(optim::dequantize_state(state_kind(1), states, p1, s1.data(), len));
      ZOE_RETURN_IF_ERROR(muon_kernel(m, begin + a, len, static_cast<float*>(master) + a, s0.data(),
                                      s1.data(), grad + a,
                                      param_out ? static_cast<char*>(param_out) + a * es : nullptr));
      ZOE_RETURN_IF_ERROR(optim::quantize_state(state_kind(0), states, s0.data(), p0, len));
      ZOE_RETURN_IF_ERROR(optim::quantize_state(state_kind(1), states, s1.data(), p1, len));
    }
    return Status::ok();
  }

  Status packed_kernel(ModuleId m, size_t begin, size_t n, void* master, void* ea, void* eas,
                       const float* grad, void* param_out) {
    if (kind == optim::OptimizerKind::kMuon)
      return packed_muon(m, begin, n, master, ea, eas, grad, param_out);
    constexpr size_t kPiece = 4096;  // a multiple of every format's block
    const size_t B = block(), bb = optim::state_block_bytes(states), es = shape->esize();
    Status st = for_each_piece(exec.pool, (n + kPiece - 1) / kPiece, [&](size_t i) -> Status {
      const size_t a = i * kPiece, len = std::min(kPiece, n - a);
      char* packed = static_cast<char*>(ea) + a / B * bb;
      float* p = static_cast<float*>(master) + a;
      void* out = param_out ? static_cast<char*>(param_out) + a * es : nullptr;
      std::vector<float> s(len);
      ZOE_RETURN_IF_ERROR(optim::dequantize_state(state_kind(0), states, packed, s.data(), len));
      Status r;
      if (kind == optim::OptimizerKind::kAdamMini) {
        r = adam_mini_update(mini_chunk(m, begin + a, len, p, s.data(), grad + a), out, shape->cdt, nullptr);
      } else {
        optim::OneStateBuffers b{len, p, grad + a, DType::kF32, s.data(), DType::kF32, out, shape->cdt};
        r = kind == optim::OptimizerKind::kLion ? optim::lion_step(optim::LionArgs{b, lp, as})
                                                : optim::adagrad_step(optim::AdagradArgs{b, gp, as});
      }
      ZOE_RETURN_IF_ERROR(r);
      return optim::quantize_state(state_kind(0), states, s.data(), packed, len);
    });
    if (!st.is_ok())
      return st.with_context("updating the packed optimizer states of module " + (*modules)[m].name);
    return Status::ok();
  }

  // The kernel over the chunk: adam_step (the device's, or the CPU's), adam_step_lowbit, or Lion's,
  // Adagrad's or Muon's.
  Status kernel(ModuleId m, size_t begin, size_t n, void* master, void* ea, void* eas, const float* grad,
                void* param_out, bool kernel_dev) {
    if (kind == optim::OptimizerKind::kMuon) {
      Status s = block() > 1 ? packed_kernel(m, begin, n, master, ea, eas, grad, param_out)
                             : muon_kernel(m, begin, n, master, ea, eas, grad, param_out);
      if (!s.is_ok()) return s.with_context("updating the optimizer states of module " + (*modules)[m].name);
      return s;
    }
    if (kind == optim::OptimizerKind::kAdamMini && block() > 1)
      return packed_kernel(m, begin, n, master, ea, eas, grad, param_out);
    if (kind == optim::OptimizerKind::kAdamMini) {
      const AdamMiniChunk c =
          mini_chunk(m, begin, n, static_cast<float*>(master), static_cast<float*>(ea), grad);
      return adam_mini_update(c, param_out, shape->cdt, exec.pool);
    }
    if (kind != optim::OptimizerKind::kAdamW) {
      if (master_fmt != optim::MasterFormat::kF32)
        return invalid_argument("%s updates an fp32 master only", optim::optimizer_kind_name(kind));
      if (block() > 1) return packed_kernel(m, begin, n, master, ea, eas, grad, param_out);
      Status s = one_state_kernel(n, master, ea, grad, param_out, kernel_dev);
      if (!s.is_ok()) return s.with_context("updating the optimizer states of module " + (*modules)[m].name);
      return s;
    }
    if (!lowbit) {
      const size_t sb = dtype_size(sdt()), es = shape->esize();
      return for_step_runs(m, begin, n, [&](size_t a0, size_t a1, int64_t step) -> Status {
        optim::AdamArgs a;
        a.buf.n = a1 - a0;
        a.buf.param = static_cast<float*>(master) + a0;
        a.buf.grad = grad + a0;
        a.buf.grad_dtype = DType::kF32;
        a.buf.exp_avg = static_cast<char*>(ea) + a0 * sb;
        a.buf.exp_avg_sq = static_cast<char*>(eas) + a0 * sb;
        a.buf.state_dtype = sdt();
        a.buf.param_out = param_out ? static_cast<char*>(param_out) + a0 * es : nullptr;
        a.buf.param_out_dtype = shape->cdt;
        a.params = ap;
        a.step = as;
        a.step.step = step;
        return kernel_dev ? ops->adam_step(a) : optim::adam_step(a, exec);
      });
    }
    optim::LowbitAdamArgs la;
    la.buf.n = n;
    la.buf.param = master;
    la.buf.master = master_fmt;
    la.buf.grad = grad;
    la.buf.grad_dtype = DType::kF32;
    la.buf.exp_avg = ea;
    la.buf.exp_avg_sq = eas;
    la.buf.states = states;
    la.buf.param_out = param_out;
    la.buf.param_out_dtype = shape->cdt;
    // The element's place in the whole model (module, then its flat index): a bf16 master's
    // rounding does not depend on the ranks or the chunking.
    const ModuleLayout& mod = (*modules)[m];
    la.buf.index_base = (static_cast<uint64_t>(m.index) << 40) + mod.opt_begin + begin;
    la.params = ap;
    la.step = as;
    // The chunk's parameters' own step count where they share one (packed blocks straddle the
    // parameters, so a chunk whose parameters count differently keeps the engine's: said once).
    int runs = 0;
    (void)for_step_runs(m, begin, n, [&](size_t, size_t, int64_t step) {
      la.step.step = step;
      ++runs;
      return Status::ok();
    });
    if (runs > 1) {
      la.step.step = as.step;
      warn_mixed_steps();
    }
    Status s = optim::adam_step_lowbit(la, exec);
    if (!s.is_ok()) return s.with_context("updating the optimizer states of module " + mod.name);
    return s;
  }

  Status operator()(ModuleId m, size_t begin, size_t n, void* master, void* ea, void* eas, const float* grad,
                    void* out) {
    const size_t es = shape->esize();
    const bool kernel_dev = (*modules)[m].opt_home == Tier::kDevice;
    const bool out_dev = !out_host && homes->owned_on_device(m);
    const bool direct = ops->host_addressable() || kernel_dev == out_dev;
    char* dst = static_cast<char*>(out) + begin * es;
    if (master_in_out) master = dst;
    Keep keep;  // outlives the fence: the ops may read its buffers until it waits
    device::DeviceBuffer dev_stage;
    // The results are handed on (written home, the chunk's buffers reused) once this returns;
    // on an error path too, no op may still use dev_stage.
    OpsFence fence(*ops);
    void* param_out = nullptr;
    if (shape->cdt != DType::kF32 && !master_in_out) {
      if (direct) {
        param_out = dst;
      } else if (kernel_dev) {
        // The kernel writes every element: no zeroing (and no use of the caller's ops).
        ZOE_ASSIGN_OR_RETURN(dev_stage, device::DeviceBuffer::allocate(*dev, n * es));
        param_out = dev_stage.get();
      } else {
        out_stage.resize(n * es);
        param_out = out_stage.data();
      }
    }
    ZOE_RETURN_IF_ERROR(keep_untouched(m, begin, n, master, ea, eas, kernel_dev, &keep));
    ZOE_RETURN_IF_ERROR(kernel(m, begin, n, master, ea, eas, grad, param_out, kernel_dev));
    if (!keep.ranges.empty()) {
      const bool param_out_dev = direct ? out_dev : kernel_dev;
      ZOE_RETURN_IF_ERROR(restore_untouched(n, master, ea, eas, kernel_dev, param_out, param_out_dev, &keep));
    }
    if (shape->cdt == DType::kF32 && master_fmt == optim::MasterFormat::kBF16) {
      // fp32 compute parameters from a bf16 master (host memory: lowbit).
      out_stage.resize(n * 4);
      ZOE_RETURN_IF_ERROR(
          optim::convert_with_norm(master, DType::kBF16, out_stage.data(), DType::kF32, n, false).status());
      ZOE_RETURN_IF_ERROR(ops->put(dst, out_dev, out_stage.data(), false, n * 4));
    } else if (shape->cdt == DType::kF32) {
      ZOE_RETURN_IF_ERROR(ops->put(dst, out_dev, master, kernel_dev, n * 4));
    } else if (!direct && !master_in_out) {
      ZOE_RETURN_IF_ERROR(ops->put(dst, out_dev, param_out, kernel_dev, n * es));
    }
    return fence.wait();
  }
};

// The update's arguments for step `step_no` at learning rate `lr` and gradient scale `scale`, on
// `ops` with `pool`'s threads.
Updater::ChunkUpdater Updater::make_updater(DeviceOps* ops, optim::CpuPool* pool, double lr, int64_t step_no,
                                            float scale) {
  const config::Config& cfg = *r_.cfg;
  ChunkUpdater up{&shape_,   &r_.mem->device(), &modules_,           &homes_, ops, {}, {}, r_.states,
                  r_.master, lowbit(),          r_.master_in_compute};
  up.exec.pool = pool;
  up.ap.lr = static_cast<float>(lr);
  up.ap.beta1 = static_cast<float>(cfg.optimizer.beta1);
  up.ap.beta2 = static_cast<float>(cfg.optimizer.beta2);
  up.ap.eps = static_cast<float>(cfg.optimizer.eps);
  up.ap.weight_decay = static_cast<float>(cfg.optimizer.weight_decay);
  up.ap.adamw = cfg.optimizer.adam_w_mode;
  up.kind = r_.optimizer;
  up.lp.lr = up.gp.lr = up.ap.lr;
  up.lp.beta1 = up.ap.beta1;
  up.lp.beta2 = up.ap.beta2;
  up.lp.weight_decay = up.gp.weight_decay = up.ap.weight_decay;
  up.gp.eps = up.ap.eps;
  if (up.kind == optim::OptimizerKind::kMuon) {
    // Each group's own rate, shaped by the scheduler when there is one (Config::group_lr_at).
    up.mp.lr = static_cast<float>(cfg.group_lr_at(step_no, cfg.optimizer.muon_lr));
    up.mp.momentum = static_cast<float>(cfg.optimizer.momentum);
    up.mp.weight_decay = up.ap.weight_decay;
    up.aux = up.ap;
    up.aux.lr = static_cast<float>(cfg.group_lr_at(step_no, cfg.optimizer.adam_lr));
    up.aux.adamw = true;
    up.muon = &muon_;
  }
  up.mini = &mini_;
  up.xp = {up.ap.lr, up.ap.beta1, up.ap.beta2, up.ap.eps, up.ap.weight_decay};
  up.as.step = step_no;
  up.as.grad_scale = scale;
  up.untouched = untouched_;
  up.skipped = skipped_;
  return up;
}

// ---------------------------------------------------------------------------------------------
// The speculative step

void Updater::set_untouched(std::vector<std::vector<uint8_t>> untouched) {
  for (auto& u : untouched) {
    if (std::find(u.begin(), u.end(), uint8_t{1}) == u.end()) u.clear();  // every parameter got one
  }
  untouched_ = std::move(untouched);
}

Status Updater::speculate(ModuleId m, const std::vector<uint8_t>& untouched) {
  const ModuleLayout& mod = modules_[m];
  OptimStates& st = states_[m.index];
  if (st.speculated) unspeculate(m);
  // Muon's update needs the whole step's orthogonalization first (muon_prepass), Adam-mini's the
  // block moments over the ranks (adam_mini_prepass): no speculation (the config's rules say so once).
  if (r_.optimizer == optim::OptimizerKind::kMuon || r_.optimizer == optim::OptimizerKind::kAdamMini)
    return Status::ok();
  if (mod.opt_home != Tier::kHost || !st.spec_save || mod.opt_n == 0) return Status::ok();
  const size_t n = mod.opt_n, sbytes = state_size(OptState::kExpAvg, n),
               mbytes = state_size(OptState::kMaster, n);
  char* save = static_cast<char*>(st.spec_save);
  memcpy(save, st.master, mbytes);
  memcpy(save + mbytes, st.exp_avg, sbytes);
  if (st.exp_avg_sq) memcpy(save + mbytes + sbytes, st.exp_avg_sq, sbytes);
  // The scale step() computes when the norm neither clips nor overflows (clip coefficient 1).
  optim::NormResult unclipped;
  unclipped.sum_sq = 0.0;
  unclipped.finite = true;
  spec_scale_ = optim::compute_step_scale(unclipped, static_cast<float>(grad_divisor()), 0.0f).grad_scale;
  ChunkUpdater up = make_updater(r_.ops, r_.pool, r_.cfg->lr_at(steps_ + 1), steps_ + 1, spec_scale_);
  up.out_host = true;
  up.untouched.assign(modules_.size(), {});
  st.spec_untouched = untouched;
  if (std::find(untouched.begin(), untouched.end(), uint8_t{1}) == untouched.end()) st.spec_untouched.clear();
  up.untouched[m.index] = st.spec_untouched;
  const uint64_t t0 = now_ns();
  Status s = up(m, 0, n, st.master, st.exp_avg, st.exp_avg_sq, st.grad_acc, st.spec_out);
  if (r_.trace->enabled())
    r_.trace->record("update " + mod.name + " (speculative)", "optimizer", t0, now_ns(), 0, kLaneOptimizer);
  st.speculated = true;  // also after an error: its states may be half-updated, the saved ones are whole
  if (!s.is_ok()) {
    unspeculate(m);
    return s.with_context("the speculative update of module " + mod.name);
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// The update over every module

// Where module m's new compute parameters go, fetched when its first chunk is updated and given
// back (written home, host copy dropped) when the update moves on: a stage-3 partition
// offloaded to NVMe is in host memory one module at a time, whatever the model size.
Result<void*> Updater::open_out(ModuleId m, double* t_io, std::vector<void*>* outs) {
  if (!(*outs)[m.index]) {
    ZOE_ASSIGN_OR_RETURN((*outs)[m.index], homes_.owned_compute(m, t_io));
  }
  return (*outs)[m.index];
}

Status Updater::close_out(ModuleId m, double* t_io, std::vector<void*>* outs) {
  if (!(*outs)[m.index]) return Status::ok();
  (*outs)[m.index] = nullptr;
  homes_.release_owned(m, t_io, &writebacks_);
  gate_.mark(m);
  return Status::ok();
}

// NVMe-resident modules, through the swapper's pipeline (groups come in order).
Status Updater::run_swapped(ChunkUpdater& update, double* t_io, std::vector<void*>* outs) {
  bool have_open = false;
  ModuleId open(0);  // the module whose chunks are being updated
  Status s = r_.swapper->step([&](const offload::ChunkView& c) -> Status {
    const ModuleId m = module_of(c.group);
    if (!have_open || m != open) {
      if (have_open) ZOE_RETURN_IF_ERROR(close_out(open, t_io, outs));
      open = m;
      have_open = true;
    }
    ZOE_ASSIGN_OR_RETURN(void* out, open_out(m, t_io, outs));
    void* master = kMasterState == kNoState ? nullptr : c.data[kMasterState];  // else the compute copy
    void* eas = kAvgSqState == kNoState ? nullptr : c.data[kAvgSqState];       // AdamW's v only
    return update(m, c.begin, c.n, master, c.data[kAvgState], eas,
                  static_cast<const float*>(c.data[kGradState]), out);
  });
  if (have_open) {
    Status cs = close_out(open, t_io, outs);
    if (s.is_ok()) s = cs;
  }
  return s;
}

// The optimizer over every module's owned range, in forward order: NVMe-resident modules through the
// swapper's pipeline, then those on the device or in host RAM (with partial offload the
// offloaded ones are the first modules, so this is forward order). Each module is marked done
// once its new compute parameters are home. No collective runs here.
Status Updater::run(ChunkUpdater& update, double* t_io) {
  std::vector<void*> outs(modules_.size(), nullptr);
  // Frozen modules are not updated: their next fetch need not wait.
  for (ModuleId m : modules_.ids()) {
    if (modules_[m].frozen) gate_.mark(m);
  }
  Status s;
  if (r_.swapper) s = run_swapped(update, t_io, &outs);
  for (ModuleId m : modules_.ids()) {
    if (!s.is_ok()) break;
    const ModuleLayout& mod = modules_[m];
    OptimStates& st = states_[m.index];
    if (mod.frozen || mod.opt_home == Tier::kNvme) continue;
    auto out = open_out(m, t_io, &outs);
    if (out.is_ok() && st.speculated) {
      // Updated during the backward and confirmed by the norm: its compute parameters go home.
      st.speculated = false;
      s = update.ops->put(out.value(), homes_.owned_on_device(m), st.spec_out, false,
                          mod.opt_n * shape_.esize());
      if (s.is_ok()) s = update.ops->synchronize();
    } else {
      s = out.is_ok()
              ? update(m, 0, mod.opt_n, st.master, st.exp_avg, st.exp_avg_sq, st.grad_acc, out.value())
              : out.status();
    }
    Status cs = close_out(m, t_io, &outs);
    if (s.is_ok()) s = cs;
  }
  for (ModuleId m : modules_.ids()) (void)close_out(m, t_io, &outs);  // after an error
  writebacks_.wait_all();
  Status ds = homes_.drain();
  if (s.is_ok()) s = ds;
  return s;
}

Status Updater::skip() {
  ZOE_RETURN_IF_ERROR(flush_held());
  std::fill(mini_noted_ok_.begin(), mini_noted_ok_.end(), uint8_t{0});  // Adam-mini's notes go with the sums
  // No update reads them: the chunks read ahead (and the gradients handed to them) go.
  if (r_.swapper) ZOE_RETURN_IF_ERROR_CTX(r_.swapper->drop_preloaded(), "dropping the chunks read ahead");
  return Status::ok();
}

void Updater::start_thread(ChunkUpdater up) {
  gate_.open(modules_.size());
  thread_t_opt_ = thread_t_io_ = 0;
  // Stage 1/2 (and persistent stage-3 modules): the updated partitions are gathered by the
  // caller's thread at each module's next fetch (or the next sync point).
  homes_.owe_gathers();
  const int64_t step_no = steps_;
  running_ = true;
  thread_ = std::thread([this, up, step_no]() mutable {
    const uint64_t t0 = now_ns();
    Status s = run(up, &thread_t_io_);
    if (!s.is_ok()) s = s.with_context("optimizer step " + std::to_string(step_no));
    thread_t_opt_ = static_cast<double>(now_ns() - t0) * 1e-9;
    gate_.finish(std::move(s));  // wakes every waiter, also on error
  });
}

Status Updater::apply(float grad_scale, double lr) {
  // Sums still held: a module whose last micro-batch never came (the caller reduced it fewer times).
  ZOE_RETURN_IF_ERROR(flush_held());
  ZOE_RETURN_IF_ERROR(muon_prepass(grad_scale));
  ZOE_RETURN_IF_ERROR(adam_mini_prepass(grad_scale));
  steps_++;
  count_skipped();
  // The optimizer over every module's owned range: behind the caller's next forward when the device's
  // memory is host memory (zoe.overlap_step), else here.
  const bool overlap = overlaps();
  if (overlap && !update_pool_) {
    optim::CpuPool::Options po;
    po.threads = static_cast<int>(r_.cfg->zoe.optimizer_threads);
    ZOE_ASSIGN_OR_RETURN(update_pool_, optim::CpuPool::create(po));
    update_ops_ = make_cpu_ops(update_pool_.get(), deferred_device_ops());
  }
  ChunkUpdater up = make_updater(overlap ? update_ops_.get() : r_.ops, overlap ? update_pool_.get() : r_.pool,
                                 lr, steps_, grad_scale);
  if (overlap) {
    start_thread(std::move(up));
    return Status::ok();
  }
  Status s = run(up, &clock_.t_io);
  if (!s.is_ok()) return s.with_context("optimizer step " + std::to_string(steps_));
  // Stage 1/2 (and persistent stage-3 modules): gather the updated partitions.
  if (shape_.stage >= 1) {
    for (ModuleId m : modules_.ids()) {
      if (!modules_[m].partitioned_params && !modules_[m].frozen)
        ZOE_RETURN_IF_ERROR(homes_.gather_updated(m));
    }
  }
  return Status::ok();
}

bool Updater::overlaps() const { return r_.cfg->zoe.overlap_step && r_.ops->host_addressable(); }

Status Updater::join() {
  if (!running_) return Status::ok();
  thread_.join();
  running_ = false;
  clock_.t_opt_overlapped += thread_t_opt_;
  Status s = gate_.close();
  if (!s.is_ok()) update_error_ = s;
  return update_error_;
}

Status Updater::finish() {
  ZOE_RETURN_IF_ERROR(join());
  return homes_.settle_all();
}

}  // namespace zoe::zero
