// TierManager tests: moves between tiers, budgets and eviction, coherence, faults, trace policy.
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "tests/offload/offload_fixture.h"
#include "tests/util/status_test_util.h"

namespace zoe::offload {
namespace {

using test::first_mismatch;
using test::random_bytes;

constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

TEST(TierManager, RoundTripsThroughEveryTier) {
  Rig r;
  TierManagerOptions o;
  o.staging_bytes = 64 * KiB;  // items below are larger than every staging buffer
  ASSERT_TRUE(r.init(8 * MiB, 16 * MiB, o));
  TierManager& tm = *r.tm;
  const size_t n = MiB + 12 * KiB + 100;  // not a multiple of 4096 either
  auto data = random_bytes(n, 1);
  ASSERT_OK(tm.add_item(ItemId{1}, n, Tier::kNvme));
  ASSERT_OK(tm.write(ItemId{1}, data.data()));
  // NVMe -> device, streamed through 64 KiB staging buffers.
  auto h = tm.fetch(ItemId{1}, Tier::kDevice);
  auto p = h.wait();
  ASSERT_OK(p);
  std::vector<unsigned char> back(n);
  ASSERT_OK(r.device->copy_to_host(back.data(), p.value(), n));
  EXPECT_EQ(first_mismatch(back.data(), data.data(), n), -1);
  // Change it on the device, evict: the dirty copy is written back to NVMe in pieces.
  for (size_t i = 0; i < n; i += 4096) back[i] ^= 0xFF;
  ASSERT_OK(r.device->copy_to_device(p.value(), back.data(), n));
  tm.unpin(ItemId{1}, Tier::kDevice, /*dirty=*/true);
  EXPECT_EQ(tm.residency(ItemId{1}, Tier::kDevice), Residency::kDirty);
  ASSERT_OK(tm.evict(ItemId{1}, Tier::kDevice).wait());
  EXPECT_EQ(tm.residency(ItemId{1}, Tier::kDevice), Residency::kAbsent);
  // NVMe -> host: sees the device's change.
  auto hp = tm.fetch(ItemId{1}, Tier::kHost).wait();
  ASSERT_OK(hp);
  EXPECT_EQ(first_mismatch(hp.value(), back.data(), n), -1);
  tm.unpin(ItemId{1}, Tier::kHost);
  std::vector<unsigned char> latest(n);
  ASSERT_OK(tm.read(ItemId{1}, latest.data()));
  EXPECT_EQ(first_mismatch(latest.data(), back.data(), n), -1);
  TierStats s = tm.stats();
  EXPECT_GE(s.nvme_to_device.bytes, n);
  EXPECT_GE(s.device_to_nvme.bytes, n);
  EXPECT_GE(s.nvme_to_host.bytes, n);
  EXPECT_EQ(s.used[0], 0u);
}

TEST(TierManager, HostHomeToDeviceAndBack) {
  Rig r;
  ASSERT_TRUE(r.init(4 * MiB, 16 * MiB));
  TierManager& tm = *r.tm;
  auto data = random_bytes(300 * KiB, 2);
  ASSERT_OK(tm.add_item(ItemId{7}, data.size(), Tier::kHost));
  ASSERT_OK(tm.write(ItemId{7}, data.data()));
  auto p = tm.fetch(ItemId{7}, Tier::kDevice).wait();
  ASSERT_OK(p);
  std::vector<unsigned char> v(data.size());
  ASSERT_OK(r.device->copy_to_host(v.data(), p.value(), v.size()));
  EXPECT_EQ(first_mismatch(v.data(), data.data(), v.size()), -1);
  v[5] = static_cast<unsigned char>(v[5] + 1);
  ASSERT_OK(r.device->copy_to_device(p.value(), v.data(), v.size()));
  tm.unpin(ItemId{7}, Tier::kDevice, true);
  ASSERT_OK(tm.flush());
  EXPECT_EQ(tm.residency(ItemId{7}, Tier::kDevice), Residency::kResident);  // flush keeps clean copies
  ASSERT_OK(tm.evict(ItemId{7}, Tier::kDevice).wait());
  std::vector<unsigned char> back(data.size());
  ASSERT_OK(tm.read(ItemId{7}, back.data()));
  EXPECT_EQ(first_mismatch(back.data(), v.data(), v.size()), -1);
}

TEST(TierManager, AnItemAddedOnNvmeStartsAsZerosEvenWhereARemovedItemWas) {
  // Like a host-homed item (its buffer is cleared), never the swap space's old contents.
  Rig r;
  ASSERT_TRUE(r.init(MiB, 8 * MiB));
  TierManager& tm = *r.tm;
  const uint64_t n = 256 * KiB;
  ASSERT_OK(tm.add_item(ItemId{1}, n, Tier::kNvme));
  auto data = random_bytes(n, 21);
  ASSERT_OK(tm.write(ItemId{1}, data.data()));
  const uint64_t offset = r.store->extent(StateKey{1, StateKind::kOther}).value().offset;
  ASSERT_OK(tm.remove_item(ItemId{1}));
  ASSERT_OK(tm.add_item(ItemId{2}, n, Tier::kNvme));
  ASSERT_EQ(r.store->extent(StateKey{2, StateKind::kOther}).value().offset, offset) << "the same swap space";
  std::vector<unsigned char> back(n, 0xee), zeros(n, 0);
  ASSERT_OK(tm.read(ItemId{2}, back.data()));
  EXPECT_EQ(first_mismatch(back.data(), zeros.data(), n), -1);
  // Half written: the rest still reads as zeros.
  ASSERT_OK(tm.write(ItemId{2}, data.data(), 0, n / 2));
  ASSERT_OK(tm.read(ItemId{2}, back.data()));
  EXPECT_EQ(first_mismatch(back.data(), data.data(), n / 2), -1);
  EXPECT_EQ(first_mismatch(back.data() + n / 2, zeros.data(), n / 2), -1);
}

TEST(TierManager, BudgetsAreHardAndErrorsSayWhy) {
  Rig r;
  ASSERT_TRUE(r.init(MiB, 8 * MiB));
  TierManager& tm = *r.tm;
  for (uint64_t i = 0; i < 8; ++i) ASSERT_OK(tm.add_item(ItemId{i}, 256 * KiB, Tier::kNvme));
  // Four fit; the fifth needs an eviction, which happens once one is unpinned.
  std::vector<void*> ptrs;
  for (uint64_t i = 0; i < 4; ++i) {
    auto p = tm.fetch(ItemId{i}, Tier::kDevice).wait();
    ASSERT_OK(p);
  }
  auto full = tm.fetch(ItemId{4}, Tier::kDevice).wait();
  ASSERT_FALSE(full.is_ok());
  const Status& s = full.status();
  EXPECT_EQ(s.code(), StatusCode::kOutOfBudget);
  EXPECT_NE(s.message().find("device tier"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("262144 bytes requested"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("1048576 bytes in use"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("budget 1048576"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("pinned"), std::string::npos) << s.message();
  tm.unpin(ItemId{0}, Tier::kDevice);
  ASSERT_OK(tm.fetch(ItemId{4}, Tier::kDevice).wait());
  EXPECT_EQ(tm.residency(ItemId{0}, Tier::kDevice), Residency::kAbsent);  // the evicted one
  for (uint64_t i = 1; i <= 4; ++i) tm.unpin(ItemId{i}, Tier::kDevice);
  // A request larger than the whole budget fails at once.
  ASSERT_OK(tm.add_item(ItemId{99}, 2 * MiB, Tier::kNvme));
  auto big = tm.fetch(ItemId{99}, Tier::kDevice).wait();
  EXPECT_EQ(big.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(big.status().message().find("alone exceeds"), std::string::npos);
  TierStats st = tm.stats();
  EXPECT_LE(st.high_water[0], MiB);
  EXPECT_EQ(r.device->high_water_bytes() <= MiB, true);
}

TEST(TierManager, WaitsForPinsWhenAskedTo) {
  Rig r;
  TierManagerOptions o;
  o.wait_for_unpin_ms = 5000;
  ASSERT_TRUE(r.init(512 * KiB, 8 * MiB, o));
  TierManager& tm = *r.tm;
  ASSERT_OK(tm.add_item(ItemId{1}, 512 * KiB, Tier::kNvme));
  ASSERT_OK(tm.add_item(ItemId{2}, 512 * KiB, Tier::kNvme));
  ASSERT_OK(tm.fetch(ItemId{1}, Tier::kDevice).wait());
  // The fetch of 2 waits on the full device tier; item 1 is unpinned only once it is seen waiting.
  std::atomic<bool> done{false};
  Status fetched;
  std::thread t([&] {
    fetched = tm.fetch(ItemId{2}, Tier::kDevice).wait().status();
    done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  while (tm.stats().waiting == 0 && !done && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  EXPECT_EQ(tm.stats().waiting, 1u) << "the fetch did not wait for the pin";
  EXPECT_FALSE(done) << "the fetch ended while item 1 was pinned";
  tm.unpin(ItemId{1}, Tier::kDevice);
  t.join();
  EXPECT_OK(fetched);
  EXPECT_EQ(tm.stats().waiting, 0u);
  EXPECT_EQ(tm.residency(ItemId{1}, Tier::kDevice), Residency::kAbsent);  // evicted for 2
  tm.unpin(ItemId{2}, Tier::kDevice);
}

TEST(TierManager, DirtyCopiesAreWrittenBeforeEviction) {
  Rig r;
  ASSERT_TRUE(r.init(MiB, 8 * MiB));
  TierManager& tm = *r.tm;
  const size_t n = 200 * KiB;
  std::vector<std::vector<unsigned char>> want;
  for (uint64_t i = 0; i < 20; ++i) {
    ASSERT_OK(tm.add_item(ItemId{i}, n, Tier::kNvme));
    want.push_back(random_bytes(n, 100 + i));
  }
  // Each item is written on the device; the budget holds 5, so evictions write back as we go.
  for (uint64_t i = 0; i < 20; ++i) {
    auto p = tm.fetch(ItemId{i}, Tier::kDevice).wait();
    ASSERT_OK(p);
    ASSERT_OK(r.device->copy_to_device(p.value(), want[i].data(), n));
    tm.unpin(ItemId{i}, Tier::kDevice, true);
  }
  EXPECT_GT(tm.stats().writebacks, 10u);
  for (uint64_t i = 0; i < 20; ++i) {
    std::vector<unsigned char> got(n);
    ASSERT_OK(tm.read(ItemId{i}, got.data()));
    EXPECT_EQ(first_mismatch(got.data(), want[i].data(), n), -1) << "item " << i;
  }
  EXPECT_LE(tm.stats().high_water[0], MiB);
}

TEST(TierManager, CleanWritesBackAndKeepsAHostCacheThatFeedsTheDevice) {
  // A host copy changed and cleaned: written home, kept; the device then loads from it (no NVMe
  // read), and the host budget drops clean copies when room is needed.
  Rig r;
  const size_t n = 200 * KiB;
  const uint64_t staging = 5 * 256 * KiB;  // the rig's staging buffers count in the host budget
  ASSERT_TRUE(r.init(8 * MiB, staging + 3 * n + 8 * KiB));  // and room for three host copies
  TierManager& tm = *r.tm;
  std::vector<std::vector<unsigned char>> want;
  for (uint64_t i = 0; i < 6; ++i) {
    ASSERT_OK(tm.add_item(ItemId{i}, n, Tier::kNvme));
    want.push_back(random_bytes(n, 300 + i));
  }
  for (uint64_t i = 0; i < 6; ++i) {
    auto p = tm.fetch(ItemId{i}, Tier::kHost).wait();
    ASSERT_OK(p);
    memcpy(p.value(), want[i].data(), n);
    tm.unpin(ItemId{i}, Tier::kHost, /*dirty=*/true);
    // Dirty and pinned again (someone may be writing it): refused.
    ASSERT_OK(tm.fetch(ItemId{i}, Tier::kHost).wait());
    EXPECT_EQ(tm.clean(ItemId{i}, Tier::kHost).wait().status().code(), StatusCode::kInvalidArgument);
    tm.unpin(ItemId{i}, Tier::kHost);
    EXPECT_EQ(tm.residency(ItemId{i}, Tier::kHost), Residency::kDirty);
    ASSERT_OK(tm.clean(ItemId{i}, Tier::kHost).wait());
    EXPECT_EQ(tm.residency(ItemId{i}, Tier::kHost), Residency::kResident) << "item " << i;
  }
  EXPECT_LE(tm.stats().high_water[1], staging + 3 * n + 8 * KiB);
  // The last three are still cached: their device loads come from host memory.
  const TierStats before = tm.stats();
  for (uint64_t i = 3; i < 6; ++i) {
    EXPECT_EQ(tm.residency(ItemId{i}, Tier::kHost), Residency::kResident) << "item " << i;
    auto p = tm.fetch(ItemId{i}, Tier::kDevice).wait();
    ASSERT_OK(p);
    std::vector<unsigned char> got(n);
    ASSERT_OK(r.device->copy_to_host(got.data(), p.value(), n));
    EXPECT_EQ(first_mismatch(got.data(), want[i].data(), n), -1) << "item " << i;
    tm.unpin(ItemId{i}, Tier::kDevice);
  }
  const TierStats after = tm.stats();
  EXPECT_EQ(after.nvme_to_device.bytes, before.nvme_to_device.bytes);
  EXPECT_GE(after.host_to_device.bytes - before.host_to_device.bytes, 3 * n);
  // Every item's home has its bytes, the dropped ones too.
  for (uint64_t i = 0; i < 6; ++i) {
    ASSERT_OK(tm.evict(ItemId{i}, Tier::kHost).wait());
    std::vector<unsigned char> got(n);
    ASSERT_OK(tm.read(ItemId{i}, got.data()));
    EXPECT_EQ(first_mismatch(got.data(), want[i].data(), n), -1) << "item " << i;
  }
  EXPECT_TRUE(tm.clean(ItemId{99}, Tier::kHost).wait().status().code() == StatusCode::kNotFound);
}

TEST(TierManager, ADeviceLoadCopiesFromAHostCopyBeingWrittenHome) {
  // clean() keeps the host copy: while its write to NVMe is still in flight (its completion held
  // back), a fetch into the device copies from it, without waiting for the write and without
  // reading NVMe. The write then ends and the copy stays, clean. An evict() (a write that drops
  // the copy) is not a source: that fetch waits and reads what was written.
  Rig r;
  ASSERT_TRUE(r.init(8 * MiB, 16 * MiB));
  TierManager& tm = *r.tm;
  const size_t n = 300 * KiB;
  auto a = random_bytes(n, 51);
  ASSERT_OK(tm.add_item(ItemId{1}, n, Tier::kNvme));
  auto hp = tm.fetch(ItemId{1}, Tier::kHost).wait();
  ASSERT_OK(hp);
  memcpy(hp.value(), a.data(), n);
  tm.unpin(ItemId{1}, Tier::kHost, /*dirty=*/true);
  std::mutex mu;
  std::condition_variable cv;
  bool holding = false, released = false;
  r.faults.set_completion_hook([&](io::IoOp op) {
    std::unique_lock<std::mutex> lock(mu);
    if (op != io::IoOp::kWrite || released) return;
    holding = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
  });
  MoveHandle w = tm.clean(ItemId{1}, Tier::kHost);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return holding; }));
  }
  EXPECT_EQ(tm.residency(ItemId{1}, Tier::kHost), Residency::kWriting);
  const uint64_t nvme_reads = tm.stats().nvme_to_device.bytes;
  auto dev = std::async(std::launch::async, [&] { return tm.fetch(ItemId{1}, Tier::kDevice).wait(); });
  const bool loaded = dev.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  cv.notify_all();
  ASSERT_TRUE(loaded) << "the device load waited for the write home";
  auto dp = dev.get();
  ASSERT_OK(dp);
  std::vector<unsigned char> got(n);
  ASSERT_OK(r.device->copy_to_host(got.data(), dp.value(), n));
  EXPECT_EQ(first_mismatch(got.data(), a.data(), n), -1);
  EXPECT_EQ(tm.stats().nvme_to_device.bytes, nvme_reads);
  tm.unpin(ItemId{1}, Tier::kDevice);
  ASSERT_OK(w.wait());
  r.faults.set_completion_hook({});
  EXPECT_EQ(tm.residency(ItemId{1}, Tier::kHost), Residency::kResident);
  std::vector<unsigned char> home(n);
  ASSERT_OK(tm.evict(ItemId{1}, Tier::kDevice).wait());
  ASSERT_OK(tm.evict(ItemId{1}, Tier::kHost).wait());
  ASSERT_OK(tm.read(ItemId{1}, home.data()));
  EXPECT_EQ(first_mismatch(home.data(), a.data(), n), -1);
}

TEST(TierManager, CoherenceAcrossHostAndDevice) {
  Rig r;
  ASSERT_TRUE(r.init(4 * MiB, 16 * MiB));
  TierManager& tm = *r.tm;
  const size_t n = 64 * KiB;
  ASSERT_OK(tm.add_item(ItemId{1}, n, Tier::kNvme));
  auto a = random_bytes(n, 1), b = random_bytes(n, 2);
  // Host changes it; the device copy made afterwards sees the change.
  auto hp = tm.fetch(ItemId{1}, Tier::kHost).wait();
  ASSERT_OK(hp);
  memcpy(hp.value(), a.data(), n);
  tm.unpin(ItemId{1}, Tier::kHost, true);
  auto dp = tm.fetch(ItemId{1}, Tier::kDevice).wait();
  ASSERT_OK(dp);
  std::vector<unsigned char> v(n);
  ASSERT_OK(r.device->copy_to_host(v.data(), dp.value(), n));
  EXPECT_EQ(first_mismatch(v.data(), a.data(), n), -1);
  // Device changes it: the host copy (now older) is dropped; a new host copy comes from the device.
  ASSERT_OK(r.device->copy_to_device(dp.value(), b.data(), n));
  tm.unpin(ItemId{1}, Tier::kDevice, true);
  EXPECT_EQ(tm.residency(ItemId{1}, Tier::kHost), Residency::kAbsent);
  hp = tm.fetch(ItemId{1}, Tier::kHost).wait();
  ASSERT_OK(hp);
  EXPECT_EQ(first_mismatch(hp.value(), b.data(), n), -1);
  EXPECT_EQ(tm.residency(ItemId{1}, Tier::kHost), Residency::kDirty);  // it carries the change to NVMe now
  tm.unpin(ItemId{1}, Tier::kHost);
  ASSERT_OK(tm.evict(ItemId{1}, Tier::kDevice).wait());
  ASSERT_OK(tm.evict(ItemId{1}, Tier::kHost).wait());
  std::vector<unsigned char> got(n);
  ASSERT_OK(tm.read(ItemId{1}, got.data()));
  EXPECT_EQ(first_mismatch(got.data(), b.data(), n), -1);
}

TEST(TierManager, WriteErrorKeepsTheDirtyCopy) {
  Rig r;
  ASSERT_TRUE(r.init(4 * MiB, 16 * MiB));
  TierManager& tm = *r.tm;
  const size_t n = 128 * KiB;
  ASSERT_OK(tm.add_item(ItemId{3}, n, Tier::kNvme));
  auto data = random_bytes(n, 3);
  auto hp = tm.fetch(ItemId{3}, Tier::kHost).wait();
  ASSERT_OK(hp);
  memcpy(hp.value(), data.data(), n);
  tm.unpin(ItemId{3}, Tier::kHost, true);
  r.faults.add(io::FaultKind::kEio, 1, 1, io::IoOp::kWrite);
  auto ev = tm.evict(ItemId{3}, Tier::kHost).wait();
  ASSERT_FALSE(ev.is_ok());
  EXPECT_EQ(ev.status().code(), StatusCode::kIoError);
  EXPECT_NE(ev.status().message().find("writing back item 3 from the host tier"), std::string::npos)
      << ev.status().message();
  EXPECT_EQ(tm.residency(ItemId{3}, Tier::kHost), Residency::kDirty);  // nothing lost
  EXPECT_EQ(tm.drain().code(), StatusCode::kIoError);
  ASSERT_OK(tm.evict(ItemId{3}, Tier::kHost).wait());  // the next try goes through
  std::vector<unsigned char> got(n);
  ASSERT_OK(tm.read(ItemId{3}, got.data()));
  EXPECT_EQ(first_mismatch(got.data(), data.data(), n), -1);
}

TEST(TierManager, ReadErrorReachesTheFetcher) {
  Rig r;
  TierManagerOptions o;
  o.staging_bytes = 64 * KiB;
  ASSERT_TRUE(r.init(4 * MiB, 16 * MiB, o));
  TierManager& tm = *r.tm;
  ASSERT_OK(tm.add_item(ItemId{5}, 512 * KiB, Tier::kNvme));
  r.faults.add(io::FaultKind::kEio, 3, 1, io::IoOp::kRead);  // the third of eight pieces
  auto p = tm.fetch(ItemId{5}, Tier::kDevice).wait();
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("loading item 5 into the device tier"), std::string::npos)
      << p.status().message();
  EXPECT_EQ(tm.residency(ItemId{5}, Tier::kDevice), Residency::kAbsent);
  EXPECT_EQ(tm.stats().used[0], 0u);  // the reservation was given back
  EXPECT_EQ(tm.drain().code(), StatusCode::kIoError);
  EXPECT_OK(tm.fetch(ItemId{5}, Tier::kDevice).wait());
  tm.unpin(ItemId{5}, Tier::kDevice);
}

// Regression: a synchronous read()/write() of an NVMe item used to wait for its I/O holding the
// manager's lock, while the reaper thread, finishing an earlier prefetch, blocked on that lock and
// so never reaped the synchronous transfer: a hang at 0% CPU. The fault injector's completion
// hook holds the prefetch's completion until the synchronous transfer is waiting behind it.
void sync_transfer_behind_held_completion(bool write) {
  Rig r;
  TierManagerOptions o;
  o.staging_bytes = 64 * KiB;
  ASSERT_TRUE(r.init(4 * MiB, 16 * MiB, o));
  TierManager& tm = *r.tm;
  const size_t n = 128 * KiB;
  auto a = random_bytes(n, 11), b = random_bytes(n, 12);
  ASSERT_OK(tm.add_item(ItemId{1}, n, Tier::kNvme));
  ASSERT_OK(tm.add_item(ItemId{2}, n, Tier::kNvme));
  ASSERT_OK(tm.write(ItemId{1}, a.data()));
  ASSERT_OK(tm.write(ItemId{2}, b.data()));

  std::mutex mu;
  std::condition_variable cv;
  bool armed = true, holding = false, released = false;
  r.faults.set_completion_hook([&](io::IoOp op) {
    std::unique_lock<std::mutex> lock(mu);
    if (!armed || op != io::IoOp::kRead) return;
    armed = false;
    holding = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
  });
  tm.prefetch(ItemId{1}, Tier::kHost);  // its completion is held on the reaper thread
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return holding; }));
  }
  std::vector<unsigned char> got(n);
  auto sync = std::async(std::launch::async, [&] {
    return write ? tm.write(ItemId{2}, a.data()) : tm.read(ItemId{2}, got.data());
  });
  // Let the synchronous transfer reach its wait, then let the held completion go.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  cv.notify_all();
  if (sync.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: the synchronous %s hung behind a held completion (deadlock)\n",
                 write ? "write" : "read");
    std::_Exit(1);  // the threads are stuck for good; nothing can be unwound
  }
  Status s = sync.get();
  ASSERT_OK(s);
  r.faults.set_completion_hook({});
  ASSERT_OK(tm.drain());
  EXPECT_EQ(tm.residency(ItemId{1}, Tier::kHost), Residency::kResident);
  auto hp = tm.fetch(ItemId{1}, Tier::kHost).wait();
  ASSERT_OK(hp);
  EXPECT_EQ(first_mismatch(hp.value(), a.data(), n), -1);
  tm.unpin(ItemId{1}, Tier::kHost);
  if (write) {
    ASSERT_OK(tm.read(ItemId{2}, got.data()));
  }
  EXPECT_EQ(first_mismatch(got.data(), write ? a.data() : b.data(), n), -1);
}

TEST(TierManager, SyncReadBehindAHeldCompletionDoesNotDeadlock) {
  sync_transfer_behind_held_completion(false);
}
TEST(TierManager, SyncWriteBehindAHeldCompletionDoesNotDeadlock) {
  sync_transfer_behind_held_completion(true);
}

// A synchronous write and fetches of the same item from other threads: every fetch sees the old
// or the new bytes, never a mix, and the transfers never run under the lock.
TEST(TierManager, FetchWaitsForASynchronousWriteOfTheSameItem) {
  Rig r;
  TierManagerOptions o;
  o.staging_bytes = 64 * KiB;
  ASSERT_TRUE(r.init(4 * MiB, 16 * MiB, o));
  TierManager& tm = *r.tm;
  const size_t n = 256 * KiB;
  auto a = random_bytes(n, 21), b = random_bytes(n, 22);
  ASSERT_OK(tm.add_item(ItemId{1}, n, Tier::kNvme));
  ASSERT_OK(tm.write(ItemId{1}, a.data()));
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0}, fetched{0};
  std::thread reader([&] {
    while (!stop.load()) {
      auto p = tm.fetch(ItemId{1}, Tier::kHost).wait();
      if (!p.is_ok()) continue;  // a write() refuses while pinned; that is its contract
      bool is_a = first_mismatch(p.value(), a.data(), n) == -1,
           is_b = first_mismatch(p.value(), b.data(), n) == -1;
      if (!is_a && !is_b) torn++;
      fetched++;
      tm.unpin(ItemId{1}, Tier::kHost);
      (void)tm.evict(ItemId{1}, Tier::kHost).wait();
      // Unpinned a moment, so that writes get a turn: otherwise a slow reader (TSan) holds the
      // pin nearly always (a fetch pins from the start of its load) and every write refuses.
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  int writes = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int k = 0; k < 40; ++k) {
    // A write refuses while the reader holds its pin: try again until the reader lets go.
    while (!tm.write(ItemId{1}, (k % 2 ? a : b).data()).is_ok() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    writes++;
  }
  stop = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(fetched.load(), 0);
  EXPECT_GT(writes, 0);
}

// A cyclic access pattern over one more item than fits: LRU evicts exactly the next one needed
// every time; the trace policy (Belady) keeps most of them.
uint64_t cyclic_loads(EvictionPolicyKind policy) {
  Rig r;
  TierManagerOptions o;
  o.policy = policy;
  if (!r.init(4 * 64 * KiB, 16 * MiB, o)) return 0;
  TierManager& tm = *r.tm;
  for (uint64_t i = 0; i < 5; ++i) EXPECT_OK(tm.add_item(ItemId{i}, 64 * KiB, Tier::kNvme));
  auto pass = [&] {
    for (uint64_t i = 0; i < 5; ++i) {
      EXPECT_OK(tm.fetch(ItemId{i}, Tier::kDevice).wait());
      tm.unpin(ItemId{i}, Tier::kDevice);
    }
  };
  tm.begin_trace();
  pass();
  tm.end_trace();
  uint64_t before = tm.stats().nvme_to_device.transfers;
  for (int k = 0; k < 10; ++k) pass();
  return tm.stats().nvme_to_device.transfers - before;
}

TEST(TierManager, TracePolicyBeatsLruOnCyclicAccess) {
  uint64_t lru = cyclic_loads(EvictionPolicyKind::kLru);
  uint64_t belady = cyclic_loads(EvictionPolicyKind::kTrace);
  EXPECT_EQ(lru, 50u);  // every access misses
  EXPECT_LE(belady, 15u) << "Belady should miss about once per pass";
}

TEST(TierManager, PrefetchLoadsAheadWithoutPinning) {
  Rig r;
  ASSERT_TRUE(r.init(MiB, 16 * MiB));
  TierManager& tm = *r.tm;
  ASSERT_OK(tm.add_item(ItemId{1}, 256 * KiB, Tier::kNvme));
  tm.prefetch(ItemId{1}, Tier::kDevice);
  ASSERT_OK(tm.drain());
  EXPECT_EQ(tm.residency(ItemId{1}, Tier::kDevice), Residency::kResident);
  EXPECT_EQ(tm.pins(ItemId{1}, Tier::kDevice), 0u);
  ASSERT_OK(tm.add_item(ItemId{2}, 2 * MiB, Tier::kNvme));
  tm.prefetch(ItemId{2}, Tier::kDevice);  // cannot fit: skipped, not an error
  EXPECT_EQ(tm.stats().prefetch_skipped, 1u);
  EXPECT_OK(tm.drain());
}

TEST(TierManager, PinnedCopiesAreNotEvictable) {
  Rig r;
  ASSERT_TRUE(r.init(MiB, 16 * MiB));
  TierManager& tm = *r.tm;
  ASSERT_OK(tm.add_item(ItemId{1}, 4096, Tier::kNvme));
  ASSERT_OK(tm.fetch(ItemId{1}, Tier::kDevice).wait());
  auto e = tm.evict(ItemId{1}, Tier::kDevice).wait();
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("pinned 1 time"), std::string::npos);
  EXPECT_EQ(tm.evict(ItemId{1}, Tier::kNvme).wait().status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tm.fetch(ItemId{1}, Tier::kNvme).wait().status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tm.fetch(ItemId{42}, Tier::kDevice).wait().status().code(), StatusCode::kNotFound);
  tm.unpin(ItemId{1}, Tier::kDevice);
}

TEST(TierManager, RangedReadAndWrite) {
  Rig r;
  TierManagerOptions o;
  o.staging_bytes = 64 * KiB;
  ASSERT_TRUE(r.init(4 * MiB, 16 * MiB, o));
  TierManager& tm = *r.tm;
  const size_t n = MiB + 5000;  // the last range ends at the item's end, not on a block
  for (Tier home : {Tier::kNvme, Tier::kHost, Tier::kDevice}) {
    uint64_t id = 10 + static_cast<uint64_t>(home);
    ASSERT_OK(tm.add_item(ItemId{id}, n, home));
    auto data = random_bytes(n, 40 + static_cast<uint64_t>(home));
    ASSERT_OK(tm.write(ItemId{id}, data.data(), 0, 256 * KiB));
    ASSERT_OK(tm.write(ItemId{id}, data.data() + 256 * KiB, 256 * KiB));  // to the end
    std::vector<unsigned char> back(n);
    ASSERT_OK(tm.read(ItemId{id}, back.data(), 0, 512 * KiB));
    ASSERT_OK(tm.read(ItemId{id}, back.data() + 512 * KiB, 512 * KiB));
    EXPECT_EQ(first_mismatch(back.data(), data.data(), n), -1) << tier_name(home);
    EXPECT_EQ(tm.write(ItemId{id}, data.data(), 100, 4096).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(tm.read(ItemId{id}, back.data(), 4096, 100).code(), StatusCode::kInvalidArgument);
  }
  // A dirty host copy is written back before part of the item is replaced: nothing is lost.
  ASSERT_OK(tm.add_item(ItemId{20}, 512 * KiB, Tier::kNvme));
  auto a = random_bytes(512 * KiB, 1), b = random_bytes(256 * KiB, 2);
  auto hp = tm.fetch(ItemId{20}, Tier::kHost).wait();
  ASSERT_OK(hp);
  memcpy(hp.value(), a.data(), a.size());
  tm.unpin(ItemId{20}, Tier::kHost, true);
  ASSERT_OK(tm.write(ItemId{20}, b.data(), 256 * KiB, 256 * KiB));
  memcpy(a.data() + 256 * KiB, b.data(), b.size());
  std::vector<unsigned char> got(512 * KiB);
  ASSERT_OK(tm.read(ItemId{20}, got.data()));
  EXPECT_EQ(first_mismatch(got.data(), a.data(), a.size()), -1);
}

// A write from 4096-byte aligned memory goes to the disk from that memory, many staging-sized
// pieces at once, its partial last block through the staging buffer: the same bytes land as from
// unaligned memory, and a failed piece fails the write (after every piece in flight is done).
TEST(TierManager, AlignedWritesGoFromTheCallersMemory) {
  Rig r;
  TierManagerOptions o;
  o.staging_bytes = 64 * KiB;  // the item is 16 pieces and a partial block
  ASSERT_TRUE(r.init(4 * MiB, 16 * MiB, o));
  TierManager& tm = *r.tm;
  const size_t n = MiB + 5000;
  auto data = random_bytes(n, 7);
  std::unique_ptr<unsigned char, void (*)(void*)> aligned(
      static_cast<unsigned char*>(std::aligned_alloc(4096, 2 * MiB)), std::free);
  ASSERT_NE(aligned, nullptr);
  memcpy(aligned.get(), data.data(), n);
  ASSERT_OK(tm.add_item(ItemId{1}, n, Tier::kNvme));
  ASSERT_OK(tm.write(ItemId{1}, aligned.get()));
  std::vector<unsigned char> back(n);
  ASSERT_OK(tm.read(ItemId{1}, back.data()));
  EXPECT_EQ(first_mismatch(back.data(), data.data(), n), -1);
  // A range from an aligned address to the item's end, and one of whole blocks inside it.
  auto other = random_bytes(n, 8);
  memcpy(aligned.get(), other.data(), n);
  ASSERT_OK(tm.write(ItemId{1}, aligned.get() + 256 * KiB, 256 * KiB));
  ASSERT_OK(tm.write(ItemId{1}, aligned.get() + 4096, 4096, 8192));
  memcpy(data.data() + 256 * KiB, other.data() + 256 * KiB, n - 256 * KiB);
  memcpy(data.data() + 4096, other.data() + 4096, 8192);
  ASSERT_OK(tm.read(ItemId{1}, back.data()));
  EXPECT_EQ(first_mismatch(back.data(), data.data(), n), -1);
  // The fifth piece fails: the write says so; the next one goes through.
  r.faults.clear();  // counts the writes from here
  r.faults.add(io::FaultKind::kEio, 5, 1, io::IoOp::kWrite);
  Status failed = tm.write(ItemId{1}, aligned.get());
  EXPECT_EQ(failed.code(), StatusCode::kIoError) << failed.message();
  EXPECT_NE(failed.message().find("writing item 1 to its nvme home"), std::string::npos) << failed.message();
  ASSERT_OK(tm.write(ItemId{1}, aligned.get()));
  ASSERT_OK(tm.read(ItemId{1}, back.data()));
  EXPECT_EQ(first_mismatch(back.data(), other.data(), n), -1);
}

TEST(TierManager, ChromeTraceOfTransfers) {
  Rig r;
  TraceRecorder rec(true);
  TierManagerOptions o;
  o.trace = &rec;
  ASSERT_TRUE(r.init(MiB, 16 * MiB, o));
  TierManager& tm = *r.tm;
  ASSERT_OK(tm.add_item(ItemId{1}, 64 * KiB, Tier::kNvme));
  ASSERT_OK(tm.fetch(ItemId{1}, Tier::kDevice).wait());
  tm.unpin(ItemId{1}, Tier::kDevice, true);
  ASSERT_OK(tm.flush());
  auto all = nlohmann::json::parse(rec.chrome_json());
  nlohmann::json j = {{"traceEvents", nlohmann::json::array()}};  // the spans (not the track names)
  for (const auto& e : all["traceEvents"]) {
    if (e["ph"] == "X") j["traceEvents"].push_back(e);
  }
  ASSERT_EQ(j["traceEvents"].size(), 2u);
  EXPECT_EQ(j["traceEvents"][0]["cat"], "nvme->device");
  EXPECT_EQ(j["traceEvents"][0]["ph"], "X");
  EXPECT_EQ(j["traceEvents"][1]["cat"], "device->nvme");
  EXPECT_EQ(j["traceEvents"][1]["args"]["bytes"], 65536);
  test::ScratchDir d("trace");
  ASSERT_OK(rec.write_chrome_json(d.file("t.json")));
}

}  // namespace
}  // namespace zoe::offload
