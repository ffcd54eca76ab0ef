// TierManager under failing device copies: a stream copy that fails to enqueue reaches the
// caller's handle and drain() as an error, keeps a dirty copy's bytes, and never hangs (failures
// are finished on the poster thread, never on the thread that holds the manager's lock).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>

#include "tests/offload/offload_fixture.h"
#include "tests/util/status_test_util.h"

namespace zoe::offload {
namespace {

using test::first_mismatch;
using test::random_bytes;

constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

// Counts of copies to refuse, shared by a FaultyDevice and its streams.
struct DeviceFaults {
  std::atomic<int> d2h{0}, h2d{0};
};

class FaultyStream final : public device::Stream {
 public:
  FaultyStream(std::unique_ptr<device::Stream> s, DeviceFaults* f) : s_(std::move(s)), f_(f) {}
  Status copy_h2d(void* dst, const void* src, size_t bytes) override {
    if (f_->h2d.fetch_sub(1) > 0) return io_error("injected: host->device copy of %zu bytes refused", bytes);
    return s_->copy_h2d(dst, src, bytes);
  }
  Status copy_d2h(void* dst, const void* src, size_t bytes) override {
    if (f_->d2h.fetch_sub(1) > 0) return io_error("injected: device->host copy of %zu bytes refused", bytes);
    return s_->copy_d2h(dst, src, bytes);
  }
  Status copy_d2d(void* dst, const void* src, size_t bytes) override { return s_->copy_d2d(dst, src, bytes); }
  Status enqueue_host(std::function<void()> fn) override { return s_->enqueue_host(std::move(fn)); }
  Status record(device::Event& e) override { return s_->record(e); }
  Status wait_event(device::Event& e) override { return s_->wait_event(e); }
  Status synchronize() override { return s_->synchronize(); }

 private:
  std::unique_ptr<device::Stream> s_;
  DeviceFaults* f_;
};

// A CPU device whose streams refuse the next copies counted in `faults`.
class FaultyDevice final : public device::Device {
 public:
  FaultyDevice(device::Device* d, DeviceFaults* f) : d_(d), f_(f) {}
  device::DeviceKind kind() const override { return d_->kind(); }
  std::string name() const override { return "faulty " + d_->name(); }
  Result<void*> allocate(size_t bytes) override { return d_->allocate(bytes); }
  void free(void* p) override { d_->free(p); }
  uint64_t budget_bytes() const override { return d_->budget_bytes(); }
  uint64_t used_bytes() const override { return d_->used_bytes(); }
  uint64_t high_water_bytes() const override { return d_->high_water_bytes(); }
  Result<std::unique_ptr<device::Stream>> create_stream() override {
    ZOE_ASSIGN_OR_RETURN(auto s, d_->create_stream());
    return std::unique_ptr<device::Stream>(new FaultyStream(std::move(s), f_));
  }
  Result<std::unique_ptr<device::Event>> create_event() override { return d_->create_event(); }
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    return d_->copy_to_device(dst, src, bytes);
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    return d_->copy_to_host(dst, src, bytes);
  }

 private:
  device::Device* d_;
  DeviceFaults* f_;
};

// The rig's store and CPU device behind a FaultyDevice, in a manager of its own.
struct FaultyRig {
  Rig r;
  DeviceFaults faults;
  std::unique_ptr<FaultyDevice> device;
  std::unique_ptr<TierManager> tm;  // last: destroyed first

  bool init(size_t staging_bytes) {
    if (!r.init(4 * MiB, 16 * MiB)) return false;
    r.tm.reset();
    device = std::make_unique<FaultyDevice>(r.device.get(), &faults);
    TierManagerOptions o;
    o.device = device.get();
    o.host_budget = 16 * MiB;
    o.nvme = r.store.get();
    o.staging_bytes = staging_bytes;
    auto t = TierManager::create(o);
    EXPECT_OK(t);
    if (!t.is_ok()) return false;
    tm = std::move(t).value();
    return true;
  }
};

// Starts a move and waits for it; a hang (in the call or in the wait) is a deadlock, which no
// test can unwind.
Result<void*> move_or_die(const std::function<MoveHandle()>& start, const char* what) {
  auto f = std::async(std::launch::async, [&] { return start().wait(); });
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: %s hung (deadlock)\n", what);
    std::_Exit(1);
  }
  return f.get();
}

// One staging piece or several: the last piece's failure used to be finished on the thread that
// started the write-back, which holds the manager's lock.
class DeviceWriteBackFault : public ::testing::TestWithParam<size_t> {};

TEST_P(DeviceWriteBackFault, KeepsTheDirtyCopyAndReportsTheError) {
  FaultyRig f;
  ASSERT_TRUE(f.init(GetParam()));
  TierManager& tm = *f.tm;
  const size_t n = 64 * KiB;
  ASSERT_OK(tm.add_item(ItemId{1}, n, Tier::kNvme));
  auto data = random_bytes(n, 5);
  auto p = move_or_die([&] { return tm.fetch(ItemId{1}, Tier::kDevice); }, "fetch");
  ASSERT_OK(p);
  ASSERT_OK(f.device->copy_to_device(p.value(), data.data(), n));
  tm.unpin(ItemId{1}, Tier::kDevice, /*dirty=*/true);
  f.faults.d2h = 1 << 20;  // every device->host copy of the write-back
  auto ev =
      move_or_die([&] { return tm.evict(ItemId{1}, Tier::kDevice); }, "a write-back whose device copy fails");
  ASSERT_FALSE(ev.is_ok());
  EXPECT_EQ(ev.status().code(), StatusCode::kIoError);
  EXPECT_NE(ev.status().message().find("writing back item 1 from the device tier"), std::string::npos)
      << ev.status().message();
  EXPECT_NE(ev.status().message().find("injected: device->host copy"), std::string::npos)
      << ev.status().message();
  EXPECT_EQ(tm.residency(ItemId{1}, Tier::kDevice), Residency::kDirty);  // nothing lost
  EXPECT_EQ(tm.drain().code(), StatusCode::kIoError);
  f.faults.d2h = 0;
  ASSERT_OK(move_or_die([&] { return tm.evict(ItemId{1}, Tier::kDevice); }, "evict"));
  EXPECT_EQ(tm.residency(ItemId{1}, Tier::kDevice), Residency::kAbsent);
  std::vector<unsigned char> got(n);
  ASSERT_OK(tm.read(ItemId{1}, got.data()));
  EXPECT_EQ(first_mismatch(got.data(), data.data(), n), -1);
}

INSTANTIATE_TEST_SUITE_P(Pieces, DeviceWriteBackFault, ::testing::Values(64 * KiB, 16 * KiB),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return i.param == 64 * KiB ? std::string("OnePiece") : std::string("FourPieces");
                         });

TEST(DeviceLoadFault, ReachesTheFetcherAndGivesTheBudgetBack) {
  FaultyRig f;
  ASSERT_TRUE(f.init(16 * KiB));
  TierManager& tm = *f.tm;
  const size_t n = 64 * KiB;
  ASSERT_OK(tm.add_item(ItemId{1}, n, Tier::kNvme));  // to the device through staging
  ASSERT_OK(tm.add_item(ItemId{2}, n, Tier::kHost));  // to the device straight from host
  for (uint64_t id : {1, 2}) {
    const uint64_t used = tm.stats().used[0];
    f.faults.h2d = 1;
    auto p =
        move_or_die([&] { return tm.fetch(ItemId{id}, Tier::kDevice); }, "a load whose device copy fails");
    ASSERT_FALSE(p.is_ok()) << "item " << id;
    EXPECT_NE(p.status().message().find("loading item " + std::to_string(id) + " into the device tier"),
              std::string::npos)
        << p.status().message();
    EXPECT_EQ(tm.residency(ItemId{id}, Tier::kDevice), Residency::kAbsent);
    EXPECT_EQ(tm.drain().code(), StatusCode::kIoError);
    EXPECT_EQ(tm.stats().used[0], used) << "the reservation was given back";
    ASSERT_OK(move_or_die([&] { return tm.fetch(ItemId{id}, Tier::kDevice); }, "fetch"));
    tm.unpin(ItemId{id}, Tier::kDevice);
  }
}

}  // namespace
}  // namespace zoe::offload
