// The Updater's states: where each module's optimizer states and gradient sums live (the device,
// host RAM or NVMe through the swapper), placing them, reading and writing them for checkpoints,
// and the sums of the gradients the reduction hands over (GradSink). The one file that switches
// on a module's opt_home to find its bytes; and the updates each parameter sat out (its own AdamW
// step count). The update itself is updater.cpp.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/log.h"
#include "zero/updater.h"

namespace zoe::zero {

using offload::Tier;

Updater::Updater(const RunShape& shape, const ModuleTable& modules, UpdateTarget& homes, StepClock& clock,
                 const Resources& r, const LossScaler& scaler)
    : shape_(shape),
      modules_(modules),
      homes_(homes),
      clock_(clock),
      r_(r),
      host_(r.cfg->zero.offload_optimizer.pin_memory ? io::PinMode::kDevice : io::PinMode::kNone),
      states_(modules.size()),
      scaler_(scaler) {
  size_t i = 0;
  kMasterState = r_.master_in_compute ? kNoState : i++;
  kAvgState = i++;
  kAvgSqState = state_count() == 2 ? i++ : kNoState;
  kGradState = i;
  if (r_.optimizer == optim::OptimizerKind::kMuon) init_muon();
  // The test hook (updater.h): ZOE_TEST_FLIP_GRAD_SUM="<module>@<step>".
  if (const char* e = getenv("ZOE_TEST_FLIP_GRAD_SUM")) {
    const std::string v = e;
    const size_t at = v.rfind('@');
    if (at != std::string::npos) {
      flip_module_ = v.substr(0, at);
      flip_step_ = strtoll(v.c_str() + at + 1, nullptr, 10);
      ZOE_LOG_WARN(
          "ZOE_TEST_FLIP_GRAD_SUM is set: module %s's first gradient sum is negated in step %lld "
          "(a wrong result on purpose, for testing zoe verify)",
          flip_module_.c_str(), static_cast<long long>(flip_step_));
    }
  }
}

// The updates each parameter sat out (Updater::skipped_steps()).
void Updater::count_skipped() {
  if (skipped_.size() != modules_.size()) {
    skipped_.resize(modules_.size());
    for (ModuleId m : modules_.ids()) skipped_[m.index].resize(modules_[m].numel.size(), 0);
  }
  for (size_t m = 0; m < untouched_.size() && m < skipped_.size(); ++m) {
    for (size_t p = 0; p < untouched_[m].size() && p < skipped_[m].size(); ++p) {
      if (untouched_[m][p]) skipped_[m][p]++;
    }
  }
}

Status Updater::set_skipped_steps(std::vector<std::vector<int64_t>> skipped) {
  if (skipped.size() > modules_.size())
    return invalid_argument("skipped steps for %zu modules, and the model has %zu", skipped.size(),
                            modules_.size());
  for (ModuleId m : modules_.ids()) {
    if (m.index >= skipped.size()) skipped.emplace_back();
    auto& v = skipped[m.index];
    if (v.size() > modules_[m].numel.size())
      return invalid_argument("skipped steps for %zu parameters of module %s, which has %zu", v.size(),
                              modules_[m].name.c_str(), modules_[m].numel.size());
    v.resize(modules_[m].numel.size(), 0);
    for (int64_t k : v) {
      if (k < 0 || k > steps_)
        return invalid_argument("module %s: %lld skipped steps is not in [0, %lld] (the steps taken)",
                                modules_[m].name.c_str(), static_cast<long long>(k),
                                static_cast<long long>(steps_));
    }
  }
  skipped_ = std::move(skipped);
  return Status::ok();
}

void Updater::warn_mixed_steps() {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  ZOE_LOG_WARN(
      "a module's parameters sat out different numbers of steps (some got no gradient in a step): with "
      "low-bit states (zoe.optimizer_states int8/int4 or zoe.master_weights bf16) their AdamW bias "
      "correction counts the engine's steps, not each parameter's own as torch.optim.AdamW does "
      "(zoe.optimizer_states \"fp32\" or \"bf16\" with zoe.master_weights \"fp32\" count their own)");
}

double Updater::grad_divisor() const {
  const double micro = static_cast<double>(std::max<int64_t>(1, r_.cfg->gradient_accumulation_steps));
  return static_cast<double>(shape_.world) * micro * (shape_.cdt == DType::kF16 ? scaler_.scale() : 1.0);
}

void Updater::shutdown() {
  (void)join();  // an overlapped update still running behind (no collectives here)
  writebacks_.wait_all();
  for (ModuleId m : modules_.ids()) {
    if (m.index >= states_.size()) break;
    OptimStates& st = states_[m.index];
    for (auto& b : st.dev) b.reset();
    if (modules_[m].opt_home == Tier::kDevice || modules_[m].frozen) {
      st.master = st.exp_avg = st.exp_avg_sq = nullptr;
      st.grad_acc = nullptr;
    }
  }
}

void Updater::test_flip(ModuleId m, const GradBatch& b, float* sum) const {
  if (flip_step_ > 0 && b.last && steps_ + 1 == flip_step_ && modules_[m].name == flip_module_ && sum)
    sum[0] = -sum[0];
}

Updater::~Updater() { (void)join(); }

std::vector<offload::SwappedState> Updater::swapped_states(optim::OptimizerKind optimizer,
                                                           optim::StateFormat states,
                                                           optim::MasterFormat master,
                                                           bool master_in_compute) {
  const auto mb = static_cast<uint32_t>(optim::master_bytes_per_element(master));
  const auto sb = static_cast<uint32_t>(optim::state_block_bytes(states));
  const auto blk = static_cast<uint32_t>(optim::state_block_elems(states));
  // Indexed by kMasterState, kAvgState, kAvgSqState, kGradState (read-only in the step). Packed
  // m and v move as whole blocks (codes and scale). A master in the compute copy is not here, nor
  // a v for Lion and Adagrad (their one state is in m's place).
  std::vector<offload::SwappedState> v = {{offload::StateKind::kMaster, mb, true, 1},
                                          {offload::StateKind::kAdamM, sb, true, blk},
                                          {offload::StateKind::kAdamV, sb, true, blk},
                                          {offload::StateKind::kGrad, 4, false, 1}};
  if (optim::optimizer_state_count(optimizer) == 1) v.erase(v.begin() + 2);
  if (master_in_compute) v.erase(v.begin());
  return v;
}

size_t Updater::state_size(OptState k, size_t n) const {
  if (k == OptState::kMaster) return n * (r_.master == optim::MasterFormat::kBF16 ? 2 : 4);
  return optim::state_bytes(r_.states, n);
}

bool Updater::lowbit() const {
  return r_.master != optim::MasterFormat::kF32 ||
         (r_.states != optim::StateFormat::kF32 && r_.states != optim::StateFormat::kBF16);
}

// The master from the fp32 values `own` (n elements) into `dst` (host memory): a copy, or bf16
// rounded to nearest even (the values the compute copy gets too).
Status Updater::master_from_f32(const float* own, void* dst, size_t n) const {
  if (r_.master == optim::MasterFormat::kF32) {
    memcpy(dst, own, n * 4);
    return Status::ok();
  }
  return optim::convert_with_norm(own, DType::kF32, dst, DType::kBF16, n, false).status();
}

// ---------------------------------------------------------------------------------------------
// Placing

Status Updater::place_on_device(ModuleId m, const float* own) {
  const ModuleLayout& mod = modules_[m];
  OptimStates& st = states_[m.index];
  if (lowbit() && !r_.ops->host_addressable()) {
    return invalid_argument(
        "zoe.optimizer_states \"%s\" with zoe.master_weights \"%s\": module %s's optimizer states are on the "
        "GPU, and the low-bit update runs on the CPU only; offload the optimizer states "
        "(zero_optimization.offload_optimizer.device \"cpu\" or \"nvme\", zoe.offload_ratio 1) or use "
        "zoe.optimizer_states \"fp32\"/\"bf16\" with zoe.master_weights \"fp32\"",
        optim::state_format_name(r_.states), optim::master_format_name(r_.master), mod.name.c_str());
  }
  if (r_.optimizer != optim::OptimizerKind::kAdamW && !r_.ops->host_addressable()) {
    return invalid_argument(
        "optimizer.type \"%s\": module %s's optimizer states are on the GPU, and the %s update runs on the "
        "CPU only; offload the optimizer states (zero_optimization.offload_optimizer.device \"cpu\" or "
        "\"nvme\", zoe.offload_ratio 1) or use optimizer.type \"AdamW\"",
        optim::optimizer_kind_name(r_.optimizer), mod.name.c_str(), optim::optimizer_kind_name(r_.optimizer));
  }
  const size_t sbytes = state_size(OptState::kExpAvg, mod.opt_n);
  const size_t sizes[4] = {r_.master_in_compute ? 0 : state_size(OptState::kMaster, mod.opt_n), sbytes,
                           state_count() == 2 ? sbytes : 0, mod.opt_n * 4};
  for (int k = 0; k < 4; ++k) {
    if (sizes[k]) {
      ZOE_ASSIGN_OR_RETURN(st.dev[k], r_.mem->zeroed(sizes[k]));
    }
  }
  st.master = st.dev[0].get();  // null for a master in the compute copy
  st.exp_avg = st.dev[1].get();
  st.exp_avg_sq = st.dev[2].get();
  st.grad_acc = static_cast<float*>(st.dev[3].get());
  if (r_.master_in_compute) return Status::ok();  // the compute copy holds it already
  if (r_.master == optim::MasterFormat::kBF16)
    return master_from_f32(own, st.master, mod.opt_n);  // host memory
  return r_.ops->put(st.master, true, own, false, mod.opt_n * 4);
}

Status Updater::place_in_host(ModuleId m, const float* own) {
  const ModuleLayout& mod = modules_[m];
  OptimStates& st = states_[m.index];
  const size_t sbytes = state_size(OptState::kExpAvg, mod.opt_n),
               mbytes = state_size(OptState::kMaster, mod.opt_n);
  if (!r_.master_in_compute) {
    ZOE_ASSIGN_OR_RETURN(st.master, host_.zeroed(mbytes));
  }
  ZOE_ASSIGN_OR_RETURN(st.exp_avg, host_.zeroed(sbytes));
  if (state_count() == 2) {
    ZOE_ASSIGN_OR_RETURN(st.exp_avg_sq, host_.zeroed(sbytes));
  }
  ZOE_ASSIGN_OR_RETURN(void* g, host_.zeroed(mod.opt_n * 4));
  st.grad_acc = static_cast<float*>(g);
  if (r_.cfg->zoe.speculative_step) {
    ZOE_ASSIGN_OR_RETURN(st.spec_save, host_.zeroed(mbytes + static_cast<size_t>(state_count()) * sbytes));
    ZOE_ASSIGN_OR_RETURN(st.spec_out, host_.zeroed(mod.opt_n * shape_.esize()));
  }
  return r_.master_in_compute ? Status::ok() : master_from_f32(own, st.master, mod.opt_n);
}

Status Updater::place_on_nvme(ModuleId m, const float* own) {
  const ModuleLayout& mod = modules_[m];
  ZOE_RETURN_IF_ERROR_CTX(r_.swapper->add_group(swap_group(m), mod.opt_n),
                          "placing the optimizer states of module " + mod.name);
  // The fp32 master, chunk by chunk, written from `own` itself where it is block-aligned
  // (write_state_borrowed: the swapper's write buffers in flight at once, no copy): the caller
  // leaves `own` unchanged until wait_placed(). The optimizer's states start as zeros, which their swap
  // space reads as until the first update writes them (add_group), so nothing is written for
  // them. The gradient sums live on NVMe too (written by the first reduction of a step).
  const size_t chunk = r_.swapper->chunk_elems();
  std::vector<char> conv;
  for (size_t b = 0; b < mod.opt_n && !r_.master_in_compute; b += chunk) {
    const size_t n = std::min(chunk, mod.opt_n - b);
    if (r_.master == optim::MasterFormat::kF32) {
      ZOE_RETURN_IF_ERROR(r_.swapper->write_state_borrowed(swap_group(m), kMasterState, own + b, b, n));
      continue;
    }
    // A bf16 master: converted a chunk at a time and copied by the swapper.
    conv.resize(state_size(OptState::kMaster, n));
    ZOE_RETURN_IF_ERROR(master_from_f32(own + b, conv.data(), n));
    ZOE_RETURN_IF_ERROR(r_.swapper->write_state(swap_group(m), kMasterState, conv.data(), b, n));
  }
  return Status::ok();
}

Status Updater::place(ModuleId m, const float* own) {
  const ModuleLayout& mod = modules_[m];
  if (mod.frozen) return Status::ok();  // no states: its compute parameters are all it has
  ZOE_RETURN_IF_ERROR(init_adam_mini(m));
  switch (mod.opt_home) {
    case Tier::kDevice:
      return place_on_device(m, own);
    case Tier::kHost:
      return place_in_host(m, own);
    case Tier::kNvme:
      return place_on_nvme(m, own);
  }
  return Status::ok();
}

Status Updater::wait_placed() { return r_.swapper ? r_.swapper->wait_async_writes() : Status::ok(); }

// ---------------------------------------------------------------------------------------------
// Reading and writing states

size_t Updater::io_chunk_elems() const { return r_.swapper ? r_.swapper->chunk_elems() : (size_t{4} << 20); }

uint64_t Updater::host_bytes() const {
  return host_.bytes() + (r_.swapper ? r_.swapper->buffer_bytes_total() : 0) + held_sums_.capacity() * 4;
}

void* Updater::state_ptr(ModuleId m, OptState k) const {
  const OptimStates& st = states_[m.index];
  return k == OptState::kMaster ? st.master : k == OptState::kExpAvg ? st.exp_avg : st.exp_avg_sq;
}

Status Updater::read_state(ModuleId m, OptState k, size_t begin, size_t n, void* dst) {
  const ModuleLayout& mod = modules_[m];
  if (k == OptState::kMaster && r_.master_in_compute) return homes_.read_owned(m, begin, n, dst);
  if (mod.opt_home == Tier::kNvme) return r_.swapper->read_state(swap_group(m), swap_index(k), dst, begin, n);
  const char* src = static_cast<const char*>(state_ptr(m, k)) + state_size(k, begin);
  // Host memory (and host-addressable device memory) is read without the ops: an asynchronous
  // checkpoint reads on its own thread while the caller's thread uses them.
  if (mod.opt_home == Tier::kHost || r_.ops->host_addressable()) {
    memcpy(dst, src, state_size(k, n));
    return Status::ok();
  }
  ZOE_RETURN_IF_ERROR(r_.ops->put(dst, false, src, true, state_size(k, n)));
  return r_.ops->synchronize();
}

Status Updater::write_state(ModuleId m, OptState k, size_t begin, size_t n, const void* src) {
  const ModuleLayout& mod = modules_[m];
  // A master in the compute copy: the compute parameters a load writes first hold its values (the
  // checkpoint's compute parameters are the master rounded to nearest, as the bf16 master is).
  if (k == OptState::kMaster && r_.master_in_compute) return Status::ok();
  if (mod.opt_home == Tier::kNvme)
    return r_.swapper->write_state(swap_group(m), swap_index(k), src, begin, n);
  char* dst = static_cast<char*>(state_ptr(m, k)) + state_size(k, begin);
  ZOE_RETURN_IF_ERROR(r_.ops->put(dst, mod.opt_home == Tier::kDevice, src, false, state_size(k, n)));
  return r_.ops->synchronize();  // the caller reuses src
}

Status Updater::read_master(ModuleId m, size_t p, float* out) {
  const ModuleLayout& mod = modules_[m];
  std::unique_ptr<float[]> full(new float[mod.padded]);
  ZOE_RETURN_IF_ERROR(read_module_master(m, full.get()));
  memcpy(out, full.get() + mod.offset[p], mod.numel[p] * 4);
  return Status::ok();
}

Status Updater::read_module_master(ModuleId m, float* full) {
  const ModuleLayout& mod = modules_[m];
  // One rank's range is the module (stage 0, or one rank): read into `full` itself.
  const bool gather = shape_.stage != 0 && shape_.world > 1;
  std::unique_ptr<float[]> own_mem;
  float* own = full;
  if (gather) {
    own_mem.reset(new float[mod.opt_n]);
    own = own_mem.get();
  }
  if (mod.frozen || r_.master_in_compute) {
    ZOE_RETURN_IF_ERROR(homes_.read_owned_f32(m, own));  // its compute parameters are its values
  } else if (r_.master == optim::MasterFormat::kF32) {
    ZOE_RETURN_IF_ERROR(read_state(m, OptState::kMaster, 0, mod.opt_n, own));
  } else {
    std::vector<uint16_t> bf(mod.opt_n);
    ZOE_RETURN_IF_ERROR(read_state(m, OptState::kMaster, 0, mod.opt_n, bf.data()));
    ZOE_RETURN_IF_ERROR(
        optim::convert_with_norm(bf.data(), DType::kBF16, own, DType::kF32, mod.opt_n, false).status());
  }
  if (gather) return r_.comm->all_gather(own, full, mod.part, comm::CommType::kF32).wait();
  std::fill(full + std::min(mod.opt_n, mod.padded), full + mod.padded, 0.0f);  // the padding
  return Status::ok();
}

Result<bool> Updater::read_master_direct(ModuleId m, size_t n, float* out) {
  const ModuleLayout& mod = modules_[m];
  const bool own_all = shape_.stage == 0 || shape_.world == 1;
  if (!own_all || mod.frozen || r_.master_in_compute || r_.master != optim::MasterFormat::kF32 ||
      mod.opt_begin != 0 || n > mod.opt_n)
    return false;
  if (mod.opt_home != Tier::kNvme) {
    ZOE_RETURN_IF_ERROR(read_state(m, OptState::kMaster, 0, n, out));
    return true;
  }
  // The swapper reads whole chunks (a range ends on a chunk boundary or at the group's end).
  const size_t chunk = io_chunk_elems(), whole = n / chunk * chunk;
  if (whole > 0) ZOE_RETURN_IF_ERROR(read_state(m, OptState::kMaster, 0, whole, out));
  if (whole < n) {
    std::vector<float> tail(mod.opt_n - whole);
    ZOE_RETURN_IF_ERROR(read_state(m, OptState::kMaster, whole, tail.size(), tail.data()));
    memcpy(out + whole, tail.data(), (n - whole) * 4);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// The sums of the gradients (GradSink)

// Host-readable view of `bytes` of device memory: the memory itself on the CPU device, else a
// copy in host_stage_ (valid until the next call).
Result<const void*> Updater::host_view(const void* dsrc, size_t bytes) {
  if (r_.ops->host_addressable()) return dsrc;
  host_stage_.resize(bytes);
  ZOE_RETURN_IF_ERROR(r_.ops->to_host(host_stage_.data(), dsrc, bytes));
  ZOE_RETURN_IF_ERROR(r_.ops->synchronize());
  return static_cast<const void*>(host_stage_.data());
}

Status Updater::add_grads(ModuleId m, const GradBatch& b) {
  // The overlapped update reads the sums (and owns the swapper) until it ends. Joining it runs
  // no collective: this point's timing differs across ranks.
  ZOE_RETURN_IF_ERROR(join());
  const ModuleLayout& mod = modules_[m];
  OptimStates& st = states_[m.index];
  optim::Exec exec;
  exec.pool = r_.pool;
  switch (mod.opt_home) {
    case Tier::kDevice:
      // The sums live on the device too: the device's kernel. Synchronized here: src (the
      // reduction's buffer) is freed once this returns, and the overlapped update reads the sums
      // on its own thread's ops.
      ZOE_RETURN_IF_ERROR(
          r_.ops->accumulate_with_norm(st.grad_acc, b.src, shape_.cdt, mod.opt_n, b.first, b.norm));
      return r_.ops->synchronize();
    case Tier::kHost: {
      unspeculate(m);  // one more micro-batch than the step has: the speculation assumed the sums final
      ZOE_ASSIGN_OR_RETURN(const void* h, host_view(b.src, mod.opt_n * shape_.esize()));
      ZOE_RETURN_IF_ERROR(
          optim::accumulate_with_norm(st.grad_acc, h, shape_.cdt, mod.opt_n, b.first, b.norm, exec));
      test_flip(m, b, st.grad_acc);
      // zoe.speculative_step: the step's last micro-batch, so these sums are final.
      if (st.spec_save && b.last && b.untouched) return speculate(m, *b.untouched);
      return Status::ok();
    }
    case Tier::kNvme:
      return add_grads_nvme(m, b, exec);
  }
  return Status::ok();
}

// NVMe: one swapper chunk at a time (read the sum so far unless this is the first micro-batch,
// add, write back asynchronously through the swapper's buffers), so host memory stays bounded
// whatever the model size. With Resources::hold_grad_sums (the layer-major schedule, whose
// micro-batches of a module come one after another) the whole module's sums stay in host memory
// until its last micro-batch: one write per step instead of a read and a write per micro-batch.
// The same accumulate_with_norm calls in the same order either way: the same bits.
Status Updater::add_grads_nvme(ModuleId m, const GradBatch& b, const optim::Exec& exec) {
  const ModuleLayout& mod = modules_[m];
  offload::OptimizerSwapper& sw = *r_.swapper;
  const size_t es = shape_.esize();
  Timer t(&clock_.t_io);
  const size_t chunk = sw.chunk_elems();
  ZOE_CHECK(chunk % optim::kChunkElems == 0);
  // Another module's sums still held (its micro-batches were not consecutive): to NVMe first.
  if (held_ != m || b.first) ZOE_RETURN_IF_ERROR(flush_held());
  const bool hold = r_.hold_grad_sums && !(b.first && b.last) && (b.first || held_ == m);
  if (hold) {
    held_sums_.resize(mod.opt_n);
    held_ = m;
  } else {
    grad_stage_.resize(chunk);
  }
  // The step's last micro-batch: the sums are final. The swapper starts reading the next
  // update's first chunks now (their master and moments do not depend on this backward), and
  // those chunks' sums go straight into its slots instead of a round trip through NVMe.
  // Not for Muon: its update rewrites the sums first (muon_prepass), which would drop them.
  if (b.last && r_.optimizer != optim::OptimizerKind::kMuon) sw.read_ahead_next_step();
  for (size_t at = 0; at < mod.opt_n; at += chunk) {
    const size_t n = std::min(chunk, mod.opt_n - at);
    float* acc = hold ? held_sums_.data() + at : grad_stage_.data();
    if (!b.first && !hold) ZOE_RETURN_IF_ERROR(sw.read_state(swap_group(m), kGradState, acc, at, n));
    ZOE_ASSIGN_OR_RETURN(const void* h, host_view(static_cast<const char*>(b.src) + at * es, n * es));
    ZOE_RETURN_IF_ERROR(
        optim::accumulate_with_norm(acc, h, shape_.cdt, n, b.first, b.norm + at / optim::kChunkElems, exec));
    if (at == 0) test_flip(m, b, acc);
    if (hold && !b.last) continue;  // written after the module's last micro-batch
    if (b.last) adam_mini_note_chunk(m, at, acc, n);
    if (b.last && sw.fill_preloaded(swap_group(m), at, kGradState, acc, n)) continue;
    // Written behind the backward (the swapper copies the chunk; at most its write buffers in
    // flight): the next read of a sum and the step wait for these writes and report their errors.
    ZOE_RETURN_IF_ERROR(sw.write_state_async(swap_group(m), kGradState, acc, at, n));
  }
  if (hold && b.last) held_ = ModuleId(SIZE_MAX);
  return Status::ok();
}

Status Updater::flush_held() {
  if (held_ == ModuleId(SIZE_MAX)) return Status::ok();
  const ModuleId m = held_;
  held_ = ModuleId(SIZE_MAX);
  const size_t chunk = r_.swapper->chunk_elems(), n = modules_[m].opt_n;
  for (size_t at = 0; at < n; at += chunk) {
    ZOE_RETURN_IF_ERROR(r_.swapper->write_state_async(swap_group(m), kGradState, held_sums_.data() + at, at,
                                                      std::min(chunk, n - at)));
  }
  return Status::ok();
}

Status Updater::zero_grads(ModuleId m) {
  const ModuleLayout& mod = modules_[m];
  if (m.index < mini_noted_ok_.size()) mini_noted_ok_[m.index] = 0;
  OptimStates& st = states_[m.index];
  switch (mod.opt_home) {
    case Tier::kDevice:
      ZOE_RETURN_IF_ERROR(r_.ops->zero(st.grad_acc, mod.opt_n * 4));
      return r_.ops->synchronize();  // the update may run on another thread's ops
    case Tier::kHost:
      memset(st.grad_acc, 0, mod.opt_n * 4);
      return Status::ok();
    case Tier::kNvme:
      break;
  }
  const size_t chunk = r_.swapper->chunk_elems();
  grad_stage_.assign(chunk, 0.0f);
  for (size_t b = 0; b < mod.opt_n; b += chunk) {
    ZOE_RETURN_IF_ERROR(r_.swapper->write_state(swap_group(m), kGradState, grad_stage_.data(), b,
                                                std::min(chunk, mod.opt_n - b)));
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// The states a speculative update (updater.cpp: speculate) saved, put back or kept

void Updater::unspeculate(ModuleId m) {
  OptimStates& st = states_[m.index];
  if (!st.speculated) return;
  const size_t n = modules_[m].opt_n, sbytes = state_size(OptState::kExpAvg, n),
               mbytes = state_size(OptState::kMaster, n);
  const char* save = static_cast<const char*>(st.spec_save);
  memcpy(st.master, save, mbytes);
  memcpy(st.exp_avg, save + mbytes, sbytes);
  if (st.exp_avg_sq) memcpy(st.exp_avg_sq, save + mbytes + sbytes, sbytes);
  st.speculated = false;
  spec_undone_++;
}

void Updater::unspeculate_all() {
  for (ModuleId m : modules_.ids()) unspeculate(m);
}

void Updater::settle_speculation(bool overflow, float grad_scale, StepStats* st) {
  if (overflow || grad_scale != spec_scale_) unspeculate_all();
  // A module whose untouched parameters (over all ranks) differ from those its speculation left.
  for (ModuleId m : modules_.ids()) {
    OptimStates& s = states_[m.index];
    static const std::vector<uint8_t> none;
    const std::vector<uint8_t>& now = m.index < untouched_.size() ? untouched_[m.index] : none;
    if (s.speculated && s.spec_untouched != now) unspeculate(m);
  }
  for (const auto& s : states_) spec_kept_ += s.speculated ? 1 : 0;
  st->speculative_kept = spec_kept_;
  st->speculative_undone = spec_undone_;
  spec_kept_ = spec_undone_ = 0;
}

}  // namespace zoe::zero
