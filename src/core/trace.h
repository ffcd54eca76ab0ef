// TraceRecorder: begin/end events of transfers and compute, written as Chrome-trace JSON
// (opens in Perfetto UI or chrome://tracing).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "zoe/status.h"

namespace zoe {

struct TraceEvent {
  std::string name;
  const char* category;  // a string literal: "nvme->host", "host->device", "compute", ...
  uint64_t begin_ns;
  uint64_t end_ns;
  uint32_t tid;    // a small id of the recording thread (or lane)
  uint64_t bytes;  // bytes moved, 0 for compute
};

// The tracks (Chrome-trace "tid"s, named in the output) zoe's layers record on, so a timeline shows
// the caller's compute, the optimizer's chunks, its NVMe reads and writes, the parameter gathers
// and the tier manager's transfers (one track per link, kLaneTransfer + link) side by side.
enum TraceLane : uint32_t {
  kLaneCompute = 1,     // the caller's forward/backward (Engine::record_compute)
  kLaneOptimizer = 2,   // optimizer chunk updates
  kLaneOptRead = 3,     // optimizer states read from NVMe
  kLaneOptWrite = 4,    // optimizer states written to NVMe
  kLaneGather = 5,      // stage-3 all-gathers of parameters
  kLaneTransfer = 100,  // + link index: the tier manager's moves
};
const char* trace_lane_name(uint32_t lane);  // nullptr for a thread id that is no named lane

// Thread-safe. Disabled recorders cost one relaxed load per event.
class TraceRecorder {
 public:
  explicit TraceRecorder(bool enabled = false) : enabled_(enabled) {}
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }

  void record(std::string name, const char* category, uint64_t begin_ns, uint64_t end_ns, uint64_t bytes = 0,
              uint32_t lane = UINT32_MAX);
  std::vector<TraceEvent> events() const;
  size_t size() const;
  void clear();

  // {"traceEvents":[{"name","cat","ph":"X","ts","dur","pid","tid","args":{"bytes"}}...]}
  std::string chrome_json() const;
  // Written whole through zoe/files.h's OutputFile: only over a regular file, never inside a
  // checkpoint save directory.
  Status write_chrome_json(const std::string& path) const;

 private:
  std::atomic<bool> enabled_;
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
};

// A small, stable id for the calling thread (0, 1, 2, ... in order of first use).
uint32_t trace_thread_id();

}  // namespace zoe
