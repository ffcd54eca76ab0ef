// The ranks' configs agree: every rank of a job must train with the same config (the same stage,
// batch, optimizer, precision, placement). Ranks that disagree would queue different collectives
// and hang until the lost-rank timeout, or train on wrong sums; this check runs at engine
// creation, before any other collective, and fails on every rank alike.
#pragma once

#include <functional>
#include <string>

#include "comm/communicator.h"
#include "config/config.h"
#include "zoe/status.h"

namespace zoe::zero {

// Collective over `comm` (every rank calls it, with its own config as given, before the rank's
// paths are expanded). The NVMe directories (zero_optimization.offload_param.nvme_path,
// offload_optimizer.nvme_path, zoe.activation_nvme_path) are left out: a rank's own drive may
// be named in its own config. OK where every rank's config is the same; else kInvalidArgument on
// every rank: a rank whose config differs from rank 0's names the keys and both values, the
// others name the ranks that differ.
Status check_ranks_agree(comm::Communicator& comm, const config::Config& cfg);

// The keys (dotted paths) whose values differ between two JSON texts of configs, each with both
// values ("zero_optimization.stage: 3 here, 2 on rank 0"), the keys `given` says this rank's
// config gives first, at most `max_keys` of them, joined with "; ".
std::string config_differences(const std::string& mine, const std::string& theirs, int other_rank,
                               const std::function<bool(const std::string&)>& given, int max_keys = 4);

}  // namespace zoe::zero
