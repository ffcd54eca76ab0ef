// GptConfig checks, the engine module layout and the deterministic initialisation of the GPT.
#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "core/cpu.h"
#include "core/init_normal.h"
#include "core/log.h"
#include "model/gpt.h"

namespace zoe::model {

const std::vector<GptPreset>& gpt_presets() {
  static const std::vector<GptPreset> kPresets = {
      {"tiny", 2, 64, 4, 64},      {"small", 4, 128, 4, 64},     {"demo", 6, 256, 8, 64},
      {"medium", 12, 512, 8, 128}, {"large", 24, 1024, 16, 128}, {"2b", 26, 2560, 20, 64},
  };
  return kPresets;
}

const GptPreset* find_gpt_preset(const std::string& name, std::string* names) {
  const GptPreset* found = nullptr;
  if (names) names->clear();
  for (const auto& p : gpt_presets()) {
    if (name == p.name) found = &p;
    if (names) *names += std::string(names->empty() ? "" : ", ") + p.name;
  }
  return found;
}
namespace {

constexpr int kMaxVocab = 65536;  // token ids are stored as uint16 by the data pipeline
constexpr int kMaxDim = 1 << 16;  // keeps every index of one tensor well inside int64

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The normal kernel of this CPU's SIMD level (the values are the same on every level).
initk::NormalFn normal_kernel() {
  static const initk::NormalFn fn = initk::normal_for(environment_simd_level());
  return fn;
}

}  // namespace

Status GptConfig::validate() const {
  if (vocab < 1 || vocab > kMaxVocab)
    return invalid_argument("model vocab %d: expected 1..%d", vocab, kMaxVocab);
  if (seq < 1 || seq > kMaxDim) return invalid_argument("model seq %d: expected 1..%d", seq, kMaxDim);
  if (d_model < 1 || d_model > kMaxDim)
    return invalid_argument("model d_model %d: expected 1..%d", d_model, kMaxDim);
  if (heads < 1) return invalid_argument("model heads %d: expected a positive number", heads);
  if (d_model % heads != 0)
    return invalid_argument("model d_model %d is not a multiple of heads %d (head_dim = d_model / heads)",
                            d_model, heads);
  if (layers < 1 || layers > 4096) return invalid_argument("model layers %d: expected 1..4096", layers);
  return Status::ok();
}

double activation_bytes_estimate(const GptConfig& c, int batch, int T, bool checkpointing) {
  const double n = static_cast<double>(batch) * T, nd = n * c.d_model;
  const double att = static_cast<double>(batch) * c.heads * T * T;
  // Residual buffers and block workspaces (GptCpu's constructor): every block's, or with
  // checkpointing two residual buffers and one workspace.
  const double residuals = checkpointing ? 2 : c.layers + 1.0, workspaces = checkpointing ? 1 : c.layers;
  const double floats =
      residuals * nd + workspaces * (15 * nd + 4 * n + att) + nd + 3 * n + 2 * n * c.vocab + 10 * nd + att;
  return 4 * floats + 8 * n;
}

double checkpoint_bytes_estimate(const GptConfig& c, int batch, int T) {
  return 4.0 * c.layers * static_cast<double>(batch) * T * c.d_model;
}

uint64_t GptConfig::num_params() const {
  const uint64_t d = static_cast<uint64_t>(d_model);
  const uint64_t block = 12 * d * d + 13 * d;
  return static_cast<uint64_t>(vocab) * d + static_cast<uint64_t>(seq) * d +
         static_cast<uint64_t>(layers) * block + 2 * d;
}

size_t TensorSpec::numel() const {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

std::vector<ModuleSpec> gpt_modules(const GptConfig& c) {
  const int64_t d = c.d_model;
  std::vector<ModuleSpec> m;
  m.reserve(static_cast<size_t>(c.layers) + 2);
  m.push_back({"embed", {{"wte", {c.vocab, d}}, {"wpe", {c.seq, d}}}});
  for (int l = 0; l < c.layers; ++l) {
    m.push_back({"block." + std::to_string(l),
                 {{"ln1_g", {d}},
                  {"ln1_b", {d}},
                  {"qkv_w", {3 * d, d}},
                  {"qkv_b", {3 * d}},
                  {"proj_w", {d, d}},
                  {"proj_b", {d}},
                  {"ln2_g", {d}},
                  {"ln2_b", {d}},
                  {"fc1_w", {4 * d, d}},
                  {"fc1_b", {4 * d}},
                  {"fc2_w", {d, 4 * d}},
                  {"fc2_b", {d}}}});
  }
  m.push_back({"final", {{"lnf_g", {d}}, {"lnf_b", {d}}}});
  return m;
}

void gpt_init_range(const GptConfig& c, uint64_t seed, size_t module, size_t param, uint64_t first,
                    float* data, size_t n) {
  const size_t modules = static_cast<size_t>(c.layers) + 2;
  ZOE_CHECK_MSG(module < modules, "module %zu of %zu", module, modules);
  enum class Kind { kZero, kOne, kNormal } kind = Kind::kZero;
  double std_dev = 0.02;
  if (module == 0) {
    ZOE_CHECK_MSG(param < 2, "embed param %zu", param);
    kind = Kind::kNormal;
  } else if (module == modules - 1) {
    ZOE_CHECK_MSG(param < 2, "final param %zu", param);
    kind = param == 0 ? Kind::kOne : Kind::kZero;
  } else {
    ZOE_CHECK_MSG(param < kBlockParams, "block param %zu", param);
    switch (param) {
      case kLn1G:
      case kLn2G:
        kind = Kind::kOne;
        break;
      case kQkvW:
      case kFc1W:
        kind = Kind::kNormal;
        break;
      case kProjW:
      case kFc2W:  // residual projections (GPT-2): scaled by 1/sqrt(2 * layers)
        kind = Kind::kNormal;
        std_dev = 0.02 / std::sqrt(2.0 * c.layers);
        break;
      default:
        kind = Kind::kZero;
        break;
    }
  }
  const size_t numel = gpt_modules(c)[module].params[param].numel();
  ZOE_CHECK_MSG(first <= numel && n <= numel - first, "elements [%llu, +%zu) of a tensor of %zu",
                static_cast<unsigned long long>(first), n, numel);
  if (kind != Kind::kNormal) {
    const float v = kind == Kind::kOne ? 1.0f : 0.0f;
    for (size_t i = 0; i < n; ++i) data[i] = v;
    return;
  }
  const uint64_t key =
      splitmix64(splitmix64(splitmix64(seed) ^ module) ^ (param + 1) * 0xD1B54A32D192ED03ull);
  normal_kernel()(key, first, n, static_cast<float>(std_dev), data);
}

void gpt_init(const GptConfig& c, uint64_t seed, size_t module, size_t param, float* data, size_t n) {
  // Every element depends only on (seed, module, param, index): a large tensor is filled in
  // ranges on every core, with the same values.
  constexpr size_t kPerThread = size_t{1} << 20;
  const size_t threads =
      std::min<size_t>(static_cast<size_t>(usable_cores()), std::max<size_t>(1, n / kPerThread));
  if (threads <= 1) {
    gpt_init_range(c, seed, module, param, 0, data, n);
    return;
  }
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) {
    const size_t b = n * t / threads, e = n * (t + 1) / threads;
    pool.emplace_back([&c, seed, module, param, data, b, e] {
      gpt_init_range(c, seed, module, param, b, data + b, e - b);
    });
  }
  gpt_init_range(c, seed, module, param, 0, data, n / threads);
  for (auto& th : pool) th.join();
}

}  // namespace zoe::model
