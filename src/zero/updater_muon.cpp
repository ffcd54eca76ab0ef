// Muon's whole-matrix phase: see updater.h (the contract) and optim/muon.h (the arithmetic).
//
// Why a gather and not whole matrices assigned to ranks: zoe's partitions are flat ranges of each
// module (the same layout every tier, checkpoint and gather uses), so a matrix straddles ranks
// wherever the module's boundary falls. Gathering U costs 4 bytes per module element per rank on
// the link and one module's U in host memory; assigning whole matrices would need a second layout
// of every state. NS itself runs only on the matrices that overlap this rank's range (a matrix on
// a boundary is orthogonalized by both ranks, with the same bits).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/log.h"
#include "zero/updater.h"

namespace zoe::zero {

using offload::Tier;

namespace {

bool is_muon_matrix(const ModuleLayout& mod, size_t p) {
  const ParamSpec& s = mod.specs[p];
  return mod.numel[p] > 0 &&
         optim::is_muon_matrix(mod.name.empty() ? s.name : mod.name + "." + s.name, s.shape.size());
}

// The element range [b, e) of parameter p inside [lo, lo + n), relative to lo; b == e: none.
std::pair<size_t, size_t> owned_part(const ModuleLayout& mod, size_t p, size_t lo, size_t n) {
  const size_t b = std::max(lo, mod.offset[p]), e = std::min(lo + n, mod.offset[p] + mod.numel[p]);
  return b < e ? std::pair{b - lo, e - lo} : std::pair{size_t{0}, size_t{0}};
}

}  // namespace

void Updater::init_muon() {
  muon_.resize(modules_.size());
  for (ModuleId m : modules_.ids()) {
    const ModuleLayout& mod = modules_[m];
    muon_[m.index].assign(mod.specs.size(), 0);
    for (size_t p = 0; p < mod.specs.size(); ++p) muon_[m.index][p] = is_muon_matrix(mod, p) ? 1 : 0;
  }
  // A test hook: with ZOE_TEST_MUON_FLAT_SHARD=1, each rank orthogonalizes its own flat piece of
  // each matrix as a 1 x len matrix instead of the whole matrix (what an engine that runs Muon on
  // flattened ZeRO shards does); the tests show the result leaves the reference.
  if (const char* e = getenv("ZOE_TEST_MUON_FLAT_SHARD"); e && strcmp(e, "1") == 0) {
    muon_flat_shard_ = true;
    ZOE_LOG_WARN(
        "ZOE_TEST_MUON_FLAT_SHARD is set: Newton-Schulz runs on each rank's flat piece of a matrix "
        "(a wrong result on purpose, for testing)");
  }
}

Status Updater::muon_prepass(float grad_scale) {
  if (r_.optimizer != optim::OptimizerKind::kMuon) return Status::ok();
  // The chunks read ahead would be stale once the sums are rewritten; the gradients handed to them
  // go home first.
  if (r_.swapper) ZOE_RETURN_IF_ERROR_CTX(r_.swapper->drop_preloaded(), "dropping the chunks read ahead");
  optim::MuonParams mp;
  mp.momentum = static_cast<float>(r_.cfg->optimizer.momentum);
  for (ModuleId m : modules_.ids()) {
    const ModuleLayout& mod = modules_[m];
    const auto& flags = muon_[m.index];
    if (mod.frozen || std::find(flags.begin(), flags.end(), uint8_t{1}) == flags.end()) continue;
    Status s = muon_module(m, grad_scale, mp);
    if (!s.is_ok()) return s.with_context("Muon's orthogonalization of module " + mod.name);
  }
  return Status::ok();
}

Status Updater::muon_module(ModuleId m, float grad_scale, const optim::MuonParams& mp) {
  const ModuleLayout& mod = modules_[m];
  OptimStates& st = states_[m.index];
  const size_t lo = mod.opt_begin, n = mod.opt_n;
  const bool nvme = mod.opt_home == Tier::kNvme;
  const bool gather = shape_.stage != 0 && shape_.world > 1;
  static const std::vector<uint8_t> none;
  const std::vector<uint8_t>& untouched = m.index < untouched_.size() ? untouched_[m.index] : none;
  // The owned gradient sums and momentum: host memory (the placement keeps Muon's states off a
  // GPU), or read from NVMe.
  // int8/int4 momentum (zoe.optimizer_states): decoded here and encoded again after the momentum step.
  const bool packed = optim::state_block_elems(r_.states) > 1;
  float* g = st.grad_acc;
  float* buf = static_cast<float*>(st.exp_avg);
  if (nvme) {
    muon_g_.resize(n);
    g = muon_g_.data();
    ZOE_RETURN_IF_ERROR(r_.swapper->read_state(swap_group(m), kGradState, g, 0, n));
  }
  if (nvme || packed) {
    muon_buf_.resize(n);
    buf = muon_buf_.data();
    if (packed) {
      muon_packed_.resize(state_size(OptState::kExpAvg, n));
      ZOE_RETURN_IF_ERROR(read_state(m, OptState::kExpAvg, 0, n, muon_packed_.data()));
      ZOE_RETURN_IF_ERROR(
          optim::dequantize_state(optim::StateKind::kExpAvg, r_.states, muon_packed_.data(), buf, n));
    } else {
      ZOE_RETURN_IF_ERROR(read_state(m, OptState::kExpAvg, 0, n, buf));
    }
  }
  const size_t own_n = gather ? mod.part : n;
  muon_u_.assign(std::max(own_n, n), 0.0f);
  const auto& flags = muon_[m.index];
  for (size_t p = 0; p < flags.size(); ++p) {
    if (!flags[p] || (p < untouched.size() && untouched[p])) continue;
    const auto [b, e] = owned_part(mod, p, lo, n);
    optim::muon_momentum(g + b, grad_scale, buf + b, muon_u_.data() + b, e - b, mp);
  }
  if (packed) {
    ZOE_RETURN_IF_ERROR(
        optim::quantize_state(optim::StateKind::kExpAvg, r_.states, buf, muon_packed_.data(), n));
    ZOE_RETURN_IF_ERROR(write_state(m, OptState::kExpAvg, 0, n, muon_packed_.data()));
  } else if (nvme) {
    ZOE_RETURN_IF_ERROR(write_state(m, OptState::kExpAvg, 0, n, buf));
  }
  const float* U = muon_u_.data();  // the module's U from its first element (lo is 0 without a gather)
  if (gather) {
    muon_full_.resize(mod.padded);
    ZOE_RETURN_IF_ERROR(
        r_.comm->all_gather(muon_u_.data(), muon_full_.data(), mod.part, comm::CommType::kF32).wait());
    U = muon_full_.data();
  }
  optim::Exec exec;
  exec.pool = r_.pool;
  const uint64_t t0 = now_ns();
  for (size_t p = 0; p < flags.size(); ++p) {
    if (!flags[p] || (p < untouched.size() && untouched[p])) continue;
    const auto [b, e] = owned_part(mod, p, lo, n);
    if (b == e) continue;
    const size_t rows = static_cast<size_t>(mod.specs[p].shape[0]), cols = mod.numel[p] / rows;
    if (muon_flat_shard_) {
      ZOE_RETURN_IF_ERROR(optim::newton_schulz(muon_u_.data() + b, 1, e - b, mp, g + b, exec));
      continue;
    }
    muon_o_.resize(mod.numel[p]);
    ZOE_RETURN_IF_ERROR(optim::newton_schulz(U + mod.offset[p], rows, cols, mp, muon_o_.data(), exec));
    memcpy(g + b, muon_o_.data() + (lo + b - mod.offset[p]), (e - b) * sizeof(float));
  }
  clock_.t_newton_schulz += static_cast<double>(now_ns() - t0) * 1e-9;
  if (nvme) ZOE_RETURN_IF_ERROR(r_.swapper->write_state(swap_group(m), kGradState, g, 0, n));
  return Status::ok();
}

}  // namespace zoe::zero
