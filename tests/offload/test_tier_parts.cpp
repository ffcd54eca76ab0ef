// The tier manager's parts on their own: eviction policies, the residency table's state machine,
// the staging pool's queue, the poster's order, and the named link statistics.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "offload/eviction_policy.h"
#include "offload/poster.h"
#include "offload/residency.h"
#include "offload/staging.h"
#include "offload/tier.h"
#include "tests/util/status_test_util.h"

namespace zoe::offload {
namespace {

// Candidates from (item number, last use) pairs.
std::vector<EvictionCandidate> candidates(std::initializer_list<std::pair<uint64_t, uint64_t>> l) {
  std::vector<EvictionCandidate> v;
  for (auto [id, last] : l) v.push_back(EvictionCandidate{ItemId{id}, last});
  return v;
}

// An item's and a group's names are built from a number only by name (ItemId{n}), never from a
// plain number by conversion, nor one from the other.
TEST(TypedId, IsBuiltFromANumberOnlyByName) {
  static_assert(!std::is_convertible_v<uint64_t, ItemId>);
  static_assert(!std::is_convertible_v<int, GroupId>);
  static_assert(std::is_constructible_v<ItemId, uint64_t>);
  static_assert(!std::is_convertible_v<ItemId, GroupId>);
  static_assert(!std::is_convertible_v<ItemId, uint64_t>);
  EXPECT_EQ(ItemId{7}.value, 7u);
  EXPECT_EQ(ItemId{7}, ItemId{7});
  EXPECT_NE(ItemId{7}, ItemId{8});
}

TEST(EvictionPolicy, LruTakesTheOldestAndTheFirstOnTies) {
  LruPolicy lru;
  EXPECT_EQ(lru.choose(candidates({{1, 9}, {2, 3}, {3, 7}})), 1u);
  EXPECT_EQ(lru.choose(candidates({{1, 5}, {2, 5}, {3, 6}})), 0u);
  EXPECT_EQ(lru.choose(candidates({{4, 1}})), 0u);
}

TEST(EvictionPolicy, BeladyTakesTheFurthestNextUseOfTheTrace) {
  BeladyPolicy p;
  // No trace yet, and while recording: LRU.
  EXPECT_EQ(p.choose(candidates({{1, 9}, {2, 3}})), 1u);
  p.begin_trace();
  for (ItemId id : {ItemId{1}, ItemId{2}, ItemId{3}, ItemId{4}}) {
    p.fetch_begins(id);
    p.fetch_returned();
  }
  EXPECT_EQ(p.choose(candidates({{1, 9}, {2, 3}})), 1u);
  p.end_trace();
  // The cursor is at the start of the trace 1 2 3 4: 4 is used last, 9 never.
  EXPECT_EQ(p.choose(candidates({{2, 1}, {4, 2}, {3, 0}})), 1u);
  EXPECT_EQ(p.choose(candidates({{2, 1}, {9, 5}, {4, 2}})), 1u);
  // After fetches of 1 and 2 the cursor is at 3: 2's next use wraps around to the next pass,
  // behind 4 and 1.
  p.fetch_begins(ItemId{1});
  p.fetch_returned();
  p.fetch_begins(ItemId{2});
  p.fetch_returned();
  EXPECT_EQ(p.choose(candidates({{4, 0}, {2, 1}, {1, 2}})), 1u);
  // Equal next uses (ids never traced): the oldest.
  EXPECT_EQ(p.choose(candidates({{8, 6}, {9, 2}})), 1u);
  // A new recording forgets the old trace.
  p.begin_trace();
  p.end_trace();
  EXPECT_EQ(p.choose(candidates({{4, 7}, {2, 1}})), 1u);
}

TEST(EvictionPolicy, MadeByKind) {
  auto lru = make_eviction_policy(EvictionPolicyKind::kLru);
  auto trace = make_eviction_policy(EvictionPolicyKind::kTrace);
  EXPECT_NE(dynamic_cast<LruPolicy*>(lru.get()), nullptr);
  EXPECT_NE(dynamic_cast<BeladyPolicy*>(trace.get()), nullptr);
}

std::unique_ptr<Item> make_item(ItemId id, Tier home) {
  auto it = std::make_unique<Item>();
  it->id = id;
  it->bytes = it->alloc = 4096;
  it->home = home;
  it->at(home).state = Residency::kResident;
  return it;
}

TEST(ResidencyTable, LoadPinUnpinWriteBack) {
  ResidencyTable t;
  Item& it = *t.insert(make_item(ItemId{1}, Tier::kNvme));
  EXPECT_EQ(t.find(ItemId{1}), &it);
  EXPECT_EQ(t.find(ItemId{2}), nullptr);
  auto move = t.begin_load(it, Tier::kDevice, /*pin=*/true);
  Copy& d = it.at(Tier::kDevice);
  EXPECT_EQ(d.state, Residency::kLoading);
  EXPECT_EQ(d.move, move);
  EXPECT_EQ(d.pins, 1u);
  EXPECT_FALSE(it.idle());
  EXPECT_TRUE(ResidencyTable::finish_load(it, Tier::kDevice, nullptr));
  EXPECT_EQ(d.state, Residency::kResident);
  EXPECT_TRUE(it.idle());
  EXPECT_EQ(t.pinned_bytes(Tier::kDevice), 4096u);
  std::vector<EvictionCandidate> c;
  t.evictable(Tier::kDevice, true, &c);
  EXPECT_TRUE(c.empty()) << "a pinned copy is never a candidate";
  const uint64_t before = d.last_use;
  EXPECT_TRUE(t.unpin(it, Tier::kDevice, /*dirty=*/true).empty());
  EXPECT_EQ(d.state, Residency::kDirty);
  EXPECT_GT(d.last_use, before);
  t.evictable(Tier::kDevice, /*allow_dirty=*/false, &c);
  EXPECT_TRUE(c.empty()) << "a dirty copy only when dirty ones are allowed";
  t.evictable(Tier::kDevice, /*allow_dirty=*/true, &c);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].id, ItemId{1});
  EXPECT_EQ(c[0].last_use, d.last_use);
  ResidencyTable::begin_writeback(it, Tier::kDevice);
  EXPECT_EQ(d.state, Residency::kWriting);
  ResidencyTable::finish_writeback(d, /*written=*/false);
  EXPECT_EQ(d.state, Residency::kDirty) << "a failed write-back keeps the bytes";
  ResidencyTable::begin_writeback(it, Tier::kDevice);
  ResidencyTable::finish_writeback(d, /*written=*/true);
  EXPECT_EQ(d.state, Residency::kResident);
  ResidencyTable::clear(d);
  EXPECT_EQ(d.state, Residency::kAbsent);
  EXPECT_EQ(d.move, nullptr);
  t.evictable(Tier::kNvme, true, &c);
  EXPECT_TRUE(c.empty()) << "the home copy is never a candidate";
}

TEST(ResidencyTable, DirtyUnpinMakesOtherCopiesStaleOrDropsThem) {
  ResidencyTable t;
  Item& it = *t.insert(make_item(ItemId{1}, Tier::kNvme));
  t.begin_load(it, Tier::kHost, false);
  ASSERT_TRUE(ResidencyTable::finish_load(it, Tier::kHost, nullptr));
  t.begin_load(it, Tier::kDevice, true);
  ASSERT_TRUE(ResidencyTable::finish_load(it, Tier::kDevice, &it.at(Tier::kHost)));
  // The device changed it: the (older) host copy must be dropped by the caller.
  std::vector<Tier> drop = t.unpin(it, Tier::kDevice, /*dirty=*/true);
  ASSERT_EQ(drop.size(), 1u);
  EXPECT_EQ(drop[0], Tier::kHost);
  ResidencyTable::clear(it.at(Tier::kHost));
  // A host copy loaded from the dirty device copy carries the dirtiness down.
  t.begin_load(it, Tier::kHost, true);
  EXPECT_TRUE(ResidencyTable::finish_load(it, Tier::kHost, &it.at(Tier::kDevice)));
  EXPECT_EQ(it.at(Tier::kHost).state, Residency::kDirty);
  EXPECT_EQ(it.at(Tier::kDevice).state, Residency::kResident);
  // A copy that is loading while another tier's copy changes goes stale: finish_load says drop.
  ResidencyTable::clear(it.at(Tier::kDevice));
  t.begin_load(it, Tier::kDevice, false);
  EXPECT_TRUE(t.unpin(it, Tier::kHost, /*dirty=*/true).empty());
  EXPECT_TRUE(it.at(Tier::kDevice).stale);
  EXPECT_FALSE(ResidencyTable::finish_load(it, Tier::kDevice, nullptr));
}

TEST(StagingPool, JobsWaitInOrderForAFreeBuffer) {
  auto p = StagingPool::create(4096, 2, io::PinMode::kNone);
  ASSERT_OK(p);
  StagingPool& pool = *p.value();
  EXPECT_EQ(pool.buffer_bytes(), 4096u);
  EXPECT_EQ(pool.total_bytes(), 3u * 4096) << "two shared buffers and the synchronous one";
  std::vector<char*> held;
  std::vector<int> order;
  for (int k = 0; k < 5; ++k) {
    pool.with_buffer([&, k](char* b) {
      held.push_back(b);
      order.push_back(k);
    });
  }
  ASSERT_EQ(held.size(), 2u) << "two buffers: the other jobs wait";
  EXPECT_NE(held[0], held[1]);
  pool.release(held[0]);  // runs job 2 here, with that buffer
  ASSERT_EQ(held.size(), 3u);
  EXPECT_EQ(held[2], held[0]);
  pool.release(held[1]);
  pool.release(held[2]);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  StagingPool::SyncLease sync = pool.lease_sync_buffer();
  ASSERT_NE(sync.data, nullptr);
  for (char* b : held) EXPECT_NE(b, sync.data) << "the synchronous buffer is never shared";
}

TEST(Poster, RunsInOrderAndStopRunsWhatIsQueued) {
  std::mutex mu;
  std::vector<int> ran;
  std::thread::id poster_thread;
  {
    Poster p;
    std::atomic<bool> go{false};
    p.post([&] {
      while (!go.load()) std::this_thread::yield();
      poster_thread = std::this_thread::get_id();
    });
    for (int k = 0; k < 100; ++k) {
      p.post([&, k] {
        std::lock_guard<std::mutex> lock(mu);
        ran.push_back(k);
        if (k == 99) {
          p.post([&] { ran.push_back(100); });  // work may post more work
        }
      });
    }
    go = true;
    p.stop();
    p.stop();  // idempotent
  }
  ASSERT_EQ(ran.size(), 101u);
  for (int k = 0; k <= 100; ++k) EXPECT_EQ(ran[static_cast<size_t>(k)], k);
  EXPECT_NE(poster_thread, std::this_thread::get_id());
}

TEST(TierStats, LinksHaveNamesInOrder) {
  TierStats s;
  s.nvme_to_host.bytes = 1;
  s.host_to_nvme.bytes = 2;
  s.host_to_device.bytes = 3;
  s.device_to_host.bytes = 4;
  s.nvme_to_device.bytes = 5;
  s.device_to_nvme.bytes = 6;
  std::vector<std::string> names;
  std::vector<uint64_t> bytes;
  s.for_each_link([&](const char* name, const LinkStats& l) {
    names.push_back(name);
    bytes.push_back(l.bytes);
  });
  EXPECT_EQ(names, (std::vector<std::string>{"nvme->host", "host->nvme", "host->device", "device->host",
                                             "nvme->device", "device->nvme"}));
  EXPECT_EQ(bytes, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(&s.link(Link::kDeviceToNvme), &s.device_to_nvme);
  EXPECT_EQ(std::string(link_name(Link::kHostToDevice)), "host->device");
}

}  // namespace
}  // namespace zoe::offload
