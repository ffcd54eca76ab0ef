// zoe::Config: a training configuration (DeepSpeed-compatible JSON, keys zoe adds under "zoe"),
// read from a file or a text, built from code with Config::Builder, and changed with setters.
//
// Every way of making or changing a Config validates it the way a JSON file is validated: an
// error names the key's JSON path ("zero_optimization.offload_param.device"), the value given and
// what is allowed, and the Config it came from is left as it was. Besides the typed accessors,
// get()/set() reach any key by its JSON path, its value as JSON text.
// Thread-safety: a Config is a value; distinct Configs may be used from distinct threads, and
// const methods of one Config from several.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zoe/activations.h"
#include "zoe/dtype.h"
#include "zoe/offload.h"
#include "zoe/status.h"

namespace zoe {

// Where a kind of model state lives when it is not on the device.

class Config {
 public:
  class Builder;

  // DeepSpeed's defaults (stage 0, fp32, micro-batch 1), for one rank.
  Config();
  Config(const Config& o);
  Config(Config&& o) noexcept;
  Config& operator=(const Config& o);
  Config& operator=(Config&& o) noexcept;
  ~Config();

  // world_size: the ranks that will train (Runtime::world_size()); it checks
  // train_batch_size = micro-batch x accumulation x world size.
  static Result<Config> load(const std::string& path, int world_size = 1);
  static Result<Config> parse(const std::string& json_text, int world_size = 1);

  // Setters: each replaces one key (its JSON path in the comment) and re-validates the whole
  // config; on an error nothing changes.
  Status set_micro_batch(int64_t n);  // train_micro_batch_size_per_gpu (train_batch_size follows)
  Status set_gradient_accumulation_steps(
      int64_t n);                        // gradient_accumulation_steps (train_batch_size follows)
  Status set_precision(ComputeDType d);  // bf16.enabled / fp16.enabled
  Status set_lr(double lr);              // optimizer.params.lr
  // optimizer.type ("AdamW", "Adam", "Lion", "Adagrad", "Muon"; any case): the params the config did not
  // give take the new type's defaults; a param it gave that the type has not is an error naming it.
  // set("optimizer.type", ...) does the same.
  Status set_optimizer(const std::string& type);
  Status set_stage(int stage);  // zero_optimization.stage
  Status set_offload_optimizer(Offload where, const std::vector<std::string>& nvme_paths = {});
  Status set_offload_param(Offload where, const std::vector<std::string>& nvme_paths = {});
  Status set_device_budget(uint64_t bytes);                // zoe.device_budget (0: the whole device)
  Status set_optimizer_threads(int threads);               // zoe.optimizer_threads (0: all cores)
  Status set_device(const std::string& device);            // zoe.device: "auto", "cpu" or "cuda"
  Status set_activation_offload(ActivationOffload where);  // zoe.activation_offload
  Status set_activation_host_budget(uint64_t bytes);       // zoe.activation_host_budget (0: default)
  // Whether every nvme_path directory of an offload on "nvme" can hold the swap files: it exists,
  // is a writable directory, is not on a kernel pseudo file system (procfs, sysfs) and a file can
  // be created there. The error names the key, the directory and the reason. Engine::create asks
  // the same; a program asks first to name its own flag. The placeholders of nvme_path ({rank},
  // {local_rank}, {host}, $VAR) are expanded first with this process's values from its launcher's
  // environment (Engine::create uses the Runtime's).
  Status check_paths() const;

  // Any key by its JSON path ("train_batch_size", "zero_optimization.offload_param.device"):
  //   get(): the value as JSON text, as to_json() writes it (3, "nvme", true, {"device": "cpu"});
  //     a section gives the whole object. kNotFound naming the key and the keys that are there
  //     when the path is not in to_json() (an unknown key, or one this config leaves unset).
  //   set(): replaces the value at the path with `json_value` (JSON text), then re-validates the
  //     whole config like the setters above (an unknown key, a bad value: the parser's error,
  //     naming the path); on an error nothing changes. Batch keys are not recomputed: setting
  //     train_micro_batch_size_per_gpu alone leaves train_batch_size to disagree (an error) where
  //     set_micro_batch() keeps them consistent.
  Result<std::string> get(const std::string& key) const;
  Status set(const std::string& key, const std::string& json_value);
  // Typed reads of get(): kInvalidArgument naming the key when the value is not of that type.
  Result<int64_t> get_int(const std::string& key) const;
  Result<double> get_double(const std::string& key) const;
  Result<bool> get_bool(const std::string& key) const;
  Result<std::string> get_string(const std::string& key) const;

  int world_size() const;
  int64_t micro_batch() const;
  int64_t gradient_accumulation_steps() const;
  int64_t train_batch_size() const;
  ComputeDType precision() const;
  double lr() const;
  // The learning rate of optimizer update `step` (1-based), the scheduler's if there is one.
  double lr_at(int64_t step) const;
  std::string scheduler_type() const;  // "" when there is none
  int stage() const;
  Offload offload_optimizer() const;
  Offload offload_param() const;
  std::vector<std::string> offload_optimizer_nvme_paths() const;
  std::vector<std::string> offload_param_nvme_paths() const;
  int64_t offload_optimizer_buffer_count() const;  // zero_optimization.offload_optimizer.buffer_count
  int64_t sub_group_size() const;                  // zero_optimization.sub_group_size (elements)
  // Host bytes of the optimizer swapper's pipeline buffers with NVMe optimizer offload, as the
  // engine sizes them from buffer_count and sub_group_size (warning once where it uses other
  // values than those given); 0 without NVMe optimizer offload.
  uint64_t optimizer_swap_buffer_bytes() const;
  uint64_t device_budget() const;
  int optimizer_threads() const;
  std::string device() const;

  // The activation store (zoe/activations.h, Engine::activations()).
  // zoe.activation_offload; activation_checkpointing.cpu_checkpointing true makes it kCpu unless
  // zoe.activation_offload is given.
  ActivationOffload activation_offload() const;
  // zoe.activation_host_budget: pinned host bytes of the store (0: the engine's default, a quarter
  // of zoe.host_budget within what the placement leaves of it, else 1/16 of the host's memory
  // per rank).
  uint64_t activation_host_budget() const;
  // zoe.activation_device_budget: the device's activation share (0: the engine's default, the
  // device budget minus the placement's device peak, the placement planned within three quarters
  // of the device budget where activations are in use; see Engine::activations()).
  uint64_t activation_device_budget() const;
  int activation_prefetch() const;        // zoe.activation_prefetch: NVMe reads ahead in the backward
  uint64_t activation_min_bytes() const;  // zoe.activation_min_bytes: smaller tensors stay on the device
  // zoe.activation_nvme_path, else zero_optimization.offload_param's nvme_path, else
  // offload_optimizer's (placeholders not expanded).
  std::vector<std::string> activation_nvme_paths() const;
  // DeepSpeed's activation_checkpointing section as given (all false / 0 when it is not).
  struct ActivationCheckpointing {
    bool given = false;                  // the section is in the config: the trainer checkpoints its blocks
    bool partition_activations = false;  // no effect in zoe (warned)
    bool cpu_checkpointing = false;      // see activation_offload()
    bool contiguous_memory_optimization = false;  // no effect in zoe (warned)
    int64_t number_checkpoints = 0;               // 0: not given
    bool synchronize_checkpoint_boundary = false;
    bool profile = false;  // no effect in zoe (warned)
  };
  ActivationCheckpointing activation_checkpointing() const;

  // Every field as JSON that parse() reads back to an equal Config.
  std::string to_json() const;

  struct Impl;  // internal: the validated configuration (src/config/public_config.h)

 private:
  friend struct ConfigAccess;
  std::unique_ptr<Impl> impl_;
};

// A directory a program's flag gave for swap files (zoe train's --nvme-path): nvme_path's placeholders
// ({rank}, {local_rank}, {host}, $VAR) expanded with this process's values, then checked as
// Config::check_paths() checks the config's directories. Errors name `flag` and the text as given,
// and the expansion where it differs ("--nvme-path '$SCRATCH/zoe': '/scratch/ann/zoe' does not
// exist"). Returns the expansion.
Result<std::string> check_nvme_dir(const std::string& flag, const std::string& dir);

// Builds a Config from code, without JSON text:
//   auto cfg = zoe::Config::Builder().stage(3).micro_batch(8).precision(zoe::ComputeDType::kBF16)
//                  .offload_optimizer(zoe::Offload::kNvme, {"/nvme"}).device_budget(256 << 20)
//                  .build(rt->world_size());
// Keys not set keep DeepSpeed's defaults. build() validates like Config::parse (the same errors,
// naming the JSON path of the key).
class Config::Builder {
 public:
  Builder();
  Builder(const Builder& o);
  Builder& operator=(const Builder& o);
  ~Builder();

  Builder& micro_batch(int64_t n);
  Builder& gradient_accumulation_steps(int64_t n);
  Builder& precision(ComputeDType d);
  Builder& stage(int stage);
  // optimizer.type: "AdamW" (the default), "Adam", "Lion", "Adagrad" or "Muon" (any case); lr() and
  // weight_decay() keep the type set here (AdamW when none is).
  Builder& optimizer(const std::string& type);
  Builder& lr(double lr);
  Builder& weight_decay(double wd);  // optimizer.params.weight_decay
  Builder& gradient_clipping(double max_norm);
  // zero_optimization.offload_optimizer / offload_param: device and, for kNvme, its directories.
  Builder& offload_optimizer(Offload where, const std::vector<std::string>& nvme_paths = {});
  Builder& offload_param(Offload where, const std::vector<std::string>& nvme_paths = {});
  // zero_optimization.stage3_param_persistence_threshold: modules smaller stay whole on the device.
  Builder& param_persistence_threshold(int64_t elements);
  Builder& device_budget(uint64_t bytes);
  Builder& optimizer_threads(int threads);
  Builder& device(const std::string& device);  // "auto", "cpu" or "cuda"

  Result<Config> build(int world_size = 1) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe
