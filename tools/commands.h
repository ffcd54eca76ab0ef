// Registration of the zoe CLI's subcommands; each lives in its own cmd_*.cpp file.
#pragma once

#include <CLI/CLI.hpp>

namespace zoe::cli {

// Each adds its subcommand to `app` (or to the `bench` group) with its options and callback.
void add_info_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_ckpt_command(CLI::App& app);
void add_plan_command(CLI::App& app);  // and `tune`
void add_bench_io_command(CLI::App& bench);
void add_bench_adam_command(CLI::App& bench);
void add_bench_swap_command(CLI::App& bench);
void add_bench_engine_command(CLI::App& bench);

}  // namespace zoe::cli
