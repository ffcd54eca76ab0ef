// The activation store's mechanism (zoe/activations.h's ActivationStore): saved tensors kept on the
// device, in pinned host memory or on NVMe between a micro-batch's forward and its backward.
//
// Tiers:
//   device: a buffer per tensor allocated through the Device, so it counts in the device's ledger
//           and high-water mark; the bytes of these buffers stay within device_budget (the share).
//   host:   pinned host blocks (HostBlocks, PinMode `pin`), kept for reuse between micro-batches.
//   nvme:   extents of the store's own SwapFile written through the store's own IoEngine
//           (io_uring, O_DIRECT where the file system takes it). Saves are copied into a pinned
//           write buffer of run_bytes and packed at 4 KiB-aligned offsets; a full buffer is written
//           as one run (one extent, one request) in the background (write-behind), and a tensor
//           larger than run_bytes gets its own extent, written in run_bytes pieces. The run still
//           being filled when the backward starts is never written: its tensors load from the
//           buffer, and end_micro_batch() drops it.
// The host budget covers everything the store pins on the host: the host tier, the NVMe write
// buffers (write_buffers x run_bytes) and the NVMe read-ahead blocks; plan() keeps room for
// prefetch + 1 read blocks of the largest tensor when offload is nvme.
//
// The plan (offload/activation_plan.h) is made from the sizes given to plan(), else from the
// previous micro-batch's sizes. A save that does not match the plan (the first micro-batch with
// no plan(), or a size that changed) goes to the device, evicting the earliest saved tensors on
// the device (not the last saved, not those under min_offload_bytes) to the host while it has
// room, else to NVMe, so the budgets hold either way.
//
// The backward: load() of tensor i starts the NVMe reads of the next `prefetch` tensors in reverse
// save order (those whose runs are written), each into a host block; load() waits only for a
// read (or a run's write) still in flight, and counts that wait as t_stall. Host-tier tensors are
// copied straight to the caller's buffer (pinned memory, no read-ahead needed). A tensor whose
// read block does not fit the host budget beside the host tier (after the read-ahead gives way)
// is read through the write buffers, one run_bytes piece at a time.
//
// Ordering on the shared links: the store has its own IoEngine (its own io_uring ring) and its own
// device stream. Parameter prefetch and optimizer swap traffic go through the engine's shared
// IoEngine, whose requests beyond its queue_depth wait in that engine's queue; the activation
// reads never enter that queue, so they reach the kernel at once and wait at most behind what the
// shared engine already has in the device's queue (queue_depth chunks of block_size). Likewise the
// host -> device copies of a load run on the store's own stream, not behind queued parameter
// copies.
//
// Faults: a failed run write is reported by the next save() or load() (a Status naming the
// tensors of the run and the swap file); loads of those tensors then fail with the same naming,
// never with wrong bytes. A failed read is reported by the load of that tensor. The store stays
// usable: end_micro_batch() waits for the I/O in flight and frees everything of the micro-batch.
//
// Statistics (stats()): high_water_device is the bytes of the store's device buffers;
// high_water_host the pinned host memory the store held (host-tier blocks kept for reuse, write
// buffers, read-ahead blocks: what zoe.activation_host_budget bounds); high_water_nvme the bytes of
// its swap extents (runs rounded to 4 KiB). The link counters count the bytes each copy or request
// moved (NVMe: 4 KiB-rounded requests).
//
// Streams: the store copies on its own stream and synchronizes it, so save() and load() return
// with their copies done; on CUDA the caller's kernels that write src must have finished before
// save() (the store does not wait for the caller's streams), and dst is ready when load() returns.
//
// Concurrency: the store is used from one thread (like the Engine). No I/O completion callback
// touches its state: it polls and waits on the completions' handles, so it holds no lock that a
// completion path takes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "io/buffer.h"
#include "io/io_engine.h"
#include "zoe/activations.h"
#include "zoe/status.h"

namespace zoe::offload {

// Tensors smaller than this stay on the device by default (zoe.activation_min_bytes): below it, a
// transfer's fixed costs (a copy launch, a 4 KiB-aligned slot on NVMe) outweigh the bytes freed.
constexpr uint64_t kDefaultActivationMinBytes = 256 * 1024;

struct ActivationStoreOptions {
  ActivationOffload offload = ActivationOffload::kNone;
  device::Device* device = nullptr;  // required; not owned, outlives the store
  uint64_t device_budget = 0;        // the device's activation share (bytes)
  uint64_t host_budget = 0;          // pinned host bytes the store may hold (cpu, nvme)
  uint64_t min_offload_bytes = kDefaultActivationMinBytes;
  uint32_t prefetch = 2;  // NVMe reads started ahead of use in the backward
  io::PinMode pin = io::PinMode::kNone;
  // NVMe (offload nvme only).
  std::vector<std::string> nvme_dirs;
  uint64_t nvme_budget = 0;       // bytes on the disks (0: the disks limit it)
  uint64_t run_bytes = 8u << 20;  // write buffer and coalesced run size, a multiple of 4096
  uint32_t write_buffers = 2;     // write-behind depth
  io::IoEngineOptions io;         // the store's own engine (faults: tests)
  bool checksum = false;          // swap checksums on the activation file
  bool hole_check = true;         // hole checks on the activation file (io::SwapFileOptions)
};

// kInvalidArgument for a missing device, a run_bytes not a multiple of 4096, nvme without dirs,
// or a host budget below the NVMe write buffers.
Result<std::unique_ptr<ActivationStore>> create_activation_store(const ActivationStoreOptions& opts);

// Waits for the store's NVMe writes in flight (the write-behind); their errors are reported by the
// next save() or load() as usual. For tests that need the runs written before the backward, and
// for a caller that wants no write traffic left behind a timed region. A no-op for another store.
void drain_activation_writes(ActivationStore& store);
// Saved tensors the store holds now (0 after end_micro_batch()); 0 for another store.
size_t activation_tensors_held(const ActivationStore& store);

}  // namespace zoe::offload
