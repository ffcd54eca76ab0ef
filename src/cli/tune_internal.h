// The parts of `zoe tune` (src/cli/cmd_tune.cpp): calibration of this host's link rates
// (tune_calibrate.cpp), the search over the plan's rows (cmd_tune.cpp) and the verification of the
// best candidates by training them (tune_verify.cpp). Internal to src/cli.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "model/gpt.h"
#include "plan/calibration.h"
#include "plan/options.h"
#include "plan/planner.h"
#include "zoe/cli.h"
#include "zoe/engine.h"

namespace zoe::cli::tune {

struct TuneOpts {
  plan::PlanOptions plan;
  bool calibrate = false;
  std::string calibration_out;  // "": the calibration is used, not saved
  bool device_given = false;    // --device was given (else a measured tune uses this host's device)
  std::string calibrate_bytes = "256MiB";
  double calibrate_max_spread = 0.05;  // plan::RepeatPolicy::max_spread of the timed measurements
  std::string out;
  int verify = 0;            // the K best candidates run
  int verify_steps = 0;      // timed engine steps of each (0: auto, see verify())
  bool fixed_micro = false;  // search only --micro-batch (else every divisor of micro x accumulation)
  std::string plot;          // predicted against measured step time per verified candidate
  bool json = false;
};

// The process's runtime, started once (calibration and --verify both train through engines).
Runtime& runtime();
// One rank of its own, whatever the launch: calibration measures this rank's compute without
// waiting for the others (every rank of the launch measures at once, sharing the node's cores).
Runtime& local_runtime();

// zoe's GPT of a model description's dimensions (meaningful where m.zoe_gpt).
model::GptConfig gpt_config_of(const plan::ModelDesc& m);

// --- Calibration (tune_calibrate.cpp) -------------------------------------------------------

// This host's link rates: NVMe through the I/O engine over an aio block size x queue depth sweep
// on the NVMe path, CPU Adam through the Adam benchmark, host memory copies, and the FLOP rate of
// zoe's GPT at the planned model's shape. Progress goes to stderr; failures end the command.
plan::LinkRates calibrate(const TuneOpts& o, const plan::PlanInputs& pre);

// The collectives' rate across the ranks of this launch (tune_network.cpp): all-gathers and
// reduce-scatters at the sizes of the planned model's modules in the compute dtype, each size
// weighted by its modules, as bus GB/s (zoe bench comm's busbw: what the cost model's network
// term divides a rank's collective bytes by). gbps 0 for one rank. Every rank calls it together.
struct NetworkRate {
  int ranks = 1, nodes = 1;
  double gbps = 0;        // bus bytes per second beyond the latency, in GB/s
  double latency_us = 0;  // one collective of the smallest size (4 KiB)
};
NetworkRate measure_network(Runtime& rt, const plan::PlanInputs& pre, Progress* progress);

// --- Verification (tune_verify.cpp) ---------------------------------------------------------

struct Verified {
  bool with_compute = false;  // the model's kernels ran (zoe's GPT), else the engine's part alone
  double step_s = 0;          // the median of the timed steps
  int steps = 0;              // timed steps run
  uint64_t nvme_read = 0, nvme_write = 0;
  uint64_t high_water[3] = {0, 0, 0};
};

// `steps` timed steps (0: at least 3 and at least 2 s of them, at most 50), after two untimed ones
// (the first records the fetch order, the second warms the pools), of the tuned config. zoe's GPT runs
// its CPU kernels on random tokens through model::GptTrainer: the whole step, as `zoe train` runs
// it. Any other model runs on its modules with the caller's compute left out (zero gradients): the
// engine's I/O, collectives and optimizer as the plan placed them.
Verified verify(Runtime& rt, const config::Config& cfg, const plan::PlanInputs& in, int steps,
                const std::string& what);

}  // namespace zoe::cli::tune
