// Plots of the CLI's JSON output: runs scripts/zoe_plot.py (matplotlib) through /usr/bin/python3.
#pragma once

#include <string>

#include "zoe/status.h"

namespace zoe::cli {

struct PlotSize {
  int width = 1200;  // pixels
  int height = 800;
};

// Draws `json_text` (the --json output of a command) into png_path. kind: "train" (zoe train:
// loss and eval curves, time per step by part), "tune" (zoe tune --verify: predicted against
// measured step time per candidate) or "bench-io" (zoe bench io: GB/s against block
// size and queue depth). The interpreter is $ZOE_PYTHON or /usr/bin/python3; the script is
// $ZOE_PLOT_SCRIPT, else scripts/zoe_plot.py of the source tree zoe was built from, else
// <zoe's directory>/zoe_plot.py. Blocks until the PNG is written. Errors: no interpreter or
// script (kNotFound, naming the path and the Debian package), matplotlib missing (kUnsupported,
// naming python3-matplotlib), any other failure of the script (kInternal with its stderr).
Status write_plot(const std::string& kind, const std::string& json_text, const std::string& png_path,
                  PlotSize size = {});
// Whether write_plot can work here (interpreter, script, matplotlib), so that a command asked to
// plot fails before its long run rather than after it. The same errors as write_plot.
Status plot_available();

}  // namespace zoe::cli
