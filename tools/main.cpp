// zoe: the command-line front end (info, bench, ...).
#include <csignal>
#include <cstdio>
#include <exception>
#include <new>

#include <CLI/CLI.hpp>

#include "core/log.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "zoe/features.h"

int main(int argc, char** argv) {
  // Under `ulimit -f` a write past the limit raises SIGXFSZ, which would kill zoe (rc 153) before
  // the write's EFBIG reaches the error message that names the file.
  signal(SIGXFSZ, SIG_IGN);
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
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Benchmarks: drive swap bandwidth (io), CPU Adam (adam), NVMe optimizer step (swap), engine (engine)");
  bench->require_subcommand(1);
  zoe::cli::add_bench_io_command(*bench);
  zoe::cli::add_bench_adam_command(*bench);
  zoe::cli::add_bench_swap_command(*bench);
  zoe::cli::add_bench_engine_command(*bench);

  // No exception ends zoe with abort(): the last resort prints what it was and exits 1.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : zoe::cli::kExitUsage;
  } catch (const zoe::cli::CommandError& e) {
    fflush(stdout);
    if (e.status.code() == zoe::StatusCode::kCancelled) {
      fprintf(stderr, "zoe: %s\n", e.status.message().c_str());  // stopped by a signal, as asked
    } else {
      fprintf(stderr, "zoe: error: %s\n", e.status.to_string().c_str());
    }
    return e.exit_code;
  } catch (const std::bad_alloc&) {
    fflush(stdout);
    fprintf(stderr,
            "zoe: error: out of memory (an allocation failed; a size from a flag or the config may be "
            "too large for this host)\n");
    return zoe::cli::kExitFailure;
  } catch (const std::exception& e) {
    fflush(stdout);
    fprintf(stderr, "zoe: error: %s\n", e.what());
    return zoe::cli::kExitFailure;
  } catch (...) {
    fflush(stdout);
    fprintf(stderr, "zoe: error: an unknown exception ended the command\n");
    return zoe::cli::kExitFailure;
  }
  return 0;
}
