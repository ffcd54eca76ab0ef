// bench_activations: one micro-batch's checkpointed activations saved and loaded back in reverse
// through the activation store, with offload none (the baseline: everything on the device), cpu
// and nvme, the modes alternating round by round in one run. Prints each mode's median seconds per
// micro-batch, its ratio to none, and the NVMe bytes moved.
//
// Usage: bench_activations [DIR]   (DIR: the NVMe directory, default the current one)
// Fixed shape: 24 tensors of 8 MiB (a 24-block model's checkpoints), a device share of 2 tensors,
// 7 rounds. Run under the exclusive lock: flock -x /tmp/zoe-heavy.lock build/bin/bench_activations.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/clock.h"
#include "device/device.h"
#include "offload/activation_store.h"

namespace {

constexpr int kTensors = 24;
constexpr uint64_t kBytes = 8u << 20;
constexpr int kRounds = 7;

struct Mode {
  zoe::ActivationOffload offload;
  std::unique_ptr<zoe::ActivationStore> store;
  std::vector<double> seconds;
};

zoe::Status one_micro_batch(zoe::ActivationStore& s, char* src, char* dst) {
  std::vector<zoe::ActivationId> ids;
  for (int i = 0; i < kTensors; ++i) {
    src[0] = static_cast<char>(i);
    ZOE_ASSIGN_OR_RETURN(zoe::ActivationId id, s.save(src, kBytes));
    ids.push_back(id);
  }
  for (int i = kTensors; i-- > 0;) {
    ZOE_RETURN_IF_ERROR(s.load(ids[i], dst));
    if (dst[0] != static_cast<char>(i)) return zoe::internal_error("tensor %d came back different", i);
  }
  return s.end_micro_batch();
}

zoe::Result<std::unique_ptr<zoe::ActivationStore>> make(zoe::device::Device& dev, zoe::ActivationOffload o,
                                                        const std::string& dir) {
  zoe::offload::ActivationStoreOptions so;
  so.offload = o;
  so.device = &dev;
  so.device_budget = o == zoe::ActivationOffload::kNone ? kTensors * kBytes : 2 * kBytes;
  // cpu: room for every tensor; nvme: write buffers and read-ahead only, so the rest goes to NVMe.
  so.host_budget = o == zoe::ActivationOffload::kCpu ? kTensors * kBytes : 2 * so.run_bytes + 3 * kBytes;
  so.nvme_dirs = {dir};
  return zoe::offload::create_activation_store(so);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  auto dev = zoe::device::create_cpu_device((kTensors + 4) * kBytes * 2);
  if (!dev.is_ok()) return fprintf(stderr, "%s\n", dev.status().to_string().c_str()), 1;
  char* src = static_cast<char*>((*dev)->allocate(kBytes).value());
  char* dst = static_cast<char*>((*dev)->allocate(kBytes).value());
  std::memset(src, 1, kBytes);
  std::vector<Mode> modes;
  for (auto o :
       {zoe::ActivationOffload::kNone, zoe::ActivationOffload::kCpu, zoe::ActivationOffload::kNvme}) {
    auto s = make(**dev, o, dir);
    if (!s.is_ok()) return fprintf(stderr, "%s\n", s.status().to_string().c_str()), 1;
    modes.push_back(Mode{o, std::move(s).value(), {}});
  }
  for (int r = 0; r <= kRounds; ++r) {
    for (Mode& m : modes) {
      const uint64_t t0 = zoe::now_ns();
      zoe::Status st = one_micro_batch(*m.store, src, dst);
      if (!st.is_ok()) return fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
      if (r > 0) m.seconds.push_back(static_cast<double>(zoe::now_ns() - t0) * 1e-9);  // round 0 warms up
    }
  }
  double base = 0;
  printf("%-5s %10s %8s %12s %12s %10s\n", "mode", "s/mb", "vs none", "nvme write", "nvme read", "stall s");
  for (Mode& m : modes) {
    std::sort(m.seconds.begin(), m.seconds.end());
    const double med = m.seconds[m.seconds.size() / 2];
    if (m.offload == zoe::ActivationOffload::kNone) base = med;
    const zoe::ActivationStats a = m.store->stats();
    printf("%-5s %10.4f %7.2fx %10.1f MiB %10.1f MiB %10.4f\n", zoe::activation_offload_name(m.offload), med,
           med / base, a.bytes_nvme_write / 1048576.0 / (kRounds + 1),
           a.bytes_nvme_read / 1048576.0 / (kRounds + 1), a.t_stall / (kRounds + 1));
  }
  for (Mode& m : modes) m.store.reset();
  (*dev)->free(src);
  (*dev)->free(dst);
  return 0;
}
