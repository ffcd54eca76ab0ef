// Config fuzzer: DeepSpeed-style configs mutated at random (fixed seed) through Config::parse in
// process. Every result must be a Status error or a Config; nothing may throw or crash, and a
// Config that parses must survive its own to_json() round trip.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/log.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::config {
namespace {

using nlohmann::json;

// Seeds: the shapes users write (ZeRO-3 with NVMe, ZeRO-2 with CPU offload and a decaying
// schedule, fp16 with the deprecated spellings, a minimal one). NVME_DIR becomes a scratch dir.
const char* const kSeeds[] = {
    R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
        "gradient_clipping": 1.0, "steps_per_print": 100,
        "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                 "hysteresis": 2, "min_loss_scale": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-5,
                                                     "warmup_num_steps": 500}},
        "zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e9,
          "stage3_prefetch_bucket_size": 1e7, "sub_group_size": 1e8, "reduce_bucket_size": 1e7,
          "offload_optimizer": {"device": "nvme", "nvme_path": "NVME_DIR", "pin_memory": true,
                                "buffer_count": 4},
          "offload_param": {"device": "nvme", "nvme_path": ["NVME_DIR"], "buffer_count": 5,
                            "buffer_size": 1e8, "max_in_cpu": 1e9}},
        "aio": {"block_size": 1048576, "queue_depth": 32, "thread_count": 1, "single_submit": false,
                "overlap_events": true},
        "zoe": {"device_budget": "256MiB", "offload_ratio": 1.0, "optimizer_threads": 2}})",
    R"({"bf16": {"enabled": true},
        "optimizer": {"type": "adam", "params": {"lr": 2e-5, "betas": [0.9, 0.98], "eps": 1e-6,
                                                 "weight_decay": 0.1, "adam_w_mode": false}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-5,
                      "warmup_num_steps": 100, "total_num_steps": 1000, "warmup_type": "linear"}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
          "allgather_bucket_size": 2e8, "overlap_comm": true, "reduce_bucket_size": 2e8,
          "round_robin_gradients": true},
        "gradient_accumulation_steps": 4, "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
        "wall_clock_breakdown": false, "tensorboard": {"enabled": false, "output_path": "logs/"}})",
    R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": "true", "auto_cast": false},
        "zero_optimization": {"stage": 3, "cpu_offload": true, "prefetch_bucket_size": 1234,
                              "stage3_gather_fp16_weights_on_model_save": true},
        "bfloat16": {"enabled": false}, "communication_data_type": "fp32", "prescale_gradients": false})",
    R"({"zero_optimization": {"stage": 1}})",
};

// Values that break casts, ranges and types.
const char* const kNastyNumbers[] = {
    "1e400",
    "-1e400",
    "-1",
    "0",
    "4294967297",
    "4294967296",
    "2147483648",
    "1e308",
    "1e-300",
    "-0.0",
    "1.5",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551616",
    "-9223372036854775809",
    "1e19",
    "5e-324",
    "1073741824",
    "4398046511104",
};
const char* const kNastyValues[] = {
    "\"NaN\"",  "\"inf\"",  "\"auto\"",   "\"-1\"",      "\"\"",      "null",
    "true",     "false",    "[]",         "{}",          "[1, 2, 3]", "{\"enabled\": true}",
    "\"true\"", "\"1MiB\"", "\"256GiB\"", "\"\\u0000\"",
};

class Fuzzer {
 public:
  explicit Fuzzer(uint64_t seed) : rng_(seed) {}

  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  // Every value in the tree, with its parent, for mutating in place.
  void collect(json& j, std::vector<json*>* out) {
    out->push_back(&j);
    if (j.is_object() || j.is_array()) {
      for (auto& v : j) collect(v, out);
    }
  }

  // A mutation of the parsed tree, dumped back to text.
  std::string mutate_tree(json j) {
    const int edits = 1 + static_cast<int>(pick(3));
    std::vector<std::string> raw_numbers;  // numbers JSON values cannot hold (1e400): spliced as text
    for (int e = 0; e < edits; ++e) {
      std::vector<json*> nodes;
      collect(j, &nodes);
      json* n = nodes[pick(nodes.size())];
      switch (pick(7)) {
        case 0: {  // a number beyond casts/ranges, as text
          std::string token = "\"@RAW" + std::to_string(raw_numbers.size()) + "@\"";
          raw_numbers.push_back(kNastyNumbers[pick(std::size(kNastyNumbers))]);
          *n = token.substr(1, token.size() - 2);
          break;
        }
        case 1:  // another type
          *n = json::parse(kNastyValues[pick(std::size(kNastyValues))]);
          break;
        case 2:  // a key deleted
          if (n->is_object() && !n->empty()) {
            auto it = n->begin();
            std::advance(it, static_cast<long>(pick(n->size())));
            n->erase(it);
          }
          break;
        case 3:  // nested deeply (sometimes over the limit)
          for (size_t d = pick(2) ? 70 : 5 + pick(40); d > 0; --d) *n = json::array({*n});
          break;
        case 4:  // an unknown or misplaced key
          if (n->is_object()) (*n)[pick(2) ? "stage" : "zero_optimisation"] = 1;
          break;
        case 5:  // an object where a value was, or the reverse
          *n = n->is_object() ? json(1) : json::object({{"device", "nvme"}});
          break;
        default:  // the number next to its range
          if (n->is_number()) *n = n->get<double>() * (pick(2) ? -1 : 1e12);
          break;
      }
    }
    std::string text = j.dump();
    for (size_t i = 0; i < raw_numbers.size(); ++i) {
      const std::string token = "\"@RAW" + std::to_string(i) + "@\"";
      const size_t at = text.find(token);
      if (at != std::string::npos) text.replace(at, token.size(), raw_numbers[i]);
    }
    return text;
  }

  // A mutation of the bytes: truncation, random bytes (NUL among them), duplicated keys.
  std::string mutate_text(std::string text) {
    switch (pick(4)) {
      case 0:
        text.resize(pick(text.size()));
        break;
      case 1:
        for (int k = 1 + static_cast<int>(pick(4)); k > 0; --k)
          text[pick(text.size())] = static_cast<char>(pick(256));
        break;
      case 2: {  // a key written twice
        const size_t at = text.find("\"stage\"");
        if (at != std::string::npos) text.insert(at, "\"stage\": 2, ");
        break;
      }
      default:
        text.insert(pick(text.size()), pick(2) ? "1e400" : std::string(1, '\0'));
        break;
    }
    return text;
  }

 private:
  std::mt19937_64 rng_;
};

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
    s.replace(pos, from.size(), to);
  return s;
}

TEST(ConfigFuzz, MutatedConfigsGiveStatusErrorsOrRoundTrip) {
  set_log_level(LogLevel::kError);  // thousands of "ignored" warnings otherwise
  test::ScratchDir dir("fuzz");
  Fuzzer fz(20240611);
  int ok = 0, errors = 0;
  const int kConfigs = 6000;
  for (int i = 0; i < kConfigs; ++i) {
    const std::string seed_text =
        replace_all(kSeeds[static_cast<size_t>(i) % std::size(kSeeds)], "NVME_DIR", dir.path());
    std::string text = fz.mutate_tree(json::parse(seed_text));
    if (fz.pick(3) == 0) text = fz.mutate_text(text);
    const int world = fz.pick(4) == 0 ? 4 : 1;
    try {
      auto r = Config::parse(text, world);
      if (!r.is_ok()) {
        ++errors;
        EXPECT_FALSE(r.status().message().empty()) << text;
        continue;
      }
      ++ok;
      // What parses must read back the same from its own output.
      auto back = Config::parse(r->to_json(), world);
      ASSERT_OK(back) << "\nfrom\n" << text;
      EXPECT_TRUE(back.value() == r.value()) << text;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "exception escaped Config::parse: " << e.what() << "\nfor\n" << text;
    } catch (...) {
      ADD_FAILURE() << "unknown exception escaped Config::parse for\n" << text;
    }
  }
  printf("%d configs: %d parsed, %d errors\n", kConfigs, ok, errors);
  // Both outcomes occur (the mutations neither always break nor never break the config).
  EXPECT_GT(ok, kConfigs / 50) << errors << " errors";
  EXPECT_GT(errors, kConfigs / 2) << ok << " parsed";
}

}  // namespace
}  // namespace zoe::config
