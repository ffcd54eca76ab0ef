// run_io_bench: qd buffers, each resubmitted from its own completion, sequential offsets.
#include "io/io_bench.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/clock.h"
#include "core/log.h"
#include "io/buffer.h"

namespace zoe::io {
namespace {

inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double percentile(std::vector<uint64_t>& v, double q) {
  if (v.empty()) return 0;
  size_t k = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
  return static_cast<double>(v[k]) / 1000.0;
}

}  // namespace

void fill_pattern(char* buf, uint64_t logical_offset, size_t len, uint64_t seed) {
  for (size_t i = 0; i < len; i += 8) {
    uint64_t w = mix((logical_offset + i) ^ seed);
    memcpy(buf + i, &w, std::min<size_t>(8, len - i));
  }
}

uint64_t count_wrong_bytes(const char* buf, uint64_t logical_offset, size_t len, uint64_t seed) {
  uint64_t wrong = 0;
  for (size_t i = 0; i < len; i += 8) {
    uint64_t w = mix((logical_offset + i) ^ seed);
    size_t n = std::min<size_t>(8, len - i);
    if (memcmp(buf + i, &w, n) == 0) continue;
    const auto* a = reinterpret_cast<const unsigned char*>(buf + i);
    const auto* b = reinterpret_cast<const unsigned char*>(&w);
    for (size_t k = 0; k < n; ++k) wrong += a[k] != b[k];
  }
  return wrong;
}

Status write_pattern(const SwapFile& file, const Extent& e, uint64_t seed) {
  IoEngineOptions eo;
  eo.queue_depth = 16;
  ZOE_ASSIGN_OR_RETURN(auto eng, IoEngine::create(eo));
  const size_t bs = 1u << 20;
  ZOE_ASSIGN_OR_RETURN(auto pool, BufferPool::create(bs, 16, PinMode::kNone));
  std::vector<IoHandle> inflight(16);
  for (uint64_t off = 0, i = 0; off < e.bytes; off += bs, ++i) {
    size_t slot = i % 16;
    if (inflight[slot]) ZOE_RETURN_IF_ERROR(inflight[slot]->wait());
    size_t len = static_cast<size_t>(std::min<uint64_t>(bs, e.bytes - off));
    fill_pattern(pool->buffer(slot), e.offset + off, len, seed);
    inflight[slot] = file.write(*eng, e, pool->buffer(slot), len, off);
  }
  for (auto& h : inflight) {
    if (h) ZOE_RETURN_IF_ERROR(h->wait());
  }
  return Status::ok();
}

Result<IoBenchRow> run_io_bench(const IoBenchConfig& cfg, const IoBenchCase& c) {
  if (!cfg.file) return invalid_argument("io bench: no file");
  if (c.bs == 0 || c.bs % 4096 != 0)
    return invalid_argument("io bench: block size %zu is not a multiple of 4096", c.bs);
  IoEngineOptions eo;
  eo.backend = c.backend;
  eo.queue_depth = c.qd;
  eo.block_size = c.bs;
  eo.sqpoll = cfg.sqpoll;
  ZOE_ASSIGN_OR_RETURN(auto eng, IoEngine::create(eo));
  ZOE_ASSIGN_OR_RETURN(auto pool, BufferPool::create(c.bs, c.qd, PinMode::kLock));
  if (cfg.fixed) {
    iovec v{pool->base(), pool->total_bytes()};
    Status s = eng->register_buffers({&v, 1});
    if (!s.is_ok()) ZOE_LOG_WARN("fixed buffers not registered: %s", s.message().c_str());
    s = cfg.file->register_files(*eng);
    if (!s.is_ok()) ZOE_LOG_WARN("fixed files not registered: %s", s.message().c_str());
  }
  if (c.op == IoOp::kWrite) {
    // Writes carry the pattern of their first pass position; with validate, of every position.
    for (size_t i = 0; i < c.qd; ++i)
      fill_pattern(pool->buffer(i), cfg.extent.offset + i * c.bs, c.bs, cfg.seed);
  }

  const uint64_t total = cfg.extent.bytes;
  const uint64_t n = (total + c.bs - 1) / c.bs;
  struct State {
    std::atomic<uint64_t> next{0};
    std::atomic<uint64_t> wrong{0};
    std::vector<uint64_t> lat;
    std::mutex mu;
    Status error;
  } st;
  st.lat.resize(n);

  IoBenchRow row;
  row.engine = eng->name();
  row.bs = c.bs;
  row.qd = c.qd;
  row.op = c.op;
  row.validated = cfg.validate;
  std::vector<uint64_t> all_lat;
  int passes = cfg.warmup + cfg.loops;

  std::function<void(char*)> issue = [&](char* buf) {
    if (cfg.stop && cfg.stop->load(std::memory_order_relaxed)) return;
    uint64_t idx = st.next.fetch_add(1, std::memory_order_relaxed);
    if (idx >= n) return;
    uint64_t off = idx * c.bs;
    size_t len = static_cast<size_t>(std::min<uint64_t>(c.bs, total - off));
    if (c.op == IoOp::kWrite && cfg.validate) fill_pattern(buf, cfg.extent.offset + off, len, cfg.seed);
    std::vector<IoRequest> reqs;
    cfg.file->map(c.op, cfg.extent.offset + off, buf, len, &reqs);
    eng->submit(reqs, [&, buf, idx, off, len](IoCompletion& done) {
      st.lat[idx] = done.latency_ns();
      if (!done.status().is_ok()) {
        std::lock_guard<std::mutex> lock(st.mu);
        if (st.error.is_ok()) st.error = done.status();
        return;
      }
      if (c.op == IoOp::kRead && cfg.validate) {
        st.wrong.fetch_add(count_wrong_bytes(buf, cfg.extent.offset + off, len, cfg.seed),
                           std::memory_order_relaxed);
      }
      issue(buf);
    });
  };

  for (int pass = 0; pass < passes; ++pass) {
    if (cfg.on_pass) cfg.on_pass(pass, passes);
    st.next = 0;
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < c.qd && i < n; ++i) issue(pool->buffer(i));
    (void)eng->drain();
    uint64_t t1 = now_ns();
    {
      std::lock_guard<std::mutex> lock(st.mu);
      if (!st.error.is_ok()) return st.error;
    }
    if (cfg.stop && cfg.stop->load()) return Status(StatusCode::kCancelled, "interrupted");
    if (pass >= cfg.warmup) {
      row.seconds += static_cast<double>(t1 - t0) * 1e-9;
      row.bytes += total;
      all_lat.insert(all_lat.end(), st.lat.begin(), st.lat.end());
    }
  }
  if (cfg.fixed) cfg.file->unregister_files(*eng);
  row.wrong_bytes = st.wrong.load();
  if (row.seconds > 0) {
    row.gbps = static_cast<double>(row.bytes) / row.seconds * 1e-9;
    row.iops = static_cast<double>(all_lat.size()) / row.seconds;
  }
  row.p50_us = percentile(all_lat, 0.50);
  row.p99_us = percentile(all_lat, 0.99);
  return row;
}

}  // namespace zoe::io
