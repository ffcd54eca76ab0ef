// The placement planner: its decisions on their own (no engine, no I/O), and its per-tier byte
// totals against the engine's measured high-water marks for every placement of the engine matrix.
#include <gtest/gtest.h>

#include <cstdio>

#include "config/config.h"
#include "core/log.h"
#include "offload/optimizer_swapper.h"
#include "optim/adam.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"
#include "tests/zero/mlp.h"
#include "tests/zero/shared_runtime.h"
#include "zero/engine_internal.h"
#include "zero/placement.h"

namespace zoe {
namespace {

// What the engine plans with on this host (its buffers are sized from the host's memory).
zero::PlanTarget engine_target(const Runtime& rt) {
  zero::PlanTarget t;
  t.host_memory = zero::engine_host_memory(rt.world_size());
  return t;
}

using zero::ModuleShape;
using zero::Placement;

config::Config parse(const std::string& text) {
  auto c = config::Config::parse(text, 1);
  EXPECT_OK(c) << "\n" << text;
  return c.is_ok() ? c.value() : config::Config{};
}

std::string cfg_text(int stage, const char* opt, const char* param, const std::string& zoe_extra = "",
                     const std::string& zero_extra = "", bool bf16 = false) {
  auto off = [](const char* dev) {
    std::string s = std::string("{\"device\": \"") + dev + "\"";
    if (std::string(dev) == "nvme") s += ", \"nvme_path\": \"/tmp\"";
    return s + "}";
  };
  return std::string("{") + (bf16 ? "\"bf16\": {\"enabled\": true}, " : "") +
         "\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": " +
         std::to_string(stage) + ", \"stage3_param_persistence_threshold\": 0, " + zero_extra +
         "\"offload_optimizer\": " + off(opt) + ", \"offload_param\": " + off(param) +
         "}, \"zoe\": {\"device_budget\": \"64MiB\"" + zoe_extra + "}}";
}

std::vector<ModuleShape> shapes(int layers, size_t d) {
  std::vector<ModuleShape> v;
  for (int l = 0; l < layers; ++l) v.push_back({"layer." + std::to_string(l), {d * d, d}});
  return v;
}

// A frozen module has no optimizer states: the tier they would live in holds 16 bytes per owned
// element less (master, m, v, gradient accumulator), its parameters stay where they were, and
// when only frozen modules would have NVMe states there is no optimizer swapper.
TEST(Placement, FrozenModulesHoldNoStates) {
  for (const char* opt : {"none", "cpu", "nvme"}) {
    SCOPED_TRACE(opt);
    config::Config c = parse(cfg_text(3, opt, "nvme"));
    std::vector<ModuleShape> plain = shapes(3, 200), frozen = plain;
    frozen[0].frozen = frozen[1].frozen = true;
    auto a = zero::plan_placement(c, frozen, 2, 1);
    auto b = zero::plan_placement(c, plain, 2, 1);
    ASSERT_OK(a);
    ASSERT_OK(b);
    const uint64_t drop = 16ull * (b->modules[0].opt_n + b->modules[1].opt_n);
    const std::string o = opt;
    EXPECT_TRUE(a->modules[0].frozen && !a->modules[2].frozen);
    EXPECT_EQ(b->resident.device - a->resident.device, o == "none" ? drop : 0);
    EXPECT_EQ(b->resident.host - a->resident.host, o == "cpu" ? drop : 0);
    EXPECT_EQ(b->resident.nvme - a->resident.nvme, o == "nvme" ? drop : 0);
    EXPECT_EQ(a->modules[0].param_home, offload::Tier::kNvme);
    // Both fill the budget with queued gathers (up to the window's rounding): within it.
    EXPECT_LE(a->peak.device, a->device_budget);
  }
  // Every module frozen: nothing to swap, no states anywhere but the parameters' partitions.
  config::Config c = parse(cfg_text(3, "nvme", "nvme"));
  std::vector<ModuleShape> all = shapes(2, 200);
  for (auto& m : all) m.frozen = true;
  auto p = zero::plan_placement(c, all, 1, 0);
  ASSERT_OK(p);
  EXPECT_FALSE(p->swapper);
  EXPECT_EQ(p->resident.nvme, 2ull * p->modules[0].part * 4);
}

TEST(Placement, FlatGroupsPartitionsAndOwnedRanges) {
  config::Config c = parse(cfg_text(3, "none", "none"));
  auto p = zero::plan_placement(c, shapes(2, 100), /*world=*/4, /*rank=*/2);
  ASSERT_OK(p);
  const auto& m = p->modules[0];
  EXPECT_EQ(m.total, 10100u);
  EXPECT_EQ(m.padded % (zero::kPartAlign * 4), 0u);
  EXPECT_GE(m.padded, m.total);
  EXPECT_LT(m.padded - m.total, zero::kPartAlign * 4);
  EXPECT_EQ(m.part * 4, m.padded);
  EXPECT_EQ(m.opt_begin, 2 * m.part);
  EXPECT_EQ(m.opt_n, m.part);
  EXPECT_EQ(m.offset[1], 10000u);
  EXPECT_TRUE(m.partitioned_params);
  EXPECT_EQ(m.param_home, offload::Tier::kDevice);
  EXPECT_TRUE(p->tier_manager);
  EXPECT_FALSE(p->swapper);

  config::Config c0 = parse(cfg_text(0, "none", "none"));
  auto p0 = zero::plan_placement(c0, shapes(2, 100), 4, 2);
  ASSERT_OK(p0);
  EXPECT_EQ(p0->modules[0].opt_begin, 0u);
  EXPECT_EQ(p0->modules[0].opt_n, p0->modules[0].padded);  // stage 0 owns everything
  EXPECT_FALSE(p0->tier_manager);
}

TEST(Placement, HomesFollowTheOffloadDevices) {
  for (const char* opt : {"none", "cpu", "nvme"}) {
    for (const char* param : {"none", "cpu", "nvme"}) {
      config::Config c = parse(cfg_text(3, opt, param));
      auto p = zero::plan_placement(c, shapes(3, 64), 1, 0);
      ASSERT_OK(p);
      const offload::Tier want_opt = std::string(opt) == "none"  ? offload::Tier::kDevice
                                     : std::string(opt) == "cpu" ? offload::Tier::kHost
                                                                 : offload::Tier::kNvme;
      const offload::Tier want_param = std::string(param) == "none"  ? offload::Tier::kDevice
                                       : std::string(param) == "cpu" ? offload::Tier::kHost
                                                                     : offload::Tier::kNvme;
      for (const auto& m : p->modules) {
        EXPECT_EQ(m.opt_home, want_opt) << opt << "/" << param;
        EXPECT_EQ(m.param_home, want_param) << opt << "/" << param;
      }
      EXPECT_EQ(p->swapper, std::string(opt) == "nvme");
      // NVMe bytes: states (master, m, v, gradient accumulator) and partitions, exactly.
      uint64_t nvme = 0;
      for (const auto& m : p->modules) {
        if (m.opt_home == offload::Tier::kNvme) nvme += m.opt_n * (4 + 4 + 4 + 4);
        if (m.param_home == offload::Tier::kNvme) nvme += m.part * 4;
      }
      EXPECT_EQ(p->nvme_bytes(), nvme) << opt << "/" << param;
    }
  }
}

TEST(Placement, PartialOffloadSplitsByElementsInRegistrationOrder) {
  config::Config c = parse(cfg_text(2, "cpu", "none", ", \"offload_ratio\": 0.5"));
  auto p = zero::plan_placement(c, shapes(4, 64), 1, 0);
  ASSERT_OK(p);
  // Four equal modules, half of the elements: the first two are offloaded.
  EXPECT_EQ(p->modules[0].opt_home, offload::Tier::kHost);
  EXPECT_EQ(p->modules[1].opt_home, offload::Tier::kHost);
  EXPECT_EQ(p->modules[2].opt_home, offload::Tier::kDevice);
  EXPECT_EQ(p->modules[3].opt_home, offload::Tier::kDevice);
  config::Config c0 = parse(cfg_text(2, "cpu", "none", ", \"offload_ratio\": 0"));
  auto p0 = zero::plan_placement(c0, shapes(4, 64), 1, 0);
  ASSERT_OK(p0);
  for (const auto& m : p0->modules) EXPECT_EQ(m.opt_home, offload::Tier::kDevice);
}

TEST(Placement, SwapperSizing) {
  config::Config c = parse(cfg_text(3, "nvme", "nvme", "", "\"sub_group_size\": 100000, "));
  c.zero.offload_optimizer.buffer_count = 5;
  auto p = zero::plan_placement(c, shapes(2, 64), 1, 0);
  ASSERT_OK(p);
  EXPECT_TRUE(p->swapper);
  EXPECT_EQ(p->swap_chunk_elems % optim::kChunkElems, 0u);
  EXPECT_GE(p->swap_chunk_elems, 100000u);
  EXPECT_LT(p->swap_chunk_elems, 100000u + optim::kChunkElems);
  EXPECT_EQ(p->swap_buffer_bytes, p->swap_chunk_elems * 4);
  EXPECT_EQ(p->swap_buffer_count, 12u);  // at least three slots of four states
  c.zero.sub_group_size = 1000000000;
  auto big = zero::plan_placement(c, shapes(2, 64), 1, 0);
  ASSERT_OK(big);
  EXPECT_EQ(big->swap_chunk_elems, zero::kMaxSwapChunkElems);
}

bool chose(const Placement& p, const std::string& key) {
  return std::find(p.chosen.begin(), p.chosen.end(), key) != p.chosen.end();
}

// The sizes a config leaves out are zoe's, from the host share (zoe.host_budget, or the host's
// memory / kAutoHostShareDiv): read-ahead slots up to one more than the chunks of a step, staging
// pieces of at most kAutoStagingBytes, and the partition cache with what is left; the host peak
// stays within the share. A value the config gives is used as given; with neither a budget nor the
// host's memory known, DeepSpeed's defaults are used as before.
TEST(Placement, SizesLeftOutAreChosenFromTheHostShare) {
  const config::Config c = parse(cfg_text(3, "nvme", "nvme", "", "", /*bf16=*/true));
  const std::vector<ModuleShape> six = shapes(6, 256);  // one 1M-element chunk each: 6 a step
  zero::PlanTarget t;
  t.device_budget = 1ull << 30;
  t.host_memory = 16ull << 30;
  auto p = zero::plan_placement(c, six, 1, 0, t);
  ASSERT_OK(p);
  EXPECT_EQ(p->host_share, (16ull << 30) / zero::kAutoHostShareDiv);
  EXPECT_EQ(p->swap_buffer_count, 7 * zero::kSwapStates);
  const uint64_t part = (p->modules[0].part * 2 + 4095) / 4096 * 4096;
  EXPECT_EQ(p->tm_staging_bytes, part);   // a partition is smaller than kAutoStagingBytes
  EXPECT_EQ(p->tm_host_cache, 6 * part);  // every partition
  for (const char* key :
       {"zero_optimization.offload_optimizer.buffer_count", "zero_optimization.offload_param.buffer_size",
        "zero_optimization.offload_param.max_in_cpu"})
    EXPECT_TRUE(chose(*p, key)) << key;
  EXPECT_LE(p->peak.host, p->host_share);

  // A model of many chunks: at most kAutoMaxSwapSlots; large partitions: staging pieces of
  // kAutoStagingBytes, and the cache holds them all when the share leaves room.
  const std::vector<ModuleShape> big = shapes(4, 4096);  // 16M elements a module: 32 MiB partitions
  auto b = zero::plan_placement(c, big, 1, 0, t);
  ASSERT_OK(b);
  EXPECT_EQ(b->swap_buffer_count, zero::kAutoMaxSwapSlots * zero::kSwapStates);
  EXPECT_EQ(b->tm_staging_bytes, zero::kAutoStagingBytes);
  EXPECT_EQ(b->tm_host_cache, 4 * (b->modules[0].part * 2));
  EXPECT_LE(b->peak.host, b->host_share);

  // zoe.host_budget is the share: fewer slots (at least three), the step's two partitions only
  // (not all of them fit), within it.
  config::Config tight = c;
  tight.zoe.host_budget_bytes = 320ll << 20;
  auto q = zero::plan_placement(tight, big, 1, 0, t);
  ASSERT_OK(q);
  EXPECT_EQ(q->host_share, 320ull << 20);
  EXPECT_GE(q->swap_buffer_count, zero::kMinSwapSlots * zero::kSwapStates);
  EXPECT_LT(q->swap_buffer_count, b->swap_buffer_count);
  EXPECT_EQ(q->tm_host_cache, 2 * (q->modules[0].part * 2));
  EXPECT_LE(q->peak.host, 320ull << 20);

  // A budget below what zoe's starting sizes hold: the swapper's write buffers drop to two and the
  // staging pieces are cut to what fits (at least kMinOwnStagingBytes), within it; the same budget
  // with the staging pieces given in the config keeps them as given and is refused, naming the key.
  const uint64_t floor_budget = 160ull << 20;
  config::Config small = c;
  small.zoe.host_budget_bytes = static_cast<int64_t>(floor_budget);
  auto f = zero::plan_placement(small, big, 1, 0, t);
  ASSERT_OK(f);
  EXPECT_EQ(f->swap_async_buffers, offload::kAsyncWriteBuffers);
  EXPECT_LT(f->tm_staging_bytes, zero::kAutoStagingBytes);
  EXPECT_GE(f->tm_staging_bytes, zero::kMinOwnStagingBytes);
  EXPECT_EQ(f->tm_staging_bytes % 4096, 0u);
  EXPECT_EQ(f->swap_buffer_count, zero::kMinSwapSlots * zero::kSwapStates);
  EXPECT_EQ(f->tm_host_cache, 2 * (f->modules[0].part * 2));
  EXPECT_LE(f->peak.host, floor_budget);
  EXPECT_EQ(f->tm_host_budget,
            static_cast<uint64_t>(f->tm_staging_bytes) * (f->tm_staging_count + 1) + f->tm_host_cache);
  config::Config pinned = small;
  pinned.zero.offload_param.buffer_size = 8 << 20;  // 16 MiB pieces of bf16
  pinned.given_keys.insert("zero_optimization.offload_param.buffer_size");
  auto r = zero::plan_placement(pinned, big, 1, 0, t);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("zoe.host_budget"), std::string::npos) << r.status().message();

  // Values the config gives are used as given.
  config::Config given = c;
  given.zero.offload_optimizer.buffer_count = 8;
  given.zero.offload_param.max_in_cpu = 0;
  given.zero.offload_param.buffer_size = 1 << 20;
  given.given_keys.insert({"zero_optimization.offload_optimizer.buffer_count",
                           "zero_optimization.offload_param.max_in_cpu",
                           "zero_optimization.offload_param.buffer_size"});
  auto g = zero::plan_placement(given, big, 1, 0, t);
  ASSERT_OK(g);
  EXPECT_EQ(g->swap_buffer_count, zero::swap_buffer_count(8));
  EXPECT_EQ(g->tm_staging_bytes, 2u << 20);
  EXPECT_EQ(g->tm_host_cache, 2 * (g->modules[0].part * 2));  // the step's two
  EXPECT_TRUE(g->chosen.empty());

  // Nothing known: DeepSpeed's defaults.
  zero::PlanTarget unknown = t;
  unknown.host_memory = 0;
  auto d = zero::plan_placement(c, big, 1, 0, unknown);
  ASSERT_OK(d);
  EXPECT_EQ(d->host_share, 0u);
  EXPECT_EQ(d->swap_buffer_count, zero::swap_buffer_count(4, false));
  EXPECT_TRUE(d->chosen.empty());
}

// Occurrences of `needle` in `text`.
size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// What plan_placement writes to stderr (its warnings) over `plans` plans of `c`, at level warn.
std::string planning_warnings(const config::Config& c, int plans) {
  const LogLevel level = log_level();
  set_log_level(LogLevel::kWarn);
  testing::internal::CaptureStderr();
  for (int i = 0; i < plans; ++i) EXPECT_OK(zero::plan_placement(c, shapes(4, 256), 1, 0));
  std::string err = testing::internal::GetCapturedStderr();
  set_log_level(level);
  return err;
}

// A config value the placement uses other than as given is warned about once, naming the key,
// the value given and the value used; values used as given are not warned about. (Each case uses
// values no other test plans with: the warning is once per process.)
TEST(Placement, ValuesUsedOtherThanGivenAreWarnedOnce) {
  config::Config c = parse(cfg_text(3, "nvme", "nvme"));
  c.zero.offload_optimizer.buffer_count = 7;  // two buffers short of a slot: 12 used
  c.zero.sub_group_size = 50000;              // rounded up to the norm's chunk
  c.zero.offload_param.buffer_count = 1;      // the synchronous buffer and one for moves
  c.zero.offload_param.buffer_size = 3000;    // 12000 bytes, below the 64 KiB minimum
  c.given_keys.insert(
      {"zero_optimization.offload_optimizer.buffer_count", "zero_optimization.sub_group_size"});
  std::string err = planning_warnings(c, 3);
  EXPECT_EQ(count_of(err, "zero_optimization.offload_optimizer.buffer_count is 7; zoe uses 12 ("), 1u) << err;
  EXPECT_EQ(count_of(err, "zero_optimization.sub_group_size is 50000; zoe uses 65536 ("), 1u) << err;
  EXPECT_EQ(count_of(err, "zero_optimization.offload_param.buffer_count is 1; zoe uses 2 ("), 1u) << err;
  EXPECT_EQ(count_of(err, "zero_optimization.offload_param.buffer_size is 3000; zoe uses 16384 ("), 1u)
      << err;
  auto p = zero::plan_placement(c, shapes(4, 256), 1, 0);
  ASSERT_OK(p);
  EXPECT_EQ(p->swap_buffer_count, 12u);
  EXPECT_EQ(p->swap_chunk_elems, 65536u);
  EXPECT_EQ(p->tm_staging_count + 1, 2u);
  EXPECT_EQ(p->tm_staging_bytes, 16384u * 4);

  // Whole slots of four buffers at or above three slots, a sub-group of whole norm chunks: used as
  // given, without a word.
  c.zero.offload_optimizer.buffer_count = 20;
  c.zero.sub_group_size = 3 * static_cast<int64_t>(optim::kChunkElems);
  c.zero.offload_param.buffer_count = 3;
  c.zero.offload_param.buffer_size = 16 * 1024;  // 64 KiB
  err = planning_warnings(c, 2);
  EXPECT_EQ(err.find("zoe uses"), std::string::npos) << err;
  p = zero::plan_placement(c, shapes(4, 256), 1, 0);
  ASSERT_OK(p);
  EXPECT_EQ(p->swap_buffer_count, 20u);
  EXPECT_EQ(p->swap_chunk_elems, 3 * optim::kChunkElems);
  EXPECT_EQ(p->tm_staging_count + 1, 3u);
  EXPECT_EQ(p->tm_staging_bytes, 16u * 1024 * 4);

  // A buffer beyond the last whole slot is never used: 21 buffers are 20.
  c.zero.offload_optimizer.buffer_count = 21;
  err = planning_warnings(c, 2);
  EXPECT_EQ(count_of(err, "zero_optimization.offload_optimizer.buffer_count is 21; zoe uses 20 ("), 1u)
      << err;
}

// DeepSpeed's defaults for the optimizer swapper (sub_group_size 1e9, offload_optimizer.buffer_count
// 4) are not what zoe uses, but nobody chose them: a config that leaves them out gets zoe's values
// without a warning; one that writes them gets the warning.
TEST(Placement, DeepSpeedDefaultsNobodyWroteAreNotWarnedAbout) {
  config::Config c = parse(cfg_text(3, "nvme", "nvme"));
  ASSERT_EQ(c.zero.sub_group_size, 1000000000);
  ASSERT_EQ(c.zero.offload_optimizer.buffer_count, 4);
  std::string err = planning_warnings(c, 2);
  EXPECT_EQ(err.find("sub_group_size"), std::string::npos) << err;
  EXPECT_EQ(err.find("offload_optimizer.buffer_count"), std::string::npos) << err;
  auto p = zero::plan_placement(c, shapes(4, 256), 1, 0);
  ASSERT_OK(p);
  EXPECT_EQ(p->swap_buffer_count, 12u);
  EXPECT_EQ(p->swap_chunk_elems, zero::kMaxSwapChunkElems);
  c = parse(cfg_text(3, "nvme", "nvme", "", "\"sub_group_size\": 999999999, "));
  err = planning_warnings(c, 2);
  EXPECT_EQ(count_of(err, "zero_optimization.sub_group_size is 999999999; zoe uses 1048576 ("), 1u) << err;
}

// DeepSpeed's default stage3_param_persistence_threshold (1e5 elements) keeps every module of a
// small model whole on the device. When those do not fit the budget beside the rest, the planner
// partitions the largest ones until the plan fits, and says once what it used; a budget that the
// modules fit as they are keeps the threshold as given.
TEST(Placement, PersistenceThresholdIsLoweredToFitTheBudget) {
  config::Config c = parse(cfg_text(3, "nvme", "nvme"));
  c.zero.stage3_param_persistence_threshold = 100000;  // DeepSpeed's default
  // 6 modules of 65792 elements (256x256 + 256), all under the threshold: 1.5 MiB kept whole.
  zero::PlanTarget roomy;
  roomy.device_budget = 64ull << 20;
  auto whole = zero::plan_placement(c, shapes(6, 256), 1, 0, roomy);
  ASSERT_OK(whole);
  for (const auto& m : whole->modules) EXPECT_FALSE(m.partitioned_params) << m.name;

  // 1.75 MiB: the modules kept whole and one module's gradients (1.76 MiB) do not fit.
  zero::PlanTarget tight;
  tight.device_budget = 1792ull << 10;
  const LogLevel level = log_level();
  set_log_level(LogLevel::kWarn);
  testing::internal::CaptureStderr();
  auto p = zero::plan_placement(c, shapes(6, 256), 1, 0, tight);
  auto again = zero::plan_placement(c, shapes(6, 256), 1, 0, tight);
  std::string err = testing::internal::GetCapturedStderr();
  set_log_level(level);
  ASSERT_OK(p);
  ASSERT_OK(again);
  for (const auto& m : p->modules) EXPECT_TRUE(m.partitioned_params) << m.name;
  EXPECT_LE(p->peak.device, tight.device_budget);
  EXPECT_EQ(count_of(err, "zero_optimization.stage3_param_persistence_threshold is 100000; zoe uses 65792 ("),
            1u)
      << err;

  // Modules of mixed sizes: only as many of the largest as needed are partitioned.
  std::vector<ModuleShape> mixed = shapes(6, 256);
  for (int l = 0; l < 8; ++l) mixed.push_back({"small." + std::to_string(l), {64 * 64, 64}});
  auto pm = zero::plan_placement(c, mixed, 1, 0, tight);
  ASSERT_OK(pm);
  for (const auto& m : pm->modules) EXPECT_EQ(m.partitioned_params, m.total > 5000) << m.name;

  // A module in use that cannot fit the budget is still refused, naming the budget.
  zero::PlanTarget tiny;
  tiny.device_budget = 100000;
  auto pt = zero::plan_placement(c, shapes(2, 256), 1, 0, tiny);
  ASSERT_FALSE(pt.is_ok());
  EXPECT_NE(pt.status().message().find("zoe.device_budget"), std::string::npos) << pt.status().message();
}

TEST(Placement, SwapResolversAgreeWithThePlan) {
  EXPECT_EQ(zero::swap_buffer_count(4), 12u);  // DeepSpeed's default: one slot, raised to three
  EXPECT_EQ(zero::swap_buffer_count(24), 24u);
  EXPECT_EQ(zero::swap_chunk_elems(1000000000), zero::kMaxSwapChunkElems);
  EXPECT_EQ(zero::swap_chunk_elems(static_cast<int64_t>(optim::kChunkElems)), optim::kChunkElems);
}

TEST(Placement, GatherWindowFollowsTheBucketAndTheBudget) {
  config::Config c = parse(cfg_text(3, "none", "nvme", "", "\"stage3_prefetch_bucket_size\": 20000, "));
  // At world size 1 the partitions are served in place: no gathers are queued, and the bucket's
  // bytes go to the tier manager's device share (partitions moving ahead) beside the one in use.
  auto p1 = zero::plan_placement(c, shapes(8, 64), 1, 0);
  ASSERT_OK(p1);
  EXPECT_EQ(p1->gather_window, 0u);
  EXPECT_GE(p1->tm_device_budget, (20000u + p1->modules[0].part) * 4);
  auto p = zero::plan_placement(c, shapes(8, 64), 2, 0);
  ASSERT_OK(p);
  EXPECT_EQ(p->gather_window, 20000u);  // bucket-bound: the budget has room
  EXPECT_GT(p->tm_device_budget, 0u);
  zero::PlanTarget gpu;
  gpu.queued_gathers = false;
  auto pg = zero::plan_placement(c, shapes(8, 64), 2, 0, gpu);
  ASSERT_OK(pg);
  EXPECT_EQ(pg->gather_window, 0u);
  // A device budget just above one module's needs (in use: its parameters and gradients; in the
  // device tier: the partition its gather pins) leaves no room for queued gathers.
  config::Config off = parse(cfg_text(3, "nvme", "nvme", "", "\"stage3_prefetch_bucket_size\": 20000, "));
  zero::PlanTarget tight;
  tight.device_budget = 72 << 10;
  auto pt = zero::plan_placement(off, shapes(8, 64), 1, 0, tight);
  ASSERT_OK(pt);
  EXPECT_EQ(pt->gather_window, 0u);
  EXPECT_LE(pt->peak.device, tight.device_budget);
  // stage3_max_live_parameters: the queued gathers and the module in use stay within it; what the
  // window gives up goes to the partitions' device cache.
  const size_t module = p->modules[0].padded;
  config::Config capped = c;
  capped.zero.stage3_max_live_parameters = static_cast<int64_t>(module) + 5000;
  auto pc = zero::plan_placement(capped, shapes(8, 64), 2, 0);
  ASSERT_OK(pc);
  EXPECT_LE(pc->gather_window, 5000u);
  EXPECT_GT(pc->gather_window, 0u);
  EXPECT_EQ(pc->max_live_parameters, module + 5000);
}

// stage3_max_live_parameters below one gathered module cannot be honoured (the module in use is
// live): the plan uses the largest gathered module instead, queues no gathers beside it, and says
// so once naming the key. (Values no other test plans with: the warning is once per process.)
TEST(Placement, MaxLiveParametersBelowAModuleIsRaisedToIt) {
  config::Config c = parse(cfg_text(3, "none", "nvme", "", "\"stage3_prefetch_bucket_size\": 20000, "));
  const size_t module = zero::plan_placement(c, shapes(8, 64), 1, 0).value().modules[0].padded;
  c.zero.stage3_max_live_parameters = 1234;
  c.given_keys.insert("zero_optimization.stage3_max_live_parameters");  // as a config that writes it
  const LogLevel level = log_level();
  set_log_level(LogLevel::kWarn);
  testing::internal::CaptureStderr();
  auto below = zero::plan_placement(c, shapes(8, 64), 1, 0);
  auto again = zero::plan_placement(c, shapes(8, 64), 1, 0);
  std::string err = testing::internal::GetCapturedStderr();
  set_log_level(level);
  ASSERT_OK(below);
  ASSERT_OK(again);
  EXPECT_EQ(below->max_live_parameters, module);
  EXPECT_EQ(below->gather_window, 0u);
  EXPECT_EQ(count_of(err, "zero_optimization.stage3_max_live_parameters is 1234; zoe uses " +
                              std::to_string(module) + " ("),
            1u)
      << err;
}

// The hints a config does not give are DeepSpeed's defaults, sized to GPUs (a prefetch bucket of
// 5e7 elements): a plan that lowers one to fit a small budget says nothing, since no value of the
// user's changed; the same value written in the config is warned about once. (Values no other
// test plans with: the warning is once per process.)
TEST(Placement, HintsTheConfigDoesNotGiveAreLoweredWithoutAWord) {
  config::Config c = parse(cfg_text(3, "nvme", "nvme"));  // 64 MiB: 16M fp32 elements at most
  c.zero.stage3_prefetch_bucket_size = 50000123;
  ASSERT_FALSE(c.given("zero_optimization.stage3_prefetch_bucket_size"));
  std::string err = planning_warnings(c, 2);
  auto p = zero::plan_placement(c, shapes(4, 256), 1, 0);
  ASSERT_OK(p);
  EXPECT_LT(p->prefetch_bucket, 50000123) << "the budget must cut the bucket for this test to mean anything";
  EXPECT_EQ(count_of(err, "stage3_prefetch_bucket_size"), 0u) << err;
  c.given_keys.insert("zero_optimization.stage3_prefetch_bucket_size");
  err = planning_warnings(c, 2);
  EXPECT_EQ(count_of(err, "zero_optimization.stage3_prefetch_bucket_size is 50000123; zoe uses " +
                              std::to_string(p->prefetch_bucket) + " ("),
            1u)
      << err;
}

// reduce_bucket_size at stage 2/3 packs each bucket into one of two send buffers on the device.
// Buckets whose buffers do not fit the budget beside the module in use are halved until they do,
// said once naming the key; a module that cannot fit even so is refused naming zoe.device_budget.
TEST(Placement, ReduceBucketIsLoweredToFitTheBudget) {
  config::Config c = parse(cfg_text(2, "cpu", "none"));
  const auto sh = shapes(2, 256);     // 65792 parameters, padded to 69632 at 2 ranks (34816 a rank)
  c.zero.reduce_bucket_size = 60001;  // 30000 a rank: two 60000-element buffers, 1.7 modules
  c.given_keys.insert("zero_optimization.reduce_bucket_size");  // as a config that writes it
  zero::PlanTarget tight;
  // Both modules' parameters, one's gradients and half a module: buckets of 15000 (0.43 modules).
  tight.device_budget = 2 * 69632 * 4 + 3 * 69632 * 4 / 2;
  const LogLevel level = log_level();
  set_log_level(LogLevel::kWarn);
  testing::internal::CaptureStderr();
  auto p = zero::plan_placement(c, sh, 2, 1, tight);
  auto again = zero::plan_placement(c, sh, 2, 1, tight);
  std::string err = testing::internal::GetCapturedStderr();
  set_log_level(level);
  ASSERT_OK(p);
  ASSERT_OK(again);
  EXPECT_EQ(p->reduce_bucket, 15000u);
  EXPECT_LE(p->peak.device, tight.device_budget);
  EXPECT_EQ(count_of(err, "zero_optimization.reduce_bucket_size is 60001; zoe uses 15000 ("), 1u) << err;
  // With room: used as given.
  auto roomy = zero::plan_placement(c, sh, 2, 1);
  ASSERT_OK(roomy);
  EXPECT_EQ(roomy->reduce_bucket, 60001u);
  // A module whose parameters and gradients alone do not fit: refused, naming the budget.
  zero::PlanTarget tiny;
  tiny.device_budget = 69632 * 4;
  auto pt = zero::plan_placement(c, sh, 2, 1, tiny);
  ASSERT_FALSE(pt.is_ok());
  EXPECT_NE(pt.status().message().find("zoe.device_budget"), std::string::npos) << pt.status().message();
  EXPECT_NE(pt.status().message().find("layer.0"), std::string::npos) << pt.status().message();
}

TEST(Placement, StagingFollowsOffloadParamBuffers) {
  // offload_param.buffer_count buffers (one the synchronous one) of buffer_size elements, in 4 KiB
  // multiples, within [64 KiB, the largest NVMe-homed partition]; counted in the host's bytes.
  const auto sh = shapes(4, 256);  // 65792 parameters a module, above 64 KiB in fp32
  config::Config c = parse(cfg_text(3, "cpu", "nvme"));
  auto def = zero::plan_placement(c, sh, 1, 0);
  ASSERT_OK(def);
  const size_t part = (def->modules[0].part * 4 + 4095) / 4096 * 4096;
  EXPECT_GT(part, 64u << 10);
  EXPECT_EQ(def->tm_staging_count, 4u);    // buffer_count 5
  EXPECT_EQ(def->tm_staging_bytes, part);  // 1e8 elements: the partition, rounded up
  c.zero.offload_param.buffer_count = 9;
  c.zero.offload_param.buffer_size = 20000;  // 80000 bytes
  auto p = zero::plan_placement(c, sh, 1, 0);
  ASSERT_OK(p);
  EXPECT_EQ(p->tm_staging_count, 8u);
  EXPECT_EQ(p->tm_staging_bytes, 20u * 4096);
  EXPECT_EQ(static_cast<int64_t>(p->resident.host) - static_cast<int64_t>(def->resident.host),
            9 * 20 * 4096 - 5 * static_cast<int64_t>(part));
  c.zero.offload_param.buffer_size = 1;
  c.zero.offload_param.buffer_count = 1;
  auto small = zero::plan_placement(c, sh, 1, 0);
  ASSERT_OK(small);
  EXPECT_EQ(small->tm_staging_bytes, 64u << 10);
  EXPECT_EQ(small->tm_staging_count, 1u);
}

TEST(PlacementVsEngine, StagingBuffersAndTheLiveCapChangeNoBits) {
  // The tier manager streams each partition through its staging buffers in pieces: one small
  // buffer (five pieces a partition, one at a time) trains the same bits as the default (one
  // piece, four in flight), within the plan's host bytes; so does a stage3_max_live_parameters
  // that leaves room for one queued gather only, and so does offload_param.max_in_cpu 0 (no host
  // cache of updated partitions: the device loads read NVMe again).
  Runtime& rt = test::shared_runtime();
  test::MlpSpec s;
  s.layers = 4;
  s.d = 256;
  std::vector<std::vector<test::Layer>> outs;
  std::vector<uint64_t> nvme_reads;
  for (const int variant : {0, 1, 2, 3}) {
    const bool small = variant == 1;
    test::ScratchDir nvme("staging");
    std::string text = cfg_text(3, "cpu", "nvme", "", "\"stage3_prefetch_bucket_size\": 70000, ");
    text.replace(text.find("\"/tmp\""), 6, "\"" + nvme.path() + "\"");
    auto cfg = config::Config::parse(text, rt.world_size());
    ASSERT_OK(cfg);
    if (small) {
      cfg->zero.offload_param.buffer_count = 2;
      cfg->zero.offload_param.buffer_size = 16384;
      cfg->given_keys.insert("zero_optimization.offload_param.buffer_size");
    }
    if (variant == 2) cfg->zero.stage3_max_live_parameters = 2 * 67584;
    if (variant == 3) {
      cfg->zero.offload_param.max_in_cpu = 0;
      cfg->given_keys.insert("zero_optimization.offload_param.max_in_cpu");
    }
    std::vector<ModuleShape> sh = shapes(s.layers, static_cast<size_t>(s.d));
    auto plan = zero::plan_placement(cfg.value(), sh, rt.world_size(), rt.rank(), engine_target(rt));
    ASSERT_OK(plan);
    EXPECT_EQ(plan->tm_staging_bytes, small ? 64u << 10 : (plan->modules[0].part * 4 + 4095) / 4096 * 4096);
    EXPECT_EQ(plan->tm_staging_count, small ? 1u : 4u);
    auto e = zero::create_engine(rt, cfg.value());
    ASSERT_OK(e);
    ASSERT_OK(test::register_mlp(*e.value(), s));
    std::vector<test::Layer> out;
    std::vector<StepStats> stats;
    Status st = test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &out, &stats);
    ASSERT_OK(st);
    EXPECT_LE(stats.back().high_water[1], plan->peak.host);
    EXPECT_GT(stats.back().bytes_nvme_read, 0u);
    nvme_reads.push_back(stats.back().bytes_nvme_read - stats[stats.size() - 2].bytes_nvme_read);
    if (variant == 2) {
      EXPECT_EQ(plan->modules[0].padded, 67584u);
      if (rt.world_size() > 1) {
        EXPECT_GT(plan->gather_window, 0u);
        EXPECT_LE(plan->gather_window, 67584u);
      } else {  // served in place: nothing is gathered, so nothing is queued
        EXPECT_EQ(plan->gather_window, 0u);
      }
    }
    outs.push_back(std::move(out));
  }
  // Four partitions of 67584 fp32 elements: without the cache the last step reads them at least
  // twice more (the update's copy and the device loads; at most two stay cached).
  EXPECT_GE(nvme_reads[3], nvme_reads[0] + 2 * 4 * 67584 * 4 - 4 * 67584 * 4);
  for (size_t v = 1; v < outs.size(); ++v) {
    ASSERT_EQ(outs[0].size(), outs[v].size());
    for (size_t l = 0; l < outs[0].size(); ++l) {
      EXPECT_EQ(outs[0][l].w, outs[v][l].w) << "variant " << v << " layer " << l;
      EXPECT_EQ(outs[0][l].b, outs[v][l].b) << "variant " << v << " layer " << l;
    }
  }
}

TEST(Placement, ErrorsNameWhatDoesNotFit) {
  config::Config c = parse(cfg_text(3, "nvme", "nvme"));
  zero::PlanTarget small;
  small.device_budget = 100000;
  auto p = zero::plan_placement(c, shapes(2, 256), 1, 0, small);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(p.status().message().find("module layer.0"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("zoe.device_budget"), std::string::npos);

  config::Config h = parse(cfg_text(2, "cpu", "none", ", \"host_budget\": \"1MiB\""));
  auto ph = zero::plan_placement(h, shapes(4, 256), 1, 0);
  ASSERT_FALSE(ph.is_ok());
  EXPECT_NE(ph.status().message().find("zoe.host_budget"), std::string::npos) << ph.status().message();

  // Optimizer states kept on the device that do not fit it.
  config::Config dev = parse(cfg_text(2, "none", "none"));
  zero::PlanTarget two;
  two.device_budget = 2 << 20;
  auto pd = zero::plan_placement(dev, shapes(8, 256), 1, 0, two);
  ASSERT_FALSE(pd.is_ok());
  EXPECT_NE(pd.status().message().find("offload_optimizer"), std::string::npos) << pd.status().message();

  EXPECT_FALSE(zero::plan_placement(c, shapes(2, 8), 2, 2).is_ok());  // rank out of range
  EXPECT_FALSE(zero::plan_placement(c, {}, 1, 0).is_ok());
  EXPECT_FALSE(zero::plan_placement(c, {{"empty", {}}}, 1, 0).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Against the engine: for every placement of the matrix and two device budgets, the measured
// high-water marks stay within the plan's peaks, the host's is at least what the plan allocates
// once, and NVMe holds exactly what the plan says.

Runtime& runtime() { return test::shared_runtime(); }

TEST(PlacementVsEngine, HighWaterMarksWithinThePlanForEveryPlacement) {
  Runtime& rt = runtime();
  using Case = test::MatrixPlacement;
  const std::vector<Case> cases = test::matrix_placements();
  test::MlpSpec s;
  s.layers = 4;
  s.d = 48;
  int ran = 0;
  for (const bool bf16 : {false, true}) {
    for (const char* budget : {"64MiB", "192KiB"}) {
      for (const Case& k : cases) {
        test::ScratchDir nvme("placement");
        std::string text =
            cfg_text(k.stage, k.opt, k.param, "", "\"stage3_prefetch_bucket_size\": 6000, ", bf16);
        for (size_t at = text.find("\"/tmp\""); at != std::string::npos; at = text.find("\"/tmp\"")) {
          text.replace(at, 6, "\"" + nvme.path() + "\"");
        }
        text.replace(text.find("64MiB"), 5, budget);
        const std::string what = std::string(bf16 ? "bf16" : "fp32") + " budget " + budget + " stage " +
                                 std::to_string(k.stage) + " optimizer " + k.opt + " params " + k.param;
        auto cfg = config::Config::parse(text, rt.world_size());
        ASSERT_OK(cfg) << what;
        std::vector<ModuleShape> sh;
        for (int l = 0; l < s.layers; ++l) {
          sh.push_back(
              {"layer." + std::to_string(l), {static_cast<size_t>(s.d * s.d), static_cast<size_t>(s.d)}});
        }
        auto plan = zero::plan_placement(cfg.value(), sh, rt.world_size(), rt.rank(), engine_target(rt));
        auto e = zero::create_engine(rt, cfg.value());
        ASSERT_OK(e) << what;
        Status reg = test::register_mlp(*e.value(), s);
        if (!plan.is_ok()) {  // does not fit: the engine refuses it the same way
          EXPECT_EQ(plan.status().code(), StatusCode::kOutOfBudget)
              << what << ": " << plan.status().to_string();
          EXPECT_EQ(reg.code(), plan.status().code()) << what << ": " << reg.to_string();
          continue;
        }
        ran++;
        ASSERT_OK(reg) << what;
        std::vector<test::Layer> out;
        std::vector<StepStats> stats;
        Status st = test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 3, &out, &stats);
        ASSERT_OK(st) << what;
        const StepStats& last = stats.back();
        EXPECT_LE(last.high_water[0], plan->peak.device) << what;
        EXPECT_LE(last.high_water[0], plan->device_budget) << what;
        EXPECT_GE(last.high_water[0], plan->resident.device) << what;
        EXPECT_LE(last.high_water[1], plan->peak.host) << what;
        EXPECT_GE(last.high_water[1], plan->resident.host) << what;
        EXPECT_EQ(last.high_water[2], plan->resident.nvme) << what;
      }
    }
  }
  EXPECT_GE(ran, 2 * 13 + 2 * 8) << "placements that fit: every one at 64 MiB, the offloaded ones at 192 KiB";
}

// Lion and Adagrad keep one state beside the master: each tier that holds the states holds 4 bytes
// per owned element fewer than AdamW's (fp32), the cost model's update touches fewer bytes, and the
// engine's measured high-water marks stay within (NVMe: equal to) the plan.
TEST(PlacementVsEngine, OneStateOptimizersPlanAndUseOneStateLess) {
  Runtime& rt = runtime();
  test::MlpSpec s;
  s.d = 48;
  for (const test::MatrixPlacement& k :
       {test::MatrixPlacement{1, "cpu", "none"}, test::MatrixPlacement{2, "nvme", "none"},
        test::MatrixPlacement{3, "none", "cpu"}, test::MatrixPlacement{3, "nvme", "nvme"}}) {
    for (const char* type : {"Lion", "Adagrad"}) {
      test::ScratchDir nvme("placement");
      std::string text = cfg_text(k.stage, k.opt, k.param);
      for (size_t at = text.find("\"/tmp\""); at != std::string::npos; at = text.find("\"/tmp\""))
        text.replace(at, 6, "\"" + nvme.path() + "\"");
      const std::string what =
          std::string(type) + " stage " + std::to_string(k.stage) + " optimizer " + k.opt;
      auto adamw = config::Config::parse(text, rt.world_size());
      text.insert(1, std::string("\"optimizer\": {\"type\": \"") + type + "\"}, ");
      auto cfg = config::Config::parse(text, rt.world_size());
      ASSERT_OK(adamw) << what;
      ASSERT_OK(cfg) << what;
      const auto sh = shapes(s.layers, static_cast<size_t>(s.d));
      auto a = zero::plan_placement(adamw.value(), sh, rt.world_size(), rt.rank(), engine_target(rt));
      auto plan = zero::plan_placement(cfg.value(), sh, rt.world_size(), rt.rank(), engine_target(rt));
      ASSERT_OK(a) << what;
      ASSERT_OK(plan) << what;
      uint64_t owned = 0;
      for (const auto& m : plan->modules) owned += m.opt_n;
      const uint64_t drop = 4 * owned;
      const std::string o = k.opt;
      EXPECT_EQ(plan->opt_states(), 1) << what;
      EXPECT_EQ(plan->opt_bytes_per_elem(), 8.0) << what;
      EXPECT_EQ(a->resident.device - plan->resident.device, o == "none" ? drop : 0) << what;
      EXPECT_EQ(a->resident.nvme - plan->resident.nvme, o == "nvme" ? drop : 0) << what;
      if (o == "cpu") EXPECT_EQ(a->resident.host - plan->resident.host, drop) << what;
      auto e = zero::create_engine(rt, cfg.value());
      ASSERT_OK(e) << what;
      ASSERT_OK(test::register_mlp(*e.value(), s)) << what;
      std::vector<test::Layer> out;
      std::vector<StepStats> stats;
      ASSERT_OK(test::engine_train(*e.value(), s, rt.rank(), rt.world_size(), 2, &out, &stats)) << what;
      const StepStats& last = stats.back();
      EXPECT_LE(last.high_water[0], plan->peak.device) << what;
      EXPECT_LE(last.high_water[1], plan->peak.host) << what;
      EXPECT_GE(last.high_water[1], plan->resident.host) << what;
      EXPECT_EQ(last.high_water[2], plan->resident.nvme) << what;
    }
  }
}

}  // namespace
}  // namespace zoe

// ---------------------------------------------------------------------------------------------
// Typed identities: a module id, a tier item id and a swapper group id do not convert into one
// another (nor back into plain numbers), so passing one for another does not compile; the
// engine maps them in one place each (ParamHomes for items, the Updater for groups).
#include <type_traits>

#include "zero/module_table.h"

namespace {

using zoe::offload::GroupId;
using zoe::offload::ItemId;
using zoe::zero::ModuleId;
static_assert(!std::is_convertible_v<ModuleId, ItemId>, "a module id must not pass for a tier item");
static_assert(!std::is_convertible_v<ModuleId, GroupId>, "a module id must not pass for a swapper group");
static_assert(!std::is_convertible_v<ItemId, GroupId>, "a tier item must not pass for a swapper group");
static_assert(!std::is_convertible_v<GroupId, ItemId>, "a swapper group must not pass for a tier item");
static_assert(!std::is_convertible_v<ModuleId, size_t> && !std::is_convertible_v<size_t, ModuleId>,
              "module ids are not plain numbers");
static_assert(!std::is_convertible_v<ItemId, uint64_t> && !std::is_convertible_v<GroupId, uint64_t>,
              "ids do not turn back into plain numbers");

}  // namespace
