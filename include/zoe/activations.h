// The activation store: checkpointed activations kept through the tiers (device -> pinned host ->
// NVMe) between a micro-batch's forward and its backward.
//
// A caller with activation checkpointing keeps only each checkpoint's input (a block's input, a
// torch.utils.checkpoint region's inputs) for the backward, and recomputes the rest. Each kept
// tensor is saved here in the forward and loaded back in the backward, in reverse order:
//
//   forward:  for each checkpoint:  ids.push_back(acts.save(x_ptr, bytes).value());
//   backward: for each in reverse:  acts.load(ids.back(), x_ptr); ids.pop_back(); recompute...
//   acts.end_micro_batch();        (drops what was not loaded, e.g. an evaluation forward)
//
// Placement: each saved tensor is kept on the device, in pinned host memory or on NVMe. The plan is
// made against the budgets: nothing leaves the device while the micro-batch's checkpoints fit the
// device's activation share; otherwise the tensors saved first (used last in the backward) go
// furthest, so that the ones the backward needs first stay near. The most recently saved tensor
// (the last checkpoint's input) never leaves the device (keep_last), and neither does a tensor
// smaller than min_offload_bytes. In the backward, loads are read ahead in reverse save order,
// `prefetch` tensors ahead of use, and they come before parameter prefetch and optimizer swap on
// the shared links. No activation state crosses a step boundary: nothing here is checkpointed.
//
// Pointers are in the engine device's memory (host memory on the CPU device). Not thread-safe:
// one caller, like the Engine it belongs to (Engine::activations()).
#pragma once

#include <cstdint>
#include <string>

#include "zoe/offload.h"
#include "zoe/status.h"

namespace zoe {

using ActivationOffload = Offload;  // zoe.activation_offload: none | cpu | nvme

// One saved tensor of the current micro-batch (ids are not reused within a micro-batch).
struct ActivationId {
  uint64_t value = ~uint64_t{0};
  bool valid() const { return value != ~uint64_t{0}; }
};

// Where the saved bytes are, and what moving them cost. Per micro-batch fields are reset by
// end_micro_batch(); high-water marks are over the run.
struct ActivationStats {
  uint64_t checkpoint_bytes = 0;   // bytes saved in the last micro-batch, wherever they live
  uint64_t tier_bytes[3] = {};     // of which device, host, nvme
  uint64_t high_water_device = 0;  // activation bytes held at once, per tier, over the run
  uint64_t high_water_host = 0;
  uint64_t high_water_nvme = 0;
  uint64_t bytes_device_to_host = 0;  // activation traffic per link since initialize()
  uint64_t bytes_host_to_device = 0;
  uint64_t bytes_nvme_write = 0;
  uint64_t bytes_nvme_read = 0;
  double t_stall = 0.0;  // seconds load() waited for bytes still on their way, since initialize()
};

class ActivationStore {
 public:
  virtual ~ActivationStore() = default;

  // Announces the byte sizes of the tensors the next micro-batch will save, in save order, so the
  // plan is known before the first save (optional: without it, the previous micro-batch's sizes
  // are used, and the first micro-batch plans as it goes).
  virtual Status plan(const uint64_t* sizes, size_t n) = 0;
  // Copies `bytes` from `src` into the store (src may be reused as soon as this returns); the
  // copy on to host or NVMe runs in the background. An I/O error of an earlier save is reported
  // here or by the next load(), naming the tensor and the file.
  virtual Result<ActivationId> save(const void* src, uint64_t bytes) = 0;
  // Copies a saved tensor back into `dst` (the size it was saved with), waiting for it if needed,
  // and frees its space; starts reading the next ones in reverse save order. Each id loads once.
  virtual Status load(ActivationId id, void* dst) = 0;
  // Drops every tensor of this micro-batch not loaded (in flight I/O is waited for, not leaked).
  virtual Status end_micro_batch() = 0;

  virtual ActivationStats stats() const = 0;
  virtual ActivationOffload offload() const = 0;
};

// The name of an offload setting ("none", "cpu", "nvme"), and the setting of a name.
const char* activation_offload_name(ActivationOffload o);
Result<ActivationOffload> parse_activation_offload(const std::string& name);

}  // namespace zoe
