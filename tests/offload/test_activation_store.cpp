// The activation store: the plan, round trips through every tier, budgets, read-ahead, faults.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "device/device.h"
#include "io/fault_injector.h"
#include "offload/activation_plan.h"
#include "offload/activation_store.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::offload {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;

ActivationBudgets budgets(ActivationOffload o, uint64_t dev, uint64_t host, uint64_t min_bytes = 0) {
  ActivationBudgets b;
  b.offload = o;
  b.device_budget = dev;
  b.host_capacity = host;
  b.min_offload_bytes = min_bytes;
  return b;
}

std::vector<Tier> plan_of(std::vector<uint64_t> sizes, const ActivationBudgets& b) {
  auto p = plan_activations(sizes, b);
  EXPECT_OK(p);
  return p.is_ok() ? p.value() : std::vector<Tier>{};
}

constexpr Tier D = Tier::kDevice, H = Tier::kHost, N = Tier::kNvme;

TEST(ActivationPlan, KeepsEverythingOnTheDeviceWhenItFits) {
  EXPECT_EQ(plan_of({100, 100, 100}, budgets(ActivationOffload::kNvme, 300, 0)),
            (std::vector<Tier>{D, D, D}));
  EXPECT_EQ(plan_of({100, 100}, budgets(ActivationOffload::kNone, 200, 0)), (std::vector<Tier>{D, D}));
}

TEST(ActivationPlan, EarliestGoFurthestAndLastStays) {
  // 5 x 100 against a share of 150: four must leave (the last stays); host holds two, latest first.
  EXPECT_EQ(plan_of({100, 100, 100, 100, 100}, budgets(ActivationOffload::kNvme, 150, 200)),
            (std::vector<Tier>{N, N, H, H, D}));
  // The same with cpu and room for all.
  EXPECT_EQ(plan_of({100, 100, 100, 100, 100}, budgets(ActivationOffload::kCpu, 250, 1000)),
            (std::vector<Tier>{H, H, H, D, D}));
}

TEST(ActivationPlan, SmallTensorsAndTheLastStay) {
  // Tensors under 50 bytes stay; the last (a big one) stays too.
  EXPECT_EQ(plan_of({10, 100, 10, 100, 400}, budgets(ActivationOffload::kCpu, 420, 1000, 50)),
            (std::vector<Tier>{D, H, D, H, D}));
}

TEST(ActivationPlan, RefusesWhatCannotFit) {
  auto none = plan_activations(std::vector<uint64_t>{100, 100}, budgets(ActivationOffload::kNone, 150, 0));
  EXPECT_EQ(none.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(none.status().message().find("zoe.activation_device_budget"), std::string::npos);
  auto last = plan_activations(std::vector<uint64_t>{10, 500}, budgets(ActivationOffload::kNvme, 100, 1000));
  EXPECT_EQ(last.status().code(), StatusCode::kOutOfBudget);
  auto cpu =
      plan_activations(std::vector<uint64_t>{100, 100, 100}, budgets(ActivationOffload::kCpu, 100, 150));
  EXPECT_EQ(cpu.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(cpu.status().message().find("zoe.activation_host_budget"), std::string::npos);
}

// A CPU device (caller buffers + the store's share), scratch dir, fault injector and a store.
struct ActRig {
  test::ScratchDir dir{"actstore"};
  io::FaultInjector faults;
  std::unique_ptr<device::Device> dev;
  std::unique_ptr<ActivationStore> store;
  std::vector<void*> bufs;

  ~ActRig() {
    store.reset();
    for (void* p : bufs) dev->free(p);
  }
  ActivationStoreOptions options(ActivationOffload o, uint64_t share, uint64_t host) {
    ActivationStoreOptions so;
    so.offload = o;
    so.device = dev.get();
    so.device_budget = share;
    so.host_budget = host;
    so.min_offload_bytes = 4 * kKiB;
    so.run_bytes = 256 * kKiB;
    so.nvme_dirs = {dir.path()};
    so.io.queue_depth = 8;
    so.io.faults = &faults;
    return so;
  }
  bool init(const ActivationStoreOptions& so, uint64_t device_bytes = 64 * kMiB) {
    if (!dev) {
      auto d = device::create_cpu_device(device_bytes);
      EXPECT_OK(d);
      if (!d.is_ok()) return false;
      dev = std::move(d).value();
    }
    ActivationStoreOptions o = so;
    o.device = dev.get();
    auto s = create_activation_store(o);
    EXPECT_OK(s);
    if (!s.is_ok()) return false;
    store = std::move(s).value();
    return true;
  }
  char* buffer(uint64_t bytes) {
    auto p = dev->allocate(bytes);
    EXPECT_OK(p);
    bufs.push_back(p.value());
    return static_cast<char*>(p.value());
  }
};

void fill(char* p, uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<char>(rng());
}

// Saves tensors of `sizes` (seeded by mb), loads them back in reverse, checks every byte.
void round_trip(ActRig& r, const std::vector<uint64_t>& sizes, uint32_t mb, char* src, char* dst,
                std::vector<char>& want) {
  std::vector<ActivationId> ids;
  std::vector<std::vector<char>> expect;
  for (size_t i = 0; i < sizes.size(); ++i) {
    fill(src, sizes[i], mb * 1000 + static_cast<uint32_t>(i));
    expect.emplace_back(src, src + sizes[i]);
    auto id = r.store->save(src, sizes[i]);
    ASSERT_OK(id) << "save " << i;
    ids.push_back(id.value());
    std::memset(src, 0x5a, sizes[i]);  // the caller reuses its buffer at once
  }
  for (size_t k = sizes.size(); k-- > 0;) {
    std::memset(dst, 0, sizes[k]);
    ASSERT_OK(r.store->load(ids[k], dst)) << "load " << k;
    ASSERT_TRUE(std::equal(expect[k].begin(), expect[k].end(), dst))
        << "tensor " << k << " micro-batch " << mb;
  }
  ASSERT_OK(r.store->end_micro_batch());
  (void)want;
}

const std::vector<uint64_t> kSizes = {64 * kKiB, 100 * kKiB + 3, 256 * kKiB, 1000, 0, 300 * kKiB + 17,
                                      4 * kKiB,  640 * kKiB + 1, 128 * kKiB, 77,   1, 200 * kKiB};

uint64_t total(const std::vector<uint64_t>& s) {
  uint64_t t = 0;
  for (uint64_t x : s) t += x;
  return t;
}

// Round trips over micro-batches with budgets: the store's device bytes stay within the share,
// its host memory within the host budget, and nothing grows after the first micro-batches.
void check_tier(ActivationOffload o, uint64_t share, uint64_t host, bool announce, bool expect_host = true) {
  ActRig r;
  ASSERT_TRUE(r.init(r.options(o, share, host)));
  char* src = r.buffer(1 * kMiB);
  char* dst = r.buffer(1 * kMiB);
  uint64_t base = r.dev->used_bytes();
  std::vector<char> want;
  uint64_t hw_dev = 0, hw_host = 0, dev_hw = 0;
  for (uint32_t mb = 0; mb < 6; ++mb) {
    if (announce) {
      ASSERT_OK(r.store->plan(kSizes.data(), kSizes.size()));
    }
    round_trip(r, kSizes, mb, src, dst, want);
    if (::testing::Test::HasFatalFailure()) return;
    ActivationStats s = r.store->stats();
    EXPECT_EQ(s.checkpoint_bytes, total(kSizes));
    EXPECT_EQ(s.tier_bytes[0] + s.tier_bytes[1] + s.tier_bytes[2], total(kSizes));
    if (o != ActivationOffload::kNone && expect_host) {
      EXPECT_GT(s.tier_bytes[1], 0u) << "the host tier was not used";
    }
    if (o == ActivationOffload::kNvme) {
      EXPECT_GT(s.tier_bytes[2], 0u) << "the NVMe tier was not used";
    }
    EXPECT_LE(s.high_water_device, share);
    EXPECT_LE(s.high_water_host, host);
    EXPECT_EQ(r.dev->used_bytes(), base) << "device memory of the store left after end_micro_batch";
    if (mb == 2) {
      hw_dev = s.high_water_device;
      hw_host = s.high_water_host;
      dev_hw = r.dev->high_water_bytes();
    }
    if (mb > 2) {
      EXPECT_EQ(s.high_water_device, hw_dev);
      EXPECT_EQ(s.high_water_host, hw_host);
      EXPECT_EQ(r.dev->high_water_bytes(), dev_hw);
    }
  }
  EXPECT_LE(r.dev->high_water_bytes(), base + share);
}

TEST(ActivationStore, RoundTripOnTheDevice) { check_tier(ActivationOffload::kNone, total(kSizes), 0, false); }
TEST(ActivationStore, RoundTripThroughTheHost) {
  check_tier(ActivationOffload::kCpu, 700 * kKiB, 4 * kMiB, true);
}
TEST(ActivationStore, RoundTripThroughTheHostPlannedAsItGoes) {
  check_tier(ActivationOffload::kCpu, 700 * kKiB, 4 * kMiB, false);
}
TEST(ActivationStore, RoundTripThroughNvme) {
  // Host: 2 write buffers (512 KiB) + 3 read blocks of the largest (3 x 644 KiB) + a little.
  check_tier(ActivationOffload::kNvme, 700 * kKiB, 2560 * kKiB, true);
}
TEST(ActivationStore, RoundTripThroughNvmePlannedAsItGoes) {
  check_tier(ActivationOffload::kNvme, 700 * kKiB, 2560 * kKiB, false);
}

TEST(ActivationStore, RoundTripThroughNvmeWithRoomForOneReadBlock) {
  // The write buffers (2 x 256 KiB) and one block of the largest tensor: read-ahead must give way
  // to the tensor the backward needs now.
  check_tier(ActivationOffload::kNvme, 700 * kKiB, 512 * kKiB + 644 * kKiB, false, false);
  check_tier(ActivationOffload::kNvme, 700 * kKiB, 512 * kKiB + 644 * kKiB, true, false);
}

// Loads in any order (not the reverse of the saves), some tensors never loaded, and a plan that
// announced fewer tensors than are saved: the bytes still come back exactly, within the budgets.
TEST(ActivationStore, AnyLoadOrderAndPlansThatDoNotMatch) {
  ActRig r;
  ASSERT_TRUE(r.init(r.options(ActivationOffload::kNvme, 700 * kKiB, 2560 * kKiB)));
  char* src = r.buffer(1 * kMiB);
  char* dst = r.buffer(1 * kMiB);
  std::mt19937 rng(7);
  for (uint32_t mb = 0; mb < 4; ++mb) {
    ASSERT_OK(r.store->plan(kSizes.data(), mb % 2 ? kSizes.size() / 2 : kSizes.size()));
    std::vector<ActivationId> ids;
    std::vector<std::vector<char>> expect;
    for (size_t i = 0; i < kSizes.size(); ++i) {
      fill(src, kSizes[i], mb * 77 + static_cast<uint32_t>(i));
      expect.emplace_back(src, src + kSizes[i]);
      auto id = r.store->save(src, kSizes[i]);
      ASSERT_OK(id) << "save " << i;
      ids.push_back(id.value());
    }
    EXPECT_GT(r.store->stats().tier_bytes[2], 0u);
    std::vector<size_t> order(kSizes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    order.resize(order.size() - 3);  // three are never loaded
    for (size_t k : order) {
      ASSERT_OK(r.store->load(ids[k], dst)) << "load " << k;
      ASSERT_TRUE(std::equal(expect[k].begin(), expect[k].end(), dst)) << "tensor " << k << " mb " << mb;
    }
    EXPECT_EQ(r.store->load(ids[order[0]], dst).code(), StatusCode::kInvalidArgument) << "each id loads once";
    ASSERT_OK(r.store->end_micro_batch());
    EXPECT_LE(r.store->stats().high_water_device, 700 * kKiB);
    EXPECT_LE(r.store->stats().high_water_host, 2560 * kKiB);
  }
}

TEST(ActivationStore, DeclinesToOffloadWhenItFits) {
  ActRig r;
  ASSERT_TRUE(r.init(r.options(ActivationOffload::kNvme, total(kSizes), 4 * kMiB)));
  char* src = r.buffer(1 * kMiB);
  char* dst = r.buffer(1 * kMiB);
  std::vector<char> want;
  ASSERT_OK(r.store->plan(kSizes.data(), kSizes.size()));
  round_trip(r, kSizes, 0, src, dst, want);
  ActivationStats s = r.store->stats();
  EXPECT_EQ(s.tier_bytes[0], total(kSizes));
  EXPECT_EQ(s.bytes_device_to_host + s.bytes_host_to_device + s.bytes_nvme_write + s.bytes_nvme_read, 0u);
}

TEST(ActivationStore, KeepLastAndSmallTensorsStay) {
  ActRig r;
  // A share that holds only the last tensor and the small ones.
  std::vector<uint64_t> sizes = {64 * kKiB, 1000, 64 * kKiB, 77, 64 * kKiB};
  ASSERT_TRUE(r.init(r.options(ActivationOffload::kCpu, 64 * kKiB + 1077, 4 * kMiB)));
  char* src = r.buffer(1 * kMiB);
  char* dst = r.buffer(1 * kMiB);
  std::vector<char> want;
  for (int announce = 0; announce < 2; ++announce) {
    if (announce) {
      ASSERT_OK(r.store->plan(sizes.data(), sizes.size()));
    }
    round_trip(r, sizes, announce, src, dst, want);
    ActivationStats s = r.store->stats();
    EXPECT_EQ(s.tier_bytes[0], 64 * kKiB + 1077) << "announce " << announce;
    EXPECT_EQ(s.tier_bytes[1], 128 * kKiB);
  }
}

TEST(ActivationStore, BudgetTooSmallIsAClearError) {
  ActRig r;
  ASSERT_TRUE(r.init(r.options(ActivationOffload::kCpu, 64 * kKiB, 64 * kKiB)));
  char* src = r.buffer(1 * kMiB);
  std::vector<uint64_t> sizes = {64 * kKiB, 64 * kKiB, 64 * kKiB};
  Status p = r.store->plan(sizes.data(), sizes.size());
  EXPECT_EQ(p.code(), StatusCode::kOutOfBudget);
  ASSERT_OK(r.store->save(src, 64 * kKiB));
  ASSERT_OK(r.store->save(src, 64 * kKiB));
  auto third = r.store->save(src, 64 * kKiB);
  EXPECT_EQ(third.status().code(), StatusCode::kOutOfBudget);
  EXPECT_LE(r.store->stats().high_water_device, 64 * kKiB);
  EXPECT_LE(r.store->stats().high_water_host, 64 * kKiB);
  EXPECT_OK(r.store->end_micro_batch());
}

TEST(ActivationStore, ReadAheadDepthInReverseOrder) {
  constexpr uint64_t kT = 64 * kKiB;
  for (uint64_t depth : {0u, 1u, 2u, 3u}) {
    ActRig r;
    // The share holds only the last tensor; the host budget only the write buffers and the read
    // blocks, so tensors 0..6 go to NVMe (one run each; 6's run is still open at the backward).
    ActivationStoreOptions so = r.options(ActivationOffload::kNvme, kT, (2 + depth + 1) * kT);
    so.prefetch = static_cast<uint32_t>(depth);
    so.run_bytes = kT;
    ASSERT_TRUE(r.init(so));
    char* src = r.buffer(kT);
    char* dst = r.buffer(kT);
    std::vector<uint64_t> sizes(8, kT);
    ASSERT_OK(r.store->plan(sizes.data(), sizes.size()));
    std::vector<ActivationId> ids;
    for (size_t i = 0; i < sizes.size(); ++i) ids.push_back(r.store->save(src, sizes[i]).value());
    drain_activation_writes(*r.store);
    ASSERT_EQ(r.store->stats().tier_bytes[2], 7 * kT);
    ASSERT_OK(r.store->load(ids[7], dst));  // on the device; reads 6..7-depth start (6 needs none)
    EXPECT_EQ(r.store->stats().bytes_nvme_read, (depth > 1 ? depth - 1 : 0) * kT) << "depth " << depth;
    ASSERT_OK(r.store->load(ids[6], dst));  // from the open buffer; reads 5..6-depth
    EXPECT_EQ(r.store->stats().bytes_nvme_read, depth * kT) << "depth " << depth;
    for (size_t k = 6; k-- > 0;) ASSERT_OK(r.store->load(ids[k], dst));
    EXPECT_EQ(r.store->stats().bytes_nvme_read, 6 * kT);
    EXPECT_LE(r.store->stats().high_water_host, (2 + depth + 1) * kT);
    EXPECT_OK(r.store->end_micro_batch());
  }
}

TEST(ActivationStore, WriteFaultIsReportedAndTheStoreGoesOn) {
  ActRig r;
  // The host holds only the write buffers and the read blocks: all but the last go to NVMe.
  ActivationStoreOptions so = r.options(ActivationOffload::kNvme, 64 * kKiB, 5 * 64 * kKiB);
  so.run_bytes = 64 * kKiB;
  ASSERT_TRUE(r.init(so));
  char* src = r.buffer(1 * kMiB);
  char* dst = r.buffer(1 * kMiB);
  std::vector<uint64_t> sizes(6, 64 * kKiB);
  ASSERT_OK(r.store->plan(sizes.data(), sizes.size()));
  r.faults.add(io::FaultKind::kEio, 1, 1, io::IoOp::kWrite);
  std::vector<ActivationId> ids;
  Status seen;
  for (size_t i = 0; i < sizes.size(); ++i) {
    fill(src, sizes[i], static_cast<uint32_t>(i));
    drain_activation_writes(*r.store);
    auto id = r.store->save(src, sizes[i]);
    if (!id.is_ok()) {
      seen = id.status();
      break;
    }
    ids.push_back(id.value());
  }
  ASSERT_FALSE(seen.is_ok()) << "the failed write was not reported by a later save";
  EXPECT_NE(seen.message().find("tensor(s) 0"), std::string::npos) << seen.message();
  EXPECT_NE(seen.message().find(r.dir.path()), std::string::npos) << seen.message();
  Status l0 = r.store->load(ids[0], dst);
  EXPECT_FALSE(l0.is_ok());
  EXPECT_NE(l0.message().find("tensor 0"), std::string::npos) << l0.message();
  EXPECT_OK(r.store->end_micro_batch());
  r.faults.clear();
  std::vector<char> want;
  round_trip(r, sizes, 9, src, dst, want);
}

TEST(ActivationStore, ReadFaultIsReportedAtThatLoad) {
  ActRig r;
  // The host holds only the write buffers and one read block: tensors 0..4 go to NVMe.
  ActivationStoreOptions so = r.options(ActivationOffload::kNvme, 64 * kKiB, 3 * 64 * kKiB);
  so.run_bytes = 64 * kKiB;
  so.prefetch = 0;
  ASSERT_TRUE(r.init(so));
  char* src = r.buffer(1 * kMiB);
  char* dst = r.buffer(1 * kMiB);
  std::vector<uint64_t> sizes(6, 64 * kKiB);
  ASSERT_OK(r.store->plan(sizes.data(), sizes.size()));
  std::vector<ActivationId> ids;
  std::vector<std::vector<char>> expect;
  for (size_t i = 0; i < sizes.size(); ++i) {
    fill(src, sizes[i], static_cast<uint32_t>(i + 50));
    expect.emplace_back(src, src + sizes[i]);
    ids.push_back(r.store->save(src, sizes[i]).value());
  }
  drain_activation_writes(*r.store);
  r.faults.add(io::FaultKind::kEio, 1, 1, io::IoOp::kRead);
  bool failed = false;
  for (size_t k = sizes.size(); k-- > 0;) {
    Status s = r.store->load(ids[k], dst);
    if (!s.is_ok()) {
      EXPECT_FALSE(failed) << "only one read was failed";
      failed = true;
      EXPECT_NE(s.message().find("tensor " + std::to_string(k)), std::string::npos) << s.message();
      EXPECT_NE(s.message().find(r.dir.path()), std::string::npos) << s.message();
      ASSERT_OK(r.store->load(ids[k], dst)) << "a load after a failed read reads again";
    }
    EXPECT_EQ(0, std::memcmp(dst, expect[k].data(), sizes[k])) << "tensor " << k;
  }
  EXPECT_TRUE(failed);
  EXPECT_OK(r.store->end_micro_batch());
  r.faults.clear();
  std::vector<char> want;
  round_trip(r, sizes, 3, src, dst, want);
}

TEST(ActivationStore, EndMicroBatchWithIoInFlight) {
  ActRig r;
  // The host holds only the write buffers and the read blocks: all but the last go to NVMe.
  ActivationStoreOptions so = r.options(ActivationOffload::kNvme, 64 * kKiB, 5 * 64 * kKiB);
  so.run_bytes = 64 * kKiB;
  ASSERT_TRUE(r.init(so));
  char* src = r.buffer(1 * kMiB);
  char* dst = r.buffer(1 * kMiB);
  // Completions are held back so that writes and reads are in flight at end_micro_batch().
  r.faults.set_completion_hook([](io::IoOp) { std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
  std::vector<uint64_t> sizes(8, 64 * kKiB);
  uint64_t base = r.dev->used_bytes();
  for (int mb = 0; mb < 3; ++mb) {
    std::vector<ActivationId> ids;
    for (uint64_t b : sizes) ids.push_back(r.store->save(src, b).value());
    ASSERT_EQ(r.store->stats().tier_bytes[2], 7 * 64 * kKiB);
    if (mb == 1) {  // starts read-ahead, then drops the rest
      ASSERT_OK(r.store->load(ids.back(), dst));
    }
    ASSERT_OK(r.store->end_micro_batch());
    EXPECT_EQ(r.dev->used_bytes(), base);
  }
  r.faults.set_completion_hook({});
  std::vector<char> want;
  round_trip(r, sizes, 4, src, dst, want);
  r.store.reset();  // destructible with nothing pending
}

TEST(ActivationStore, DestroyedWithIoInFlight) {
  ActRig r;
  // The host holds only the write buffers and the read blocks: all but the last go to NVMe.
  ActivationStoreOptions so = r.options(ActivationOffload::kNvme, 64 * kKiB, 5 * 64 * kKiB);
  so.run_bytes = 64 * kKiB;
  ASSERT_TRUE(r.init(so));
  char* src = r.buffer(1 * kMiB);
  r.faults.set_completion_hook([](io::IoOp) { std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
  for (int i = 0; i < 6; ++i) ASSERT_OK(r.store->save(src, 64 * kKiB));
  r.store.reset();
}

TEST(ActivationStore, BadIdsAndOptions) {
  ActRig r;
  ASSERT_TRUE(r.init(r.options(ActivationOffload::kCpu, 1 * kMiB, 1 * kMiB)));
  char* dst = r.buffer(4096);
  EXPECT_EQ(r.store->load(ActivationId{}, dst).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.store->load(ActivationId{3}, dst).code(), StatusCode::kInvalidArgument);
  ActivationStoreOptions bad = r.options(ActivationOffload::kNvme, 1 * kMiB, 100 * kKiB);  // < write buffers
  bad.device = r.dev.get();
  auto s = create_activation_store(bad);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("zoe.activation_host_budget"), std::string::npos);
  EXPECT_EQ(parse_activation_offload("disk").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_activation_offload("nvme").value(), ActivationOffload::kNvme);
  EXPECT_STREQ(activation_offload_name(ActivationOffload::kCpu), "cpu");
}

}  // namespace
}  // namespace zoe::offload
