// Link and compute rates the cost model runs on: defaults, a calibration JSON file (written by
// `zoe tune --calibrate`, or by hand), and flags on top.
//
// The file is one JSON object; every key is optional (absent: the default), unknown keys are
// errors naming the key:
//   {"version": 1, "host": "node-a",
//    "nvme_read_gbps": 3.0, "nvme_write_gbps": 2.0,   GB/s (1e9 bytes/s) of one node's drives
//    "h2d_gbps": 25.0,                                host <-> device, per rank (one PCIe link)
//    "cpu_adam_gbps": 20.0,                           CPU Adam, one node (all its cores)
//    "flops": 1e14,                                   sustained FLOP/s of one rank's device
//    "net_gbps": 12.5, "intra_gbps": 150.0,           collectives per rank: across nodes, inside one
//    "net_latency_us": 20.0,                          the fixed cost of one collective across nodes
//    "device_mem_gbps": 1500.0,                       device memory (device-resident Adam)
//    "local_copy_gbps": 10.0, "nvme_cpu_gbps": 8.0}   zoe's CPU device: its copies; its I/O's CPU cost
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "zoe/status.h"

namespace zoe::plan {

// One point of the I/O engine's sweep: GB/s at an aio block size and queue depth.
struct IoPoint {
  int64_t block_size = 0, queue_depth = 0;
  double read_gbps = 0, write_gbps = 0;
  // GB/s of a read followed by a write of the same bytes (the optimizer's swap): how points rank.
  double read_then_write_gbps() const { return 1.0 / (1.0 / read_gbps + 1.0 / write_gbps); }
};

struct LinkRates {
  double nvme_read_gbps = 3.0;
  double nvme_write_gbps = 2.0;
  double h2d_gbps = 25.0;
  double cpu_adam_gbps = 20.0;
  double flops = 100e12;
  double net_gbps = 12.5;
  double intra_gbps = 150.0;
  // Microseconds every collective across nodes costs beside its bytes (net_gbps is then the rate
  // beyond it): `zoe bench comm`'s time at its smallest size. Inside one node it is not modelled.
  double net_latency_us = 20.0;
  double device_mem_gbps = 1500.0;
  // zoe's CPU device: the engine's own copies and zeroing of device buffers (stage-3 gathers and
  // partition loads), bytes written and read over seconds, as they run beside the compute.
  double local_copy_gbps = 10.0;
  // zoe's CPU device: NVMe bytes (read and written) moved per second of CPU time they take from
  // the cores running the compute and the update (the I/O's submission, completion and the
  // drive's own work on a virtual machine), measured as the slowdown of zoe's GPT kernels beside a
  // stream of the I/O engine's reads and writes.
  double nvme_cpu_gbps = 8.0;
  std::string host;  // where the numbers were measured (informational)
  // `zoe tune --calibrate`: the I/O engine over block_size x queue_depth on the NVMe path, and the
  // point it chose (the fastest read-then-write, 1 / (1/read + 1/write)), whose rates are
  // nvme_read_gbps and nvme_write_gbps. Empty, and 0: not swept (the aio config's own values).
  std::vector<IoPoint> io_sweep;
  int64_t aio_block_size = 0, aio_queue_depth = 0;
  // `zoe tune --calibrate` on zoe's GPT: the FLOP rate measured at each micro-batch the search may
  // choose (a GEMM's rate falls with its row count), as {micro-batch, FLOP/s}. Empty: `flops` at
  // every micro-batch.
  std::vector<std::pair<int64_t, double>> flops_by_micro_batch;

  // The FLOP rate at `micro_batch`: its measured entry, else `flops`.
  double flops_at(int64_t micro_batch) const;
  // NVMe GB/s (write: writes, else reads) of a stream of `block`-byte requests, `depth` in flight:
  // the sweep's envelope there, each point scaled down in proportion where its requests are larger
  // or its queue deeper (a point never counts for more than it measured; more in flight never
  // counts for less, which smooths the sweep's noise), relative to the chosen point and times
  // nvme_read_gbps / nvme_write_gbps (so a flag that sets those scales every point). Without a
  // sweep: nvme_read_gbps / nvme_write_gbps.
  double nvme_at(bool write, int64_t block, int64_t depth) const;

  // Every rate positive and finite; errors name the key and the value.
  Status validate() const;
  // The calibration file's text (every key).
  std::string to_json() const;
};

// Overlays the keys of a calibration file's text on `rates`. Errors: not JSON, not an object, an
// unknown key, a value that is not a positive number; each names `where`, the key and the value.
Status apply_calibration_json(const std::string& text, const std::string& where, LinkRates* rates);
// Reads the file first (zoe/files.h's read_input_file, capped as a --config file is at
// config::JsonLimits::max_bytes): a missing file, one larger than the cap, or anything but a
// regular file (a FIFO, /dev/zero) is an error naming the path, refused without blocking.
Status apply_calibration_file(const std::string& path, LinkRates* rates);

}  // namespace zoe::plan
