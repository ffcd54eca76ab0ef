// The NVMe drive's wear a plan predicts (`zoe plan` and `zoe tune`): the bytes one rank writes to
// NVMe per step (the cost model's LinkBytes::nvme_write, optimizer states, stage-3 partitions,
// gradient accumulation and offloaded activations), per 1,000 steps, and with --drive-tbw the
// steps a drive's rated endurance allows when the ranks of a node share its drives. `zoe info`
// reads what SMART says of a drive (drive_smart.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/units.h"
#include "zoe/cli.h"

namespace zoe::cli {

// Drive makers rate endurance in decimal terabytes written (TBW).
inline constexpr double kBytesPerTb = 1e12;

struct DriveWear {
  uint64_t per_step = 0;    // bytes one rank writes to NVMe per step
  int ranks_per_drive = 1;  // the ranks of a node, writing to the node's drives
  double tbw = 0;           // --drive-tbw; 0: not given

  uint64_t per_1000_steps() const { return 1000 * per_step; }
  // The steps the rated endurance allows (whole steps); < 0 where nothing is written (no limit).
  double steps() const {
    if (per_step == 0) return -1;
    return std::floor(tbw * kBytesPerTb / (static_cast<double>(per_step) * ranks_per_drive));
  }
};

// The wear fields of one placement's JSON (a plan row, a tune candidate).
inline void add_wear_json(nlohmann::json* j, const DriveWear& w) {
  (*j)["nvme_bytes_written_per_step"] = w.per_step;
  (*j)["nvme_bytes_written_per_1000_steps"] = w.per_1000_steps();
  if (w.tbw > 0) {
    (*j)["steps_per_drive_endurance"] = w.steps() < 0 ? nlohmann::json(nullptr) : nlohmann::json(w.steps());
  }
}

// One line of text: "# NVMe wear (<what>): 1.2 GiB written per step ..., a 600 TB drive allows N steps".
inline std::string wear_line(const DriveWear& w, const std::string& what) {
  std::string s =
      fmt("# NVMe wear (%s): %s written per step per rank, %.4g TB per 1,000 steps", what.c_str(),
          format_bytes(w.per_step).c_str(), static_cast<double>(w.per_1000_steps()) / kBytesPerTb);
  if (w.tbw > 0 && w.steps() < 0) s += fmt("; a %g TB drive: no NVMe writes, no wear", w.tbw);
  if (w.tbw > 0 && w.steps() >= 0) {
    s += fmt("; a %g TB drive's rated endurance allows %.0f steps", w.tbw, w.steps());
    if (w.ranks_per_drive > 1) s += fmt(" (%d ranks writing to a node's drives)", w.ranks_per_drive);
  } else if (w.tbw <= 0) {
    s += " (--drive-tbw: the steps a drive's endurance allows)";
  }
  return s + "\n";
}

}  // namespace zoe::cli
