// zoe: the command-line front end (info, bench, ...).
#include <cstdio>

#include <CLI/CLI.hpp>

#include "core/log.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "zoe/features.h"

int main(int argc, char** argv) {
  CLI::App app{
      "zoe: train models larger than accelerator memory (ZeRO stages 1-3 with offload of\n"
      "parameters, gradients and optimizer states to pinned host RAM and NVMe).\n"
      "Results go to stdout (one JSON object with --json), progress to stderr.",
      "zoe"};
  app.set_version_flag("--version", std::string("zoe ") + ZOE_VERSION_STRING);
  app.require_subcommand(1);
  std::string log_level;
  app.add_option("--log-level", log_level, "error|warn|info|debug|trace (default: $ZOE_LOG_LEVEL or warn)");
  app.parse_complete_callback([&] {
    if (!log_level.empty()) {
      zoe::LogLevel l;
      if (!zoe::parse_log_level(log_level.c_str(), &l)) {
        throw CLI::ValidationError("--log-level", "expected error, warn, info, debug or trace");
      }
      zoe::set_log_level(l);
    }
  });

  zoe::cli::add_info_command(app);
  zoe::cli::add_train_command(app);
  zoe::cli::add_ckpt_command(app);
  zoe::cli::add_plan_command(app);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: drive swap bandwidth (io), CPU Adam (adam), NVMe optimizer step (swap), engine (engine)");
  bench->require_subcommand(1);
  zoe::cli::add_bench_io_command(*bench);
  zoe::cli::add_bench_adam_command(*bench);
  zoe::cli::add_bench_swap_command(*bench);
  zoe::cli::add_bench_engine_command(*bench);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const zoe::cli::CommandError& e) {
    fflush(stdout);
    fprintf(stderr, "zoe: error: %s\n", e.status.to_string().c_str());
    return 1;
  }
  return 0;
}
