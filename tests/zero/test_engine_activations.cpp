// The engine's activation store: config keys (zoe.activation_*, DeepSpeed's activation_checkpointing),
// the budgets planned beside the placement, round trips through Engine::activations() and the
// StepStats it fills. Public API only (a program written against include/zoe/ could do the same).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "config/config.h"
#include "io/fault_injector.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"
#include "tests/zero/shared_runtime.h"
#include "zero/test_hooks.h"
#include "zoe/zoe.h"

namespace zoe {
namespace {

Runtime& runtime() { return test::shared_runtime(); }

std::string with_zoe(const std::string& zoe_keys, const std::string& extra = "") {
  return "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 2}, \"zoe\": {" +
         zoe_keys + "}" + extra + "}";
}

TEST(ActivationConfig, KeysAreParsed) {
  auto c =
      Config::parse(with_zoe("\"activation_offload\": \"nvme\", \"activation_host_budget\": \"3MiB\", "
                             "\"activation_device_budget\": 65536, \"activation_prefetch\": 4, "
                             "\"activation_min_bytes\": 8192, \"activation_nvme_path\": \"/tmp/acts\""));
  ASSERT_OK(c);
  EXPECT_EQ(c->activation_offload(), ActivationOffload::kNvme);
  EXPECT_EQ(c->activation_host_budget(), 3u << 20);
  EXPECT_EQ(c->activation_device_budget(), 65536u);
  EXPECT_EQ(c->activation_prefetch(), 4);
  EXPECT_EQ(c->activation_min_bytes(), 8192u);
  EXPECT_EQ(c->activation_nvme_paths(), std::vector<std::string>{"/tmp/acts"});
  auto back = Config::parse(c->to_json());
  ASSERT_OK(back);
  EXPECT_EQ(back->to_json(), c->to_json());
  // Defaults.
  auto d = Config::parse(with_zoe(""));
  ASSERT_OK(d);
  EXPECT_EQ(d->activation_offload(), ActivationOffload::kNone);
  EXPECT_EQ(d->activation_prefetch(), 2);
  EXPECT_EQ(d->activation_min_bytes(), 262144u);
  EXPECT_FALSE(d->activation_checkpointing().given);
}

TEST(ActivationConfig, BadValuesNameTheKey) {
  const std::pair<std::string, std::string> bad[] = {
      {"\"activation_offload\": \"disk\"", "zoe.activation_offload"},
      {"\"activation_prefetch\": -1", "zoe.activation_prefetch"},
      {"\"activation_prefetch\": 100", "zoe.activation_prefetch"},
      {"\"activation_host_budget\": \"lots\"", "zoe.activation_host_budget"},
      {"\"activation_min_bytes\": -5", "zoe.activation_min_bytes"},
      {"\"activation_offload\": \"nvme\"", "zoe.activation_nvme_path"},
  };
  for (const auto& [keys, name] : bad) {
    auto c = Config::parse(with_zoe(keys));
    ASSERT_FALSE(c.is_ok()) << keys;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << keys;
    EXPECT_NE(c.status().message().find(name), std::string::npos) << c.status().message();
  }
  // The offload's nvme_path serves when zoe.activation_nvme_path is not given.
  auto c = Config::parse(
      "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": "
      "\"/tmp/p\"}},"
      " \"zoe\": {\"activation_offload\": \"nvme\"}}");
  ASSERT_OK(c);
  EXPECT_EQ(c->activation_nvme_paths(), std::vector<std::string>{"/tmp/p"});
}

TEST(ActivationConfig, DeepSpeedSection) {
  auto c = Config::parse(with_zoe("",
                                  ", \"activation_checkpointing\": {\"partition_activations\": false, "
                                  "\"cpu_checkpointing\": true, \"contiguous_memory_optimization\": false, "
                                  "\"number_checkpoints\": null, \"synchronize_checkpoint_boundary\": true, "
                                  "\"profile\": false}"));
  ASSERT_OK(c);
  Config::ActivationCheckpointing a = c->activation_checkpointing();
  EXPECT_TRUE(a.given);
  EXPECT_TRUE(a.cpu_checkpointing);
  EXPECT_TRUE(a.synchronize_checkpoint_boundary);
  EXPECT_EQ(a.number_checkpoints, 0);
  EXPECT_EQ(c->activation_offload(), ActivationOffload::kCpu) << "cpu_checkpointing means offload cpu";
  auto back = Config::parse(c->to_json());
  ASSERT_OK(back);
  EXPECT_TRUE(back->activation_checkpointing().given);
  EXPECT_EQ(back->activation_offload(), ActivationOffload::kCpu);
  // zoe.activation_offload, when given, wins over cpu_checkpointing.
  auto z = Config::parse(with_zoe("\"activation_offload\": \"none\"",
                                  ", \"activation_checkpointing\": {\"cpu_checkpointing\": true, "
                                  "\"number_checkpoints\": 4}"));
  ASSERT_OK(z);
  EXPECT_EQ(z->activation_offload(), ActivationOffload::kNone);
  EXPECT_EQ(z->activation_checkpointing().number_checkpoints, 4);
  // What zoe cannot honour is a warning naming the key.
  auto p = config::Config::parse(
      with_zoe("", ", \"activation_checkpointing\": {\"partition_activations\": true, \"profile\": true}"));
  ASSERT_OK(p);
  ASSERT_EQ(p->unimplemented.size(), 2u);
  EXPECT_EQ(p->unimplemented[0].rfind("activation_checkpointing.partition_activations", 0), 0u);
  EXPECT_EQ(p->unimplemented[1].rfind("activation_checkpointing.profile", 0), 0u);
  auto bad = Config::parse(with_zoe("", ", \"activation_checkpointing\": {\"number_checkpoints\": -2}"));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("activation_checkpointing.number_checkpoints"), std::string::npos);
}

constexpr int kLayers = 8;
constexpr int64_t kD = 64;  // a 64 x 64 fp32 weight: 16 KiB

// `sections`: the config's sections beside "zoe" and the micro-batch.
Result<std::unique_ptr<Engine>> make_engine(
    const std::string& zoe_keys, const std::string& sections = "\"zero_optimization\": {\"stage\": 2}",
    const std::string& budget = "8MiB") {
  const std::string text = "{\"train_micro_batch_size_per_gpu\": 1, " + sections +
                           ", \"zoe\": {\"device_budget\": \"" + budget +
                           "\", \"optimizer_threads\": 1, "
                           "\"activation_min_bytes\": 4096" +
                           std::string(zoe_keys.empty() ? "" : ", ") + zoe_keys + "}}";
  ZOE_ASSIGN_OR_RETURN(Config cfg, Config::parse(text, runtime().world_size()));
  ZOE_ASSIGN_OR_RETURN(auto e, Engine::create(runtime(), cfg));
  for (int l = 0; l < kLayers; ++l) {
    ZOE_RETURN_IF_ERROR(e->add_module("layer." + std::to_string(l), {{"w", {kD, kD}}, {"b", {kD}}}));
  }
  ZOE_RETURN_IF_ERROR(e->initialize([](size_t m, size_t p, float* d, size_t n) {
    for (size_t i = 0; i < n; ++i) d[i] = 0.01f * static_cast<float>((m * 7 + p * 3 + i) % 13) - 0.06f;
  }));
  return e;
}

// One step: every layer's weight saved as an activation, loaded back in reverse into its
// gradient buffer and compared with the weight, then gradients zeroed, reduced, and a step.
Result<StepStats> step_with_activations(Engine& e) {
  ActivationStore& acts = e.activations();
  std::vector<ActivationId> ids;
  std::vector<std::vector<char>> want;
  for (size_t m = 0; m < e.num_modules(); ++m) {
    ZOE_ASSIGN_OR_RETURN(ModuleParams p, e.fetch(m));
    const TensorView& w = p.tensors[0];
    want.emplace_back(static_cast<char*>(w.data), static_cast<char*>(w.data) + w.bytes);
    ZOE_ASSIGN_OR_RETURN(ActivationId id, acts.save(w.data, w.bytes));
    ids.push_back(id);
    ZOE_RETURN_IF_ERROR(e.release(m));
  }
  for (size_t m = e.num_modules(); m-- > 0;) {
    ZOE_ASSIGN_OR_RETURN(ModuleParams g, e.grads(m));
    const TensorView& gw = g.tensors[0];
    ZOE_RETURN_IF_ERROR(acts.load(ids[m], gw.data));
    if (std::memcmp(gw.data, want[m].data(), gw.bytes) != 0)
      return internal_error("activation of module %zu came back different", m);
    for (const TensorView& t : g.tensors) std::memset(t.data, 0, t.bytes);
    ZOE_RETURN_IF_ERROR(e.reduce_grads(m));
  }
  ZOE_RETURN_IF_ERROR(acts.end_micro_batch());
  return e.step();
}

void check_offload(const std::string& keys, ActivationOffload o) {
  test::ScratchDir dir("engine-acts");
  std::string k = keys;
  if (o == ActivationOffload::kNvme) k += ", \"activation_nvme_path\": \"" + dir.path() + "\"";
  auto e = make_engine(k);
  ASSERT_OK(e);
  EXPECT_EQ((*e)->activations().offload(), o);
  const uint64_t weight = kD * kD * 4;
  for (int s = 0; s < 3; ++s) {
    auto st = step_with_activations(**e);
    ASSERT_OK(st) << "step " << s;
    EXPECT_EQ(st->activation_checkpoint_bytes, kLayers * weight);
    EXPECT_EQ(st->activation_tier_bytes[0] + st->activation_tier_bytes[1] + st->activation_tier_bytes[2],
              kLayers * weight);
    if (o != ActivationOffload::kNone) {
      EXPECT_LE(st->activation_high_water[0], 2 * weight) << "the device share was given as 2 weights";
    }
    EXPECT_GE(st->high_water[1], st->activation_high_water[1]);
    EXPECT_GE(st->high_water[2], st->activation_high_water[2]);
    EXPECT_LE(st->high_water[0], (*e)->device_budget_bytes());
    if (o == ActivationOffload::kNone) continue;
    EXPECT_GT(st->activation_tier_bytes[o == ActivationOffload::kCpu ? 1 : 2], 0u);
    EXPECT_GT(st->activation_bytes_device_to_host, 0u);
    EXPECT_GT(st->activation_bytes_host_to_device, 0u);
    if (o == ActivationOffload::kNvme) {
      EXPECT_GT(st->activation_bytes_nvme_write, 0u);
      EXPECT_GT(st->activation_bytes_nvme_read, 0u);
      EXPECT_GE(st->t_activation_stall, 0.0);
    }
  }
}

// Stage 3 with the parameters offloaded and a model larger than the device budget: the gather
// window and the partitions' device cache would take the whole budget, so without
// zoe.activation_device_budget the engine keeps a quarter of it for activations (offload asked
// for, or DeepSpeed's activation_checkpointing section). Without that share the first save failed.
Result<StepStats> stage3_step(const std::string& zoe_keys, const std::string& sections, uint64_t* share) {
  const std::string text =
      "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 3, \"offload_param\": "
      "{\"device\": \"cpu\"}, \"offload_optimizer\": {\"device\": \"cpu\"}}" +
      sections +
      ", \"zoe\": {\"device_budget\": \"4MiB\", \"optimizer_threads\": 1, \"activation_min_bytes\": 4096" +
      zoe_keys + "}}";
  ZOE_ASSIGN_OR_RETURN(Config cfg, Config::parse(text, runtime().world_size()));
  ZOE_ASSIGN_OR_RETURN(auto e, Engine::create(runtime(), cfg));
  for (int l = 0; l < 16; ++l)
    ZOE_RETURN_IF_ERROR(e->add_module("big." + std::to_string(l), {{"w", {256, 256}}}));
  ZOE_RETURN_IF_ERROR(e->initialize([](size_t, size_t, float* d, size_t n) { std::fill(d, d + n, 0.01f); }));
  // Four 64 KiB activations saved and loaded back, the step's modules fetched between the saves.
  ActivationStore& acts = e->activations();
  std::vector<std::vector<float>> saved(4, std::vector<float>(16384));
  std::vector<ActivationId> ids;
  for (size_t m = 0; m < e->num_modules(); ++m) {
    ZOE_RETURN_IF_ERROR(e->fetch(m).status());
    if (m % 4 == 0) {
      std::vector<float>& a = saved[m / 4];
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(m * 100000 + i);
      ZOE_ASSIGN_OR_RETURN(ActivationId id, acts.save(a.data(), a.size() * 4));
      ids.push_back(id);
    }
    ZOE_RETURN_IF_ERROR(e->release(m));
  }
  std::vector<float> back(16384);
  for (size_t k = ids.size(); k-- > 0;) {
    ZOE_RETURN_IF_ERROR(acts.load(ids[k], back.data()));
    if (back != saved[k]) return internal_error("activation %zu came back different", k);
  }
  ZOE_RETURN_IF_ERROR(acts.end_micro_batch());
  for (size_t m = e->num_modules(); m-- > 0;) {
    ZOE_ASSIGN_OR_RETURN(ModuleParams g, e->grads(m));
    for (const TensorView& t : g.tensors) std::memset(t.data, 0, t.bytes);
    ZOE_RETURN_IF_ERROR(e->reduce_grads(m));
  }
  ZOE_ASSIGN_OR_RETURN(StepStats st, e->step());
  *share = e->device_budget_bytes() - st.high_water[0] + st.activation_high_water[0];
  return st;
}

TEST(EngineActivations, DefaultDeviceShareBesideAStage3Cache) {
  const uint64_t budget = 4u << 20, one = 64u << 10;
  uint64_t room = 0;
  for (const bool section : {false, true}) {
    auto st = section
                  ? stage3_step("", ", \"activation_checkpointing\": {\"cpu_checkpointing\": true}", &room)
                  : stage3_step(", \"activation_offload\": \"cpu\"", "", &room);
    ASSERT_OK(st) << (section ? "the DeepSpeed section" : "zoe.activation_offload");
    EXPECT_EQ(st->activation_checkpoint_bytes, 4 * one);
    EXPECT_GT(st->activation_tier_bytes[0], 0u);
    EXPECT_LE(st->high_water[0], budget);
    EXPECT_GE(room, budget / 4) << "the engine kept a quarter of the budget for activations";
  }
  // A share given is honoured exactly: one activation's bytes, so the rest goes to the host.
  auto st = stage3_step(
      ", \"activation_offload\": \"cpu\", \"activation_device_budget\": " + std::to_string(one), "", &room);
  ASSERT_OK(st);
  EXPECT_EQ(st->activation_tier_bytes[0], one);
  EXPECT_EQ(st->activation_tier_bytes[1], 3 * one);
}

TEST(EngineActivations, NoneKeepsOnTheDevice) {
  check_offload("\"activation_offload\": \"none\"", ActivationOffload::kNone);
}
TEST(EngineActivations, CpuOffload) {
  check_offload("\"activation_device_budget\": 32768, \"activation_offload\": \"cpu\"",
                ActivationOffload::kCpu);
}
TEST(EngineActivations, NvmeOffload) {
  // The host holds the write buffers (2 x 64 KiB), two read blocks and one tensor: the other five
  // that leave the device go to NVMe, more than one run of 64 KiB.
  check_offload(
      "\"activation_device_budget\": 32768, \"activation_offload\": \"nvme\", "
      "\"activation_host_budget\": 184320, \"activation_prefetch\": 1",
      ActivationOffload::kNvme);
}

// An I/O error writing activations is the error of that step (naming the tensors and the swap
// file), not a hang or wrong bytes; the engine is destructible after it.
TEST(EngineActivations, WriteErrorIsTheStatusOfThatStep) {
  io::FaultInjector faults;  // outlives the engine
  faults.add(io::FaultKind::kEio, 1, 1, io::IoOp::kWrite);
  test::ScratchDir dir("engine-acts");
  zero::set_engine_io_faults(&faults);
  auto e = make_engine(
      "\"activation_device_budget\": 32768, \"activation_offload\": \"nvme\", "
      "\"activation_host_budget\": 184320, \"activation_prefetch\": 1, \"activation_nvme_path\": \"" +
      dir.path() + "\"");
  zero::set_engine_io_faults(nullptr);
  ASSERT_OK(e);
  auto st = step_with_activations(**e);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(faults.injected(), 1u);
  EXPECT_NE(st.status().message().find("tensor"), std::string::npos) << st.status().to_string();
  EXPECT_NE(st.status().message().find(dir.path()), std::string::npos) << st.status().to_string();
  EXPECT_EQ(st.status().message().find("came back different"), std::string::npos) << st.status().to_string();
  EXPECT_OK((*e)->activations().end_micro_batch());
  e->reset();
}

TEST(EngineActivations, NoneOverTheShareIsAClearError) {
  auto e = make_engine("\"activation_device_budget\": 20000");
  ASSERT_OK(e);
  auto p = (*e)->fetch(0);
  ASSERT_OK(p);
  ActivationStore& acts = (*e)->activations();
  ASSERT_OK(acts.save(p->tensors[0].data, p->tensors[0].bytes));
  auto second = acts.save(p->tensors[0].data, p->tensors[0].bytes);
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(second.status().message().find("zoe.activation_device_budget"), std::string::npos);
  ASSERT_OK(acts.end_micro_batch());
  ASSERT_OK((*e)->release(0));
}

TEST(EngineActivations, SharesBeyondTheBudgetsAreRefused) {
  auto dev = make_engine("\"activation_device_budget\": \"64MiB\"");
  ASSERT_FALSE(dev.is_ok());
  EXPECT_NE(dev.status().message().find("zoe.activation_device_budget"), std::string::npos)
      << dev.status().message();
  auto host = make_engine(
      "\"host_budget\": \"64MiB\", \"activation_offload\": \"cpu\", "
      "\"activation_host_budget\": \"1GiB\"");
  ASSERT_FALSE(host.is_ok());
  EXPECT_NE(host.status().message().find("zoe.activation_host_budget"), std::string::npos)
      << host.status().message();
}

TEST(EngineActivations, BeforeInitializeEveryCallFails) {
  auto cfg = Config::parse(with_zoe("\"device_budget\": \"8MiB\""));
  ASSERT_OK(cfg);
  auto e = Engine::create(runtime(), *cfg);
  ASSERT_OK(e);
  auto s = (*e)->activations().save(nullptr, 0);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("initialize()"), std::string::npos);
}

TEST(EngineActivations, StepDropsWhatAMicroBatchLeft) {
  auto e = make_engine("\"activation_offload\": \"cpu\", \"activation_device_budget\": 20000");
  ASSERT_OK(e);
  for (size_t m = 0; m < (*e)->num_modules(); ++m) {
    auto p = (*e)->fetch(m);
    ASSERT_OK(p);
    ASSERT_OK((*e)->activations().save(p->tensors[0].data, p->tensors[0].bytes));
    ASSERT_OK((*e)->release(m));
    auto g = (*e)->grads(m);
    ASSERT_OK(g);
    for (const TensorView& t : g->tensors) std::memset(t.data, 0, t.bytes);
    ASSERT_OK((*e)->reduce_grads(m));
  }
  auto st = (*e)->step();
  ASSERT_OK(st);
  // The next micro-batch starts empty: its ids begin again and a load of an old one is refused.
  EXPECT_EQ((*e)->activations().load(ActivationId{0}, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zoe
