// Adam-mini's block moments: see updater.h (the contract) and optim/adam_mini.h (the arithmetic).
//
// Why every rank keeps every block's moment: a block (a row, a head, a whole norm) straddles ranks
// wherever a module's flat partition boundary falls, and its mean needs all of its elements. The
// moments are one float a block (a row of a d-column matrix: 1/d of its elements), so each rank
// holds the module's whole vector, the per-block sums of g^2 of its owned elements are summed over
// the ranks (one all-reduce of 8 bytes a block a step, zeros where it owns nothing), and every rank
// updates every block's moment with the same values. A second layout that gives whole blocks to
// ranks would cost a layout change of every state; this costs the block vector.
#include <algorithm>
#include <cstring>
#include <functional>

#include "zero/updater.h"

namespace zoe::zero {

using offload::Tier;

namespace {

std::string full_name(const ModuleLayout& mod, size_t p) {
  return mod.name.empty() ? mod.specs[p].name : mod.name + "." + mod.specs[p].name;
}

// Calls fn(block index within the parameter, element begin, element end) for parameter p's blocks
// that meet [lo, hi) (module-absolute), with the element range clipped to it.
template <class F>
void for_blocks(const ModuleLayout& mod, const optim::AdamMiniParam& ap, size_t p, size_t lo, size_t hi,
                F&& fn) {
  const size_t pb = mod.offset[p], pe = pb + mod.numel[p];
  if (std::max(lo, pb) >= std::min(hi, pe)) return;
  size_t at = pb, j = 0;
  for (const optim::BlockRun& r : ap.runs) {
    const size_t run_end = at + r.count * r.elems;
    if (run_end <= lo || r.elems == 0) {
      at = run_end;
      j += r.count;
      continue;
    }
    // The first block of this run that reaches past lo.
    const size_t k0 = lo > at ? (lo - at) / r.elems : 0;
    for (size_t k = k0; k < r.count; ++k) {
      const size_t b = at + k * r.elems, e = b + r.elems;
      if (b >= hi) return;
      fn(j + k, std::max(b, lo), std::min(e, hi));
    }
    at = run_end;
    j += r.count;
  }
}

}  // namespace

Status Updater::init_adam_mini(ModuleId m) {
  if (r_.optimizer != optim::OptimizerKind::kAdamMini) return Status::ok();
  if (mini_.size() != modules_.size()) mini_.resize(modules_.size());
  const ModuleLayout& mod = modules_[m];
  AdamMiniModule& mm = mini_[m.index];
  optim::AdamMiniShape shape;
  shape.dim = r_.cfg->optimizer.dim;
  shape.n_heads = r_.cfg->optimizer.n_heads;
  mm.params.clear();
  mm.first.clear();
  size_t blocks = 0;
  for (size_t p = 0; p < mod.specs.size(); ++p) {
    auto part = optim::adam_mini_partition(full_name(mod, p), mod.specs[p].shape, shape);
    if (!part.is_ok()) return part.status().with_context("module " + mod.name);
    mm.first.push_back(blocks);
    blocks += part.value().blocks();
    mm.params.push_back(std::move(part).value());
  }
  mm.v.assign(blocks, 0.0f);
  return Status::ok();
}

// Module m's per-block sums of g^2 (the unscaled gradient sums) over this rank's owned elements,
// added into sums (the module's blocks from 0). Parameters this step leaves untouched add nothing.
// Adds the block sums of g^2 of module m's owned elements [lo + at, lo + at + n) (g from lo + at)
// into sums, block by block in element order.
static void add_block_sums(const ModuleLayout& mod, const AdamMiniModule& mm, size_t at, const float* g,
                           size_t n, double* sums) {
  const size_t lo = mod.opt_begin + at;
  for (size_t p = 0; p < mm.params.size(); ++p) {
    for_blocks(mod, mm.params[p], p, lo, lo + n, [&](size_t j, size_t b, size_t e) {
      double& s = sums[mm.first[p] + j];
      s = optim::adam_mini_sum_sq(g + (b - lo), e - b, s);
    });
  }
}

void Updater::adam_mini_note_chunk(ModuleId m, size_t at, const float* acc, size_t n) {
  if (r_.optimizer != optim::OptimizerKind::kAdamMini || m.index >= mini_.size()) return;
  if (mini_noted_.size() != mini_.size()) {
    mini_noted_.resize(mini_.size());
    mini_noted_ok_.assign(mini_.size(), 0);
  }
  std::vector<double>& sums = mini_noted_[m.index];
  if (at == 0) {
    sums.assign(mini_[m.index].v.size(), 0.0);
    mini_noted_ok_[m.index] = 1;
  }
  if (!mini_noted_ok_[m.index]) return;
  add_block_sums(modules_[m], mini_[m.index], at, acc, n, sums.data());
}

// Module m's per-block sums of g^2 (the unscaled gradient sums) over this rank's owned elements,
// into sums (the module's blocks from 0): noted as the last micro-batch wrote them to NVMe, else
// from the sums where they live (NVMe: read back).
Status Updater::adam_mini_sums(ModuleId m, double* sums) {
  const ModuleLayout& mod = modules_[m];
  const AdamMiniModule& mm = mini_[m.index];
  const size_t n = mod.opt_n;
  if (m.index < mini_noted_ok_.size() && mini_noted_ok_[m.index]) {
    mini_noted_ok_[m.index] = 0;
    std::copy(mini_noted_[m.index].begin(), mini_noted_[m.index].end(), sums);
    return Status::ok();
  }
  const float* g = states_[m.index].grad_acc;
  if (mod.opt_home == Tier::kNvme) {
    // The chunks read ahead may hold sums the NVMe copy lacks: they go home first.
    ZOE_RETURN_IF_ERROR_CTX(r_.swapper->drop_preloaded(), "dropping the chunks read ahead");
    mini_g_.resize(n);
    ZOE_RETURN_IF_ERROR(r_.swapper->read_state(swap_group(m), kGradState, mini_g_.data(), 0, n));
    g = mini_g_.data();
  }
  add_block_sums(mod, mm, 0, g, n, sums);
  return Status::ok();
}

Status Updater::adam_mini_prepass(float grad_scale) {
  if (r_.optimizer != optim::OptimizerKind::kAdamMini) return Status::ok();
  size_t total = 0;
  for (const AdamMiniModule& mm : mini_) total += mm.v.size();
  mini_sums_.assign(total, 0.0);
  size_t at = 0;
  for (ModuleId m : modules_.ids()) {
    if (m.index >= mini_.size()) break;
    if (!modules_[m].frozen && !mini_[m.index].v.empty()) {
      Status s = adam_mini_sums(m, mini_sums_.data() + at);
      if (!s.is_ok()) return s.with_context("Adam-mini's block moments of module " + modules_[m].name);
    }
    at += mini_[m.index].v.size();
  }
  if (shape_.stage != 0 && shape_.world > 1 && total > 0) {
    mini_all_.resize(total);
    ZOE_RETURN_IF_ERROR_CTX(r_.comm
                                ->all_reduce(mini_sums_.data(), mini_all_.data(), total, comm::CommType::kF64,
                                             comm::ReduceOp::kSum)
                                .wait(),
                            "all-reducing Adam-mini's block sums");
    mini_sums_.swap(mini_all_);
  }
  // The sums are of the unscaled gradients: the step's scale squared makes them the step's.
  const double s2 = static_cast<double>(grad_scale) * static_cast<double>(grad_scale);
  optim::AdamMiniParams xp;
  xp.beta2 = static_cast<float>(r_.cfg->optimizer.beta2);
  static const std::vector<uint8_t> none;
  at = 0;
  for (ModuleId m : modules_.ids()) {
    if (m.index >= mini_.size()) break;
    AdamMiniModule& mm = mini_[m.index];
    // The parameters no rank gave a gradient keep their moments (their sums are zeros).
    const std::vector<uint8_t>& untouched = m.index < untouched_.size() ? untouched_[m.index] : none;
    for (size_t p = 0; p < mm.params.size() && !modules_[m].frozen; ++p) {
      if (p < untouched.size() && untouched[p]) continue;
      size_t j = mm.first[p];
      for (const optim::BlockRun& r : mm.params[p].runs) {
        for (size_t k = 0; k < r.count; ++k, ++j)
          optim::adam_mini_vmean(&mm.v[j], mini_sums_[at + j] * s2, r.elems, xp);
      }
    }
    at += mm.v.size();
  }
  return Status::ok();
}

void adam_mini_chunk(const AdamMiniChunk& c) {
  const ModuleLayout& mod = *c.mod;
  const AdamMiniModule& mm = *c.mm;
  for (size_t p = 0; p < mm.params.size(); ++p) {
    const int64_t step = c.step - (c.skipped && p < c.skipped->size() ? (*c.skipped)[p] : 0);
    const bool decay = mm.params[p].decay;
    for_blocks(mod, mm.params[p], p, c.lo, c.lo + c.n, [&](size_t j, size_t b, size_t e) {
      const size_t o = b - c.lo;
      optim::adam_mini_block(c.master + o, c.grad + o, c.grad_scale, c.m + o, e - b, mm.v[mm.first[p] + j],
                             std::max<int64_t>(step, 1), decay, c.p);
    });
  }
}

Status for_each_piece(optim::CpuPool* pool, size_t count, const std::function<Status(size_t)>& fn) {
  std::vector<Status> st(count);
  auto one = [&](size_t i) { st[i] = fn(i); };
  if (pool) {
    pool->for_each(count, one);
  } else {
    for (size_t i = 0; i < count; ++i) one(i);
  }
  for (Status& x : st) ZOE_RETURN_IF_ERROR(x);
  return Status::ok();
}

Status adam_mini_update(const AdamMiniChunk& c, void* param_out, DType cdt, optim::CpuPool* pool) {
  constexpr size_t kPiece = size_t{1} << 14;
  return for_each_piece(pool, (c.n + kPiece - 1) / kPiece, [&](size_t i) -> Status {
    AdamMiniChunk p = c;
    const size_t a = i * kPiece, len = std::min(kPiece, c.n - a);
    p.lo += a, p.n = len, p.master += a, p.m += a, p.grad += a;
    adam_mini_chunk(p);
    if (!param_out) return Status::ok();
    return optim::convert_with_norm(p.master, DType::kF32,
                                    static_cast<char*>(param_out) + a * dtype_size(cdt), cdt, len, false)
        .status();
  });
}

std::vector<std::vector<float>> Updater::adam_mini_v() const {
  std::vector<std::vector<float>> out;
  for (const AdamMiniModule& mm : mini_) out.push_back(mm.v);
  return out;
}

Status Updater::set_adam_mini_v(const std::vector<std::vector<float>>& v) {
  if (v.size() != mini_.size()) {
    return invalid_argument("Adam-mini's block moments of %zu modules; this model has %zu", v.size(),
                            mini_.size());
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].size() != mini_[i].v.size()) {
      return invalid_argument(
          "module %s: %zu Adam-mini block moments saved, %zu blocks with this config's "
          "optimizer.params.dim %lld and n_heads %lld: load it with the dim and n_heads it was saved with",
          modules_[ModuleId(i)].name.c_str(), v[i].size(), mini_[i].v.size(),
          static_cast<long long>(r_.cfg->optimizer.dim), static_cast<long long>(r_.cfg->optimizer.n_heads));
    }
  }
  for (size_t i = 0; i < v.size(); ++i) mini_[i].v = v[i];
  return Status::ok();
}

}  // namespace zoe::zero
