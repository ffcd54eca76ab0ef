// TraceRecorder: event storage and Chrome-trace JSON output.
#include "core/trace.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>

#include "zoe/files.h"

namespace zoe {

uint32_t trace_thread_id() {
  static std::atomic<uint32_t> next{0};
  thread_local uint32_t id = next.fetch_add(1);
  return id;
}

void TraceRecorder::record(std::string name, const char* category, uint64_t begin_ns, uint64_t end_ns,
                           uint64_t bytes, uint32_t lane) {
  if (!enabled_) return;
  uint32_t tid = lane == UINT32_MAX ? trace_thread_id() : lane;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(TraceEvent{std::move(name), category, begin_ns, end_ns, tid, bytes});
}

std::vector<TraceEvent> TraceRecorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

size_t TraceRecorder::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

void TraceRecorder::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
}

static void append_escaped(std::string* out, const std::string& s) {
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      out->append(buf);
    } else {
      out->push_back(c);
    }
  }
}

const char* trace_lane_name(uint32_t lane) {
  static const char* kLinks[] = {"nvme->host",   "host->nvme",   "host->device",
                                 "device->host", "nvme->device", "device->nvme"};
  switch (lane) {
    case kLaneCompute:
      return "compute (forward/backward)";
    case kLaneOptimizer:
      return "optimizer chunks";
    case kLaneOptRead:
      return "optimizer NVMe reads";
    case kLaneOptWrite:
      return "optimizer NVMe writes";
    case kLaneGather:
      return "parameter gathers";
    default:
      break;
  }
  if (lane >= kLaneTransfer && lane < kLaneTransfer + 6) return kLinks[lane - kLaneTransfer];
  return nullptr;
}

std::string TraceRecorder::chrome_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  char buf[256];
  uint64_t origin = UINT64_MAX;
  for (const auto& e : events_) origin = std::min(origin, e.begin_ns);
  bool first = true;
  for (const auto& e : events_) {
    if (!first) out += ",";
    first = false;
    out += "{\"name\":\"";
    append_escaped(&out, e.name);
    snprintf(buf, sizeof(buf),
             "\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%u,\"args\":{"
             "\"bytes\":%llu}}",
             e.category, static_cast<double>(e.begin_ns - origin) / 1000.0,
             static_cast<double>(e.end_ns >= e.begin_ns ? e.end_ns - e.begin_ns : 0) / 1000.0, e.tid,
             static_cast<unsigned long long>(e.bytes));
    out += buf;
  }
  // Track names for the lanes that appear (Perfetto and chrome://tracing show them).
  std::vector<uint32_t> lanes;
  for (const auto& e : events_) {
    if (trace_lane_name(e.tid) && std::find(lanes.begin(), lanes.end(), e.tid) == lanes.end())
      lanes.push_back(e.tid);
  }
  for (uint32_t lane : lanes) {
    if (!first) out += ",";
    first = false;
    snprintf(
        buf, sizeof(buf),
        "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"args\":{\"name\":\"%s\"}},"
        "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"args\":{\"sort_index\":%u}}",
        lane, trace_lane_name(lane), lane, lane);
    out += buf;
  }
  out += "]}\n";
  return out;
}

Status TraceRecorder::write_chrome_json(const std::string& path) const {
  return write_output_file(path, chrome_json(), "trace file");
}

}  // namespace zoe
