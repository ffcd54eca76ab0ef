// The swap-bandwidth benchmark behind `zoe bench io` (and later `zoe tune`): sequential passes
// over a SwapFile extent through the same IoEngine the offload path uses.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "io/io_engine.h"
#include "io/swap_file.h"

namespace zoe::io {

struct IoBenchCase {
  IoBackend backend = IoBackend::kUring;
  size_t bs = 1u << 20;
  uint32_t qd = 32;
  IoOp op = IoOp::kRead;
};

struct IoBenchConfig {
  const SwapFile* file = nullptr;
  Extent extent;          // the region passed over, from its start
  int loops = 3;          // timed passes
  int warmup = 1;         // untimed passes before them
  bool validate = false;  // writes carry a pattern; reads check it and count wrong bytes
  bool fixed = true;      // register buffers and files with io_uring
  bool sqpoll = false;
  uint64_t seed = 0x5eed;
  const std::atomic<bool>* stop = nullptr;            // set to abandon the run (Ctrl-C)
  std::function<void(int pass, int passes)> on_pass;  // progress
};

struct IoBenchRow {
  std::string engine;
  size_t bs = 0;
  uint32_t qd = 0;
  IoOp op = IoOp::kRead;
  uint64_t bytes = 0;  // moved in the timed passes
  double seconds = 0;
  double gbps = 0;  // 1e9 bytes per second
  double iops = 0;
  double p50_us = 0, p99_us = 0;
  uint64_t wrong_bytes = 0;
  bool validated = false;
};

Result<IoBenchRow> run_io_bench(const IoBenchConfig& cfg, const IoBenchCase& c);

// Writes the validation pattern over the whole extent (what reads are checked against).
Status write_pattern(const SwapFile& file, const Extent& e, uint64_t seed);

// The pattern: 8-byte words that depend on their logical offset and the seed.
void fill_pattern(char* buf, uint64_t logical_offset, size_t len, uint64_t seed);
uint64_t count_wrong_bytes(const char* buf, uint64_t logical_offset, size_t len, uint64_t seed);

}  // namespace zoe::io
