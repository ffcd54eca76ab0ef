// Config tests: real DeepSpeed files, defaults, every kind of bad input, round trip, LR schedules.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "config/config_table.h"
#include "config/json_reader.h"
#include "config/paths.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::config {
namespace {

using test::ScratchDir;

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
    s.replace(pos, from.size(), to);
  return s;
}

// The error message of a parse that must fail.
std::string parse_error(const std::string& json, int world_size = 1) {
  auto c = Config::parse(json, world_size);
  EXPECT_FALSE(c.is_ok()) << "parsed although it should not: " << json;
  return c.is_ok() ? "" : c.status().message();
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// A ZeRO-3 NVMe config as users write them (DeepSpeed's ZeRO-Infinity tutorial shape);
// NVME_DIR is replaced by a scratch directory.
const char* kZero3Nvme = R"({
  "train_batch_size": 16,
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 8,
  "steps_per_print": 100,
  "wall_clock_breakdown": false,
  "gradient_clipping": 1.0,
  "fp16": {
    "enabled": true,
    "auto_cast": false,
    "loss_scale": 0,
    "loss_scale_window": 1000,
    "initial_scale_power": 16,
    "hysteresis": 2,
    "min_loss_scale": 1
  },
  "optimizer": {
    "type": "AdamW",
    "params": {"lr": 3e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}
  },
  "scheduler": {
    "type": "WarmupLR",
    "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 500}
  },
  "zero_optimization": {
    "stage": 3,
    "contiguous_gradients": true,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "stage3_prefetch_bucket_size": 1e7,
    "stage3_param_persistence_threshold": 1e5,
    "reduce_bucket_size": 1e7,
    "sub_group_size": 1e8,
    "offload_optimizer": {
      "device": "nvme",
      "nvme_path": "NVME_DIR",
      "pin_memory": true,
      "buffer_count": 4,
      "fast_init": false
    },
    "offload_param": {
      "device": "nvme",
      "nvme_path": "NVME_DIR",
      "pin_memory": true,
      "buffer_count": 5,
      "buffer_size": 1e8,
      "max_in_cpu": 1e9
    },
    "stage3_gather_16bit_weights_on_model_save": true
  },
  "aio": {
    "block_size": 262144,
    "queue_depth": 32,
    "thread_count": 1,
    "single_submit": false,
    "overlap_events": true
  },
  "flops_profiler": {"enabled": false, "profile_step": 1},
  "tensorboard": {"enabled": false, "output_path": "logs/"}
})";

// A ZeRO-2 CPU-offload config for 4 ranks, bf16, "Adam" type (DeepSpeed reads it as AdamW).
const char* kZero2Cpu = R"({
  "bf16": {"enabled": true},
  "fp16": {"enabled": false},
  "optimizer": {"type": "adam", "params": {"lr": 2e-5, "betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": 0.1}},
  "scheduler": {
    "type": "WarmupDecayLR",
    "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-5, "warmup_num_steps": 100,
               "total_num_steps": 1000, "warmup_type": "linear"}
  },
  "zero_optimization": {
    "stage": 2,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "allgather_partitions": true,
    "allgather_bucket_size": 2e8,
    "overlap_comm": true,
    "reduce_scatter": true,
    "reduce_bucket_size": 2e8,
    "contiguous_gradients": true,
    "round_robin_gradients": true
  },
  "gradient_accumulation_steps": 4,
  "gradient_clipping": 1.0,
  "steps_per_print": 2000,
  "train_batch_size": 64,
  "train_micro_batch_size_per_gpu": 4,
  "wall_clock_breakdown": false,
  "zero_allow_untested_optimizer": true
})";

TEST(Config, RealZero3NvmeConfig) {
  ScratchDir dir("cfg");
  auto r = Config::parse(replace_all(kZero3Nvme, "NVME_DIR", dir.path()));
  ASSERT_OK(r);
  const Config& c = r.value();
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_FALSE(c.bf16);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_TRUE(c.zero.overlap_comm);  // stage 3 default
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 10000000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(c.zero.reduce_bucket_size, 10000000);
  EXPECT_EQ(c.zero.sub_group_size, 100000000);
  EXPECT_TRUE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.zero.offload_optimizer.device, Offload::kNvme);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, std::vector<std::string>{dir.path()});
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(c.zero.offload_param.device, Offload::kNvme);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c.zero.offload_param.buffer_size, 100000000);
  EXPECT_EQ(c.zero.offload_param.max_in_cpu, 1000000000);
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.queue_depth, 32);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_EQ(c.optimizer.lr, 3e-5);
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  EXPECT_EQ(c.scheduler.warmup_num_steps, 500);
  EXPECT_EQ(c.scheduler.warmup_type, "log");
  EXPECT_TRUE(c.unimplemented.empty());
}

TEST(Config, RealZero2CpuConfig) {
  auto r = Config::parse(kZero2Cpu, /*world_size=*/4);
  ASSERT_OK(r);
  const Config& c = r.value();
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_TRUE(c.bf16);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.allgather_bucket_size, 200000000);
  EXPECT_EQ(c.zero.offload_optimizer.device, Offload::kCpu);
  EXPECT_EQ(c.zero.offload_param.device, Offload::kNone);
  EXPECT_EQ(c.optimizer.type, "Adam");   // canonical spelling of "adam"
  EXPECT_TRUE(c.optimizer.adam_w_mode);  // DeepSpeed: Adam means decoupled decay by default
  EXPECT_EQ(c.optimizer.beta2, 0.98);
  EXPECT_EQ(c.scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(c.scheduler.warmup_type, "linear");
  EXPECT_EQ(c.scheduler.total_num_steps, 1000);
  ASSERT_EQ(c.unimplemented.size(), 1u);
  EXPECT_HAS(c.unimplemented[0], "zero_optimization.round_robin_gradients");
  // The same file on 2 ranks contradicts itself.
  EXPECT_HAS(parse_error(kZero2Cpu, 2), "train_batch_size: 64 does not equal");
}

TEST(Config, DefaultsAreDeepSpeeds) {
  auto r = Config::parse("{}");
  ASSERT_OK(r);
  const Config& c = r.value();
  EXPECT_EQ(c.train_batch_size, 1);
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_TRUE(c.zero.reduce_scatter);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 500000000);
  EXPECT_EQ(c.zero.sub_group_size, 1000000000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50000000);  // code's 5e7, not the docs' 5e8
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(c.zero.stage3_model_persistence_threshold, INT64_MAX);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 1000000000);
  EXPECT_FALSE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c.zero.offload_param.buffer_size, 100000000);
  EXPECT_EQ(c.zero.offload_param.max_in_cpu, 1000000000);
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.aio.use_gds);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_EQ(c.scheduler.type, "");
  Config d;
  d.train_batch_size = 1;
  EXPECT_TRUE(c == d);
  // Stage 3 turns overlap_comm on unless the key says otherwise.
  EXPECT_TRUE(Config::parse(R"({"zero_optimization": {"stage": 3}})")->zero.overlap_comm);
  EXPECT_FALSE(
      Config::parse(R"({"zero_optimization": {"stage": 3, "overlap_comm": false}})")->zero.overlap_comm);
}

TEST(Config, BatchKeysResolvedLikeDeepSpeed) {
  auto a = Config::parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2})", 4);
  ASSERT_OK(a);
  EXPECT_EQ(a->gradient_accumulation_steps, 4);
  auto b = Config::parse(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 4);
  ASSERT_OK(b);
  EXPECT_EQ(b->train_micro_batch_size_per_gpu, 4);
  auto c = Config::parse(R"({"train_batch_size": 8})", 4);
  ASSERT_OK(c);
  EXPECT_EQ(c->train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(c->gradient_accumulation_steps, 1);
  auto d = Config::parse(R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})", 2);
  ASSERT_OK(d);
  EXPECT_EQ(d->train_batch_size, 30);
  std::string e = parse_error(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2,
                                  "gradient_accumulation_steps": 2})",
                              2);
  EXPECT_HAS(
      e,
      "train_batch_size: 10 does not equal train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 2 "
      "x world size 2 = 8");
  EXPECT_HAS(parse_error(R"({"train_batch_size": 10})", 4), "train_batch_size: 10 is not divisible");
}

TEST(Config, IntegersMayBeWrittenAsWholeDoubles) {
  auto r = Config::parse(R"({"zero_optimization": {"reduce_bucket_size": 5e8, "sub_group_size": 1.0e9}})");
  ASSERT_OK(r);
  EXPECT_EQ(r->zero.reduce_bucket_size, 500000000);
  std::string e = parse_error(R"({"zero_optimization": {"reduce_bucket_size": 1.5}})");
  EXPECT_HAS(e, "zero_optimization.reduce_bucket_size: 1.5 is not an integer");
  EXPECT_HAS(parse_error(R"({"zero_optimization": {"sub_group_size": 1e30}})"), "1e+30 is out of range");
  EXPECT_HAS(parse_error(R"({"aio": {"queue_depth": "8"}})"), "aio.queue_depth: \"8\" is not a number");
}

TEST(Config, StringBooleansAreReadAsWhatTheySpell) {
  // DeepSpeed's tuner writes these; "false" must never become true.
  auto r = Config::parse(R"({"aio": {"single_submit": "false", "overlap_events": "true"},
                            "zero_optimization": {"contiguous_gradients": "false"}})");
  ASSERT_OK(r);
  EXPECT_FALSE(r->aio.single_submit);
  EXPECT_TRUE(r->aio.overlap_events);
  EXPECT_FALSE(r->zero.contiguous_gradients);
  EXPECT_HAS(parse_error(R"({"fp16": {"enabled": "yes"}})"),
             "fp16.enabled: \"yes\" is not a boolean (expected true or false)");
  EXPECT_HAS(parse_error(R"({"fp16": {"enabled": 1}})"), "fp16.enabled: 1 is not a boolean");
}

TEST(Config, UnknownKeysNamePathAndSuggest) {
  std::string e = parse_error(R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_sise": 5e7}})");
  EXPECT_HAS(e, "unknown key 'zero_optimization.stage3_prefetch_bucket_sise'");
  EXPECT_HAS(e, "did you mean 'stage3_prefetch_bucket_size'?");
  e = parse_error(R"({"zero_optimization": {"offload_optimiser": {"device": "cpu"}}})");
  EXPECT_HAS(e, "did you mean 'offload_optimizer'?");
  // A key of another section at the wrong level.
  e = parse_error(R"({"offload_optimizer": {"device": "cpu"}})");
  EXPECT_HAS(e, "unknown key 'offload_optimizer' (it belongs under 'zero_optimization')");
  e = parse_error(R"({"completely_made_up": 1})");
  EXPECT_HAS(e, "unknown key 'completely_made_up'");
  e = parse_error(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas1": 0.9}}})");
  EXPECT_HAS(e, "unknown key 'optimizer.params.betas1' (did you mean 'betas'?)");
  e = parse_error(R"({"aio": {"num_threads": 4}})");  // what DeepSpeed's tuner writes
  EXPECT_HAS(e, "unknown key 'aio.num_threads'");
}

TEST(Config, WrongValuesNameKeyValueAndAllowed) {
  EXPECT_HAS(parse_error(R"({"zero_optimization": {"stage": 4}})"),
             "zero_optimization.stage: 4 is not one of 0, 1, 2, 3");
  EXPECT_HAS(parse_error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}})"),
             "zero_optimization.offload_param.device: \"gpu\" is not one of \"none\", \"cpu\", \"nvme\"");
  // DeepSpeed's other optimizer types are refused by name (any case), saying what zoe offers.
  EXPECT_HAS(
      parse_error(R"({"optimizer": {"type": "Lamb"}})"),
      "optimizer.type: \"Lamb\" is refused: Lamb (a LAMB or 1-bit communication optimizer) is not in zoe; "
      "zoe runs optimizer.type \"AdamW\" (or \"Adam\"), \"Lion\", \"Adagrad\", \"Muon\" and \"AdamMini\"");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "OneBitAdam"}})"), "\"OneBitAdam\" is refused");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "muadamw"}})"), "\"muadamw\" is refused: MuAdamW (muP's");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "SGD"}})"),
             "optimizer.type: \"SGD\" is not one of \"Adam\", \"AdamW\", \"Lion\", \"Adagrad\"");
  EXPECT_HAS(parse_error(R"({"scheduler": {"type": "OneCycle"}})"),
             "scheduler.type: \"OneCycle\" is not one of \"WarmupLR\", \"WarmupDecayLR\"");
  EXPECT_HAS(parse_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})"),
             "scheduler.params.warmup_type: \"cosine\" is not one of \"log\", \"linear\"");
  EXPECT_HAS(parse_error(R"({"optimizer": {"params": {"betas": [0.9, 1.5]}}})"),
             "optimizer.params.betas[1]: 1.5 is out of range (expected [0, 1))");
  EXPECT_HAS(parse_error(R"({"optimizer": {"params": {"betas": 0.9}}})"),
             "optimizer.params.betas: 0.9 is not a pair");
  EXPECT_HAS(parse_error(R"({"zoe": {"device": "tpu"}})"),
             "zoe.device: \"tpu\" is not one of \"auto\", \"cpu\", \"cuda\"");
  EXPECT_HAS(parse_error(R"({"zero_optimization": 3})"), "zero_optimization: 3 is not an object");
  EXPECT_HAS(parse_error(R"({"train_batch_size": "auto"})"), "placeholder the Hugging Face Trainer fills in");
  EXPECT_HAS(parse_error("[1, 2]"), "not a JSON object");
}

TEST(Config, ZeroAndNegativeSizesAreErrors) {
  EXPECT_HAS(parse_error(R"({"train_micro_batch_size_per_gpu": 0})"),
             "train_micro_batch_size_per_gpu: 0 is out of range (expected an integer in [1, 1048576])");
  EXPECT_HAS(parse_error(R"({"gradient_accumulation_steps": -2})"),
             "gradient_accumulation_steps: -2 is out of range");
  EXPECT_HAS(parse_error(R"({"zero_optimization": {"reduce_bucket_size": 0}})"),
             "zero_optimization.reduce_bucket_size: 0");
  EXPECT_HAS(parse_error(R"({"aio": {"block_size": -4096}})"), "aio.block_size: -4096 is out of range");
  EXPECT_HAS(parse_error(R"({"zero_optimization": {"offload_optimizer": {"buffer_count": 0}}})"),
             "zero_optimization.offload_optimizer.buffer_count: 0 is out of range");
  EXPECT_HAS(parse_error(R"({"gradient_clipping": -1.0})"),
             "gradient_clipping: -1.0 is out of range (expected >= 0)");
  EXPECT_HAS(parse_error(R"({"optimizer": {"params": {"eps": 0}}})"),
             "optimizer.params.eps: 0 is out of range (expected > 0)");
  EXPECT_HAS(parse_error(R"({"zoe": {"host_budget": -5}})"), "zoe.host_budget: -5 is out of range");
  EXPECT_HAS(parse_error(R"({"zoe": {"device_budget": "lots"}})"),
             "zoe.device_budget: \"lots\" is not a byte size");
  EXPECT_HAS(parse_error(R"({"zoe": {"offload_ratio": 1.5}})"),
             "zoe.offload_ratio: 1.5 is out of range (expected [0, 1])");
  // 0 is meaningful where DeepSpeed gives it a meaning (no prefetch).
  EXPECT_OK(Config::parse(R"({"zero_optimization": {"stage3_prefetch_bucket_size": 0}})"));
}

// The error of check_paths on a config that parses (parse itself touches no file).
Status paths_status(const std::string& json) {
  auto c = Config::parse(json);
  EXPECT_OK(c) << "\n" << json;
  if (!c.is_ok()) return c.status();
  Status st = check_paths(c.value());
  EXPECT_FALSE(st.is_ok()) << "check_paths passed although it should not: " << json;
  return st;
}

std::string paths_error(const std::string& json) { return paths_status(json).message(); }

TEST(Config, NvmeWithoutPathOrWithABadPath) {
  EXPECT_HAS(
      parse_error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})"),
      "zero_optimization.offload_param.device: \"nvme\" needs zero_optimization.offload_param.nvme_path");
  Status missing = paths_status(R"({"zero_optimization": {"stage": 2, "offload_optimizer":
                                  {"device": "nvme", "nvme_path": "/no/such/zoe/dir"}}})");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_HAS(missing.message(),
             "zero_optimization.offload_optimizer.nvme_path: '/no/such/zoe/dir' does not exist");

  ScratchDir dir("cfg");
  std::string file = dir.file("plain_file");
  std::ofstream(file) << "x";
  EXPECT_HAS(
      paths_error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ")" +
                  file + R"("}}})"),
      "zero_optimization.offload_param.nvme_path: '" + file + "' is not a directory");
  // A list: every entry is checked.
  EXPECT_HAS(paths_error(
                 R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": [")" +
                 dir.path() + R"(", "/no/such/zoe/dir2"]}}})"),
             "'/no/such/zoe/dir2' does not exist");
  EXPECT_HAS(parse_error(
                 R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": [")" +
                 dir.path() + R"(", ")" + dir.path() + R"("]}}})"),
             "is listed twice");
  auto two = Config::parse(
      R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": [")" +
      dir.path() + R"(", "/tmp"]}}})");
  ASSERT_OK(two);
  EXPECT_EQ(two->zero.offload_param.nvme_path.size(), 2u);
  EXPECT_OK(check_paths(two.value()));
  // A path is not checked when the device is not nvme.
  auto cpu = Config::parse(R"({"zero_optimization": {"stage": 2, "offload_optimizer":
                               {"device": "cpu", "nvme_path": "/no/such/zoe/dir"}}})");
  ASSERT_OK(cpu);
  EXPECT_OK(check_paths(cpu.value()));
}

// Config::parse reads text only: a directory that does not exist (yet) is check_paths' error,
// and one created after parsing passes.
TEST(Config, ParseTouchesNoFile) {
  ScratchDir dir("cfg");
  const std::string later = dir.file("created_later");
  const std::string json =
      R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ")" + later +
      R"("}}})";
  auto c = Config::parse(json);
  ASSERT_OK(c);
  EXPECT_EQ(check_paths(c.value()).code(), StatusCode::kNotFound);
  ASSERT_EQ(mkdir(later.c_str(), 0755), 0);
  EXPECT_OK(check_paths(c.value()));
  // A Config built in code is checked the same way.
  Config made;
  made.zero.stage = 3;
  made.zero.offload_param.device = Offload::kNvme;
  EXPECT_HAS(check_paths(made).message(), "zero_optimization.offload_param.device: \"nvme\" needs");
  made.zero.offload_param.nvme_path = {std::string("/tmp\0x", 6)};
  EXPECT_HAS(check_paths(made).message(), "contains a NUL byte");
}

TEST(Config, UnwritableNvmePath) {
  // A directory only its owner may write; root checks it from a child that dropped to nobody
  // (root passes access(W_OK) everywhere). /tmp so that nobody can reach it.
  char tmpl[] = "/tmp/zoe-cfg-ro-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string ro = tmpl;
  ASSERT_EQ(chmod(ro.c_str(), 0555), 0);
  const std::string json =
      R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ")" + ro +
      R"("}}})";
  auto check = [&json]() -> std::string {
    auto r = Config::parse(json);
    if (!r.is_ok()) return "parse: " + r.status().to_string();
    Status st = check_paths(r.value());
    if (st.is_ok()) return "passed";
    return std::string(status_code_name(st.code())) + "|" + st.message();
  };
  std::string got;
  if (geteuid() == 0) {
    got = test::run_in_child([&]() -> std::string {
      if (setgid(65534) != 0 || setuid(65534) != 0) return "SKIP";
      return check();
    });
  } else {
    got = check();
  }
  rmdir(ro.c_str());
  if (got == "SKIP") GTEST_SKIP() << "cannot drop to uid 65534";
  EXPECT_HAS(got, std::string(status_code_name(StatusCode::kPermissionDenied)) + "|");
  EXPECT_HAS(got, "zero_optimization.offload_param.nvme_path: '" + ro + "' is not writable");
}

TEST(Config, Contradictions) {
  EXPECT_HAS(parse_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
             "fp16.enabled and bf16.enabled are both true");
  EXPECT_HAS(parse_error(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})"),
             "zero_optimization.offload_param.device: \"cpu\" needs zero_optimization.stage 3 (stage is 2");
  EXPECT_HAS(parse_error(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})"),
             "zero_optimization.offload_optimizer.device: \"cpu\" needs zero_optimization.stage 1, 2 or 3 "
             "(stage is 0)");
  // device "none" is fine at any stage.
  EXPECT_OK(Config::parse(R"({"zero_optimization": {"stage": 1, "offload_param": {"device": "none"}}})"));
  EXPECT_HAS(
      parse_error(R"({"aio": {"intra_op_parallelism": 2, "thread_count": 4}})"),
      "aio.intra_op_parallelism and aio.thread_count (its older name) are both given, with different values");
}

TEST(Config, InvalidJsonGivesLineAndColumn) {
  std::string e = parse_error("{\n  \"zero_optimization\": {\n    \"stage\" 3\n  }\n}");
  EXPECT_HAS(e, "invalid JSON: parse error at line 3, column");
  EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
  EXPECT_HAS(parse_error(R"({"zero_optimization": {"stage": 2, "stage": 3}})"),
             "duplicate key 'zero_optimization.stage'");
  // Comments are allowed.
  auto r = Config::parse("{\n // ZeRO-2\n \"zero_optimization\": {\"stage\": 2} /* end */\n}");
  ASSERT_OK(r);
  EXPECT_EQ(r->zero.stage, 2);
}

TEST(Config, LoadNamesThePath) {
  auto missing = Config::load("/no/such/zoe/ds_config.json");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_HAS(missing.status().to_string(), "/no/such/zoe/ds_config.json");
  ScratchDir dir("cfg");
  std::ofstream(dir.file("bad.json")) << R"({"zero_optimization": {"stage": 9}})";
  auto bad = Config::load(dir.file("bad.json"));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_HAS(bad.status().to_string(), "zero_optimization.stage: 9");
  EXPECT_HAS(bad.status().to_string(), dir.file("bad.json"));
  std::ofstream(dir.file("ok.json")) << kZero2Cpu;
  auto ok = Config::load(dir.file("ok.json"), 4);
  ASSERT_OK(ok);
  EXPECT_EQ(ok->zero.stage, 2);
}

// Muon with DeepSpeed's names: lr sets both groups' rates unless muon_lr / adam_lr do; without lr,
// MuonWithAuxAdam's defaults; the aux AdamW's betas and eps defaults are DeepSpeed's; Muon's keys
// with another type, another type's keys with Muon, and low-bit or bf16 states are refused by name.
TEST(Config, MuonTakesDeepSpeedsParams) {
  auto lr = Config::parse(R"({"optimizer": {"type": "MUON", "params": {"lr": 0.01, "adam_lr": 0.001}}})");
  ASSERT_OK(lr);
  EXPECT_EQ(lr->optimizer.type, "Muon");
  EXPECT_EQ(lr->optimizer.muon_lr, 0.01);
  EXPECT_EQ(lr->optimizer.adam_lr, 0.001);
  EXPECT_EQ(lr->optimizer.momentum, 0.95);
  EXPECT_EQ(lr->optimizer.beta2, 0.95);
  EXPECT_EQ(lr->optimizer.eps, 1e-10);
  auto none = Config::parse(R"({"optimizer": {"type": "muon"}})");
  ASSERT_OK(none);
  EXPECT_EQ(none->optimizer.muon_lr, 0.02);
  EXPECT_EQ(none->optimizer.adam_lr, 3e-4);
  EXPECT_HAS(
      parse_error(R"({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})"),
      "optimizer.params.momentum is optimizer.type \"Muon\"'s; optimizer.type is \"AdamW\": remove it");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "Muon", "params": {"adam_w_mode": false}}})"),
             "optimizer.params.adam_w_mode: optimizer.type \"Muon\" has no adam_w_mode");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "Muon"}, "zoe": {"optimizer_states": "bf16"}})"),
             "zoe.optimizer_states \"bf16\" with optimizer.type \"Muon\"");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "Muon", "params": {"momentum": 1.0}}})"),
             "optimizer.params.momentum: 1.0 is out of range");
  // A scheduler shapes each group's own rate: base x its rate / its peak (warmup_max_lr).
  auto sched = Config::parse(R"({"optimizer": {"type": "Muon", "params": {"muon_lr": 0.02, "adam_lr": 0.001}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                  "warmup_num_steps": 10, "warmup_type": "linear"}}})");
  ASSERT_OK(sched);
  for (int64_t step = 1; step <= 12; ++step) {
    EXPECT_DOUBLE_EQ(sched->group_lr_at(step, 0.02), 0.02 * sched->lr_at(step) / 0.01) << step;
    EXPECT_DOUBLE_EQ(sched->group_lr_at(step, 0.001), 0.001 * sched->lr_at(step) / 0.01) << step;
  }
  EXPECT_DOUBLE_EQ(sched->group_lr_at(50, 0.02), 0.02);   // at the peak: the group's own rate
  EXPECT_DOUBLE_EQ(none->group_lr_at(50, 0.02), 0.02);    // no scheduler
  for (const Config* c : {&lr.value(), &none.value()}) {  // written back and read back the same
    auto back = Config::parse(c->to_json());
    ASSERT_OK(back);
    EXPECT_TRUE(back.value() == *c) << c->to_json();
  }
}

// Adam-mini: optimizer.type "AdamMini" (any case) with AdamW's params and defaults and the adam-mini
// package's dim, n_heads and n_kv_heads (its defaults 2048 and 32); those keys with another type,
// AdamW's adam_w_mode, a n_kv_heads that does not divide n_heads and the low-bit or bf16 states are
// refused by name; each type writes back only its own keys.
TEST(Config, AdamMiniTakesItsParams) {
  auto mini = Config::parse(
      R"({"optimizer": {"type": "adammini", "params": {"lr": 0.002, "dim": 64, "n_heads": 8, "n_kv_heads": 2}}})");
  ASSERT_OK(mini);
  EXPECT_EQ(mini->optimizer.type, "AdamMini");
  EXPECT_EQ(mini->optimizer.lr, 0.002);
  EXPECT_EQ(mini->optimizer.dim, 64);
  EXPECT_EQ(mini->optimizer.n_heads, 8);
  EXPECT_EQ(mini->optimizer.n_kv_heads, 2);
  EXPECT_EQ(mini->optimizer.beta2, 0.999);
  EXPECT_EQ(mini->optimizer.eps, 1e-8);
  auto none = Config::parse(R"({"optimizer": {"type": "AdamMini"}})");
  ASSERT_OK(none);
  EXPECT_EQ(none->optimizer.dim, 2048);
  EXPECT_EQ(none->optimizer.n_heads, 32);
  EXPECT_HAS(
      parse_error(R"({"optimizer": {"type": "AdamW", "params": {"n_heads": 8}}})"),
      "optimizer.params.n_heads is optimizer.type \"AdamMini\"'s; optimizer.type is \"AdamW\": remove it");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "AdamMini", "params": {"adam_w_mode": true}}})"),
             "optimizer.params.adam_w_mode: optimizer.type \"AdamMini\" has no adam_w_mode");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "AdamMini", "params": {"n_heads": 8, "n_kv_heads": 3}}})"),
             "optimizer.params.n_kv_heads 3 does not divide optimizer.params.n_heads 8");
  EXPECT_HAS(
      parse_error(R"({"optimizer": {"type": "AdamMini"}, "zoe": {"optimizer_states": "bf16"}})"),
      "zoe.optimizer_states \"bf16\" with optimizer.type \"AdamMini\": AdamMini keeps fp32, int8 or int4 "
      "states");
  EXPECT_OK(Config::parse(R"({"optimizer": {"type": "AdamMini"}, "zoe": {"optimizer_states": "int8"}})"));
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "AdamMini"}, "zoe": {"master_weights": "bf16"}})"),
             "zoe.master_weights \"bf16\" with optimizer.type \"AdamMini\"");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "AdamMini", "params": {"dim": 0}}})"),
             "optimizer.params.dim");
  for (const Config* c : {&mini.value(), &none.value()}) {  // written back and read back the same
    auto back = Config::parse(c->to_json());
    ASSERT_OK(back);
    EXPECT_TRUE(back.value() == *c) << c->to_json();
  }
  auto adamw = Config::parse(R"({"optimizer": {"type": "AdamW"}})");
  ASSERT_OK(adamw);
  EXPECT_EQ(adamw->to_json().find("n_heads"), std::string::npos) << adamw->to_json();
}

// Lion and Adagrad with DeepSpeed's names (any case), params and defaults; a key the type has not,
// and the low-bit formats, are refused naming the keys; each type writes back only its own keys.
TEST(Config, LionAndAdagradTakeDeepSpeedsParams) {
  auto lion = Config::parse(R"({"optimizer": {"type": "LION", "params": {"betas": [0.95, 0.98]}}})");
  ASSERT_OK(lion);
  EXPECT_EQ(lion->optimizer.type, "Lion");
  EXPECT_EQ(lion->optimizer.lr, 1e-3);  // DeepSpeedCPULion's defaults
  EXPECT_EQ(lion->optimizer.beta1, 0.95);
  EXPECT_EQ(lion->optimizer.beta2, 0.98);
  EXPECT_EQ(lion->optimizer.weight_decay, 0.0);
  auto ada = Config::parse(R"({"optimizer": {"type": "adagrad", "params": {"weight_decay": 0.1}}})");
  ASSERT_OK(ada);
  EXPECT_EQ(ada->optimizer.type, "Adagrad");
  EXPECT_EQ(ada->optimizer.lr, 1e-2);  // DeepSpeedCPUAdagrad's (and torch's) defaults
  EXPECT_EQ(ada->optimizer.eps, 1e-10);
  EXPECT_EQ(ada->optimizer.weight_decay, 0.1);
  auto given = Config::parse(R"({"optimizer": {"type": "Adagrad", "params": {"lr": 0.5, "eps": 1e-6}}})");
  ASSERT_OK(given);
  EXPECT_EQ(given->optimizer.lr, 0.5);
  EXPECT_EQ(given->optimizer.eps, 1e-6);
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "Lion", "params": {"eps": 1e-8}}})"),
             "optimizer.params.eps: optimizer.type \"Lion\" has no eps (its params are lr, betas and "
             "weight_decay, as in DeepSpeed): remove it");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "Adagrad", "params": {"betas": [0.9, 0.99]}}})"),
             "optimizer.params.betas: optimizer.type \"Adagrad\" has no betas (its params are lr, eps and "
             "weight_decay");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "Lion", "params": {"adam_w_mode": true}}})"),
             "optimizer.params.adam_w_mode: optimizer.type \"Lion\" has no adam_w_mode");
  // Their one state takes every format (Lion's m and Adagrad's sum packed as int8/int4 blocks).
  for (const char* f : {"bf16", "int8", "int4"}) {
    for (const char* t : {"Lion", "Adagrad"}) {
      const std::string text = std::string("{\"optimizer\": {\"type\": \"") + t +
                               "\"}, \"zoe\": {\"optimizer_states\": \"" + f + "\"}}";
      EXPECT_OK(Config::parse(text)) << text;
    }
  }
  EXPECT_OK(Config::parse(R"({"optimizer": {"type": "Muon"}, "zoe": {"optimizer_states": "int8"}})"));
  EXPECT_HAS(
      parse_error(R"({"optimizer": {"type": "Muon"}, "zoe": {"optimizer_states": "bf16"}})"),
      "zoe.optimizer_states \"bf16\" with optimizer.type \"Muon\": Muon keeps fp32, int8 or int4 states");
  EXPECT_HAS(parse_error(R"({"optimizer": {"type": "Adagrad"}, "zoe": {"master_weights": "bf16"}})"),
             "zoe.master_weights \"bf16\" with optimizer.type \"Adagrad\"");
  EXPECT_OK(Config::parse(R"({"optimizer": {"type": "Lion"}, "zoe": {"optimizer_states": "bf16"}})"));
  // Written back with the keys of its type only, and read back the same.
  for (const Config* c : {&lion.value(), &ada.value()}) {
    const std::string text = c->to_json();
    auto back = Config::parse(text);
    ASSERT_OK(back);
    EXPECT_TRUE(back.value() == *c) << text;
  }
  EXPECT_EQ(lion->to_json().find("\"eps\""), std::string::npos);
  EXPECT_EQ(ada->to_json().find("\"betas\""), std::string::npos);
}

TEST(Config, OptimizerSemantics) {
  // DeepSpeed: "Adam" is decoupled unless adam_w_mode is false; "AdamW" always is.
  EXPECT_FALSE(Config::parse(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})")
                   ->optimizer.adam_w_mode);
  EXPECT_TRUE(Config::parse(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})")
                  ->optimizer.adam_w_mode);
  EXPECT_EQ(Config::parse(R"({"optimizer": {"type": "ADAMW"}})")->optimizer.type, "AdamW");
  // Torch-style extras with their default values are fine; the others would change results.
  EXPECT_OK(
      Config::parse(R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": false, "bias_correction": true,
                               "torch_adam": true}}})"));
  auto ams = Config::parse(R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": true}}})");
  ASSERT_FALSE(ams.is_ok());
  EXPECT_EQ(ams.status().code(), StatusCode::kUnsupported);
  EXPECT_HAS(ams.status().message(), "optimizer.params.amsgrad: true is not supported");
  EXPECT_HAS(parse_error(R"({"optimizer": {"params": {"bias_correction": false}}})"),
             "optimizer.params.bias_correction: false is not supported");
  EXPECT_HAS(parse_error(R"({"optimizer": {"params": {"max_grad_norm": 1.0}}})"), "gradient_clipping");
}

TEST(Config, UnimplementedKeysAreListed) {
  auto r = Config::parse(R"({"prescale_gradients": true, "gradient_predivide_factor": 2.0,
                            "communication_data_type": "fp32", "zero_optimization": {"stage": 3,
                            "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})");
  ASSERT_OK(r);
  std::string all;
  for (const auto& u : r->unimplemented) all += u + "\n";
  EXPECT_EQ(r->unimplemented.size(), 3u) << all;
  EXPECT_HAS(all, "prescale_gradients");
  EXPECT_HAS(all, "gradient_predivide_factor");
  EXPECT_HAS(all, "communication_data_type");
  // DeepSpeed's partial-offload ratio is implemented: it is zoe.offload_ratio.
  EXPECT_EQ(r->zero.offload_optimizer.ratio, 0.3);
  EXPECT_EQ(r->zoe.offload_ratio, 0.3);
  EXPECT_HAS(
      parse_error(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}},
                            "zoe": {"offload_ratio": 0.5}})"),
      "zero_optimization.offload_optimizer.ratio 0.3 and zoe.offload_ratio 0.5 disagree");
  // Default values of those keys are not "unimplemented".
  auto d = Config::parse(R"({"prescale_gradients": false, "gradient_predivide_factor": 1.0,
                            "zero_optimization": {"round_robin_gradients": false}})");
  ASSERT_OK(d);
  EXPECT_TRUE(d->unimplemented.empty());
  // Features that would change what is trained are errors.
  EXPECT_HAS(parse_error(R"({"progressive_layer_drop": {"enabled": true, "theta": 0.5}})"),
             "progressive_layer_drop.enabled: true is not supported");
  EXPECT_OK(Config::parse(R"({"progressive_layer_drop": {"enabled": false}})"));
}

TEST(Config, DeprecatedSpellings) {
  auto r = Config::parse(R"({"zero_optimization": {"stage": 2, "cpu_offload": true},
                            "bfloat16": {"enabled": true}})");
  ASSERT_OK(r);
  EXPECT_EQ(r->zero.offload_optimizer.device, Offload::kCpu);
  EXPECT_TRUE(r->bf16);
  auto s = Config::parse(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1234,
                            "stage3_gather_fp16_weights_on_model_save": true}})");
  ASSERT_OK(s);
  EXPECT_EQ(s->zero.stage3_prefetch_bucket_size, 1234);
  EXPECT_TRUE(s->zero.stage3_gather_16bit_weights_on_model_save);
}

TEST(Config, ZoeSection) {
  auto r = Config::parse(R"({"zoe": {"device_budget": "256MiB", "host_budget": 0, "offload_ratio": 0.5,
                            "bf16_optimizer_states": true, "device": "cpu", "optimizer_threads": 8}})");
  ASSERT_OK(r);
  EXPECT_EQ(r->zoe.device_budget_bytes, 256ll << 20);
  EXPECT_EQ(r->zoe.host_budget_bytes, 0);
  EXPECT_EQ(r->zoe.offload_ratio, 0.5);
  EXPECT_TRUE(r->zoe.bf16_optimizer_states);
  EXPECT_EQ(r->zoe.device, "cpu");
  EXPECT_EQ(r->zoe.optimizer_threads, 8);
}

void expect_round_trip(const Config& c, int world_size) {
  std::string text = c.to_json();
  EXPECT_EQ(text.find("\"true\""), std::string::npos) << text;  // real JSON booleans
  EXPECT_EQ(text.find("\"false\""), std::string::npos) << text;
  auto back = Config::parse(text, world_size);
  ASSERT_OK(back) << "\n" << text;
  EXPECT_TRUE(back.value() == c) << text << "\nread back as\n" << back->to_json();
  EXPECT_EQ(back->to_json(), text);
}

TEST(Config, RoundTripThroughToJson) {
  ScratchDir dir("cfg");
  auto z3 = Config::parse(replace_all(kZero3Nvme, "NVME_DIR", dir.path()));
  ASSERT_OK(z3);
  expect_round_trip(z3.value(), 1);
  auto z2 = Config::parse(kZero2Cpu, 4);
  ASSERT_OK(z2);
  expect_round_trip(z2.value(), 4);
  expect_round_trip(Config::parse("{}").value(), 1);

  // Every field away from its default.
  Config c;
  c.train_micro_batch_size_per_gpu = 3;
  c.gradient_accumulation_steps = 7;
  c.train_batch_size = 42;
  c.gradient_clipping = 0.7;
  c.fp16 = {true, 128.0, 12, 500, 3, true, 0.25};
  c.zero.stage = 3;
  c.zero.contiguous_gradients = false;
  c.zero.reduce_scatter = false;
  c.zero.reduce_bucket_size = 123;
  c.zero.allgather_partitions = false;
  c.zero.allgather_bucket_size = 456;
  c.zero.overlap_comm = false;
  c.zero.sub_group_size = 789;
  c.zero.stage3_prefetch_bucket_size = 0;
  c.zero.stage3_param_persistence_threshold = 11;
  c.zero.stage3_model_persistence_threshold = 12;
  c.zero.stage3_max_live_parameters = 13;
  c.zero.stage3_max_reuse_distance = 14;
  c.zero.stage3_gather_16bit_weights_on_model_save = true;
  c.zero.offload_optimizer = {Offload::kNvme, {dir.path(), "/tmp"},
                              false,          6,
                              100000000,      1000000000,
                              true,           true,
                              true,           0.25};  // ratio = zoe.offload_ratio
  c.zero.offload_param = {Offload::kNvme, {dir.path()}, false, 9, 777, 888, false, false, false, 1.0};
  c.aio = {4096, 64, 4, true, false, true};
  c.optimizer = {"Adam", 0.1 + 0.2, 0.8, 0.95, 1e-12, 0.05, false};
  c.scheduler = {"WarmupDecayLR", 1e-6, 3e-4, 2000, "linear", 100000};
  c.zoe = {1ll << 40, 0.25, true, "cuda", 3ll << 30, 16};
  c.zoe.optimizer_states = "bf16";  // what bf16_optimizer_states true means
  c.zoe.master_weights = "bf16";
  expect_round_trip(c, 2);
}

// kGivenSizes: the sizes zoe chooses when a config leaves them out are written only where given,
// so a written config read back sizes them the same way; every other key is written as kEvery does.
TEST(Config, GivenSizesOnlyWrittenWhereGiven) {
  auto c = Config::parse(R"({"zero_optimization": {"stage": 3, "sub_group_size": 262144,
                             "offload_param": {"device": "cpu", "max_in_cpu": 0}}})");
  ASSERT_OK(c);
  const auto every = nlohmann::json::parse(c->to_json());
  const auto given = nlohmann::json::parse(c->to_json(Config::JsonKeys::kGivenSizes));
  const auto& z = given["zero_optimization"];
  EXPECT_EQ(z["sub_group_size"], 262144);
  EXPECT_EQ(z["offload_param"]["max_in_cpu"], 0);
  EXPECT_FALSE(z["offload_param"].contains("buffer_size")) << given.dump();
  EXPECT_FALSE(z["offload_optimizer"].contains("buffer_count")) << given.dump();
  EXPECT_EQ(every["zero_optimization"]["offload_optimizer"]["buffer_count"], 4);
  EXPECT_EQ(every["zero_optimization"]["offload_param"]["buffer_size"], 100000000);
  auto back = Config::parse(given.dump());
  ASSERT_OK(back);
  EXPECT_TRUE(back.value() == c.value());
  for (const char* k :
       {"zero_optimization.sub_group_size", "zero_optimization.offload_param.max_in_cpu",
        "zero_optimization.offload_param.buffer_size", "zero_optimization.offload_optimizer.buffer_count"}) {
    EXPECT_EQ(back->given(k), c->given(k)) << k;  // what zoe sizes stays zoe's to size
  }
  // The same keys but those four.
  size_t n_every = 0, n_given = 0;
  for (const auto& [k, v] : every.items()) n_every += v.is_object() ? v.flatten().size() : 1;
  for (const auto& [k, v] : given.items()) n_given += v.is_object() ? v.flatten().size() : 1;
  EXPECT_EQ(n_every, n_given + 2);
}

TEST(Config, LrSchedules) {
  Config none;
  none.optimizer.lr = 0.02;
  EXPECT_EQ(none.lr_at(1), 0.02);
  EXPECT_EQ(none.lr_at(1000), 0.02);

  // WarmupLR, log: min + (max - min) * log(it + 1) / log(W), update k at iteration k - 2.
  auto w = Config::parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001,
                            "warmup_max_lr": 0.011, "warmup_num_steps": 100}}})")
               .value();
  EXPECT_DOUBLE_EQ(w.lr_at(1), 0.001);  // before the scheduler's first step
  EXPECT_DOUBLE_EQ(w.lr_at(2), 0.001);  // iteration 0: log(1) = 0
  EXPECT_DOUBLE_EQ(w.lr_at(3), 0.001 + 0.01 * std::log(2.0) / std::log(100.0));
  EXPECT_DOUBLE_EQ(w.lr_at(51), 0.001 + 0.01 * std::log(50.0) / std::log(100.0));
  EXPECT_DOUBLE_EQ(w.lr_at(101), 0.011);  // iteration 99: log(100)/log(100)
  EXPECT_DOUBLE_EQ(w.lr_at(102), 0.011);
  EXPECT_DOUBLE_EQ(w.lr_at(100000), 0.011);
  EXPECT_DOUBLE_EQ(w.lr_at_iteration(9), 0.001 + 0.01 * std::log(10.0) / std::log(100.0));

  // WarmupLR, linear: min + (max - min) * it / W.
  auto l = Config::parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1.0,
                            "warmup_num_steps": 10, "warmup_type": "linear"}}})")
               .value();
  EXPECT_DOUBLE_EQ(l.lr_at(1), 0.0);
  EXPECT_DOUBLE_EQ(l.lr_at(2), 0.0);
  EXPECT_DOUBLE_EQ(l.lr_at(7), 0.5);
  EXPECT_DOUBLE_EQ(l.lr_at(11), 0.9);
  EXPECT_DOUBLE_EQ(l.lr_at(12), 1.0);

  // WarmupDecayLR: after warmup, max * (T - it) / (T - W), down to 0.
  auto d = Config::parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 1.0,
                            "warmup_num_steps": 10, "warmup_type": "linear", "total_num_steps": 110}}})")
               .value();
  EXPECT_DOUBLE_EQ(d.lr_at(7), 0.5);
  EXPECT_DOUBLE_EQ(d.lr_at(12), 1.0);   // iteration 10
  EXPECT_DOUBLE_EQ(d.lr_at(37), 0.75);  // iteration 35: 75/100
  EXPECT_DOUBLE_EQ(d.lr_at(62), 0.5);
  EXPECT_DOUBLE_EQ(d.lr_at(112), 0.0);  // iteration 110 = total
  EXPECT_DOUBLE_EQ(d.lr_at(500), 0.0);
  // Log warmup then decay, with a non-zero floor: min + (max - min) * gamma.
  auto dl = Config::parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.5,
                             "warmup_max_lr": 1.5, "warmup_num_steps": 4, "total_num_steps": 8}}})")
                .value();
  EXPECT_DOUBLE_EQ(dl.lr_at_iteration(1), 0.5 + std::log(2.0) / std::log(4.0));
  EXPECT_DOUBLE_EQ(dl.lr_at_iteration(6), 0.5 + 2.0 / 4.0);
  EXPECT_DOUBLE_EQ(dl.lr_at_iteration(8), 0.5);
  // DeepSpeed warms up over at least 2 steps.
  auto w0 = Config::parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1.0,
                             "warmup_num_steps": 0, "warmup_type": "linear"}}})")
                .value();
  EXPECT_DOUBLE_EQ(w0.lr_at_iteration(1), 0.5);
  EXPECT_DOUBLE_EQ(w0.lr_at_iteration(2), 1.0);
  // WarmupDecayLR needs its end.
  EXPECT_HAS(parse_error(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})"),
             "scheduler.params.total_num_steps is missing");
}

TEST(Config, IntegersAreRangeCheckedIntoTheirType) {
  // Values that a cast to int or uint32 would turn into 0, 1 or a negative number.
  for (const char* v : {"2147483648", "4294967296", "4294967297", "1073741824", "1e12"}) {
    std::string e = parse_error(std::string(R"({"gradient_accumulation_steps": )") + v + "}");
    EXPECT_HAS(e, "gradient_accumulation_steps: ");
    EXPECT_HAS(e, "is out of range (expected an integer in [1, 1048576])");
  }
  EXPECT_HAS(parse_error(R"({"gradient_accumulation_steps": 4294967297})"),
             "gradient_accumulation_steps: 4294967297 is out of range");
  EXPECT_HAS(
      parse_error(R"({"train_micro_batch_size_per_gpu": 1099511627776})"),
      "train_micro_batch_size_per_gpu: 1099511627776 is out of range (expected an integer in [1, 1048576])");
  EXPECT_HAS(parse_error(R"({"aio": {"queue_depth": 4294967297}})"),
             "aio.queue_depth: 4294967297 is out of range (expected an integer in [1, 4096])");
  EXPECT_HAS(parse_error(R"({"aio": {"queue_depth": 4294967296}})"),
             "aio.queue_depth: 4294967296 is out of range");
  EXPECT_HAS(parse_error(R"({"aio": {"block_size": 4294967297}})"),
             "aio.block_size: 4294967297 is out of range (expected an integer in [1, 1073741824])");
  EXPECT_HAS(parse_error(R"({"aio": {"thread_count": 4294967297}})"),
             "aio.thread_count: 4294967297 is out of range");
  EXPECT_HAS(parse_error(R"({"zoe": {"optimizer_threads": 4294967297}})"),
             "zoe.optimizer_threads: 4294967297 is out of range (expected an integer in [0, 4096])");
  EXPECT_HAS(parse_error(R"({"zero_optimization": {"offload_optimizer": {"buffer_count": 4398046511104}}})"),
             "zero_optimization.offload_optimizer.buffer_count: 4398046511104 is out of range (expected an "
             "integer in "
             "[1, 1024])");
  EXPECT_HAS(parse_error(R"({"fp16": {"loss_scale_window": 4294967297}})"),
             "fp16.loss_scale_window: 4294967297 is out of range (expected an integer in [1, 2147483647])");
  EXPECT_HAS(parse_error(R"({"zero_optimization": {"sub_group_size": 1e300}})"),
             "zero_optimization.sub_group_size: 1e+300 is out of range");
  EXPECT_HAS(parse_error(R"({"gradient_accumulation_steps": 18446744073709551617})"),
             "gradient_accumulation_steps: 1.8446744073709552e+19 is out of range");
  // The bounds themselves are accepted, with their exact value.
  auto r =
      Config::parse(R"({"gradient_accumulation_steps": 1048576, "train_micro_batch_size_per_gpu": 1048576,
                            "aio": {"queue_depth": 4096}, "zoe": {"optimizer_threads": 4096},
                            "zero_optimization": {"offload_optimizer": {"buffer_count": 1024}}})");
  ASSERT_OK(r);
  EXPECT_EQ(r->gradient_accumulation_steps, 1048576);
  EXPECT_EQ(r->train_batch_size, int64_t{1} << 40);
  EXPECT_EQ(r->aio.queue_depth, 4096);
  EXPECT_EQ(r->zoe.optimizer_threads, 4096);
  EXPECT_EQ(r->zero.offload_optimizer.buffer_count, 1024);
}

TEST(Config, Fp32HyperparametersNameTheValueAsGiven) {
  // eps 1e-300 is 0 as a float, lr 1e308 infinity: the message shows the value written.
  std::string e = parse_error(R"({"optimizer": {"params": {"eps": 1e-300}}})");
  EXPECT_HAS(e, "optimizer.params.eps: 1e-300 is out of range");
  EXPECT_HAS(e, "fp32");
  EXPECT_HAS(e, "1.17549e-38");
  e = parse_error(R"({"optimizer": {"params": {"lr": 1e308}}})");
  EXPECT_HAS(e, "optimizer.params.lr: 1e+308 is out of range");
  EXPECT_HAS(e, "3.40282e+38");
  EXPECT_HAS(
      parse_error(R"({"optimizer": {"params": {"betas": [0.9, 0.99999999999]}}})"),
      "optimizer.params.betas[1]: 0.99999999999 is out of range (expected [0, 1); in fp32, as zoe computes "
      "it, it is 1)");
  EXPECT_HAS(parse_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e39}}})"),
             "scheduler.params.warmup_max_lr: 1e+39 is out of range");
  EXPECT_HAS(parse_error(R"({"gradient_clipping": 1e39})"), "gradient_clipping: 1e+39 is out of range");
  // 0 stays legal where it is (lr 0, no weight decay), and small normal floats pass.
  auto r = Config::parse(R"({"optimizer": {"params": {"lr": 0, "eps": 1e-30, "weight_decay": 0}}})");
  ASSERT_OK(r);
  EXPECT_EQ(r->optimizer.lr, 0.0);
  EXPECT_EQ(r->optimizer.eps, 1e-30);
}

// The engine enforces it (tests/zero/test_placement.cpp, tests/cli/test_train_input.cpp): the
// config reads it as bytes and round-trips it.
TEST(Config, HostBudgetIsReadAsBytes) {
  auto r = Config::parse(R"({"zoe": {"host_budget": "1MiB"}})");
  ASSERT_OK(r);
  EXPECT_EQ(r->zoe.host_budget_bytes, 1 << 20);
  auto back = Config::parse(r->to_json());
  ASSERT_OK(back);
  EXPECT_EQ(back->zoe.host_budget_bytes, 1 << 20);
}

TEST(Config, NulByteIsAnError) {
  const std::string text("{\"zoe\":{}}\0{\"zero_optimization\": {\"stage\": 9}}", 45);
  ASSERT_EQ(text.size(), 45u);
  EXPECT_HAS(parse_error(text), "a NUL byte at offset 10 (line 1, column 11)");
  EXPECT_HAS(parse_error(std::string("{\n  \"a\": 1\0}", 12)), "offset 10 (line 2, column 9)");
  ScratchDir dir("cfg");
  std::ofstream(dir.file("nul.json"), std::ios::binary) << text;
  auto l = Config::load(dir.file("nul.json"));
  ASSERT_FALSE(l.is_ok());
  EXPECT_HAS(l.status().to_string(), "NUL byte");
  EXPECT_HAS(l.status().to_string(), dir.file("nul.json"));
}

TEST(Config, NumbersBeyondDoubleNameTheirPath) {
  EXPECT_HAS(parse_error(R"({"optimizer": {"params": {"lr": 1e400}}})"),
             "invalid JSON at optimizer.params.lr: number overflow parsing '1e400'");
  EXPECT_HAS(parse_error(R"({"optimizer": {"params": {"betas": [0.9, -1e400]}}})"),
             "invalid JSON at optimizer.params.betas[1]: number overflow parsing '-1e400'");
  EXPECT_HAS(parse_error(R"({"steps_per_print": 1e400})"), "at steps_per_print:");
  EXPECT_HAS(parse_error("1e400"), "at the top level");
}

TEST(Config, DeepNestingIsAnErrorNotACrash) {
  for (int depth : {65, 100000}) {
    std::string arrays = R"({"tensorboard": )" + std::string(static_cast<size_t>(depth), '[') +
                         std::string(static_cast<size_t>(depth), ']') + "}";
    std::string e = parse_error(arrays);
    EXPECT_HAS(e, "nested more than 64 deep at tensorboard[0][0]");
    EXPECT_LT(e.size(), 400u) << "the path is shortened";
    std::string objects;
    for (int i = 0; i < depth; ++i) objects += R"({"a": )";
    objects += '1';
    objects.append(static_cast<size_t>(depth), '}');
    EXPECT_HAS(parse_error(objects), "nested more than 64 deep at a.a.a");
  }
  // 64 levels are fine (the config itself is one).
  std::string ok = R"({"tensorboard": )" + std::string(63, '[') + std::string(63, ']') + "}";
  EXPECT_OK(Config::parse(ok));
}

TEST(JsonReader, ParseJsonChecked) {
  auto ok = parse_json_checked(R"({"a": [1, {"b": 2}]} // trailing comment)", "manifest");
  ASSERT_OK(ok);
  EXPECT_EQ((*ok)["a"][1]["b"], 2);
  auto dup = parse_json_checked(R"({"a": [1, {"b": 2, "b": 3}]})", "manifest");
  ASSERT_FALSE(dup.is_ok());
  EXPECT_HAS(dup.status().message(), "manifest: duplicate key 'a[1].b'");
  JsonLimits small;
  small.max_bytes = 10;
  auto big = parse_json_checked(R"({"a": 12345})", "manifest", small);
  ASSERT_FALSE(big.is_ok());
  EXPECT_HAS(big.status().message(), "manifest: 12 bytes");
  EXPECT_HAS(big.status().message(), "more than the 10 bytes");
  JsonLimits strict;
  strict.allow_comments = false;
  EXPECT_FALSE(parse_json_checked("{} // no", "manifest", strict).is_ok());
  strict.max_depth = 2;
  EXPECT_OK(parse_json_checked("[[1]]", "m", strict));
  EXPECT_HAS(parse_json_checked("[[[1]]]", "m", strict).status().message(),
             "nested more than 2 deep at [0][0]");
}

TEST(JsonReader, ReadFileCapped) {
  ScratchDir dir("cfg");
  std::ofstream(dir.file("f.json")) << "0123456789";
  auto exact = read_file_capped(dir.file("f.json"), 10, "config file");
  ASSERT_OK(exact);
  EXPECT_EQ(*exact, "0123456789");
  auto over = read_file_capped(dir.file("f.json"), 9, "config file");
  ASSERT_FALSE(over.is_ok());
  EXPECT_HAS(over.status().message(), "config file " + dir.file("f.json") + " holds 10 bytes");
  EXPECT_HAS(over.status().message(), "more than the 9 bytes");
  // A device (no size, or no end): refused before it is read.
  auto zero = read_file_capped("/dev/zero", 1 << 20, "config file");
  ASSERT_FALSE(zero.is_ok());
  EXPECT_HAS(zero.status().message(), "config file /dev/zero is a character device, not a regular file");
  auto d = read_file_capped(dir.path(), 100, "config file");
  ASSERT_FALSE(d.is_ok());
  EXPECT_HAS(d.status().message(), "is a directory");
  auto missing = read_file_capped(dir.file("none"), 100, "config file");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  // Config::load applies the 16 MiB cap (a sparse file of 17 MiB).
  std::ofstream(dir.file("big.json")).close();
  std::filesystem::resize_file(dir.file("big.json"), 17u << 20);
  auto l = Config::load(dir.file("big.json"));
  ASSERT_FALSE(l.is_ok());
  EXPECT_HAS(l.status().to_string(), dir.file("big.json"));
  EXPECT_HAS(l.status().to_string(), "16777216 bytes");
}

}  // namespace
}  // namespace zoe::config

namespace zoe::config {
namespace {

// A batch value the rule derives goes through its key's range, as if it had been given: a config
// is accepted exactly when the same config with every value written out (to_json) is.
TEST(ConfigBatch, DerivedValuesAreCheckedLikeGivenOnes) {
  for (const char* json : {
           R"({"train_batch_size": 4294967297, "train_micro_batch_size_per_gpu": 1})",
           R"({"train_batch_size": 1073741824, "train_micro_batch_size_per_gpu": 1})",
           R"({"train_batch_size": 4398046511104, "gradient_accumulation_steps": 1})",
           R"({"train_batch_size": 4398046511104})",
       }) {
    const std::string msg = parse_error(json);
    EXPECT_HAS(msg, "is out of range (expected an integer in [1, 1048576])");
    EXPECT_HAS(msg, "derived");
    EXPECT_TRUE(msg.find("gradient_accumulation_steps") == 0 ||
                msg.find("train_micro_batch_size_per_gpu") == 0)
        << msg;
  }
  EXPECT_HAS(parse_error(R"({"train_batch_size": 4294967297, "train_micro_batch_size_per_gpu": 1})"),
             "gradient_accumulation_steps: 4294967297 (derived: train_batch_size 4294967297 / "
             "(train_micro_batch_size_per_gpu 1 x world size 1)) is out of range");
  // The largest derived values that the keys allow still parse, and round-trip.
  for (const char* json : {R"({"train_batch_size": 1048576, "train_micro_batch_size_per_gpu": 1})",
                           R"({"train_batch_size": 1048576})"}) {
    auto c = Config::parse(json);
    ASSERT_OK(c);
    ASSERT_OK(Config::parse(c->to_json()));
  }
}

// Every config parse accepts is accepted again from its own to_json (what Config::set and the
// CLI's flags re-validate), and reads back equal.
TEST(ConfigRoundTrip, AcceptedEdgeValuesReadBackEqual) {
  for (
      const char* json : {
          R"({"zoe": {"offload_ratio": 0}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})",
          R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0}}})",
          R"({"train_batch_size": 1048576, "train_micro_batch_size_per_gpu": 1})",
          R"({"fp16": {"enabled": true, "loss_scale": 3e38, "min_loss_scale": 1.2e-38}})",
      }) {
    auto c = Config::parse(json);
    ASSERT_OK(c) << json;
    auto back = Config::parse(c->to_json());
    ASSERT_OK(back) << json << "\n" << c->to_json();
    EXPECT_TRUE(*back == *c) << json;
  }
}

// Every number zoe reads is computed in fp32: it must be a finite float and, where nonzero, not
// underflow to 0 or a denormal there. Checked for every number key of the table.
TEST(ConfigFloatRange, EveryNumberKeyIsCheckedInFp32) {
  int checked = 0;
  for (const detail::Field& f : detail::config_fields()) {
    if (f.kind != detail::Kind::kDouble && f.kind != detail::Kind::kPair) continue;
    ++checked;
    std::string key = f.path;
    std::string json = "{";
    std::string close = "}";
    for (size_t dot; (dot = key.find('.')) != std::string::npos; key = key.substr(dot + 1)) {
      json += "\"" + key.substr(0, dot) + "\": {";
      close += "}";
    }
    for (const char* bad : {"1e308", "1e39", "1e-300", "1e-40"}) {
      const std::string v = f.kind == detail::Kind::kPair ? std::string("[") + bad + ", 0.5]" : bad;
      const std::string text = json + "\"" + key + "\": " + v + close;
      auto c = Config::parse(text);
      EXPECT_FALSE(c.is_ok()) << f.path << " accepted " << bad;
      if (!c.is_ok()) {
        EXPECT_HAS(c.status().message(), f.path);
      }
    }
  }
  EXPECT_GE(checked, 10);
  EXPECT_HAS(parse_error(R"({"fp16": {"enabled": true, "loss_scale": 1e308}})"),
             "fp16.loss_scale: 1e+308 is out of range (zoe computes it in fp32");
  EXPECT_HAS(parse_error(R"({"fp16": {"enabled": true, "loss_scale": 1e-300}})"),
             "fp16.loss_scale: 1e-300 is out of range (zoe computes it in fp32, where it would be denormal");
}

// A number whose text is not zero but which reads as 0 in a double is refused where it is, in any
// key (and in any JSON zoe reads); a zero written any way is still 0.
TEST(ConfigFloatRange, NumbersThatUnderflowToZeroAreRefused) {
  const std::string msg = parse_error(R"({"optimizer": {"params": {"lr": 1e-400}}})");
  EXPECT_HAS(msg, "optimizer.params.lr: 1e-400 is too small for a double and would be read as 0");
  EXPECT_HAS(parse_error(R"({"optimizer": {"params": {"betas": [0.9, -2.5e-999]}}})"),
             "optimizer.params.betas[1]: -2.5e-999");
  EXPECT_HAS(parse_error(R"({"steps_per_print": 0.000001e-330})"), "steps_per_print");
  for (const char* zero : {"0", "0.0", "0e-400", "-0.0E+5", "0.000e-999"}) {
    auto c = Config::parse(std::string(R"({"optimizer": {"params": {"lr": )") + zero + "}}}");
    ASSERT_OK(c) << zero;
    EXPECT_EQ(c->optimizer.lr, 0.0);
  }
  auto j = parse_json_checked(R"({"a": [1, {"b": 3e-500}]})", "manifest");
  ASSERT_FALSE(j.is_ok());
  EXPECT_HAS(j.status().message(), "manifest: invalid JSON at a[1].b: 3e-500");
}

// null is not read as the default: an error naming the key (for every key with an effect).
TEST(ConfigNull, NullIsRefusedNamingTheKey) {
  for (const auto& [json, path] : std::vector<std::pair<std::string, std::string>>{
           {R"({"zero_optimization": {"stage": null}})", "zero_optimization.stage"},
           {R"({"optimizer": {"params": {"lr": null}}})", "optimizer.params.lr"},
           {R"({"bf16": {"enabled": null}})", "bf16.enabled"},
           {R"({"bfloat16": {"enabled": null}})", "bfloat16.enabled"},
           {R"({"zero_optimization": {"offload_optimizer": {"buffer_count": null}}})",
            "zero_optimization.offload_optimizer.buffer_count"},
           {R"({"train_batch_size": null})", "train_batch_size"},
           {R"({"amp": {"enabled": null}})", "amp.enabled"},
       }) {
    const std::string msg = parse_error(json);
    EXPECT_EQ(msg.find(path + ": null is not a value zoe reads"), 0u) << msg;
  }
  EXPECT_HAS(parse_error(R"({"zero_optimization": {"stage": null}})"), "its default 0");
  // Keys without effect, whose contents are never checked, may be null; so may a key whose default
  // is null itself (no directory), and a section (DeepSpeed's Optional sections: null is absent).
  ASSERT_OK(Config::parse(R"({"steps_per_print": null, "tensorboard": null})"));
  ASSERT_OK(Config::parse(R"({"zero_optimization": {"offload_optimizer": {"nvme_path": null}}})"));
  ASSERT_OK(Config::parse(R"({"zero_optimization": {"stage": 2, "offload_optimizer": null}})"));
}

}  // namespace
}  // namespace zoe::config
