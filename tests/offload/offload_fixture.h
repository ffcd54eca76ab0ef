// A tier-manager test rig: CPU device, swap file, I/O engine with fault injection.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "device/device.h"
#include "io/fault_injector.h"
#include "io/io_engine.h"
#include "io/swap_file.h"
#include "offload/swap_store.h"
#include "offload/tier_manager.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::offload {

constexpr uint64_t MiB() { return 1024 * 1024; }

struct Rig {
  test::ScratchDir dir{"offload"};
  io::FaultInjector faults;
  std::unique_ptr<io::IoEngine> engine;
  std::unique_ptr<io::SwapFile> swap;
  std::unique_ptr<SwapStore> store;
  std::unique_ptr<device::Device> device;
  std::unique_ptr<TierManager> tm;

  // Returns false (with a gtest failure) when setup fails.
  bool init(uint64_t device_budget, uint64_t host_budget, TierManagerOptions extra = {},
            uint64_t nvme_budget = 0) {
    io::IoEngineOptions eo;
    eo.queue_depth = 16;
    eo.faults = &faults;
    auto e = io::IoEngine::create(eo);
    EXPECT_OK(e);
    if (!e.is_ok()) return false;
    engine = std::move(e).value();
    io::SwapFileOptions so;
    so.dirs = {dir.path()};
    so.grow_bytes = 4 << 20;
    so.checksum = true;  // the tier and swapper tests run with swap checksums on
    auto s = io::SwapFile::create(so);
    EXPECT_OK(s);
    if (!s.is_ok()) return false;
    swap = std::move(s).value();
    store = std::make_unique<SwapStore>(swap.get(), engine.get(), nvme_budget);
    auto d = device::create_cpu_device(device_budget);
    EXPECT_OK(d);
    if (!d.is_ok()) return false;
    device = std::move(d).value();
    TierManagerOptions o = extra;
    if (o.staging_bytes == TierManagerOptions{}.staging_bytes) o.staging_bytes = 256 * 1024;  // small hosts
    o.device = device.get();
    o.host_budget = host_budget;
    o.nvme = store.get();
    auto t = TierManager::create(o);
    EXPECT_OK(t);
    if (!t.is_ok()) return false;
    tm = std::move(t).value();
    return true;
  }

  ~Rig() {
    tm.reset();  // before the device, store and engine it uses
  }
};

inline uint64_t checksum(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace zoe::offload
