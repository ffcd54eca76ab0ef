// Config: zoe's training configuration, read from DeepSpeed-compatible JSON. DeepSpeed's keys
// mean what they mean in DeepSpeed (defaults are the ones its code applies); keys zoe adds live
// under "zoe". Unknown keys are errors naming their JSON path; recognised DeepSpeed keys that
// zoe does not implement are accepted silently when they cannot change results (logging,
// profiling), accepted with one warning listing them when they would change only placement or
// speed, and errors when they would change what is trained (amsgrad, other optimizers). Every
// key, with its default, range, older spellings and that disposition, is one row of the table in
// config_table.cpp; the rules between keys are in config_rules.cpp.
#pragma once

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "config/lr_schedule.h"
#include "zoe/offload.h"
#include "zoe/status.h"

namespace zoe::config {

// zero_optimization.offload_optimizer / offload_param.
struct OffloadConfig {
  Offload device = Offload::kNone;
  std::vector<std::string> nvme_path;  // one or several directories (a string or a list)
  bool pin_memory = true;
  int64_t buffer_count = 4;         // offload_optimizer: 4; offload_param: 5
  int64_t buffer_size = 100000000;  // elements (offload_param)
  int64_t max_in_cpu = 1000000000;  // elements (offload_param with nvme)
  bool pipeline_read = false;       // offload_optimizer
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;  // offload_optimizer: fraction of the step on the CPU

  bool operator==(const OffloadConfig&) const = default;
};

struct AioConfig {
  int64_t block_size = 1048576;
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;  // "thread_count" in older files
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;

  bool operator==(const AioConfig&) const = default;
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;  // elements
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500000000;
  bool overlap_comm = false;  // DeepSpeed: true for stage 3 unless set
  bool round_robin_gradients = false;
  int64_t sub_group_size = 1000000000;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_model_persistence_threshold = std::numeric_limits<int64_t>::max();
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param = [] {  // buffer_count defaults to 5 here
    OffloadConfig o;
    o.buffer_count = 5;
    return o;
  }();

  bool operator==(const ZeroConfig&) const = default;
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0;  // 0: dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;

  bool operator==(const Fp16Config&) const = default;
};

struct OptimizerConfig {
  std::string type = "AdamW";  // "Adam" or "AdamW", as written (any case in the file)
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // The decay the step must use: true = decoupled (AdamW), false = L2 added to the gradient.
  // As in DeepSpeed, "Adam" means decoupled decay unless params.adam_w_mode is false; "AdamW"
  // is always decoupled. Use this, not `type`.
  bool adam_w_mode = true;
  // optimizer.type "Muon" (DeepSpeed's names): the rate of the matrices Muon updates and of the
  // parameters its auxiliary AdamW updates (each defaults to lr when lr is given, else to
  // DeepSpeed's MuonWithAuxAdam defaults 0.02 and 3e-4), and Muon's momentum.
  double muon_lr = 0.02, adam_lr = 3e-4;
  double momentum = 0.95;
  // optimizer.type "AdamMini" (the adam-mini package's names): the hidden size and the attention
  // heads its per-head blocks are cut by (dim*dim/n_heads elements; the package's defaults), and the
  // key/value heads (0: n_heads), which must divide n_heads.
  int64_t dim = 2048, n_heads = 32, n_kv_heads = 0;

  bool operator==(const OptimizerConfig&) const = default;
};

// The device zoe.device "auto" picks on this host: zoe's CPU device ("cpu"); the engine uses a GPU
// only where "cuda" is asked for.
inline const char* auto_device() { return "cpu"; }

// Keys under "zoe".
struct ZoeConfig {
  int64_t device_budget_bytes = 0;  // 0: the whole device; accepts "256MiB"-style strings
  double offload_ratio = 1.0;       // partial offload: fraction of optimizer states on host/NVMe
  bool bf16_optimizer_states =
      false;                    // the older spelling of optimizer_states "bf16" (kept equal by the rules)
  std::string device = "auto";  // "auto" (= "cpu" for now) or "cpu"; "cuda": the engine on this rank's GPU
  // 0: no limit. Enforced by the placement planner (src/zero/placement.cpp) at initialize().
  int64_t host_budget_bytes = 0;
  int64_t optimizer_threads = 0;  // 0: all cores
  // The optimizer update runs behind the next forward (each fetch waits only for its module's
  // update); false: step() returns after the whole update. Results are the same bits either way.
  bool overlap_step = true;
  // The update of each module whose optimizer states are in host RAM runs during the backward, as
  // soon as its gradients are final, as if the step will neither clip nor overflow; the step keeps
  // it when the norm agrees and otherwise puts the saved states back and updates again. The same
  // bits as without it.
  bool speculative_step = false;
  bool swap_checksum = false;   // checksum every swap write, verify every read (io::SwapFileOptions)
  bool swap_hole_check = true;  // a read from a swap file with holes punched into it fails
  // Under MPI: a rank silent this long (no heartbeat on zoe's own TCP channel) is lost, and every
  // other rank exits naming it (comm/heartbeat.h). 0: never. Without the key: ZOE_COMM_TIMEOUT_S,
  // else 30.
  double comm_timeout_s = 30.0;
  // The endurance the NVMe drive is rated for, in terabytes written (TBW, 1 TB = 1e12 bytes): zoe
  // train reports the share of it the run's NVMe writes used. 0: not given (unknown).
  double drive_tbw = 0;
  // The activation store (zoe/activations.h): where checkpointed activations live between a
  // micro-batch's forward and backward. "none" keeps them on the device.
  std::string activation_offload = "none";  // none | cpu | nvme
  // Pinned host bytes of the store (its host tier, NVMe write buffers, read-ahead); 0: a quarter of
  // zoe.host_budget (at most what the placement leaves of it), else 1/16 of the host's memory per rank.
  int64_t activation_host_budget_bytes = 0;
  // The device's activation share; 0: zoe.device_budget minus the placement's device peak.
  int64_t activation_device_budget_bytes = 0;
  int64_t activation_prefetch = 2;        // NVMe reads ahead of use in the backward
  int64_t activation_min_bytes = 262144;  // smaller saved tensors stay on the device
  // Directories of the activation swap file; empty: offload_param's nvme_path, else
  // offload_optimizer's (the same placeholders, config/paths.h).
  std::vector<std::string> activation_nvme_path;

  // Adam's m and v as stored in every tier (optim/lowbit.h): "fp32", "bf16", "int8", "int4"
  // (blockwise quantized). zoe.bf16_optimizer_states: true is the older spelling of "bf16".
  std::string optimizer_states = "fp32";
  // The master weights the optimizer updates: "fp32", or "bf16" (rounded stochastically).
  std::string master_weights = "fp32";
  // The order of a step with gradient_accumulation_steps > 1: "micro-batch" (each micro-batch's
  // forward and backward through every module in turn) or "layer-major" (each module once per
  // step in the forward and once in the backward, every micro-batch through it; include/zoe/engine.h
  // says what the engine then expects of its caller).
  std::string schedule = "micro-batch";

  bool operator==(const ZoeConfig&) const = default;
};

// DeepSpeed's activation_checkpointing section. The caller (a trainer) turns checkpointing on when
// the section is given; the store honours cpu_checkpointing (zoe.activation_offload "cpu" unless
// that key is given). partition_activations, contiguous_memory_optimization and profile have no
// effect in zoe (warned once when true); number_checkpoints and synchronize_checkpoint_boundary
// are for the caller.
struct ActivationCheckpointingConfig {
  bool given = false;  // the section is in the config
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  int64_t number_checkpoints = 0;  // 0: not given (DeepSpeed's null)
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;

  bool operator==(const ActivationCheckpointingConfig&) const = default;
};

struct Config {
  // parse() fills the three batch keys the way DeepSpeed does (any two give the third; one alone
  // means accumulation 1), so after parse train_batch_size = micro x accumulation x world size.
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 1;
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;  // 0: off
  Fp16Config fp16;
  bool bf16 = false;
  ZeroConfig zero;
  AioConfig aio;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZoeConfig zoe;
  ActivationCheckpointingConfig activation_checkpointing;
  // Recognised DeepSpeed keys without effect in zoe yet (their JSON paths); parse() also logs
  // one warning listing them.
  std::vector<std::string> unimplemented;
  // The JSON paths the text gave (each spelling, aliases too; not compared by ==): a value zoe
  // uses other than as given is warned about only when the user wrote it, not for a DeepSpeed
  // default nobody chose.
  std::set<std::string> given_keys;
  bool given(const std::string& path) const { return given_keys.count(path) != 0; }

  // Parses and validates. world_size checks train_batch_size = micro x accumulation x world.
  // Errors name the key's JSON path (e.g. "zero_optimization.offload_param.device"), the value
  // given and what is allowed; contradictions (nvme offload without nvme_path, fp16 and bf16 both
  // on, param offload below stage 3) too. It touches no file: whether the nvme_path directories
  // exist and are writable is check_paths' question (config/paths.h), asked at engine creation.
  static Result<Config> parse(const std::string& json_text, int world_size = 1);
  // Reads the file through read_file_capped and parse_json_checked (json_reader.h): at most
  // JsonLimits::max_bytes (16 MiB), nesting at most 64 deep, no NUL bytes.
  static Result<Config> load(const std::string& path, int world_size = 1);

  // The learning rate of optimizer update `step` (1-based): lr_at_step (lr_schedule.h) of the
  // scheduler section, optimizer.lr without a scheduler.
  double lr_at(int64_t step) const { return lr_at_step(scheduler, optimizer.lr, step); }
  // optimizer.type "Muon": the rate of update `step` of a parameter group whose own rate is `base`
  // (optimizer.muon_lr for the matrices, adam_lr for the rest): `base`, shaped by the scheduler
  // when there is one (base x the schedule's rate / its peak, warmup_max_lr). DeepSpeed's
  // schedulers instead write the schedule's rate into every group, which would drop both keys.
  double group_lr_at(int64_t step, double base) const {
    if (scheduler.type.empty()) return base;
    return scheduler.warmup_max_lr > 0 ? base * lr_at(step) / scheduler.warmup_max_lr : 0.0;
  }
  // The schedule at DeepSpeed's last_batch_iteration `iteration` (>= 0; below 0: warmup_min_lr).
  double lr_at_iteration(int64_t iteration) const {
    return config::lr_at_iteration(scheduler, optimizer.lr, iteration);
  }
  // Which keys to_json writes. kEvery: every field. kGivenSizes: the sizes zoe chooses itself when
  // a config leaves them out (sub_group_size, offload_optimizer.buffer_count, offload_param's
  // buffer_size and max_in_cpu) only where given: a config written for another run (zoe tune
  // --out) then lets that run size them for its own placement instead of pinning DeepSpeed's
  // defaults (4 swap buffers: no read-ahead), and reads back to the same sizing.
  enum class JsonKeys { kEvery, kGivenSizes };
  // A JSON text (real JSON booleans and numbers) that parse() with the same world_size reads back
  // to an equal Config. `unimplemented` keys are not written: they had no effect.
  std::string to_json(JsonKeys keys = JsonKeys::kEvery) const;

  // Every field but `unimplemented`.
  bool operator==(const Config& o) const;
};

}  // namespace zoe::config
