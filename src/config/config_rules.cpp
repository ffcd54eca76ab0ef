// The rules between config keys (config_rules.h): what no single row of the table can say.
#include "config/config_rules.h"

#include <limits>

#include "config/config_table.h"
#include "core/log.h"

namespace zoe::config::detail {

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

// A batch value the rule derived (not given) goes through its key's own check, as if the file had
// given it: the rule must not make a config that the same config with every value written out
// (to_json, Config::set) would refuse. `how` says how it was derived.
Status check_derived(const std::string& key, int64_t value, const std::string& how) {
  const Field* f = find_field(key);
  auto r = to_int(Json(value), key, f->min, f->max);
  if (r.is_ok()) return Status::ok();
  return invalid_argument("%s: %lld (derived: %s) is out of range (expected an integer in [%lld, %lld])",
                          key.c_str(), static_cast<long long>(value), how.c_str(),
                          static_cast<long long>(f->min), static_cast<long long>(f->max));
}

// DeepSpeed's rule: any two of the three give the third; one alone means accumulation 1.
Status resolve_batch(const GivenKeys& g, Config* c, int world_size) {
  const bool has_tbs = g.has("train_batch_size"), has_micro = g.has("train_micro_batch_size_per_gpu"),
             has_gas = g.has("gradient_accumulation_steps");
  int64_t& tbs = c->train_batch_size;
  int64_t& micro = c->train_micro_batch_size_per_gpu;
  int64_t& gas = c->gradient_accumulation_steps;
  const int64_t w = world_size;
  if (has_tbs && !has_micro) {
    const int64_t per_rank_steps = has_gas ? gas * w : w;
    if (tbs % per_rank_steps != 0) {
      return invalid_argument(
          "train_batch_size: %lld is not divisible by gradient_accumulation_steps %lld x world size %lld",
          static_cast<long long>(tbs), static_cast<long long>(has_gas ? gas : 1), static_cast<long long>(w));
    }
    micro = tbs / per_rank_steps;
    ZOE_RETURN_IF_ERROR(
        check_derived("train_micro_batch_size_per_gpu", micro,
                      "train_batch_size " + std::to_string(tbs) + " / (gradient_accumulation_steps " +
                          std::to_string(has_gas ? gas : 1) + " x world size " + std::to_string(w) + ")"));
  } else if (has_tbs && has_micro && !has_gas) {
    if (tbs % (micro * w) != 0) {
      return invalid_argument(
          "train_batch_size: %lld is not divisible by train_micro_batch_size_per_gpu %lld x world size %lld",
          static_cast<long long>(tbs), static_cast<long long>(micro), static_cast<long long>(w));
    }
    gas = tbs / (micro * w);
    ZOE_RETURN_IF_ERROR(check_derived("gradient_accumulation_steps", gas,
                                      "train_batch_size " + std::to_string(tbs) +
                                          " / (train_micro_batch_size_per_gpu " + std::to_string(micro) +
                                          " x world size " + std::to_string(w) + ")"));
  }
  // Overflow-safe product check.
  if (micro > kMaxInt / gas || micro * gas > kMaxInt / w) {
    return invalid_argument(
        "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size overflows");
  }
  const int64_t product = micro * gas * w;
  if (has_tbs && tbs != product) {
    return invalid_argument(
        "train_batch_size: %lld does not equal train_micro_batch_size_per_gpu %lld x "
        "gradient_accumulation_steps %lld x world size %lld = %lld",
        static_cast<long long>(tbs), static_cast<long long>(micro), static_cast<long long>(gas),
        static_cast<long long>(w), static_cast<long long>(product));
  }
  tbs = product;
  return check_derived("train_batch_size", tbs,
                       "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size");
}

// zero_optimization.cpu_offload / cpu_offload_params: true means the block's device "cpu".
Status apply_old_offload(const GivenKeys& g, const std::string& old_key, const std::string& block,
                         OffloadConfig* o) {
  const std::string z = "zero_optimization.";
  const Json* on = g.value(z + old_key);
  if (!on || !on->get<bool>()) return Status::ok();
  if (g.has(z + block + ".device") && o->device != Offload::kCpu) {
    return invalid_argument("%s%s: true contradicts %s%s.device \"%s\"", z.c_str(), old_key.c_str(),
                            z.c_str(), block.c_str(), offload_name(o->device));
  }
  ZOE_LOG_WARN("config: %s%s is deprecated; reading it as %s%s.device \"cpu\"", z.c_str(), old_key.c_str(),
               z.c_str(), block.c_str());
  o->device = Offload::kCpu;
  if (const Json* pin = g.value(z + "cpu_offload_use_pin_memory")) o->pin_memory = pin->get<bool>();
  return Status::ok();
}

Status check_scheduler(const GivenKeys& g, const SchedulerConfig& sc) {
  if (g.has("scheduler") && !g.has("scheduler.type")) {
    return invalid_argument("scheduler.type is missing (expected \"WarmupLR\" or \"WarmupDecayLR\")");
  }
  if (sc.type == "WarmupDecayLR" && !g.has("scheduler.params.total_num_steps")) {
    return invalid_argument("scheduler.params.total_num_steps is missing (WarmupDecayLR decays to 0 there)");
  }
  if (sc.type == "WarmupDecayLR" && sc.total_num_steps < sc.warmup_num_steps) {
    ZOE_LOG_WARN("config: scheduler.params.total_num_steps %lld is less than warmup_num_steps %lld",
                 static_cast<long long>(sc.total_num_steps), static_cast<long long>(sc.warmup_num_steps));
  }
  return Status::ok();
}

// Partial offload: DeepSpeed's offload_optimizer.ratio and zoe.offload_ratio mean the same.
Status merge_offload_ratio(Config* c) {
  const double ds = c->zero.offload_optimizer.ratio, zr = c->zoe.offload_ratio;
  if (ds != 1.0 && zr != 1.0 && ds != zr) {
    return invalid_argument(
        "zero_optimization.offload_optimizer.ratio %g and zoe.offload_ratio %g disagree "
        "(they are the same setting: give one)",
        ds, zr);
  }
  if (ds != 1.0) c->zoe.offload_ratio = ds;
  c->zero.offload_optimizer.ratio = c->zoe.offload_ratio;
  return Status::ok();
}

// zoe.bf16_optimizer_states: true is the older spelling of zoe.optimizer_states "bf16" (with
// zoe.optimizer_states "fp32", the default, it means "bf16"; with "int8" or "int4" the two
// disagree). Only zoe.optimizer_states is written back.
Status merge_state_format(Config* c) {
  ZoeConfig& z = c->zoe;
  if (z.bf16_optimizer_states && z.optimizer_states != "fp32" && z.optimizer_states != "bf16") {
    return invalid_argument(
        "zoe.bf16_optimizer_states true and zoe.optimizer_states \"%s\" disagree (the first is the older "
        "spelling of zoe.optimizer_states \"bf16\": give zoe.optimizer_states only)",
        z.optimizer_states.c_str());
  }
  if (z.bf16_optimizer_states) z.optimizer_states = "bf16";
  z.bf16_optimizer_states = z.optimizer_states == "bf16";
  return Status::ok();
}

// optimizer.params as DeepSpeed's Lion (lr, betas, weight_decay), Adagrad (lr, eps,
// weight_decay), Muon (lr, muon_lr, adam_lr, momentum, weight_decay, betas, eps) and Adam-mini (lr,
// betas, eps, weight_decay, and the adam-mini package's dim, n_heads, n_kv_heads) take them: a
// key the type has not is refused (DeepSpeed's optimizer would not take it either), and the
// defaults are each type's own: Adagrad lr 1e-2, eps 1e-10 (DeepSpeedCPUAdagrad, torch); Muon
// DeepSpeed's MuonWithAuxAdam's (muon_lr 0.02 and adam_lr 3e-4, or lr for both where lr is given;
// betas (0.9, 0.95), eps 1e-10). Their master is fp32; their states take the low-bit formats
// (Lion's and Adagrad's every one, Adam-mini's and Muon's fp32, int8 and int4).
Status check_optimizer_params(const GivenKeys& g, Config* c) {
  OptimizerConfig& o = c->optimizer;
  const bool lion = o.type == "Lion", adagrad = o.type == "Adagrad", muon = o.type == "Muon",
             mini = o.type == "AdamMini";
  if (!muon) {
    for (const char* k : {"muon_lr", "adam_lr", "momentum"}) {
      if (!g.has(std::string("optimizer.params.") + k)) continue;
      return invalid_argument(
          "optimizer.params.%s is optimizer.type \"Muon\"'s; optimizer.type is \"%s\": remove it", k,
          o.type.c_str());
    }
  }
  if (!mini) {
    for (const char* k : {"dim", "n_heads", "n_kv_heads"}) {
      if (!g.has(std::string("optimizer.params.") + k)) continue;
      return invalid_argument(
          "optimizer.params.%s is optimizer.type \"AdamMini\"'s; optimizer.type is \"%s\": remove it", k,
          o.type.c_str());
    }
  }
  if (mini && o.n_kv_heads != 0 && o.n_heads % o.n_kv_heads != 0) {
    return invalid_argument(
        "optimizer.params.n_kv_heads %lld does not divide optimizer.params.n_heads %lld (grouped-query "
        "attention: n_heads is a multiple of n_kv_heads): give the model's key/value heads, or leave "
        "n_kv_heads out",
        static_cast<long long>(o.n_kv_heads), static_cast<long long>(o.n_heads));
  }
  if (!lion && !adagrad && !muon && !mini) return Status::ok();
  const char* takes = lion      ? "lr, betas and weight_decay"
                      : adagrad ? "lr, eps and weight_decay"
                      : mini    ? "lr, betas, eps, weight_decay, dim, n_heads and n_kv_heads"
                                : "lr, muon_lr, adam_lr, momentum, weight_decay, betas and eps";
  for (const char* k : {lion ? "eps" : adagrad ? "betas" : "", "adam_w_mode"}) {
    if (*k == 0 || !g.has(std::string("optimizer.params.") + k)) continue;
    return invalid_argument(
        "optimizer.params.%s: optimizer.type \"%s\" has no %s (its params are %s, as in DeepSpeed): remove "
        "it",
        k, o.type.c_str(), k, takes);
  }
  if (adagrad) {
    if (!g.has("optimizer.params.lr")) o.lr = 1e-2;
    if (!g.has("optimizer.params.eps")) o.eps = 1e-10;
  }
  if (muon) {
    const bool lr = g.has("optimizer.params.lr");
    if (!g.has("optimizer.params.muon_lr")) o.muon_lr = lr ? o.lr : 0.02;
    if (!g.has("optimizer.params.adam_lr")) o.adam_lr = lr ? o.lr : 3e-4;
    if (!g.has("optimizer.params.betas")) o.beta1 = 0.9, o.beta2 = 0.95;
    if (!g.has("optimizer.params.eps")) o.eps = 1e-10;
  }
  const ZoeConfig& z = c->zoe;
  // Lion and Adagrad take every format; Adam-mini and Muon fp32, int8 and int4 (their updates
  // read their states as fp32 or as decoded blocks).
  if ((muon || mini) && z.optimizer_states == "bf16") {
    return invalid_argument(
        "zoe.optimizer_states \"bf16\" with optimizer.type \"%s\": %s keeps fp32, int8 or int4 states; use "
        "zoe.optimizer_states \"fp32\", \"int8\" or \"int4\" with %s, or optimizer.type \"AdamW\", \"Lion\" "
        "or \"Adagrad\" for bf16 states",
        o.type.c_str(), o.type.c_str(), o.type.c_str());
  }
  if (z.master_weights != "fp32") {
    return invalid_argument(
        "zoe.master_weights \"%s\" with optimizer.type \"%s\": %s updates an fp32 master only; use "
        "zoe.master_weights \"fp32\" with %s, or optimizer.type \"AdamW\"",
        z.master_weights.c_str(), o.type.c_str(), o.type.c_str(), o.type.c_str());
  }
  if (mini && z.speculative_step) {
    ZOE_LOG_WARN(
        "zoe.speculative_step: not used with optimizer.type \"AdamMini\" (its second moments are block means "
        "over the whole step's gradients, summed over the ranks, so no module can be updated during the "
        "backward); set it to false");
  }
  if (muon && z.speculative_step) {
    ZOE_LOG_WARN(
        "zoe.speculative_step: not used with optimizer.type \"Muon\" (its update orthogonalizes each matrix "
        "from the whole step's gradients, so no module can be updated during the backward); set it to false");
  }
  return Status::ok();
}

Status check_contradictions(const Config& c) {
  if (c.fp16.enabled && c.bf16) {
    return invalid_argument("fp16.enabled and bf16.enabled are both true (choose one precision)");
  }
  const ZeroConfig& z = c.zero;
  if (z.offload_param.device != Offload::kNone && z.stage < 3) {
    return invalid_argument(
        "zero_optimization.offload_param.device: \"%s\" needs zero_optimization.stage 3 "
        "(stage is %d; parameters are partitioned only at stage 3)",
        offload_name(z.offload_param.device), z.stage);
  }
  if (z.offload_optimizer.device != Offload::kNone && z.stage < 1) {
    return invalid_argument(
        "zero_optimization.offload_optimizer.device: \"%s\" needs zero_optimization.stage 1, "
        "2 or 3 (stage is 0)",
        offload_name(z.offload_optimizer.device));
  }
  for (auto [o, block] :
       {std::pair{&z.offload_optimizer, "offload_optimizer"}, std::pair{&z.offload_param, "offload_param"}}) {
    if (o->device == Offload::kNvme && o->nvme_path.empty()) {
      return invalid_argument(
          "zero_optimization.%s.device: \"nvme\" needs zero_optimization.%s.nvme_path "
          "(a directory on the NVMe drive, or a list of them)",
          block, block);
    }
  }
  return Status::ok();
}

// DeepSpeed's activation_checkpointing section: whether it is given, and cpu_checkpointing, which
// means zoe.activation_offload "cpu" unless that key is given (then it wins, warned once).
void apply_activation_checkpointing(const GivenKeys& g, Config* c) {
  ActivationCheckpointingConfig& ac = c->activation_checkpointing;
  ac.given = g.has("activation_checkpointing");
  if (!ac.cpu_checkpointing) return;
  if (!g.has("zoe.activation_offload")) {
    c->zoe.activation_offload = "cpu";
  } else if (c->zoe.activation_offload != "cpu") {
    ZOE_LOG_WARN(
        "config: activation_checkpointing.cpu_checkpointing true with zoe.activation_offload \"%s\": "
        "zoe.activation_offload is used",
        c->zoe.activation_offload.c_str());
  }
}

Status check_activation_offload(const Config& c) {
  if (c.zoe.activation_offload != "nvme") return Status::ok();
  if (!c.zoe.activation_nvme_path.empty() || !c.zero.offload_param.nvme_path.empty() ||
      !c.zero.offload_optimizer.nvme_path.empty())
    return Status::ok();
  return invalid_argument(
      "zoe.activation_offload: \"nvme\" needs zoe.activation_nvme_path (a directory on the NVMe drive, or a "
      "list of them; without it, zero_optimization.offload_param's or offload_optimizer's nvme_path)");
}

}  // namespace

Status apply_rules(const GivenKeys& g, int world_size, Config* c) {
  ZOE_RETURN_IF_ERROR(resolve_batch(g, c, world_size));
  // DeepSpeed turns overlap_comm on at stage 3 unless the key says otherwise.
  if (!g.has("zero_optimization.overlap_comm")) c->zero.overlap_comm = c->zero.stage == 3;
  ZOE_RETURN_IF_ERROR(apply_old_offload(g, "cpu_offload", "offload_optimizer", &c->zero.offload_optimizer));
  ZOE_RETURN_IF_ERROR(apply_old_offload(g, "cpu_offload_params", "offload_param", &c->zero.offload_param));
  // As in DeepSpeed, "Adam" means decoupled decay unless params.adam_w_mode is false; "AdamW" is
  // always decoupled.
  if (c->optimizer.type == "AdamW") c->optimizer.adam_w_mode = true;
  ZOE_RETURN_IF_ERROR(check_scheduler(g, c->scheduler));
  ZOE_RETURN_IF_ERROR(merge_offload_ratio(c));
  ZOE_RETURN_IF_ERROR(merge_state_format(c));
  ZOE_RETURN_IF_ERROR(check_optimizer_params(g, c));
  apply_activation_checkpointing(g, c);
  ZOE_RETURN_IF_ERROR(check_activation_offload(*c));
  return check_contradictions(*c);
}

}  // namespace zoe::config::detail
