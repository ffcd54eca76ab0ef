// `zoe info`'s drive: the block device holding a directory and what SMART says of its wear (bytes
// written, the share of its rated endurance used), read through nvme-cli or smartctl where they
// are installed (never installed by zoe), each run with a timeout; else the reason there is none.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace zoe::cli {

// {"path", "device": "/dev/nvme0n1" | null, "smart": "nvme-cli" | "smartctl" | null,
//  "reason": null | why there are no SMART figures, "bytes_written", "endurance_used" (a fraction
//  of the rated endurance), "rated_bytes_written" (bytes_written / endurance_used, an estimate;
//  null below 1% used)}.
nlohmann::json drive_json(const std::string& path);

// One line of `zoe info`'s text for drive_json()'s object.
std::string drive_line(const nlohmann::json& d);

}  // namespace zoe::cli
