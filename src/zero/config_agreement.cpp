// The ranks' configs agree (config_agreement.h): a digest of each rank's config, gathered; where
// they differ, rank 0's config text broadcast so that each differing rank names the keys.
#include "zero/config_agreement.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zoe/status.h"

namespace zoe::zero {
namespace {

// The config's JSON text without the per-rank NVMe directories.
std::string comparable_text(const config::Config& given) {
  config::Config c = given;
  c.zero.offload_param.nvme_path.clear();
  c.zero.offload_optimizer.nvme_path.clear();
  c.zoe.activation_nvme_path.clear();
  return c.to_json();
}

// FNV-1a over the text: equal texts give equal digests on every rank (no per-process seed).
int64_t digest(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h);
}

void differing_keys(const nlohmann::json& a, const nlohmann::json& b, const std::string& path,
                    std::vector<std::pair<std::string, std::pair<std::string, std::string>>>* out) {
  if (a.is_object() && b.is_object()) {
    for (auto it = a.begin(); it != a.end(); ++it) {
      const std::string key = path.empty() ? it.key() : path + "." + it.key();
      if (!b.contains(it.key())) {
        out->push_back({key, {it.value().dump(), "(absent)"}});
      } else {
        differing_keys(it.value(), b.at(it.key()), key, out);
      }
    }
    for (auto it = b.begin(); it != b.end(); ++it) {
      if (!a.contains(it.key())) {
        out->push_back({path.empty() ? it.key() : path + "." + it.key(), {"(absent)", it.value().dump()}});
      }
    }
    return;
  }
  if (a != b) out->push_back({path, {a.dump(), b.dump()}});
}

}  // namespace

std::string config_differences(const std::string& mine, const std::string& theirs, int other_rank,
                               const std::function<bool(const std::string&)>& given, int max_keys) {
  nlohmann::json a = nlohmann::json::parse(mine, nullptr, /*allow_exceptions=*/false);
  nlohmann::json b = nlohmann::json::parse(theirs, nullptr, /*allow_exceptions=*/false);
  if (a.is_discarded() || b.is_discarded()) return "(the configs' texts could not be compared)";
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> diff;
  differing_keys(a, b, "", &diff);
  // The keys this rank's config gives first: a default that follows from them (overlap_comm from
  // the stage) says less.
  if (given) {
    std::stable_sort(diff.begin(), diff.end(),
                     [&](const auto& x, const auto& y) { return given(x.first) && !given(y.first); });
  }
  std::string s;
  for (size_t i = 0; i < diff.size() && static_cast<int>(i) < max_keys; ++i) {
    if (!s.empty()) s += "; ";
    s += diff[i].first + ": " + diff[i].second.first + " here, " + diff[i].second.second + " on rank " +
         std::to_string(other_rank);
  }
  if (static_cast<int>(diff.size()) > max_keys) {
    s += "; and " + std::to_string(diff.size() - max_keys) + " more";
  }
  return s;
}

Status check_ranks_agree(comm::Communicator& comm, const config::Config& cfg) {
  const int world = comm.size(), rank = comm.rank();
  if (world <= 1) return Status::ok();
  const std::string mine = comparable_text(cfg);
  const int64_t d = digest(mine);
  std::vector<int64_t> all(world);
  ZOE_RETURN_IF_ERROR(comm.all_gather(&d, all.data(), 1, comm::CommType::kI64).wait());
  std::vector<int> differ;
  for (int r = 1; r < world; ++r) {
    if (all[r] != all[0]) differ.push_back(r);
  }
  if (differ.empty()) return Status::ok();
  // Rank 0's text to every rank (its length first), so a differing rank can name the keys.
  std::string theirs = mine;
  int64_t len = static_cast<int64_t>(mine.size());
  ZOE_RETURN_IF_ERROR(comm.broadcast(&len, 1, comm::CommType::kI64, 0).wait());
  theirs.resize(static_cast<size_t>(len));
  ZOE_RETURN_IF_ERROR(comm.broadcast(theirs.data(), theirs.size(), comm::CommType::kU8, 0).wait());
  std::string ranks;
  for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (all[rank] != all[0]) {
    return invalid_argument(
        "rank %d's config differs from rank 0's (%s): every rank must be given the same config (only the "
        "nvme_path directories may differ)",
        rank,
        config_differences(mine, theirs, 0, [&](const std::string& k) { return cfg.given(k); }).c_str());
  }
  return invalid_argument(
      "the ranks' configs differ: rank(s) %s were given a config other than rank 0's (each of them names the "
      "keys); every rank must be given the same config (only the nvme_path directories may differ)",
      ranks.c_str());
}

}  // namespace zoe::zero
