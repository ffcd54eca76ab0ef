// zoe: the command-line program. The frame of zoe/cli.h with every command linked in: zoe's
// diagnostic commands from src/cli/ (info, bench, ckpt, plan, tune) and `zoe train`
// (tools/cmd_train.cpp), each of which registers itself.
#include <CLI/CLI.hpp>

#include "zoe/cli.h"

int main(int argc, char** argv) {
  CLI::App app{
      "zoe: train models larger than accelerator memory (ZeRO stages 1-3 with offload of\n"
      "parameters, gradients and optimizer states to pinned host RAM and NVMe).\n"
      "Results go to stdout (one JSON object with --json), progress to stderr.",
      "zoe"};
  zoe::cli::add_registered_commands(app);
  return zoe::cli::run(app, argc, argv);
}
