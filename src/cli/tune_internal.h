// The parts of `zoe tune` (src/cli/cmd_tune.cpp: its flags and the order of its phases):
// calibration of this host's link rates (tune_calibrate.cpp, tune_network.cpp), the search over the
// plan's rows (tune_search.cpp), the verification of the best candidates by training them
// (tune_verify.cpp) and the report (tune_report.cpp). Internal to src/cli.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

// --- Search (tune_search.cpp) --------------------------------------------------------------

// The knobs the search sets beyond the placement, as config values (what --out writes).
struct Knobs {
  int64_t prefetch_bucket = 0;           // zero_optimization.stage3_prefetch_bucket_size
  int64_t max_live = 0;                  // zero_optimization.stage3_max_live_parameters
  int64_t sub_group = 0;                 // zero_optimization.sub_group_size
  int64_t opt_buffers = 0;               // offload_optimizer.buffer_count
  int64_t param_buffers = 0;             // offload_param.buffer_count
  int64_t param_buffer_size = 0;         // offload_param.buffer_size (elements)
  int64_t max_in_cpu = 0;                // offload_param.max_in_cpu (elements)
  int64_t aio_block = 0, aio_depth = 0;  // aio.block_size, aio.queue_depth
  std::string schedule = "micro-batch";  // zoe.schedule (layer-major tried where a step has micro-batches)

  void apply(config::Config* c) const {
    // A sizing knob the variant sets to another value than the base config's is given: the
    // planner uses it as it is instead of sizing it from the host share.
    auto set = [c](int64_t* field, int64_t v, const char* key) {
      if (*field != v) c->given_keys.insert(key);
      *field = v;
    };
    c->zero.stage3_prefetch_bucket_size = prefetch_bucket;
    c->zero.stage3_max_live_parameters = max_live;
    set(&c->zero.sub_group_size, sub_group, "zero_optimization.sub_group_size");
    set(&c->zero.offload_optimizer.buffer_count, opt_buffers,
        "zero_optimization.offload_optimizer.buffer_count");
    c->zero.offload_param.buffer_count = param_buffers;
    set(&c->zero.offload_param.buffer_size, param_buffer_size, "zero_optimization.offload_param.buffer_size");
    set(&c->zero.offload_param.max_in_cpu, max_in_cpu, "zero_optimization.offload_param.max_in_cpu");
    c->aio.block_size = aio_block;
    c->aio.queue_depth = aio_depth;
    c->zoe.schedule = schedule;
  }
  static Knobs of(const config::Config& c) {
    return {c.zero.stage3_prefetch_bucket_size,
            c.zero.stage3_max_live_parameters,
            c.zero.sub_group_size,
            c.zero.offload_optimizer.buffer_count,
            c.zero.offload_param.buffer_count,
            c.zero.offload_param.buffer_size,
            c.zero.offload_param.max_in_cpu,
            c.aio.block_size,
            c.aio.queue_depth,
            c.zoe.schedule};
  }
};

struct Candidate {
  plan::PlanRow row;
  Knobs knobs;
  int64_t micro_batch = 1, grad_accum = 1;  // micro_batch x grad_accum: the rank's batch per step
};

// A candidate as a full config: its placement and knobs over the base config, with the sizes the
// planner chose given as values, at its micro-batch and accumulation (what --out writes).
config::Config tuned_config(const plan::PlanInputs& in, const Candidate& c, const std::string& nvme);
// Every fitting row at every searched micro-batch with its knob variants, best predicted first.
Result<std::vector<Candidate>> search(const plan::PlanInputs& in, bool fixed_micro);

// --- The choice: the search and its verification -------------------------------------------

// A candidate --verify ran.
struct VerifiedRun {
  size_t index;  // into the candidates
  config::Config cfg;
  Verified v;
  double predicted_no_compute;
};

// The search and its verification: the candidates by prediction, the runs of --verify and the
// choice.
struct TuneResult {
  plan::PlanInputs in;
  plan::PlanResult res;
  std::vector<Candidate> cands;
  std::vector<VerifiedRun> runs;
  size_t chosen = 0;       // into runs (the verified, in the order run)
  size_t chosen_cand = 0;  // into cands (by prediction)
};

// --verify K: the K best candidates by prediction run for a few engine steps each; t->chosen is
// the measured best (tune_verify.cpp).
void verify_candidates(const TuneOpts& o, const plan::PlanOptions& po, TuneResult* t);

// --- Report (tune_report.cpp) --------------------------------------------------------------

void write_tuned_config(const TuneOpts& o, const config::Config& cfg, const plan::PlanInputs& in);  // --out
nlohmann::json verified_json(const TuneResult& t);  // the JSON's "verified"
void plot_verified(const TuneOpts& o, const plan::PlanInputs& in, const nlohmann::json& verified);  // --plot
void print_tune_json(const TuneOpts& o, const TuneResult& t, const nlohmann::json& verified,
                     nlohmann::json j);
void print_candidates(const TuneOpts& o, const TuneResult& t);
void print_verified(const TuneOpts& o, const TuneResult& t);

}  // namespace zoe::cli::tune
