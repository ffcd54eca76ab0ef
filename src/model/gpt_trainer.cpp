// GptTrainer: the reference GPT's glue to the engine, over zoe's public API only.
#include "model/gpt_trainer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "zoe/activations.h"

namespace zoe::model {

Status add_gpt_modules(Engine& e, const GptConfig& c) {
  for (const auto& m : gpt_modules(c)) {
    std::vector<ParamSpec> ps;
    for (const auto& t : m.params) ps.push_back({t.name, t.shape});
    ZOE_RETURN_IF_ERROR(e.add_module(m.name, ps));
  }
  return Status::ok();
}

namespace {

// Whether a module's tensors are fp32 in host memory: the model reads them in place.
bool usable_in_place(const ModuleParams& p) {
  bool direct = p.dtype == ComputeDType::kF32;
  for (const TensorView& v : p.tensors) direct = direct && v.host_addressable;
  return direct;
}

}  // namespace

// A block's fp32 tensors for GptCpu, with fewer copies at once than the whole block: the small
// parameters (biases, LayerNorm gains) converted whole, the weights each converted when the model
// needs it into one buffer they share; the gradients of the weights share one buffer too, each
// written into the engine's gradient buffer (x the loss scale) as soon as the model has finished it.
// Without it a 2b block (d_model 2560) took 300 MiB of fp32 parameters and 300 MiB of gradients;
// with it, 100 MiB each (the largest weight). The same values reach the same kernels: losses are
// bit-identical. Hooks cannot fail: the first error is kept for finish() / error().
class GptTrainer::BlockTensors final : public BlockTensorHooks {
 public:
  BlockTensors(Engine& e, const ModuleSpec& spec) : e_(e) {
    size_t small = 0, big = 0;
    for (const auto& t : spec.params) {
      shared_.push_back(t.shape.size() >= 2);
      offset_.push_back(shared_.back() ? 0 : small);
      if (shared_.back()) {
        big = std::max(big, t.numel());
      } else {
        small += t.numel();
      }
    }
    small_.resize(small);
    gsmall_.resize(small);
    big_.resize(big);
    gbig_.resize(big);
  }

  // Parameter pointers for block_forward / block_backward of the module whose views are `p` (kept
  // until the next call): the small ones filled now, the weights by need().
  Result<std::vector<const float*>> params(const ModuleParams& p) {
    p_ = &p;
    held_ = SIZE_MAX;
    error_ = Status::ok();
    direct_ = usable_in_place(p);
    std::vector<const float*> out;
    for (size_t i = 0; i < p.size(); ++i) {
      if (direct_) {
        out.push_back(p[i].as<const float>());
      } else if (shared_[i]) {
        out.push_back(big_.data());
      } else {
        ZOE_RETURN_IF_ERROR(e_.read_f32(p[i], small_.data() + offset_[i]));
        out.push_back(small_.data() + offset_[i]);
      }
    }
    return out;
  }
  // Zeroed gradient pointers for module m, written into the engine x `scale` as they complete.
  std::vector<float*> grads(size_t m, double scale) {
    module_ = m;
    scale_ = static_cast<float>(scale);
    gb_.reset();
    written_.assign(shared_.size(), false);
    std::fill(gsmall_.begin(), gsmall_.end(), 0.0f);
    if (!gbig_zero_) std::fill(gbig_.begin(), gbig_.end(), 0.0f);
    gbig_zero_ = false;
    std::vector<float*> out;
    for (size_t i = 0; i < shared_.size(); ++i)
      out.push_back(shared_[i] ? gbig_.data() : gsmall_.data() + offset_[i]);
    return out;
  }
  // After block_backward: a hook's error, else the gradients not yet written (none when the model
  // called grad_done for each), and the reduction.
  Status finish() {
    ZOE_RETURN_IF_ERROR(error_);
    for (size_t i = 0; i < shared_.size(); ++i) {
      if (!written_[i]) ZOE_RETURN_IF_ERROR(write(i));
    }
    gb_.reset();
    return e_.reduce_grads(module_);
  }
  // After block_forward: a hook's error.
  const Status& error() const { return error_; }

  void need(size_t i) override {
    if (direct_ || !shared_[i] || held_ == i || !error_.is_ok()) return;
    error_ = e_.read_f32((*p_)[i], big_.data());
    held_ = i;
  }
  void grad_done(size_t i) override {
    if (!error_.is_ok()) return;
    error_ = write(i);
    if (!shared_[i]) return;
    std::fill(gbig_.begin(), gbig_.end(), 0.0f);
    // After the last weight's gradient the model writes none in this call: the next grads() need
    // not zero it again.
    gbig_zero_ = true;
    for (size_t k = 0; k < shared_.size(); ++k) gbig_zero_ = gbig_zero_ && (!shared_[k] || written_[k]);
  }

 private:
  Status write(size_t i) {
    if (!gb_) {  // at the first finished gradient: the previous module's reduction overlapped until now
      ZOE_ASSIGN_OR_RETURN(ModuleParams gb, e_.grads(module_));
      gb_ = std::move(gb);
    }
    written_[i] = true;
    return e_.write_f32((*gb_)[i], shared_[i] ? gbig_.data() : gsmall_.data() + offset_[i], scale_);
  }

  Engine& e_;
  std::vector<bool> shared_;    // per parameter: a weight (in big_ / gbig_)
  std::vector<size_t> offset_;  // per small parameter: its place in small_ / gsmall_
  std::vector<float> small_, big_, gsmall_, gbig_;
  bool gbig_zero_ = true;  // gbig_ holds zeros
  const ModuleParams* p_ = nullptr;
  bool direct_ = false;     // fp32 host-addressable parameters: used in place
  size_t held_ = SIZE_MAX;  // the weight big_ holds
  size_t module_ = 0;
  float scale_ = 1.0f;
  std::optional<ModuleParams> gb_;  // the engine's gradient views, from the first finished gradient
  std::vector<bool> written_;
  Status error_;
};

GptTrainer::GptTrainer(Engine& e, GptCpu& m, const GptConfig& c, int T)
    : e_(e),
      m_(m),
      c_(c),
      T_(T),
      specs_(gpt_modules(c)),
      block_(std::make_unique<BlockTensors>(e, specs_[1])) {}

GptTrainer::~GptTrainer() = default;

Result<std::vector<const float*>> GptTrainer::as_f32(const ModuleParams& p, std::vector<float>* scratch) {
  std::vector<const float*> out;
  if (usable_in_place(p)) {
    for (const TensorView& v : p.tensors) out.push_back(v.as<const float>());
    return out;
  }
  size_t total = 0;
  for (const TensorView& v : p.tensors) total += v.numel;
  scratch->resize(total);
  size_t off = 0;
  for (const TensorView& v : p.tensors) {
    ZOE_RETURN_IF_ERROR(e_.read_f32(v, scratch->data() + off));
    out.push_back(scratch->data() + off);
    off += v.numel;
  }
  return out;
}

void GptTrainer::reset_grads(size_t m, std::vector<float>* data, std::vector<float*>* ptrs) const {
  size_t total = 0;
  for (const auto& t : specs_[m].params) total += t.numel();
  data->assign(total, 0.0f);
  ptrs->clear();
  size_t off = 0;
  for (const auto& t : specs_[m].params) {
    ptrs->push_back(data->data() + off);
    off += t.numel();
  }
}

Status GptTrainer::store_and_reduce(size_t m, const std::vector<float*>& g, double scale) {
  ZOE_ASSIGN_OR_RETURN(ModuleParams gb, e_.grads(m));
  for (size_t i = 0; i < gb.size(); ++i)
    ZOE_RETURN_IF_ERROR(e_.write_f32(gb[i], g[i], static_cast<float>(scale)));
  return e_.reduce_grads(m);
}

Result<float> GptTrainer::forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
  ZOE_ASSIGN_OR_RETURN(float loss, forward_pass(tokens, targets, false));
  if (m_.checkpointing()) ZOE_RETURN_IF_ERROR(e_.activations().end_micro_batch());
  return loss;
}

Result<float> GptTrainer::forward_pass(const std::vector<int32_t>& tokens,
                                       const std::vector<int32_t>& targets, bool keep) {
  const size_t L = static_cast<size_t>(c_.layers);
  keep = keep && m_.checkpointing();
  ids_.clear();
  {
    ZOE_ASSIGN_OR_RETURN(Gathered p, e_.gather(0));
    ZOE_ASSIGN_OR_RETURN(auto f, as_f32(p.params(), &scratch_));
    uint64_t t0 = clock_ns();
    m_.embed_forward(tokens.data(), f.data());
    e_.record_compute("embed fwd", t0, clock_ns());
    ZOE_RETURN_IF_ERROR(p.release());
  }
  for (size_t l = 0; l < L; ++l) {
    ZOE_ASSIGN_OR_RETURN(Gathered p, e_.gather(1 + l));
    ZOE_ASSIGN_OR_RETURN(auto f, block_->params(p.params()));
    if (keep && !p.params().tensors.empty() && !p.params().tensors[0].host_addressable) {
      // The store takes pointers in the engine device's memory; GptCpu's block inputs are host memory.
      return unsupported(
          "activation checkpointing (--activation-checkpointing) runs the reference GPT on the CPU, whose "
          "block "
          "inputs are host memory, but the engine's device is not (zoe.device cuda): use zoe.device cpu");
    }
    if (keep) {
      ZOE_ASSIGN_OR_RETURN(ActivationId id, e_.activations().save(m_.checkpoint_input(static_cast<int>(l)),
                                                                  m_.checkpoint_bytes()));
      ids_.push_back(id);
    }
    uint64_t t0 = clock_ns();
    m_.set_block_hooks(block_.get());
    m_.block_forward(static_cast<int>(l), f.data());
    m_.set_block_hooks(nullptr);
    e_.record_compute("block " + std::to_string(l) + " fwd", t0, clock_ns());
    ZOE_RETURN_IF_ERROR(block_->error());
    ZOE_RETURN_IF_ERROR(p.release());
  }
  ZOE_ASSIGN_OR_RETURN(Gathered pf, e_.gather(L + 1));
  ZOE_ASSIGN_OR_RETURN(Gathered pe, e_.gather(0));
  ZOE_ASSIGN_OR_RETURN(auto ff, as_f32(pf.params(), &scratch_));
  ZOE_ASSIGN_OR_RETURN(auto fe, as_f32(pe.params(), &scratch2_));
  uint64_t t0 = clock_ns();
  float loss = m_.head_forward(ff.data(), fe.data(), targets.data());
  e_.record_compute("head fwd", t0, clock_ns());
  ZOE_RETURN_IF_ERROR(pe.release());
  ZOE_RETURN_IF_ERROR(pf.release());
  return loss;
}

Result<std::string> GptTrainer::sample(const std::string& prompt, int n, double temperature, uint64_t seed,
                                       int batch) {
  if (n < 0 || batch <= 0 || !(temperature >= 0) || !std::isfinite(temperature)) {
    return invalid_argument("sample: %d bytes, batch %d, temperature %g: none may be negative", n, batch,
                            temperature);
  }
  std::vector<int32_t> ctx;
  for (unsigned char ch : prompt) ctx.push_back(static_cast<int32_t>(ch) % c_.vocab);
  if (ctx.empty()) ctx.push_back('\n');
  const size_t T = static_cast<size_t>(T_), V = static_cast<size_t>(c_.vocab);
  std::vector<int32_t> tokens(static_cast<size_t>(batch) * T), targets(tokens.size(), 0);
  std::vector<double> p(V);
  uint64_t state = seed ^ 0x5a3d1e5c0ffee123ull;
  auto uniform = [&state] {  // splitmix64 -> [0, 1)
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  };
  std::string out;
  for (int i = 0; i < n; ++i) {
    const size_t len = std::min(ctx.size(), T);
    // Every row holds the context (the causal model ignores the padding after it).
    for (size_t r = 0; r < static_cast<size_t>(batch); ++r) {
      std::copy(ctx.end() - static_cast<ptrdiff_t>(len), ctx.end(),
                tokens.begin() + static_cast<ptrdiff_t>(r * T));
      std::fill(tokens.begin() + static_cast<ptrdiff_t>(r * T + len),
                tokens.begin() + static_cast<ptrdiff_t>((r + 1) * T), ' ');
    }
    ZOE_RETURN_IF_ERROR(forward(tokens, targets).status());
    const float* row = m_.logits() + (len - 1) * V;
    size_t pick = static_cast<size_t>(std::max_element(row, row + V) - row);
    if (temperature > 0) {
      double sum = 0;
      for (size_t v = 0; v < V; ++v) sum += p[v] = std::exp((row[v] - row[pick]) / temperature);
      double u = uniform() * sum;
      for (size_t v = 0; v < V; ++v) {
        if ((u -= p[v]) < 0 || v + 1 == V) {
          pick = v;
          break;
        }
      }
    }
    ctx.push_back(static_cast<int32_t>(pick));
    out.push_back(static_cast<char>(pick));
  }
  return out;
}

Result<float> GptTrainer::forward_backward(const std::vector<int32_t>& tokens,
                                           const std::vector<int32_t>& targets) {
  if (m_.checkpointing()) {
    const std::vector<uint64_t> sizes(static_cast<size_t>(c_.layers), m_.checkpoint_bytes());
    ZOE_RETURN_IF_ERROR(e_.activations().plan(sizes.data(), sizes.size()));
  }
  ZOE_ASSIGN_OR_RETURN(float loss, forward_pass(tokens, targets, true));
  ZOE_RETURN_IF_ERROR(backward_pass());
  if (m_.checkpointing()) ZOE_RETURN_IF_ERROR(e_.activations().end_micro_batch());
  return loss;
}

Status GptTrainer::backward_pass() {
  const size_t L = static_cast<size_t>(c_.layers);
  const double scale = e_.loss_scale();
  reset_grads(0, &g_embed_, &g_embed_ptrs_);
  {
    ZOE_ASSIGN_OR_RETURN(Gathered pf, e_.gather(L + 1));
    ZOE_ASSIGN_OR_RETURN(Gathered pe, e_.gather(0));
    ZOE_ASSIGN_OR_RETURN(auto ff, as_f32(pf.params(), &scratch_));
    ZOE_ASSIGN_OR_RETURN(auto fe, as_f32(pe.params(), &scratch2_));
    reset_grads(L + 1, &g_, &g_ptrs_);
    uint64_t t0 = clock_ns();
    m_.head_backward(ff.data(), fe.data(), g_ptrs_.data(), g_embed_ptrs_.data());
    e_.record_compute("head bwd", t0, clock_ns());
    ZOE_RETURN_IF_ERROR(store_and_reduce(L + 1, g_ptrs_, scale));
    ZOE_RETURN_IF_ERROR(pe.release());
    ZOE_RETURN_IF_ERROR(pf.release());
  }
  for (size_t i = L; i-- > 0;) ZOE_RETURN_IF_ERROR(block_backward(i, scale));
  ZOE_ASSIGN_OR_RETURN(Gathered p, e_.gather(0));
  uint64_t t0 = clock_ns();
  m_.embed_backward(g_embed_ptrs_.data());
  e_.record_compute("embed bwd", t0, clock_ns());
  ZOE_RETURN_IF_ERROR(store_and_reduce(0, g_embed_ptrs_, scale));
  return p.release();
}

Status GptTrainer::block_backward(size_t layer, double scale) {
  if (m_.checkpointing()) {
    // The block's input back where the model recomputes the block from (saved in forward_pass).
    if (ids_.size() != layer + 1) {
      return internal_error("block %zu's backward: %zu block inputs saved in the forward, expected %zu",
                            layer, ids_.size(), layer + 1);
    }
    ZOE_RETURN_IF_ERROR(e_.activations().load(ids_.back(), m_.checkpoint_input(static_cast<int>(layer))));
    ids_.pop_back();
  }
  ZOE_ASSIGN_OR_RETURN(Gathered p, e_.gather(1 + layer));
  ZOE_ASSIGN_OR_RETURN(auto f, block_->params(p.params()));
  const std::vector<float*> g = block_->grads(1 + layer, scale);
  uint64_t t0 = clock_ns();
  m_.set_block_hooks(block_.get());
  m_.block_backward(static_cast<int>(layer), f.data(), g.data());
  m_.set_block_hooks(nullptr);
  e_.record_compute("block " + std::to_string(layer) + " bwd", t0, clock_ns());
  ZOE_RETURN_IF_ERROR(block_->finish());
  return p.release();
}

Result<std::vector<float>> GptTrainer::forward_backward_layer_major(
    const std::vector<std::vector<int32_t>>& tokens, const std::vector<std::vector<int32_t>>& targets,
    const std::vector<GptCpu*>& models) {
  const size_t G = tokens.size();
  if (G == 0 || targets.size() != G || models.size() < G) {
    return invalid_argument(
        "layer-major step: %zu token batches, %zu target batches and %zu models (expected "
        "one of each per micro-batch, at least one)",
        G, targets.size(), models.size());
  }
  for (size_t g = 0; g < G; ++g) {
    if (models[g] == nullptr || models[g]->checkpointing() != m_.checkpointing())
      return invalid_argument("layer-major step: model %zu is missing or differs in checkpointing", g);
  }
  if (m_.checkpointing()) {
    const std::vector<uint64_t> sizes(static_cast<size_t>(c_.layers) * G, m_.checkpoint_bytes());
    ZOE_RETURN_IF_ERROR(e_.activations().plan(sizes.data(), sizes.size()));
  }
  const double scale = e_.loss_scale();
  ZOE_RETURN_IF_ERROR(layer_major_forward(tokens, models));
  ZOE_ASSIGN_OR_RETURN(std::vector<float> losses, layer_major_head(targets, models, scale));
  ZOE_RETURN_IF_ERROR(layer_major_backward(models, scale));
  if (m_.checkpointing()) ZOE_RETURN_IF_ERROR(e_.activations().end_micro_batch());
  return losses;
}

// Every micro-batch through the embedding, then through each block. With checkpointing, block l's
// inputs are saved from the last micro-batch to the first, so that the backward (block by block,
// micro-batches in order) loads them in the reverse of their save order, the order the store reads
// ahead in.
Status GptTrainer::layer_major_forward(const std::vector<std::vector<int32_t>>& tokens,
                                       const std::vector<GptCpu*>& models) {
  const size_t G = tokens.size(), L = static_cast<size_t>(c_.layers);
  const bool keep = m_.checkpointing();
  {
    ZOE_ASSIGN_OR_RETURN(Gathered p, e_.gather(0));
    ZOE_ASSIGN_OR_RETURN(auto f, as_f32(p.params(), &scratch_));
    uint64_t t0 = clock_ns();
    for (size_t g = 0; g < G; ++g) models[g]->embed_forward(tokens[g].data(), f.data());
    e_.record_compute("embed fwd", t0, clock_ns());
    ZOE_RETURN_IF_ERROR(p.release());
  }
  lm_ids_.assign(L, std::vector<ActivationId>(G));
  for (size_t l = 0; l < L; ++l) {
    ZOE_ASSIGN_OR_RETURN(Gathered p, e_.gather(1 + l));
    if (keep && !p.params().tensors.empty() && !p.params().tensors[0].host_addressable) {
      return unsupported(
          "activation checkpointing runs the reference GPT on the CPU, whose block inputs are host memory, "
          "but the engine's device is not (zoe.device cuda): use zoe.device cpu");
    }
    ZOE_ASSIGN_OR_RETURN(auto f, block_->params(p.params()));
    uint64_t t0 = clock_ns();
    for (size_t g = G; g-- > 0;) {
      if (keep) {
        ZOE_ASSIGN_OR_RETURN(lm_ids_[l][g],
                             e_.activations().save(models[g]->checkpoint_input(static_cast<int>(l)),
                                                   models[g]->checkpoint_bytes()));
      }
      models[g]->set_block_hooks(block_.get());
      models[g]->block_forward(static_cast<int>(l), f.data());
      models[g]->set_block_hooks(nullptr);
      ZOE_RETURN_IF_ERROR(block_->error());
    }
    e_.record_compute("block " + std::to_string(l) + " fwd", t0, clock_ns());
    ZOE_RETURN_IF_ERROR(p.release());
  }
  return Status::ok();
}

// The final LayerNorm and the tied head, forward then backward for each micro-batch in order,
// under one gather of both modules; the head's gradient of wte stays in lm_embed_[g] until the
// embedding's backward adds to it.
Result<std::vector<float>> GptTrainer::layer_major_head(const std::vector<std::vector<int32_t>>& targets,
                                                        const std::vector<GptCpu*>& models, double scale) {
  const size_t G = targets.size(), L = static_cast<size_t>(c_.layers);
  std::vector<float> losses(G);
  lm_embed_.resize(G);
  ZOE_ASSIGN_OR_RETURN(Gathered pf, e_.gather(L + 1));
  ZOE_ASSIGN_OR_RETURN(Gathered pe, e_.gather(0));
  ZOE_ASSIGN_OR_RETURN(auto ff, as_f32(pf.params(), &scratch_));
  ZOE_ASSIGN_OR_RETURN(auto fe, as_f32(pe.params(), &scratch2_));
  for (size_t g = 0; g < G; ++g) {
    uint64_t t0 = clock_ns();
    losses[g] = models[g]->head_forward(ff.data(), fe.data(), targets[g].data());
    reset_grads(0, &lm_embed_[g], &g_embed_ptrs_);
    reset_grads(L + 1, &g_, &g_ptrs_);
    models[g]->head_backward(ff.data(), fe.data(), g_ptrs_.data(), g_embed_ptrs_.data());
    e_.record_compute("head", t0, clock_ns());
    ZOE_RETURN_IF_ERROR(store_and_reduce(L + 1, g_ptrs_, scale));
  }
  ZOE_RETURN_IF_ERROR(pe.release());
  ZOE_RETURN_IF_ERROR(pf.release());
  return losses;
}

// Each block from the last to the first, every micro-batch through its backward in order (its
// input loaded back first with checkpointing), then the embedding's.
Status GptTrainer::layer_major_backward(const std::vector<GptCpu*>& models, double scale) {
  const size_t G = lm_embed_.size(), L = static_cast<size_t>(c_.layers);
  const bool keep = m_.checkpointing();
  for (size_t l = L; l-- > 0;) {
    ZOE_ASSIGN_OR_RETURN(Gathered p, e_.gather(1 + l));
    ZOE_ASSIGN_OR_RETURN(auto f, block_->params(p.params()));
    for (size_t g = 0; g < G; ++g) {
      if (keep) {
        ZOE_RETURN_IF_ERROR(
            e_.activations().load(lm_ids_[l][g], models[g]->checkpoint_input(static_cast<int>(l))));
      }
      const std::vector<float*> gr = block_->grads(1 + l, scale);
      uint64_t t0 = clock_ns();
      models[g]->set_block_hooks(block_.get());
      models[g]->block_backward(static_cast<int>(l), f.data(), gr.data());
      models[g]->set_block_hooks(nullptr);
      e_.record_compute("block " + std::to_string(l) + " bwd", t0, clock_ns());
      ZOE_RETURN_IF_ERROR(block_->finish());
    }
    ZOE_RETURN_IF_ERROR(p.release());
  }
  ZOE_ASSIGN_OR_RETURN(Gathered p, e_.gather(0));
  for (size_t g = 0; g < G; ++g) {
    std::vector<float*> ptrs;
    size_t off = 0;
    for (const auto& t : specs_[0].params) {
      ptrs.push_back(lm_embed_[g].data() + off);
      off += t.numel();
    }
    uint64_t t0 = clock_ns();
    models[g]->embed_backward(ptrs.data());
    e_.record_compute("embed bwd", t0, clock_ns());
    ZOE_RETURN_IF_ERROR(store_and_reduce(0, ptrs, scale));
  }
  return p.release();
}

namespace {
// "number 3", "string \"x\"": a JSON value in an error message, shortened (as checkpoint
// manifests show theirs).
std::string shown(const nlohmann::json& v) {
  constexpr size_t kMax = 48;
  std::string text = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMax) text = text.substr(0, kMax) + "... (" + std::to_string(text.size()) + " bytes)";
  return (v.is_number() ? std::string("number") : std::string(v.type_name())) + " " + text;
}

// An integer field of the trainer state, in [lo, hi]; the error names the checkpoint and the key.
template <typename T>
Status read_integer(const nlohmann::json& tj, const char* key, const std::string& from, T* out) {
  const nlohmann::json& v = tj.at(key);
  const auto lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  bool ok = false;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(hi);
    if (ok) *out = static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    ok = x >= 0 || std::numeric_limits<T>::is_signed;
    ok = ok &&
         (std::numeric_limits<T>::is_signed ? x >= static_cast<int64_t>(lo) && x <= static_cast<int64_t>(hi)
                                            : static_cast<uint64_t>(x) <= static_cast<uint64_t>(hi));
    if (ok) *out = static_cast<T>(x);
  }
  if (ok) return Status::ok();
  return corruption("checkpoint %s: key 'trainer.%s': expected an integer in [%s, %s], found %s",
                    from.c_str(), key, std::to_string(lo).c_str(), std::to_string(hi).c_str(),
                    shown(v).c_str());
}
}  // namespace

Status parse_trainer_state(const std::string& json_text, const std::string& from, int* step, uint64_t* seed) {
  auto tj = nlohmann::json::parse(json_text, nullptr, false);
  if (tj.is_discarded() || !tj.is_object() || !tj.contains("step")) {
    return corruption("checkpoint %s has no trainer state", from.c_str());
  }
  // Typed reads: a field of the wrong type is an error naming it (trainer.step), not an exception.
  ZOE_RETURN_IF_ERROR(read_integer(tj, "step", from, step));
  if (tj.contains("seed")) ZOE_RETURN_IF_ERROR(read_integer(tj, "seed", from, seed));
  return Status::ok();
}

}  // namespace zoe::model
