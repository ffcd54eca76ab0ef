// The placement matrix, planned and costed.
#include "plan/planner.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/units.h"

namespace zoe::plan {

std::string RowPlacement::label() const {
  std::string s = "stage " + std::to_string(stage);
  if (stage == 3) s += std::string(", params ") + offload_name(param);
  s += std::string(", optimizer ") + offload_name(optimizer);
  if (optimizer != Offload::kNone) {
    char r[32];
    snprintf(r, sizeof(r), " x%g", ratio);
    s += r;
  }
  if (bf16_states) s += ", bf16 states";
  if (states == "int8" || states == "int4") s += ", " + states + " states";
  return s;
}

bool PlanResult::any_fits() const {
  return std::any_of(rows.begin(), rows.end(), [](const PlanRow& r) { return r.fits; });
}

std::vector<RowPlacement> all_placements(const std::string& base_states, const std::string& optimizer_type) {
  const bool lowbit = base_states == "int8" || base_states == "int4";
  // Muon and Adam-mini keep no bf16 states (config_rules.cpp).
  const bool fp32_only = optimizer_type == "Muon" || optimizer_type == "AdamMini";
  std::vector<RowPlacement> v;
  const Offload devs[] = {Offload::kNone, Offload::kCpu, Offload::kNvme};
  for (int stage = 1; stage <= 3; ++stage) {
    for (Offload param : devs) {
      if (stage != 3 && param != Offload::kNone) continue;
      for (Offload opt : devs) {
        for (double ratio : {0.25, 0.5, 1.0}) {
          if (opt == Offload::kNone && ratio != 1.0) continue;
          for (bool bf16 : {false, true}) {
            if ((lowbit || fp32_only) && bf16) continue;
            v.push_back({stage, param, opt, ratio, bf16, lowbit ? base_states : bf16 ? "bf16" : "fp32"});
          }
        }
      }
    }
  }
  return v;
}

config::Config config_for(const config::Config& base, const RowPlacement& p, const std::string& nvme_path) {
  config::Config c = base;
  c.zero.stage = p.stage;
  c.zero.offload_param.device = p.param;
  c.zero.offload_optimizer.device = p.optimizer;
  c.zoe.offload_ratio = p.optimizer == Offload::kNone ? 1.0 : p.ratio;
  // A low-bit format the row keeps; else bf16_states says fp32 or bf16.
  c.zoe.optimizer_states = p.states == "int8" || p.states == "int4" ? p.states
                           : p.bf16_states                          ? "bf16"
                                                                    : "fp32";
  c.zoe.bf16_optimizer_states = c.zoe.optimizer_states == "bf16";
  for (config::OffloadConfig* o : {&c.zero.offload_param, &c.zero.offload_optimizer}) {
    if (o->device == Offload::kNvme && o->nvme_path.empty() && !nvme_path.empty()) o->nvme_path = {nvme_path};
  }
  return c;
}

uint64_t activation_bytes(const ModelDesc& m, const Workload& w, size_t compute_bytes) {
  if (!m.layers || !m.d_model || !m.heads) return 0;
  // Per layer, bytes per token in 16-bit (Korthikanti et al., no recomputation): 34 d for the
  // block's inputs and intermediates, 5 a s for the attention scores, softmax and its mask.
  const double s = static_cast<double>(w.seq), b = static_cast<double>(w.micro_batch);
  const double d = m.d_model, a = m.heads;
  const double per_layer = s * b * d * (34.0 + 5.0 * a * s / d) * static_cast<double>(compute_bytes) / 2.0;
  // The logits and their gradient (fp32) at the head.
  const double head = s * b * static_cast<double>(m.vocab) * 4.0 * 2.0;
  return static_cast<uint64_t>(per_layer * m.layers + head);
}

ActivationSizes activation_sizes(const ModelDesc& m, const Workload& w, size_t compute_bytes,
                                 bool checkpointing) {
  ActivationSizes a;
  a.workspace = activation_bytes(m, w, compute_bytes);
  if (a.workspace == 0) return a;
  // Layer-major: every micro-batch of the step has gone through a layer before the next layer
  // runs, so the activations the backward needs are held for all G micro-batches at once.
  const uint64_t g = w.layer_major && w.grad_accum > 1 ? static_cast<uint64_t>(w.grad_accum) : 1;
  const double s = static_cast<double>(w.seq), b = static_cast<double>(w.micro_batch);
  const double head = s * b * static_cast<double>(m.vocab) * 4.0 * 2.0;
  const double per_layer = (static_cast<double>(a.workspace) - head) / m.layers;
  if (!checkpointing) {
    if (g > 1) a.workspace = static_cast<uint64_t>(per_layer * m.layers * static_cast<double>(g) + head);
    return a;
  }
  // One block's share of the estimate stays (the workspace the recompute reuses), with the head.
  a.workspace = static_cast<uint64_t>(per_layer + head);
  // The block inputs: zoe's GPT keeps fp32 (its kernels compute in fp32), another model its
  // compute dtype.
  const double elem = m.zoe_gpt ? 4.0 : static_cast<double>(compute_bytes);
  a.count = static_cast<uint64_t>(m.layers) * g;
  a.tensor = static_cast<uint64_t>(s * b * m.d_model * elem);
  a.checkpoint = a.count * a.tensor;
  return a;
}

zero::TierBytes split_checkpoints(const ActivationSizes& a, const ActivationOptions& o, uint64_t device_room,
                                  uint64_t host_room) {
  zero::TierBytes t;
  if (a.count == 0 || a.tensor == 0) return t;
  if (o.offload == ActivationOffload::kNone || a.tensor < o.min_bytes) {
    t.device = a.checkpoint;
    return t;
  }
  const uint64_t room = o.device_budget ? o.device_budget : device_room;
  const uint64_t dev = std::clamp<uint64_t>(room / a.tensor, 1, a.count);  // keep_last: at least one
  const uint64_t rest = a.count - dev;
  uint64_t host_cap = o.host_budget ? o.host_budget : host_room;
  const bool nvme = o.offload == ActivationOffload::kNvme;
  const uint64_t buffers = nvme ? nvme_host_buffers(a, o, host_cap) : 0;
  host_cap = host_cap > buffers ? host_cap - buffers : 0;
  const uint64_t host = nvme ? std::min(rest, host_cap / a.tensor) : rest;
  t.device = dev * a.tensor;
  t.host = host * a.tensor;
  t.nvme = (rest - host) * a.tensor;
  return t;
}

uint64_t nvme_host_buffers(const ActivationSizes& a, const ActivationOptions& o, uint64_t host_budget) {
  const uint64_t run =
      o.run_bytes ? o.run_bytes : std::clamp<uint64_t>(host_budget / 8 / 4096 * 4096, 64u << 10, 8u << 20);
  return static_cast<uint64_t>(o.write_buffers) * run +
         (o.prefetch + 1ull) * ((a.tensor + 4095) / 4096 * 4096);
}

namespace {

uint64_t sat_sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

// The engine's placement of a row with `activations` bytes of the device taken by activations (the
// engine's device budget is what they leave; the CPU device shares the host's memory with the
// host tier).
Result<zero::Placement> place(const config::Config& cfg, const PlanInputs& in, const zero::TierBytes& have,
                              uint64_t activations) {
  zero::PlanTarget target;
  target.queued_gathers = !in.cuda;
  target.host_addressable = !in.cuda;
  target.host_memory = have.host;  // the buffers left to zoe are sized from it, as the engine does
  target.device_budget = sat_sub(have.device, activations);
  if (target.device_budget == 0) return out_of_budget("no device memory left");
  return zero::plan_placement(cfg, in.model.modules, in.topo.world(), 0, target);
}

// Whether the activation store would move checkpoints off the device for this row: offload is on
// and they do not fit (the placement refused them, or zoe.activation_device_budget is smaller).
bool offloads(const PlanInputs& in, const ActivationSizes& a, const Result<zero::Placement>& all_on_device) {
  if (!in.act.checkpointing || in.act.offload == ActivationOffload::kNone || a.count == 0) return false;
  if (in.act.device_budget && a.checkpoint > in.act.device_budget) return true;
  return !all_on_device.is_ok() && all_on_device.status().code() == StatusCode::kOutOfBudget;
}

// The checkpoints of the row placed (the device's room is what the plan and the workspace leave;
// the host's what the plan leaves, device bytes included on the CPU device, within the store's
// host budget), counted in its bytes and its workload's link traffic. Returns the bytes the host
// budget lacks (offload cpu: every checkpoint that leaves the device must fit it).
uint64_t place_checkpoints(const PlanInputs& in, const ActivationSizes& a, const zero::TierBytes& have,
                           const zero::Placement& plan, PlanRow* row, Workload* w) {
  const uint64_t dev_room = sat_sub(have.device, plan.peak.device + a.workspace);
  const uint64_t dev_part = std::min(a.checkpoint, in.act.device_budget ? in.act.device_budget : dev_room);
  const uint64_t host_used = plan.peak.host + (in.cuda ? 0 : plan.peak.device + a.workspace + dev_part);
  const uint64_t share = in.act.host_share ? in.act.host_share : have.host / 16;
  const uint64_t host_room = std::min(share, sat_sub(have.host, host_used));
  const zero::TierBytes t = split_checkpoints(a, in.act, dev_room, host_room);
  const uint64_t host_budget = in.act.host_budget ? in.act.host_budget : host_room;
  row->checkpoint_bytes = a.checkpoint;
  row->checkpoint_tiers = t;
  row->activation_bytes = a.workspace + t.device;
  row->bytes = plan.peak;
  // A row above the budget was planned again without one: its peak is what it needs.
  row->bytes.device = plan.peak.device + row->activation_bytes;
  row->bytes.host += t.host + (t.nvme ? nvme_host_buffers(a, in.act, host_budget) : 0);
  row->bytes.nvme += t.nvme;
  // The traffic per micro-batch: a layer-major step's checkpoints are its G micro-batches'.
  const uint64_t g = w->layer_major && w->grad_accum > 1 ? static_cast<uint64_t>(w->grad_accum) : 1;
  w->act = {in.act.checkpointing, t.host / g, t.nvme / g, a.tensor};
  const bool cpu = in.act.offload == ActivationOffload::kCpu;
  return cpu ? sat_sub(t.host, host_budget) : 0;
}

}  // namespace

zero::TierBytes per_rank_memory(const PlanInputs& in) {
  const uint64_t g = static_cast<uint64_t>(std::max(1, in.topo.gpus_per_node));
  return {in.device_mem / g, in.host_mem / g, in.nvme_space / g};
}

Result<PlanRow> plan_row(const PlanInputs& in, const RowPlacement& p) {
  const zero::TierBytes have = per_rank_memory(in);
  Workload w = in.work;
  w.params = in.model.params;
  w.layer_major = in.base.zoe.schedule == "layer-major";
  w.fetches_per_pass = in.model.fetches_per_pass;
  PlanRow row;
  row.placement = p;
  const config::Config cfg = config_for(in.base, p);
  const size_t es = cfg.bf16 || cfg.fp16.enabled ? 2 : 4;
  const ActivationSizes a =
      in.count_activations ? activation_sizes(in.model, w, es, in.act.checkpointing) : ActivationSizes{};
  // Every activation on the device first: the store offloads nothing when the run fits. Where
  // it does not and offload is on, only the workspace and the last checkpoint (keep_last) must.
  auto pl = place(cfg, in, have, a.workspace + a.checkpoint);
  if (offloads(in, a, pl)) pl = place(cfg, in, have, a.workspace + a.tensor);
  if (!pl.is_ok()) {
    if (pl.status().code() != StatusCode::kOutOfBudget) return pl.status().with_context(p.label());
    row.refused = pl.status().message();
    row.exact = false;
    zero::PlanTarget unbounded;
    unbounded.device_budget = uint64_t{1} << 60;
    unbounded.queued_gathers = false;
    pl = zero::plan_placement(cfg, in.model.modules, in.topo.world(), 0, unbounded);
    if (!pl.is_ok()) return row;  // a limit of the base config (zoe.host_budget): the row cannot run at all
  }
  const zero::Placement& plan = pl.value();
  for (const auto& m : plan.modules) {
    if (m.partitioned_params) row.largest_gathered = std::max<uint64_t>(row.largest_gathered, m.padded);
  }
  const uint64_t over_budget = place_checkpoints(in, a, have, plan, &row, &w);
  const uint64_t host_need = row.bytes.host + (in.cuda ? 0 : row.bytes.device);
  row.lacks.device = sat_sub(row.bytes.device, have.device);
  row.lacks.host = std::max(sat_sub(host_need, have.host), over_budget);
  row.lacks.nvme = sat_sub(row.bytes.nvme, have.nvme);
  row.fits = row.exact && !row.lacks.device && !row.lacks.host && !row.lacks.nvme;
  if (!row.exact && !row.lacks.device) row.lacks.device = 1;  // refused: it lacks at least something
  row.cost = estimate_step(cfg, plan, w, in.topo, in.rates, DeviceKind{!in.cuda});
  if (w.grad_accum > 1) {
    Workload other = w;
    other.layer_major = !w.layer_major;
    const double o = estimate_step(cfg, plan, other, in.topo, in.rates, DeviceKind{!in.cuda}).step_s;
    row.step_s_layer_major = w.layer_major ? row.cost.step_s : o;
    row.step_s_micro_batch = w.layer_major ? o : row.cost.step_s;
  }
  return row;
}

Result<PlanResult> make_plan(const PlanInputs& in) {
  if (in.topo.nodes < 1 || in.topo.gpus_per_node < 1) {
    return invalid_argument("--nodes %d --gpus-per-node %d: both must be at least 1", in.topo.nodes,
                            in.topo.gpus_per_node);
  }
  if (in.model.modules.empty()) return invalid_argument("the model has no modules");
  ZOE_RETURN_IF_ERROR_CTX(in.rates.validate(), "link rates");
  PlanResult res;
  res.params = in.model.params;
  res.per_rank = per_rank_memory(in);
  for (const RowPlacement& p : all_placements(in.base.zoe.optimizer_states, in.base.optimizer.type)) {
    ZOE_ASSIGN_OR_RETURN(PlanRow row, plan_row(in, p));
    res.rows.push_back(std::move(row));
  }
  std::stable_sort(res.rows.begin(), res.rows.end(), [](const PlanRow& a, const PlanRow& b) {
    if (a.fits != b.fits) return a.fits;
    return a.cost.step_s < b.cost.step_s;
  });
  return res;
}

Status nothing_fits(const PlanResult& r, const PlanInputs& in) {
  const PlanRow* best = nullptr;
  auto total = [](const PlanRow& x) { return x.lacks.device + x.lacks.host + x.lacks.nvme; };
  for (const PlanRow& x : r.rows) {
    if (x.bytes.device == 0 && x.bytes.host == 0 && x.bytes.nvme == 0) continue;  // could not be planned
    if (!best || total(x) < total(*best)) best = &x;
  }
  std::string where =
      std::to_string(in.topo.nodes) + " node(s) x " + std::to_string(in.topo.gpus_per_node) + " GPU(s)";
  if (!best)
    return out_of_budget("no placement of %s can be planned on %s", in.model.name.c_str(), where.c_str());
  std::string what;
  auto add = [&](const char* tier, uint64_t lack, uint64_t need, uint64_t have) {
    if (!lack) return;
    what += (what.empty() ? "" : "; ") + format_bytes(lack) + " of " + tier + " per rank (needs " +
            format_bytes(need) + ", a rank has " + format_bytes(have) + ")";
  };
  add("device memory", best->lacks.device, best->bytes.device, r.per_rank.device);
  add("host memory", best->lacks.host, best->bytes.host + (in.cuda ? 0 : best->bytes.device),
      r.per_rank.host);
  add("NVMe space", best->lacks.nvme, best->bytes.nvme, r.per_rank.nvme);
  const std::string why = best->refused.empty() ? "" : " (the engine's planner: " + best->refused + ")";
  return out_of_budget("no placement of %s (%llu parameters) fits on %s: the closest, %s, lacks %s%s",
                       in.model.name.c_str(), static_cast<unsigned long long>(r.params), where.c_str(),
                       best->placement.label().c_str(), what.c_str(), why.c_str());
}

Result<uint64_t> host_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  if (!f) return sys_error("open", "/proc/meminfo", errno);
  std::string line;
  while (std::getline(f, line)) {
    unsigned long long kb = 0;
    if (sscanf(line.c_str(), "MemTotal: %llu kB", &kb) == 1) return static_cast<uint64_t>(kb) * 1024;
  }
  return not_found("/proc/meminfo has no MemTotal line");
}

}  // namespace zoe::plan
