// The activation store's state (offload/activation_store.h describes the behaviour). Internal to
// offload/: the store's .cpp files share it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "io/io_engine.h"
#include "io/swap_file.h"
#include "offload/activation_plan.h"
#include "offload/activation_store.h"
#include "offload/host_blocks.h"

namespace zoe::offload {

class TieredActivationStore final : public ActivationStore {
 public:
  explicit TieredActivationStore(const ActivationStoreOptions& o);
  ~TieredActivationStore() override;
  Status init();

  Status plan(const uint64_t* sizes, size_t n) override;
  Result<ActivationId> save(const void* src, uint64_t bytes) override;
  Status load(ActivationId id, void* dst) override;
  Status end_micro_batch() override;
  ActivationStats stats() const override { return stats_; }
  ActivationOffload offload() const override { return o_.offload; }
  void drain_writes();
  size_t held() const;

 private:
  struct Tensor {
    uint64_t bytes = 0;
    Tier tier = Tier::kDevice;
    bool live = false;
    void* dev = nullptr;   // device tier: the store's buffer
    char* host = nullptr;  // host tier: its block; nvme: the read-ahead block once a read started
    size_t run = 0;        // nvme: index in runs_
    uint64_t at = 0;       // nvme: offset in the run's extent (or buffer, while the run is open)
    io::IoHandle read;     // nvme: the read in flight
  };
  struct Run {
    io::Extent extent;
    bool has_extent = false;
    bool open = false;  // still being filled in write buffer `buf`
    size_t buf = 0;
    uint64_t fill = 0;
    size_t live = 0;  // tensors not loaded yet
    std::vector<size_t> tensors;
    std::vector<io::IoHandle> writes;
    Status error;  // the first failed write of this run
  };
  struct WriteBuf {
    char* p = nullptr;
    io::IoHandle pending;  // the write in flight from this buffer
    size_t run = 0;
    bool filling = false;  // holds the open run
  };

  // Placement (activation_store.cpp).
  Tier target_tier(uint64_t bytes) const;
  Status place(size_t i, const void* src, Tier tier);
  Status place_device(size_t i, const void* src);
  Status place_host(size_t i, const void* src, bool from_device);
  Status make_device_room(uint64_t bytes);
  Status evict(size_t j);
  uint64_t host_reserve(uint64_t largest) const;
  void note_tier(Tier t, int64_t delta);
  Status copy(void* dst, const void* src, uint64_t bytes, int kind);
  Status load_resident(Tensor& t, void* dst);
  void release(size_t i);
  void drop_all();

  // NVMe (activation_store_nvme.cpp).
  Status init_nvme();
  Status place_nvme(size_t i, const void* src, bool from_device);
  Status place_large(size_t i, const void* src, bool from_device);
  Result<size_t> free_write_buf();
  Status flush_open_run();
  Status submit_run_write(size_t run, size_t buf, uint64_t at, uint64_t len);
  Status poll_writes(bool report);
  Status wait_run_writes(size_t run);
  Status start_read(size_t i);
  void prefetch_from(size_t i);
  void drop_reads_ahead(size_t i);
  Status load_in_pieces(size_t i, void* dst);
  Status load_nvme(size_t i, void* dst);
  Status run_error(size_t run, size_t i) const;
  void free_run(size_t run);
  std::string swap_paths() const;

  ActivationStoreOptions o_;
  std::unique_ptr<device::Stream> stream_;
  HostBlocks host_;
  std::unique_ptr<io::IoEngine> io_;
  std::unique_ptr<io::SwapFile> swap_;

  std::vector<Tensor> t_;
  std::vector<Tier> plan_;
  std::vector<uint64_t> plan_sizes_;  // the sizes plan_ was made for
  bool planned_next_ = false;         // plan() was called for the coming micro-batch
  std::vector<Run> runs_;
  std::vector<WriteBuf> wbuf_;
  int64_t open_run_ = -1;
  uint64_t device_used_ = 0;
  uint64_t tier_now_[3] = {};
  uint64_t nvme_used_ = 0;
  Status pending_error_;  // a write error not yet reported
  ActivationStats stats_;
};

}  // namespace zoe::offload
