// Randomised stress of the TierManager: thousands of items under tight budgets on all three tiers,
// random fetch / modify / evict / prefetch from several threads. Checks that every item holds
// exactly what its last writer wrote and that no tier ever exceeds its budget. Run it under TSan.
#include <atomic>
#include <random>
#include <thread>

#include "tests/offload/offload_fixture.h"
#include "tests/util/status_test_util.h"

namespace zoe::offload {
namespace {

constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

// The content of item `id` after `version` writes: a function of both, so checks need no copies.
void fill(unsigned char* p, size_t n, uint64_t id, uint64_t version) {
  uint64_t x = id * 0x9e3779b97f4a7c15ull + version * 0xbf58476d1ce4e5b9ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<unsigned char>(x);
  }
}

TEST(TierStress, RandomOpsFromSeveralThreads) {
  Rig r;
  TierManagerOptions o;
  o.staging_bytes = 64 * KiB;
  o.staging_count = 4;
  o.wait_for_unpin_ms = 10000;
  const uint64_t device_budget = MiB, host_budget = 6 * MiB, nvme_budget = 64 * MiB;
  ASSERT_TRUE(r.init(device_budget, host_budget, o, nvme_budget));
  TierManager& tm = *r.tm;

  const int threads = 4;
  const size_t items = 2000;
  std::mt19937_64 setup(7);
  std::vector<size_t> size(items);
  std::vector<Tier> home(items);
  std::vector<std::atomic<uint64_t>> version(items);
  for (size_t i = 0; i < items; ++i) {
    size[i] = 512 + setup() % (40 * KiB);
    home[i] = setup() % 10 == 0 ? Tier::kHost : Tier::kNvme;  // ~200 host-home items (~4 MiB)
    ASSERT_OK(tm.add_item(ItemId{i}, size[i], home[i])) << "item " << i;
    std::vector<unsigned char> buf(size[i]);
    fill(buf.data(), buf.size(), i, 0);
    ASSERT_OK(tm.write(ItemId{i}, buf.data()));
  }

  std::atomic<int> failures{0};
  std::atomic<bool> over_budget{false};
  std::atomic<bool> stop{false};
  std::thread watcher([&] {
    while (!stop.load()) {
      TierStats s = tm.stats();
      if (s.used[0] > device_budget || s.used[1] > host_budget || s.used[2] > nvme_budget) over_budget = true;
      std::this_thread::yield();
    }
  });
  auto worker = [&](int t) {
    std::mt19937_64 rng(1000 + t);
    std::vector<unsigned char> want;
    for (int op = 0; op < 1500 && failures.load() < 5; ++op) {
      // Each thread owns the items i with i % threads == t, so it knows their versions.
      size_t i = (rng() % (items / threads)) * threads + static_cast<size_t>(t);
      int kind = static_cast<int>(rng() % 10);
      Tier tier = (rng() % 2 || home[i] == Tier::kHost) ? Tier::kDevice : Tier::kHost;
      if (kind < 6) {  // fetch, check, maybe modify
        auto p = tm.fetch(ItemId{i}, tier).wait();
        if (!p.is_ok()) {
          ADD_FAILURE() << "fetch " << i << " " << tier_name(tier) << ": " << p.status().to_string();
          failures++;
          continue;
        }
        want.resize(size[i]);
        fill(want.data(), size[i], i, version[i].load());
        std::vector<unsigned char> got(size[i]);
        if (tier == Tier::kDevice) {
          EXPECT_OK(r.device->copy_to_host(got.data(), p.value(), size[i]));
        } else {
          memcpy(got.data(), p.value(), size[i]);
        }
        if (checksum(got.data(), got.size()) != checksum(want.data(), want.size())) {
          ADD_FAILURE() << "item " << i << " content differs in the " << tier_name(tier) << " tier (version "
                        << version[i].load() << ")";
          failures++;
        }
        bool modify = kind < 3;
        if (modify) {
          uint64_t v = version[i].load() + 1;
          fill(want.data(), size[i], i, v);
          if (tier == Tier::kDevice) {
            EXPECT_OK(r.device->copy_to_device(p.value(), want.data(), size[i]));
          } else {
            memcpy(p.value(), want.data(), size[i]);
          }
          version[i] = v;
        }
        tm.unpin(ItemId{i}, tier, modify);
      } else if (kind < 8) {
        Tier t2 = home[i] == Tier::kHost ? Tier::kDevice : tier;
        auto e = tm.evict(ItemId{i}, t2).wait();
        if (!e.is_ok()) {
          ADD_FAILURE() << "evict " << i << ": " << e.status().to_string();
          failures++;
        }
      } else {
        tm.prefetch(ItemId{i}, tier);
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(worker, t);
  for (auto& t : ts) t.join();
  stop = true;
  watcher.join();

  ASSERT_OK(tm.flush());
  EXPECT_FALSE(over_budget.load()) << "a tier went over its budget";
  TierStats s = tm.stats();
  EXPECT_LE(s.high_water[0], device_budget);
  EXPECT_LE(s.high_water[1], host_budget);
  EXPECT_LE(s.high_water[2], nvme_budget);
  EXPECT_LE(r.device->high_water_bytes(), device_budget);
  EXPECT_GT(s.evictions, 100u) << "the budgets should have forced evictions";
  EXPECT_GT(s.writebacks, 10u);
  // Every item holds exactly its last version (checksums changed only where a thread wrote).
  for (size_t i = 0; i < items; ++i) {
    std::vector<unsigned char> got(size[i]), want(size[i]);
    ASSERT_OK(tm.read(ItemId{i}, got.data()));
    fill(want.data(), size[i], i, version[i].load());
    ASSERT_EQ(checksum(got.data(), got.size()), checksum(want.data(), want.size())) << "item " << i;
  }
}

}  // namespace
}  // namespace zoe::offload
