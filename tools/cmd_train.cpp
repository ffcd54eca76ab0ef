// `zoe train`: trains the reference GPT through the engine on a text file or the built-in
// arithmetic corpus, with the engine's placement from a DeepSpeed-style config (or flags). A thin
// CLI over model::GptTrainer and the public API: flags -> zoe::Config (its Builder and setters).
// This file holds the command and the order of the run's phases (tools/train_run.h).
#include <memory>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tools/train_run.h"

namespace zoe::cli {
namespace {

using nlohmann::json;

// The run's phases in order (tools/train_run.h), then its report on the lead rank.
void run(TrainOpts o) {
  check_flags(o);
  TrainRun r(std::move(o));
  r.check_seq();
  r.start_runtime();
  r.build_config();
  r.load_data();
  r.build_engine();
  r.resume();
  r.build_model();
  r.train();
  r.finish();
  if (!r.lead) return;
  r.total_s = static_cast<double>(clock_ns() - r.t_start) * 1e-9;
  const json j = r.summary_json();
  r.plot(j);
  if (r.o.json) {
    print_json(j);
    return;
  }
  r.print_summary(j);
}

}  // namespace

static void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOpts>();
  CLI::App* cmd = add_train_options(app, o.get());
  cmd->callback([o, cmd] {
    for (const CLI::Option* opt : cmd->get_options()) {
      if (opt->count() > 0) o->given.insert(opt->get_name());
    }
    run(*o);
  });
}

// Joins the program this file is linked into (the `zoe` program).
static const CommandRegistrar kRegister(20, "", "", add_train_command);

}  // namespace zoe::cli
