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
//    "local_copy_gbps": 10.0, "nvme_cpu_gbps": 8.0,   zoe's CPU device: its copies; its I/O's CPU cost
//    "spread": {"flops@8": 0.012}}                    relative spread of each repeated measurement
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
  // `zoe tune --calibrate`: the relative spread (Repeated::spread()) of each repeated measurement
  // the rates came from, as {what, spread}: "flops@M" (the FLOP rate at micro-batch M),
  // "engine_gbps", "local_copy_gbps". Informational.
  std::vector<std::pair<std::string, double>> spread;

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

// A timed quantity measured repeatedly until its samples agree: trusted once `window` of them lie
// within `max_spread` of each other, given up after `max_samples`. The spread of a set of samples
// is (max - min) / median; the samples that count are the `window` closest together (sorted, the
// run of `window` with the least spread), so that a sample slowed by a passing process or a page
// fault does not hold the measurement back, nor move it.
struct RepeatPolicy {
  int window = 5;
  int max_samples = 30;
  double max_spread = 0.05;
};

class Repeated {
 public:
  explicit Repeated(RepeatPolicy p) : p_(p) {}
  void add(double sample) { samples_.push_back(sample); }
  size_t samples() const { return samples_.size(); }
  // `window` samples within max_spread.
  bool stable() const;
  // Stable, or max_samples taken: no more samples are needed (or worth taking).
  bool done() const { return stable() || samples_.size() >= static_cast<size_t>(p_.max_samples); }
  // The spread of the tightest `window` samples (of all of them while there are fewer); infinity
  // with fewer than two samples.
  double spread() const;
  // The index (in the order added) of the median of the tightest window: the sample whose value
  // is the measurement (and whose other parts, e.g. a step's split, go with it).
  size_t median_index() const;
  double value() const { return samples_.at(median_index()); }
  const RepeatPolicy& policy() const { return p_; }

 private:
  // The sorted order and the start of the tightest window in it.
  std::vector<size_t> sorted() const;
  size_t tightest(const std::vector<size_t>& order, double* spread) const;
  RepeatPolicy p_;
  std::vector<double> samples_;
};

// Ok when `r` is stable; else the refusal, naming `what`, the spread, how many samples it took and
// the threshold (--calibrate-max-spread).
Status check_stable(const Repeated& r, const std::string& what);

// The spread of two measurements of one thing: |a - b| over their mean.
double two_spread(double a, double b);
// Ok when the same rate measured at the start (`first`) and at the end (`again`) of a
// calibration agree within `max_spread` (two_spread); else the refusal naming `what`, both values
// and the threshold.
Status check_drift(double first, double again, double max_spread, const std::string& what);

// Overlays the keys of a calibration file's text on `rates`. Errors: not JSON, not an object, an
// unknown key, a value that is not a positive number; each names `where`, the key and the value.
Status apply_calibration_json(const std::string& text, const std::string& where, LinkRates* rates);
// Reads the file first (zoe/files.h's read_input_file, capped as a --config file is at
// config::JsonLimits::max_bytes): a missing file, one larger than the cap, or anything but a
// regular file (a FIFO, /dev/zero) is an error naming the path, refused without blocking.
Status apply_calibration_file(const std::string& path, LinkRates* rates);

}  // namespace zoe::plan
