// Config: reading, validating and writing zoe's DeepSpeed-compatible JSON configuration.
//
// DeepSpeed keys zoe does not implement, by what they would change (kind -> what parse() does):
//
// 1. Nothing in the results (logging, profiling, checkpoint I/O, model-side helpers, launcher
//    options) -> accepted silently, contents unchecked:
//      steps_per_print, wall_clock_breakdown, dump_state, memory_breakdown, flops_profiler,
//      tensorboard, wandb, csv_monitor, comet, comms_logger, timers, autotuning,
//      activation_checkpointing, checkpoint, nebula, pipeline, dataloader_drop_last,
//      zero_allow_untested_optimizer, zero_force_ds_cpu_optimizer,
//      zero_optimization.{ignore_unused_parameters, memory_efficient_linear, elastic_checkpoint,
//      load_from_fp32_weights}, bf16.immediate_grad_update,
//      optimizer.params.{torch_adam, fused, foreach, capturable, differentiable}.
// 2. Placement, speed or communication, not the math of the update (or it would only make the
//    update less exact) -> accepted, listed in Config::unimplemented, one warning:
//      zero_optimization.round_robin_gradients true, zero_hpz_partition_size > 1, mics_shard_size > 0,
//      zero_quantized_{weights, gradients, nontrainable_weights} true, legacy_stage1 true,
//      prescale_gradients true, gradient_predivide_factor != 1, communication_data_type,
//      data_types.grad_accum_dtype, sparse_gradients true, fp16.auto_cast true,
//      fp16.fp16_master_weights_and_grads true, bf16.check_grad_overflow true,
//      scheduler.params.last_batch_iteration != -1.
// 3. What is trained, and zoe cannot do it -> error (unsupported or invalid argument):
//      optimizer types other than Adam/AdamW, amsgrad true, bias_correction false, maximize true,
//      max_grad_norm (DeepSpeed rejects it too: use gradient_clipping), schedulers other than
//      WarmupLR/WarmupDecayLR, {amp, elasticity, curriculum_learning, progressive_layer_drop,
//      data_efficiency, eigenvalue, quantize_training, hybrid_engine}.enabled true.
//
// Other decisions:
// - Booleans written as the strings "true"/"false" (DeepSpeed's NVMe tuner does this) are read as
//   the booleans they spell, with one warning listing them; any other string is an error.
//   (DeepSpeed's own runtime may read the string "false" as true.)
// - Integer keys accept whole doubles (5e8); 1.5 is an error.
// - Comments (// and /* */) are allowed; duplicate keys are errors (a JSON reader keeps one of
//   them silently).
// - Deprecated DeepSpeed spellings are read: thread_count (aio.intra_op_parallelism),
//   cpu_offload / cpu_offload_params / cpu_offload_use_pin_memory, the short names of the
//   stage3_* keys (prefetch_bucket_size, ...), stage3_gather_fp16_weights_on_model_save, and the
//   "bfloat16" block. Both spellings with different values are an error.
#include "config/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "config/json_reader.h"
#include "core/log.h"
#include "core/units.h"

namespace zoe::config {

using detail::Json;
using detail::JsonSection;
using detail::Range;
using detail::ReadContext;

const char* offload_device_name(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

bool Config::operator==(const Config& o) const {
  return train_batch_size == o.train_batch_size &&
         train_micro_batch_size_per_gpu == o.train_micro_batch_size_per_gpu &&
         gradient_accumulation_steps == o.gradient_accumulation_steps &&
         gradient_clipping == o.gradient_clipping && fp16 == o.fp16 && bf16 == o.bf16 && zero == o.zero &&
         aio == o.aio && optimizer == o.optimizer && scheduler == o.scheduler && zoe == o.zoe;
}

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
// Sane bounds (far above any real run, far below overflow of the products they enter; the
// error message gives the bound): batch sizes and accumulation steps, element counts (buffers,
// buckets, sub-groups: x 16 bytes stays far inside int64), pipeline buffers, threads.
constexpr int64_t kMaxBatch = int64_t{1} << 20;
constexpr int64_t kMaxElems = int64_t{1} << 50;
constexpr int64_t kMaxBufferCount = 1024;
constexpr int64_t kMaxThreads = 4096;
// io::IoEngine's range of the io_uring queue depth, and the largest I/O block.
constexpr int64_t kMaxQueueDepth = 4096;
constexpr int64_t kMaxBlockSize = int64_t{1} << 30;

// State of one parse beyond the JSON reader's.
struct Parser {
  ReadContext ctx;
  std::vector<std::string> unimplemented;

  void note(const std::string& path, const std::string& why) {
    unimplemented.push_back(why.empty() ? path : path + " (" + why + ")");
  }
};

Status unsupported_key(const std::string& path, const Json& v, const char* why) {
  return unsupported("%s: %s is not supported by zoe (%s)", path.c_str(), detail::describe(v).c_str(), why);
}

// A bool key that zoe does not implement when true.
Status note_if_true(JsonSection& s, Parser& p, const char* key, const char* why) {
  bool v = false;
  ZOE_RETURN_IF_ERROR(s.read(key, &v));
  if (v) p.note(s.key_path(key), why);
  return Status::ok();
}

// A feature block ({"enabled": true, ...}) that would change what is trained.
Status reject_if_enabled(JsonSection& top, const char* key, const char* why) {
  const Json* v = top.find(key);
  if (!v) return Status::ok();
  if (!v->is_object()) {
    return invalid_argument("%s: %s is not an object (expected {...})", key, detail::describe(*v).c_str());
  }
  auto e = v->find("enabled");
  if (e == v->end() || e->is_null()) return Status::ok();
  ZOE_ASSIGN_OR_RETURN(bool on, detail::to_bool(*e, std::string(key) + ".enabled", nullptr));
  if (on) return unsupported("%s.enabled: true is not supported by zoe (%s)", key, why);
  return Status::ok();
}

// Reads `name` and its deprecated alias into one value; both with different values is an error.
template <typename T, typename ReadFn>
Status read_aliased(JsonSection& s, const char* name, const char* alias, T* out, ReadFn read) {
  T a = *out, b = *out;
  ZOE_RETURN_IF_ERROR(read(name, &a));
  ZOE_RETURN_IF_ERROR(read(alias, &b));
  if (s.has(name) && s.has(alias) && !(a == b)) {
    return invalid_argument("%s and %s (its older name) are both given, with different values",
                            s.key_path(name).c_str(), s.key_path(alias).c_str());
  }
  *out = s.has(name) ? a : b;
  return Status::ok();
}

Status read_offload(JsonSection& s, OffloadConfig* o, bool is_param, Parser& p) {
  std::string dev = offload_device_name(o->device);
  ZOE_RETURN_IF_ERROR(s.read_choice("device", &dev, {"none", "cpu", "nvme"}, false));
  o->device = dev == "cpu"    ? OffloadDevice::kCpu
              : dev == "nvme" ? OffloadDevice::kNvme
                              : OffloadDevice::kNone;
  if (const Json* v = s.find("nvme_path")) {
    const std::string path = s.key_path("nvme_path");
    std::vector<std::string> paths;
    if (v->is_string()) {
      paths.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (size_t i = 0; i < v->size(); ++i) {
        if (!(*v)[i].is_string()) {
          return invalid_argument("%s[%zu]: %s is not a string (expected a directory path)", path.c_str(), i,
                                  detail::describe((*v)[i]).c_str());
        }
        paths.push_back((*v)[i].get<std::string>());
      }
    } else {
      return invalid_argument("%s: %s is not a path (expected a directory or a list of directories)",
                              path.c_str(), detail::describe(*v).c_str());
    }
    std::set<std::string> seen;
    for (const auto& d : paths) {
      if (d.empty()) return invalid_argument("%s: an empty string is not a directory", path.c_str());
      if (!seen.insert(d).second)
        return invalid_argument("%s: '%s' is listed twice", path.c_str(), d.c_str());
    }
    if (paths.empty()) return invalid_argument("%s: [] (expected at least one directory)", path.c_str());
    o->nvme_path = paths;
  }
  ZOE_RETURN_IF_ERROR(s.read("pin_memory", &o->pin_memory));
  ZOE_RETURN_IF_ERROR(s.read("buffer_count", &o->buffer_count, 1, kMaxBufferCount));
  if (is_param) {
    ZOE_RETURN_IF_ERROR(s.read("buffer_size", &o->buffer_size, 1, kMaxElems));
    ZOE_RETURN_IF_ERROR(s.read("max_in_cpu", &o->max_in_cpu, 0, kMaxElems));
  } else {
    ZOE_RETURN_IF_ERROR(s.read("pipeline_read", &o->pipeline_read));
    ZOE_RETURN_IF_ERROR(s.read("pipeline_write", &o->pipeline_write));
    ZOE_RETURN_IF_ERROR(s.read("fast_init", &o->fast_init));
    ZOE_RETURN_IF_ERROR(s.read("ratio", &o->ratio, Range{0.0, 1.0, true, false}));
  }
  s.finish();
  return Status::ok();
}

Status read_zero(JsonSection& top, ZeroConfig* z, Parser& p) {
  ZOE_ASSIGN_OR_RETURN(JsonSection s, top.section("zero_optimization"));
  ZOE_RETURN_IF_ERROR(s.read_choice("stage", &z->stage, {0, 1, 2, 3}));
  z->overlap_comm = z->stage == 3;  // DeepSpeed's default, unless the key says otherwise
  ZOE_RETURN_IF_ERROR(s.read("contiguous_gradients", &z->contiguous_gradients));
  ZOE_RETURN_IF_ERROR(s.read("reduce_scatter", &z->reduce_scatter));
  ZOE_RETURN_IF_ERROR(s.read("reduce_bucket_size", &z->reduce_bucket_size, 1, kMaxElems));
  ZOE_RETURN_IF_ERROR(s.read("allgather_partitions", &z->allgather_partitions));
  ZOE_RETURN_IF_ERROR(s.read("allgather_bucket_size", &z->allgather_bucket_size, 1, kMaxElems));
  ZOE_RETURN_IF_ERROR(s.read("overlap_comm", &z->overlap_comm));
  ZOE_RETURN_IF_ERROR(s.read("round_robin_gradients", &z->round_robin_gradients));
  if (z->round_robin_gradients) p.note(s.key_path("round_robin_gradients"), "");
  ZOE_RETURN_IF_ERROR(s.read("sub_group_size", &z->sub_group_size, 1, kMaxElems));

  auto int_reader = [&s](int64_t min, int64_t max = kMaxElems) {
    return [&s, min, max](const char* k, int64_t* out) { return s.read(k, out, min, max); };
  };
  // 0 is meaningful for these (no prefetch, nothing persistent, release at once).
  ZOE_RETURN_IF_ERROR(read_aliased(s, "stage3_prefetch_bucket_size", "prefetch_bucket_size",
                                   &z->stage3_prefetch_bucket_size, int_reader(0)));
  ZOE_RETURN_IF_ERROR(read_aliased(s, "stage3_param_persistence_threshold", "param_persistence_threshold",
                                   &z->stage3_param_persistence_threshold, int_reader(0)));
  ZOE_RETURN_IF_ERROR(read_aliased(s, "stage3_model_persistence_threshold", "model_persistence_threshold",
                                   &z->stage3_model_persistence_threshold, int_reader(0, kMaxInt)));
  ZOE_RETURN_IF_ERROR(read_aliased(s, "stage3_max_live_parameters", "max_live_parameters",
                                   &z->stage3_max_live_parameters, int_reader(0)));
  ZOE_RETURN_IF_ERROR(read_aliased(s, "stage3_max_reuse_distance", "max_reuse_distance",
                                   &z->stage3_max_reuse_distance, int_reader(0)));
  auto bool_reader = [&s](const char* k, bool* out) { return s.read(k, out); };
  bool gather = z->stage3_gather_16bit_weights_on_model_save;
  ZOE_RETURN_IF_ERROR(read_aliased(s, "stage3_gather_16bit_weights_on_model_save",
                                   "stage3_gather_fp16_weights_on_model_save", &gather, bool_reader));
  ZOE_RETURN_IF_ERROR(read_aliased(s, "stage3_gather_16bit_weights_on_model_save",
                                   "gather_16bit_weights_on_model_save", &gather, bool_reader));
  z->stage3_gather_16bit_weights_on_model_save = gather;

  ZOE_ASSIGN_OR_RETURN(JsonSection oo, s.section("offload_optimizer"));
  ZOE_RETURN_IF_ERROR(read_offload(oo, &z->offload_optimizer, false, p));
  ZOE_ASSIGN_OR_RETURN(JsonSection op, s.section("offload_param"));
  ZOE_RETURN_IF_ERROR(read_offload(op, &z->offload_param, true, p));

  // DeepSpeed's deprecated booleans for cpu offload.
  bool cpu_offload = false, cpu_offload_params = false, cpu_pin = true;
  ZOE_RETURN_IF_ERROR(s.read("cpu_offload", &cpu_offload));
  ZOE_RETURN_IF_ERROR(s.read("cpu_offload_params", &cpu_offload_params));
  ZOE_RETURN_IF_ERROR(s.read("cpu_offload_use_pin_memory", &cpu_pin));
  auto apply_old = [&](bool on, const char* old_key, const char* new_key, OffloadConfig* o,
                       JsonSection& sec) {
    if (!on) return Status::ok();
    if (sec.has("device") && o->device != OffloadDevice::kCpu) {
      return invalid_argument("%s: true contradicts %s.device \"%s\"", s.key_path(old_key).c_str(),
                              s.key_path(new_key).c_str(), offload_device_name(o->device));
    }
    ZOE_LOG_WARN("config: %s is deprecated; reading it as %s.device \"cpu\"", s.key_path(old_key).c_str(),
                 s.key_path(new_key).c_str());
    o->device = OffloadDevice::kCpu;
    if (s.has("cpu_offload_use_pin_memory")) o->pin_memory = cpu_pin;
    return Status::ok();
  };
  ZOE_RETURN_IF_ERROR(apply_old(cpu_offload, "cpu_offload", "offload_optimizer", &z->offload_optimizer, oo));
  ZOE_RETURN_IF_ERROR(
      apply_old(cpu_offload_params, "cpu_offload_params", "offload_param", &z->offload_param, op));

  for (const char* k : {"ignore_unused_parameters", "memory_efficient_linear", "elastic_checkpoint",
                        "load_from_fp32_weights"}) {
    s.accept(k);
  }
  ZOE_RETURN_IF_ERROR(note_if_true(s, p, "zero_quantized_weights", "quantized all-gather"));
  ZOE_RETURN_IF_ERROR(note_if_true(s, p, "zero_quantized_gradients", "quantized reduce-scatter"));
  ZOE_RETURN_IF_ERROR(note_if_true(s, p, "zero_quantized_nontrainable_weights", ""));
  ZOE_RETURN_IF_ERROR(note_if_true(s, p, "legacy_stage1", ""));
  int64_t hpz = 1, mics = -1;
  ZOE_RETURN_IF_ERROR(s.read("zero_hpz_partition_size", &hpz, 1, std::numeric_limits<int>::max()));
  if (hpz > 1) p.note(s.key_path("zero_hpz_partition_size"), "hierarchical partitioning");
  ZOE_RETURN_IF_ERROR(s.read("mics_shard_size", &mics, -1, std::numeric_limits<int>::max()));
  if (mics > 0) p.note(s.key_path("mics_shard_size"), "MiCS sharding");
  s.finish();
  return Status::ok();
}

Status read_aio(JsonSection& top, AioConfig* a) {
  ZOE_ASSIGN_OR_RETURN(JsonSection s, top.section("aio"));
  ZOE_RETURN_IF_ERROR(s.read("block_size", &a->block_size, 1, kMaxBlockSize));
  ZOE_RETURN_IF_ERROR(s.read("queue_depth", &a->queue_depth, 1, kMaxQueueDepth));
  ZOE_RETURN_IF_ERROR(
      read_aliased(s, "intra_op_parallelism", "thread_count", &a->intra_op_parallelism,
                   [&s](const char* k, int64_t* out) { return s.read(k, out, 1, kMaxThreads); }));
  ZOE_RETURN_IF_ERROR(s.read("single_submit", &a->single_submit));
  ZOE_RETURN_IF_ERROR(s.read("overlap_events", &a->overlap_events));
  ZOE_RETURN_IF_ERROR(s.read("use_gds", &a->use_gds));
  s.finish();
  return Status::ok();
}

Status read_precision(JsonSection& top, Config* c, Parser& p) {
  ZOE_ASSIGN_OR_RETURN(JsonSection s, top.section("fp16"));
  Fp16Config& f = c->fp16;
  ZOE_RETURN_IF_ERROR(s.read("enabled", &f.enabled));
  ZOE_RETURN_IF_ERROR(s.read("loss_scale", &f.loss_scale, Range::at_least(0)));
  ZOE_RETURN_IF_ERROR(s.read("initial_scale_power", &f.initial_scale_power, 0, 127));
  ZOE_RETURN_IF_ERROR(s.read("loss_scale_window", &f.loss_scale_window, 1, std::numeric_limits<int>::max()));
  ZOE_RETURN_IF_ERROR(s.read("hysteresis", &f.hysteresis, 1, std::numeric_limits<int>::max()));
  ZOE_RETURN_IF_ERROR(s.read("consecutive_hysteresis", &f.consecutive_hysteresis));
  ZOE_RETURN_IF_ERROR(s.read("min_loss_scale", &f.min_loss_scale, Range::above(0)));
  ZOE_RETURN_IF_ERROR(note_if_true(s, p, "auto_cast", "casting the model's inputs is the caller's"));
  ZOE_RETURN_IF_ERROR(note_if_true(s, p, "fp16_master_weights_and_grads", "zoe keeps fp32 master weights"));
  s.finish();

  // "bfloat16" is DeepSpeed's older name of the block.
  bool bf16 = false, bf16_old = false;
  for (auto [name, out] : {std::pair{"bf16", &bf16}, std::pair{"bfloat16", &bf16_old}}) {
    ZOE_ASSIGN_OR_RETURN(JsonSection b, top.section(name));
    ZOE_RETURN_IF_ERROR(b.read("enabled", out));
    b.accept("immediate_grad_update");
    ZOE_RETURN_IF_ERROR(note_if_true(b, p, "check_grad_overflow", ""));
    b.finish();
  }
  if (top.has("bf16") && top.has("bfloat16") && bf16 != bf16_old) {
    return invalid_argument("bf16.enabled and bfloat16.enabled (its older name) disagree");
  }
  c->bf16 = bf16 || bf16_old;
  return Status::ok();
}

Status read_optimizer(JsonSection& top, OptimizerConfig* o) {
  ZOE_ASSIGN_OR_RETURN(JsonSection s, top.section("optimizer"));
  if (const Json* t = s.find("type")) {
    if (!t->is_string()) {
      return invalid_argument("optimizer.type: %s is not a string (expected \"Adam\" or \"AdamW\")",
                              detail::describe(*t).c_str());
    }
    ZOE_RETURN_IF_ERROR(s.read_choice("type", &o->type, {"Adam", "AdamW"}, true));
  }
  ZOE_ASSIGN_OR_RETURN(JsonSection pr, s.section("params"));
  ZOE_RETURN_IF_ERROR(pr.read("lr", &o->lr, Range::at_least(0), /*fp32=*/true));
  if (const Json* b = pr.find("betas")) {
    const std::string path = pr.key_path("betas");
    if (!b->is_array() || b->size() != 2) {
      return invalid_argument("%s: %s is not a pair (expected [beta1, beta2], e.g. [0.9, 0.999])",
                              path.c_str(), detail::describe(*b).c_str());
    }
    Range r{0.0, 1.0, false, true};
    ZOE_ASSIGN_OR_RETURN(o->beta1, detail::to_double((*b)[0], path + "[0]", r, /*fp32=*/true));
    ZOE_ASSIGN_OR_RETURN(o->beta2, detail::to_double((*b)[1], path + "[1]", r, /*fp32=*/true));
  }
  ZOE_RETURN_IF_ERROR(pr.read("eps", &o->eps, Range::above(0), /*fp32=*/true));
  ZOE_RETURN_IF_ERROR(pr.read("weight_decay", &o->weight_decay, Range::at_least(0), /*fp32=*/true));
  bool w_mode = true;
  ZOE_RETURN_IF_ERROR(pr.read("adam_w_mode", &w_mode));
  // DeepSpeed: decoupled decay if the type is AdamW or adam_w_mode (default true).
  o->adam_w_mode = o->type == "AdamW" || w_mode;

  bool amsgrad = false, bias_correction = true, maximize = false;
  ZOE_RETURN_IF_ERROR(pr.read("amsgrad", &amsgrad));
  if (amsgrad) return unsupported_key(pr.key_path("amsgrad"), true, "AMSGrad is not implemented");
  ZOE_RETURN_IF_ERROR(pr.read("bias_correction", &bias_correction));
  if (!bias_correction) {
    return unsupported_key(pr.key_path("bias_correction"), false, "zoe's Adam always corrects the bias");
  }
  ZOE_RETURN_IF_ERROR(pr.read("maximize", &maximize));
  if (maximize) return unsupported_key(pr.key_path("maximize"), true, "zoe's Adam minimises");
  if (const Json* m = pr.find("max_grad_norm")) {
    return unsupported_key(pr.key_path("max_grad_norm"), *m,
                           "use the top-level gradient_clipping, as DeepSpeed asks");
  }
  for (const char* k : {"torch_adam", "fused", "foreach", "capturable", "differentiable"}) pr.accept(k);
  pr.finish();
  s.finish();
  return Status::ok();
}

Status read_scheduler(JsonSection& top, SchedulerConfig* sc, Parser& p) {
  ZOE_ASSIGN_OR_RETURN(JsonSection s, top.section("scheduler"));
  if (top.has("scheduler") && !s.has("type")) {
    return invalid_argument("scheduler.type is missing (expected \"WarmupLR\" or \"WarmupDecayLR\")");
  }
  ZOE_RETURN_IF_ERROR(s.read_choice("type", &sc->type, {"WarmupLR", "WarmupDecayLR"}, false));
  ZOE_ASSIGN_OR_RETURN(JsonSection pr, s.section("params"));
  ZOE_RETURN_IF_ERROR(pr.read("warmup_min_lr", &sc->warmup_min_lr, Range::at_least(0), /*fp32=*/true));
  ZOE_RETURN_IF_ERROR(pr.read("warmup_max_lr", &sc->warmup_max_lr, Range::at_least(0), /*fp32=*/true));
  ZOE_RETURN_IF_ERROR(pr.read("warmup_num_steps", &sc->warmup_num_steps, 0));
  ZOE_RETURN_IF_ERROR(pr.read_choice("warmup_type", &sc->warmup_type, {"log", "linear"}, false));
  ZOE_RETURN_IF_ERROR(pr.read("total_num_steps", &sc->total_num_steps, 1));
  int64_t last = -1;
  ZOE_RETURN_IF_ERROR(pr.read("last_batch_iteration", &last, -1));
  if (last != -1) p.note(pr.key_path("last_batch_iteration"), "resume position comes from the checkpoint");
  pr.finish();
  s.finish();
  if (sc->type == "WarmupDecayLR" && !pr.has("total_num_steps")) {
    return invalid_argument("scheduler.params.total_num_steps is missing (WarmupDecayLR decays to 0 there)");
  }
  if (sc->type == "WarmupDecayLR" && sc->total_num_steps < sc->warmup_num_steps) {
    ZOE_LOG_WARN("config: scheduler.params.total_num_steps %lld is less than warmup_num_steps %lld",
                 static_cast<long long>(sc->total_num_steps), static_cast<long long>(sc->warmup_num_steps));
  }
  return Status::ok();
}

// A byte count: an integer or a "256MiB"-style string.
Status read_bytes(JsonSection& s, const char* key, int64_t* out) {
  const Json* v = s.find(key);
  if (!v) return Status::ok();
  const std::string path = s.key_path(key);
  if (v->is_string()) {
    auto b = parse_bytes(v->get<std::string>());
    if (!b.is_ok() || b.value() > static_cast<uint64_t>(kMaxInt)) {
      return invalid_argument(
          "%s: %s is not a byte size (expected bytes >= 0 or a string like \"256MiB\", \"64GiB\")",
          path.c_str(), detail::describe(*v).c_str());
    }
    *out = static_cast<int64_t>(b.value());
    return Status::ok();
  }
  ZOE_ASSIGN_OR_RETURN(*out, detail::to_int(*v, path, 0, kMaxInt));
  return Status::ok();
}

Status read_zoe(JsonSection& top, ZoeConfig* z) {
  ZOE_ASSIGN_OR_RETURN(JsonSection s, top.section("zoe"));
  ZOE_RETURN_IF_ERROR(read_bytes(s, "device_budget", &z->device_budget_bytes));
  ZOE_RETURN_IF_ERROR(read_bytes(s, "host_budget", &z->host_budget_bytes));
  // Enforced by the placement planner (src/zero/placement.cpp): a placement whose host memory
  // (offloaded states, partitions, swapper and staging buffers) exceeds it is refused at
  // initialize(), naming the key.
  ZOE_RETURN_IF_ERROR(s.read("offload_ratio", &z->offload_ratio, Range{0.0, 1.0}));
  ZOE_RETURN_IF_ERROR(s.read("bf16_optimizer_states", &z->bf16_optimizer_states));
  ZOE_RETURN_IF_ERROR(s.read_choice("device", &z->device, {"auto", "cpu", "cuda"}, false));
  ZOE_RETURN_IF_ERROR(s.read("optimizer_threads", &z->optimizer_threads, 0, kMaxThreads));
  ZOE_RETURN_IF_ERROR(s.read("overlap_step", &z->overlap_step));
  ZOE_RETURN_IF_ERROR(s.read("swap_checksum", &z->swap_checksum));
  s.finish();
  return Status::ok();
}

// DeepSpeed's rule: any two of the three give the third; one alone means accumulation 1.
Status resolve_batch(JsonSection& top, Config* c, int world_size) {
  const bool has_tbs = top.has("train_batch_size"), has_micro = top.has("train_micro_batch_size_per_gpu"),
             has_gas = top.has("gradient_accumulation_steps");
  int64_t& tbs = c->train_batch_size;
  int64_t& micro = c->train_micro_batch_size_per_gpu;
  int64_t& gas = c->gradient_accumulation_steps;
  const int64_t w = world_size;
  if (has_tbs && !has_micro) {
    int64_t per_rank_steps = has_gas ? gas * w : w;
    if (tbs % per_rank_steps != 0) {
      return invalid_argument(
          "train_batch_size: %lld is not divisible by gradient_accumulation_steps %lld x world size %lld",
          static_cast<long long>(tbs), static_cast<long long>(has_gas ? gas : 1), static_cast<long long>(w));
    }
    micro = tbs / per_rank_steps;
  } else if (has_tbs && has_micro && !has_gas) {
    if (tbs % (micro * w) != 0) {
      return invalid_argument(
          "train_batch_size: %lld is not divisible by train_micro_batch_size_per_gpu %lld x world size %lld",
          static_cast<long long>(tbs), static_cast<long long>(micro), static_cast<long long>(w));
    }
    gas = tbs / (micro * w);
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
        "gradient_accumulation_steps "
        "%lld x world size %lld = %lld",
        static_cast<long long>(tbs), static_cast<long long>(micro), static_cast<long long>(gas),
        static_cast<long long>(w), static_cast<long long>(product));
  }
  tbs = product;
  return Status::ok();
}

Status check_nvme_paths(const OffloadConfig& o, const char* section) {
  if (o.device != OffloadDevice::kNvme) return Status::ok();
  if (o.nvme_path.empty()) {
    return invalid_argument(
        "zero_optimization.%s.device: \"nvme\" needs zero_optimization.%s.nvme_path "
        "(a directory on the NVMe drive, or a list of them)",
        section, section);
  }
  for (const auto& d : o.nvme_path) {
    struct stat st {};
    if (stat(d.c_str(), &st) != 0) {
      int err = errno;
      return Status(
          err == ENOENT ? StatusCode::kNotFound : StatusCode::kInvalidArgument,
          "zero_optimization." + std::string(section) + ".nvme_path: '" + d + "' " +
              (err == ENOENT ? "does not exist" : "cannot be examined: " + std::string(strerror(err))),
          err);
    }
    if (!S_ISDIR(st.st_mode)) {
      return invalid_argument("zero_optimization.%s.nvme_path: '%s' is not a directory", section, d.c_str());
    }
    if (access(d.c_str(), W_OK | X_OK) != 0) {
      int err = errno;
      return Status(StatusCode::kPermissionDenied,
                    "zero_optimization." + std::string(section) + ".nvme_path: '" + d +
                        "' is not writable: " + strerror(err),
                    err);
    }
  }
  return Status::ok();
}

Status check_contradictions(const Config& c) {
  if (c.fp16.enabled && c.bf16) {
    return invalid_argument("fp16.enabled and bf16.enabled are both true (choose one precision)");
  }
  const ZeroConfig& z = c.zero;
  if (z.offload_param.device != OffloadDevice::kNone && z.stage < 3) {
    return invalid_argument(
        "zero_optimization.offload_param.device: \"%s\" needs zero_optimization.stage 3 "
        "(stage is %d; parameters are partitioned only at stage 3)",
        offload_device_name(z.offload_param.device), z.stage);
  }
  if (z.offload_optimizer.device != OffloadDevice::kNone && z.stage < 1) {
    return invalid_argument(
        "zero_optimization.offload_optimizer.device: \"%s\" needs zero_optimization.stage 1, "
        "2 or 3 (stage is 0)",
        offload_device_name(z.offload_optimizer.device));
  }
  ZOE_RETURN_IF_ERROR(check_nvme_paths(z.offload_optimizer, "offload_optimizer"));
  ZOE_RETURN_IF_ERROR(check_nvme_paths(z.offload_param, "offload_param"));
  return Status::ok();
}

// The top-level keys: everything but the sections.
Status read_top(JsonSection& top, Config* c, Parser& p, int world_size) {
  ZOE_RETURN_IF_ERROR(top.read("train_batch_size", &c->train_batch_size, 1));
  ZOE_RETURN_IF_ERROR(
      top.read("train_micro_batch_size_per_gpu", &c->train_micro_batch_size_per_gpu, 1, kMaxBatch));
  ZOE_RETURN_IF_ERROR(top.read("gradient_accumulation_steps", &c->gradient_accumulation_steps, 1, kMaxBatch));
  ZOE_RETURN_IF_ERROR(resolve_batch(top, c, world_size));
  ZOE_RETURN_IF_ERROR(
      top.read("gradient_clipping", &c->gradient_clipping, Range::at_least(0), /*fp32=*/true));

  ZOE_RETURN_IF_ERROR(read_zero(top, &c->zero, p));
  ZOE_RETURN_IF_ERROR(read_aio(top, &c->aio));
  ZOE_RETURN_IF_ERROR(read_precision(top, c, p));
  ZOE_RETURN_IF_ERROR(read_optimizer(top, &c->optimizer));
  ZOE_RETURN_IF_ERROR(read_scheduler(top, &c->scheduler, p));
  ZOE_RETURN_IF_ERROR(read_zoe(top, &c->zoe));
  // Partial offload: DeepSpeed's offload_optimizer.ratio and zoe.offload_ratio mean the same.
  {
    const double ds = c->zero.offload_optimizer.ratio, zr = c->zoe.offload_ratio;
    if (ds != 1.0 && zr != 1.0 && ds != zr) {
      return invalid_argument(
          "zero_optimization.offload_optimizer.ratio %g and zoe.offload_ratio %g disagree "
          "(they are the same setting: give one)",
          ds, zr);
    }
    if (ds != 1.0) c->zoe.offload_ratio = ds;
    c->zero.offload_optimizer.ratio = c->zoe.offload_ratio;
  }

  for (const char* k :
       {"steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown", "flops_profiler",
        "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "timers", "autotuning",
        "activation_checkpointing", "checkpoint", "nebula", "pipeline", "dataloader_drop_last",
        "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"}) {
    top.accept(k);
  }
  ZOE_RETURN_IF_ERROR(note_if_true(top, p, "prescale_gradients", ""));
  ZOE_RETURN_IF_ERROR(note_if_true(top, p, "sparse_gradients", ""));
  double predivide = 1.0;
  ZOE_RETURN_IF_ERROR(top.read("gradient_predivide_factor", &predivide, Range::above(0)));
  if (predivide != 1.0) p.note("gradient_predivide_factor", "");
  if (const Json* v = top.find("communication_data_type")) {
    p.note("communication_data_type", "zoe reduces in the gradients' dtype; given " + detail::describe(*v));
  }
  {
    ZOE_ASSIGN_OR_RETURN(JsonSection dt, top.section("data_types"));
    if (const Json* v = dt.find("grad_accum_dtype")) {
      p.note(dt.key_path("grad_accum_dtype"), "given " + detail::describe(*v));
    }
    dt.finish();
  }
  ZOE_RETURN_IF_ERROR(reject_if_enabled(top, "amp", "Apex AMP; use fp16 or bf16"));
  ZOE_RETURN_IF_ERROR(reject_if_enabled(top, "elasticity", "elastic batch sizes would change the batch"));
  for (const char* k : {"curriculum_learning", "progressive_layer_drop", "data_efficiency", "eigenvalue",
                        "quantize_training", "hybrid_engine"}) {
    ZOE_RETURN_IF_ERROR(reject_if_enabled(top, k, "it would change what is trained"));
  }
  top.finish();
  return Status::ok();
}

}  // namespace

Result<Config> Config::parse(const std::string& json_text, int world_size) {
  if (world_size < 1) return invalid_argument("world size %d: expected >= 1", world_size);
  ZOE_ASSIGN_OR_RETURN(Json j, parse_json_checked(json_text, "config"));
  if (!j.is_object()) {
    return invalid_argument("the config is %s, not a JSON object ({...})", detail::describe(j).c_str());
  }
  Config c;
  Parser p;
  JsonSection top(&j, "", &p.ctx);
  ZOE_RETURN_IF_ERROR(read_top(top, &c, p, world_size));
  std::string unknown = detail::unknown_keys_message(p.ctx);
  if (!unknown.empty()) return invalid_argument("%s", unknown.c_str());
  ZOE_RETURN_IF_ERROR(check_contradictions(c));

  if (!p.ctx.string_booleans.empty()) {
    std::string list;
    for (const auto& k : p.ctx.string_booleans) list += (list.empty() ? "" : ", ") + k;
    ZOE_LOG_WARN(
        "config: booleans written as strings, read as the booleans they spell: %s (write true/false "
        "without quotes; DeepSpeed's runtime may read \"false\" as true)",
        list.c_str());
  }
  c.unimplemented = std::move(p.unimplemented);
  if (!c.unimplemented.empty()) {
    std::string list;
    for (const auto& k : c.unimplemented) list += (list.empty() ? "" : ", ") + k;
    ZOE_LOG_WARN("config: DeepSpeed settings zoe does not implement (ignored): %s", list.c_str());
  }
  return c;
}

Result<Config> Config::load(const std::string& path, int world_size) {
  ZOE_ASSIGN_OR_RETURN(std::string text, read_file_capped(path, JsonLimits{}.max_bytes, "config file"));
  auto c = parse(text, world_size);
  if (!c.is_ok()) return c.status().with_context("while reading config file " + path);
  return c;
}

double Config::lr_at_iteration(int64_t iteration) const {
  const SchedulerConfig& s = scheduler;
  if (s.type.empty()) return optimizer.lr;
  if (iteration < 0) return s.warmup_min_lr;
  // DeepSpeed warms up over at least 2 steps (so log(warmup) is never 0).
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);
  double gamma = 1.0;
  if (iteration < warmup) {
    gamma = s.warmup_type == "linear"
                ? static_cast<double>(iteration) / static_cast<double>(warmup)
                : std::log(static_cast<double>(iteration + 1)) / std::log(static_cast<double>(warmup));
  } else if (s.type == "WarmupDecayLR") {
    double left = static_cast<double>(s.total_num_steps - iteration);
    double span = std::max(1.0, static_cast<double>(s.total_num_steps - warmup));
    gamma = std::max(0.0, left / span);
  }
  return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
}

double Config::lr_at(int64_t step) const { return lr_at_iteration(step - 2); }

namespace {

nlohmann::ordered_json offload_json(const OffloadConfig& o, bool is_param) {
  nlohmann::ordered_json j;
  j["device"] = offload_device_name(o.device);
  // One path as a string, as DeepSpeed writes it; several as a list.
  if (o.nvme_path.size() == 1) {
    j["nvme_path"] = o.nvme_path[0];
  } else if (!o.nvme_path.empty()) {
    j["nvme_path"] = o.nvme_path;
  }
  j["pin_memory"] = o.pin_memory;
  j["buffer_count"] = o.buffer_count;
  if (is_param) {
    j["buffer_size"] = o.buffer_size;
    j["max_in_cpu"] = o.max_in_cpu;
  } else {
    j["pipeline_read"] = o.pipeline_read;
    j["pipeline_write"] = o.pipeline_write;
    j["fast_init"] = o.fast_init;
    j["ratio"] = o.ratio;
  }
  return j;
}

}  // namespace

std::string Config::to_json() const {
  nlohmann::ordered_json j;
  j["train_batch_size"] = train_batch_size;
  j["train_micro_batch_size_per_gpu"] = train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = gradient_accumulation_steps;
  j["gradient_clipping"] = gradient_clipping;

  nlohmann::ordered_json& z = j["zero_optimization"];
  z["stage"] = zero.stage;
  z["contiguous_gradients"] = zero.contiguous_gradients;
  z["reduce_scatter"] = zero.reduce_scatter;
  z["reduce_bucket_size"] = zero.reduce_bucket_size;
  z["allgather_partitions"] = zero.allgather_partitions;
  z["allgather_bucket_size"] = zero.allgather_bucket_size;
  z["overlap_comm"] = zero.overlap_comm;
  z["round_robin_gradients"] = zero.round_robin_gradients;
  z["sub_group_size"] = zero.sub_group_size;
  z["stage3_prefetch_bucket_size"] = zero.stage3_prefetch_bucket_size;
  z["stage3_param_persistence_threshold"] = zero.stage3_param_persistence_threshold;
  z["stage3_model_persistence_threshold"] = zero.stage3_model_persistence_threshold;
  z["stage3_max_live_parameters"] = zero.stage3_max_live_parameters;
  z["stage3_max_reuse_distance"] = zero.stage3_max_reuse_distance;
  z["stage3_gather_16bit_weights_on_model_save"] = zero.stage3_gather_16bit_weights_on_model_save;
  z["offload_optimizer"] = offload_json(zero.offload_optimizer, false);
  z["offload_param"] = offload_json(zero.offload_param, true);

  j["aio"] = {{"block_size", aio.block_size},
              {"queue_depth", aio.queue_depth},
              {"intra_op_parallelism", aio.intra_op_parallelism},
              {"single_submit", aio.single_submit},
              {"overlap_events", aio.overlap_events},
              {"use_gds", aio.use_gds}};
  j["fp16"] = {{"enabled", fp16.enabled},
               {"loss_scale", fp16.loss_scale},
               {"initial_scale_power", fp16.initial_scale_power},
               {"loss_scale_window", fp16.loss_scale_window},
               {"hysteresis", fp16.hysteresis},
               {"consecutive_hysteresis", fp16.consecutive_hysteresis},
               {"min_loss_scale", fp16.min_loss_scale}};
  j["bf16"] = {{"enabled", bf16}};
  j["optimizer"] = {{"type", optimizer.type},
                    {"params",
                     {{"lr", optimizer.lr},
                      {"betas", {optimizer.beta1, optimizer.beta2}},
                      {"eps", optimizer.eps},
                      {"weight_decay", optimizer.weight_decay},
                      {"adam_w_mode", optimizer.adam_w_mode}}}};
  // No scheduler: the key is left out (its fields have no effect then).
  if (!scheduler.type.empty()) {
    nlohmann::ordered_json params = {{"warmup_min_lr", scheduler.warmup_min_lr},
                                     {"warmup_max_lr", scheduler.warmup_max_lr},
                                     {"warmup_num_steps", scheduler.warmup_num_steps},
                                     {"warmup_type", scheduler.warmup_type}};
    if (scheduler.total_num_steps != 0) params["total_num_steps"] = scheduler.total_num_steps;
    j["scheduler"] = {{"type", scheduler.type}, {"params", params}};
  }
  j["zoe"] = {{"device_budget", zoe.device_budget_bytes},
              {"host_budget", zoe.host_budget_bytes},
              {"offload_ratio", zoe.offload_ratio},
              {"bf16_optimizer_states", zoe.bf16_optimizer_states},
              {"device", zoe.device},
              {"optimizer_threads", zoe.optimizer_threads},
              {"overlap_step", zoe.overlap_step},
              {"swap_checksum", zoe.swap_checksum}};
  return j.dump(2) + "\n";
}

}  // namespace zoe::config
