// Engine::sleep() / Engine::wake() at this process's world size (1 here, 2 under mpirun): sleeping
// between every step gives the bits of never sleeping, for every placement of the engine matrix
// (stages 0-3, offload none/cpu/nvme), fp32 and bf16 compute, with and without micro-batches;
// while asleep the device holds no memory and the copies sit in host memory, or on NVMe when
// zoe.host_budget has no room; calls in the wrong order are refused by name and change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "config/config.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"
#include "tests/zero/mlp.h"
#include "tests/zero/shared_runtime.h"
#include "zero/engine_internal.h"

namespace zoe {
namespace {

using test::identical;
using test::Layer;
using test::MlpSpec;

struct Case {
  test::MatrixPlacement pl;
  bool bf16 = false;
  std::string extra_zoe{};  // more zoe.* keys
};

std::string make_config(const Case& c, const std::string& nvme) {
  auto off = [&](const char* dev) {
    std::string j = std::string("{\"device\": \"") + dev + "\"";
    if (std::string(dev) == "nvme") j += ", \"nvme_path\": \"" + nvme + "\"";
    return j + "}";
  };
  return std::string("{") + (c.bf16 ? "\"bf16\": {\"enabled\": true}," : "") +
         "\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2, \"optimizer\": "
         "{\"type\": "
         "\"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}, \"zero_optimization\": "
         "{\"stage\": " +
         std::to_string(c.pl.stage) +
         ", \"stage3_param_persistence_threshold\": 0, \"sub_group_size\": 16384, \"offload_optimizer\": " +
         off(c.pl.opt) +
         ", \"offload_param\": " + (c.pl.stage == 3 ? off(c.pl.param) : "{\"device\": \"none\"}") +
         "}, \"zoe\": {\"device_budget\": \"64MiB\", \"optimizer_threads\": 1" + c.extra_zoe + "}}";
}

std::string describe(const Case& c) {
  return "stage " + std::to_string(c.pl.stage) + " offload_optimizer " + c.pl.opt + " offload_param " +
         c.pl.param + (c.bf16 ? " bf16" : " fp32") + c.extra_zoe;
}

Result<std::unique_ptr<Engine>> make_engine(const Case& c, const std::string& nvme, const MlpSpec& s) {
  Runtime& rt = test::shared_runtime();
  ZOE_ASSIGN_OR_RETURN(auto cfg, config::Config::parse(make_config(c, nvme), rt.world_size()));
  ZOE_ASSIGN_OR_RETURN(auto e, zero::create_engine(rt, cfg));
  ZOE_RETURN_IF_ERROR(test::register_mlp(*e, s));
  return e;
}

// What a sleep saw: the device's memory before and while asleep, the copies' host and NVMe bytes.
struct SleepSeen {
  uint64_t device_awake = 0, device_asleep = ~uint64_t{0}, host_grew = 0, nvme_grew = 0;
  bool flag_wrong = false;
};

// Trains `steps` steps of micro-batches; with `sleep`, sleep() and wake() after every step.
Result<std::vector<Layer>> train(const Case& c, const MlpSpec& s, int steps, bool sleep,
                                 SleepSeen* seen = nullptr) {
  Runtime& rt = test::shared_runtime();
  test::ScratchDir nvme("nvme");
  ZOE_ASSIGN_OR_RETURN(auto e, make_engine(c, nvme.path(), s));
  std::vector<Layer> out;
  auto sleep_wake = [&](int) -> Status {
    if (!sleep) return Status::ok();
    const MemoryUse before = e->memory_in_use();
    ZOE_RETURN_IF_ERROR(e->sleep());
    const MemoryUse asleep = e->memory_in_use();
    if (seen != nullptr) {
      seen->device_awake = std::max(seen->device_awake, before.device);
      seen->device_asleep = std::min(seen->device_asleep, asleep.device);
      seen->host_grew = std::max(seen->host_grew, asleep.host - std::min(asleep.host, before.host));
      seen->nvme_grew = std::max(seen->nvme_grew, asleep.nvme - std::min(asleep.nvme, before.nvme));
      seen->flag_wrong |= !e->is_asleep();
    }
    ZOE_RETURN_IF_ERROR(e->wake());
    if (seen != nullptr) seen->flag_wrong |= e->is_asleep();
    return Status::ok();
  };
  ZOE_RETURN_IF_ERROR(test::engine_train(*e, s, rt.rank(), rt.world_size(), steps, &out, nullptr, -1,
                                         /*micro=*/2, 0, false, {}, sleep_wake));
  return out;
}

TEST(SleepWake, SleepingBetweenEveryStepGivesTheBitsOfNeverSleeping) {
  const MlpSpec s;
  uint64_t most_on_device = 0;
  for (const auto& pl : test::matrix_placements()) {
    for (bool bf16 : {false, true}) {
      const Case c{pl, bf16};
      SCOPED_TRACE(describe(c));
      auto plain = train(c, s, 3, false);
      ASSERT_OK(plain);
      SleepSeen seen;
      auto slept = train(c, s, 3, true, &seen);
      ASSERT_OK(slept);
      EXPECT_TRUE(identical(plain.value(), slept.value())) << "sleeping changed the weights";
      most_on_device = std::max(most_on_device, seen.device_awake);  // 0 where everything is on NVMe
      EXPECT_EQ(seen.device_asleep, 0u) << "device memory in use while asleep";
      EXPECT_GE(seen.host_grew, seen.device_awake) << "the device's bytes are not in host memory";
      EXPECT_FALSE(seen.flag_wrong) << "is_asleep() disagrees";
    }
  }
  EXPECT_GT(most_on_device, 0u) << "no placement held device memory between steps";
}

TEST(SleepWake, OverlappedAndSpeculativeUpdatesSleepAfterTheirStep) {
  const MlpSpec s;
  for (const char* extra : {", \"overlap_step\": true", ", \"speculative_step\": true"}) {
    const Case c{{2, "cpu", "none"}, true, extra};
    SCOPED_TRACE(describe(c));
    auto plain = train(c, s, 3, false);
    ASSERT_OK(plain);
    auto slept = train(c, s, 3, true);
    ASSERT_OK(slept);
    EXPECT_TRUE(identical(plain.value(), slept.value()));
  }
}

TEST(SleepWake, AFullHostBudgetSendsTheCopiesToNvme) {
  MlpSpec s;
  s.d = 256;
  // A host budget the optimizer's swap buffers nearly fill: no room for the device's bytes.
  const Case c{{2, "nvme", "none"}, false, ", \"host_budget\": \"1MiB\""};
  auto plain = train(c, s, 3, false);
  ASSERT_OK(plain);
  SleepSeen seen;
  auto slept = train(c, s, 3, true, &seen);
  ASSERT_OK(slept);
  EXPECT_TRUE(identical(plain.value(), slept.value()));
  EXPECT_GT(seen.device_awake, 0u);
  EXPECT_EQ(seen.device_asleep, 0u);
  EXPECT_GE(seen.nvme_grew, seen.device_awake / 2) << "the copies did not go to NVMe";
  EXPECT_LE(seen.host_grew, seen.device_awake / 2);
}

TEST(SleepWake, NoRoomAnywhereIsRefusedAndTheEngineStaysUsable) {
  MlpSpec s;
  s.d = 256;  // about 4 MB on the device: parameters, gradients and the optimizer's states
  const Case c{{2, "none", "none"}, false, ", \"host_budget\": \"1MiB\""};
  test::ScratchDir nvme("nvme");
  auto e = make_engine(c, nvme.path(), s);
  ASSERT_OK(e);
  Runtime& rt = test::shared_runtime();
  std::vector<Layer> out;
  Status refused;
  ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 2, &out, nullptr, -1, 2, 0, false,
                               {}, [&](int) {
                                 refused = e.value()->sleep();
                                 return Status::ok();
                               }));
  EXPECT_EQ(refused.code(), StatusCode::kOutOfBudget);
  EXPECT_NE(refused.message().find("zoe.host_budget"), std::string::npos) << refused.message();
  EXPECT_FALSE(e.value()->is_asleep());
  auto plain = train(c, s, 2, false);
  ASSERT_OK(plain);
  EXPECT_TRUE(identical(out, plain.value())) << "a refused sleep() changed the run";
}

TEST(SleepWake, CallsInTheWrongOrderAreRefusedByName) {
  const MlpSpec s;
  const Case c{{3, "cpu", "cpu"}, false};
  test::ScratchDir nvme("nvme");
  auto made = make_engine(c, nvme.path(), s);
  ASSERT_OK(made);
  Engine& e = *made.value();
  auto expect_refused = [](const Status& st, const std::string& words) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
  };
  expect_refused(e.wake(), "wake() while the engine is awake");
  // Mid-step: a module fetched, then gradients reduced but no step taken.
  ASSERT_OK(e.fetch(0).status());
  expect_refused(e.sleep(), "middle of a step");
  ASSERT_OK(e.release(0));
  ASSERT_OK(e.sleep());
  expect_refused(e.sleep(), "sleep() while the engine is asleep");
  expect_refused(e.fetch(0).status(), "fetch() while the engine is asleep: call wake() first");
  expect_refused(e.grads(0).status(), "grads() while the engine is asleep");
  expect_refused(e.step().status(), "step() while the engine is asleep");
  std::vector<float> w(static_cast<size_t>(s.d * s.d));
  expect_refused(e.read_master(0, 0, w.data()), "read_master() while the engine is asleep");
  expect_refused(e.save(nvme.path() + "/ckpt", "t", "{}"), "save() while the engine is asleep");
  ASSERT_OK(e.wake());
  // Nothing was lost: the run goes on as one that never slept.
  Runtime& rt = test::shared_runtime();
  std::vector<Layer> out;
  ASSERT_OK(test::engine_train(e, s, rt.rank(), rt.world_size(), 2, &out, nullptr, -1, 2));
  auto plain = train(c, s, 2, false);
  ASSERT_OK(plain);
  EXPECT_TRUE(identical(out, plain.value()));
  // Mid-step with gradients reduced: refused, and the step still completes.
  ASSERT_OK(test::engine_train(e, s, rt.rank(), rt.world_size(), 3, &out, nullptr, -1, 2, 2, false, [&](int) {
    expect_refused(e.sleep(), "middle of a step");
    return Status::ok();
  }));
  auto plain3 = train(c, s, 3, false);
  ASSERT_OK(plain3);
  EXPECT_TRUE(identical(out, plain3.value()));
}

}  // namespace
}  // namespace zoe
