// The calibration file: read, validated, written.
#include "plan/calibration.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/json_reader.h"
#include "zoe/files.h"

namespace zoe::plan {

using nlohmann::json;

namespace {

std::vector<std::pair<const char*, double LinkRates::*>> rate_keys() {
  return {{"nvme_read_gbps", &LinkRates::nvme_read_gbps},
          {"nvme_write_gbps", &LinkRates::nvme_write_gbps},
          {"h2d_gbps", &LinkRates::h2d_gbps},
          {"cpu_adam_gbps", &LinkRates::cpu_adam_gbps},
          {"flops", &LinkRates::flops},
          {"net_gbps", &LinkRates::net_gbps},
          {"intra_gbps", &LinkRates::intra_gbps},
          {"net_latency_us", &LinkRates::net_latency_us},
          {"device_mem_gbps", &LinkRates::device_mem_gbps},
          {"local_copy_gbps", &LinkRates::local_copy_gbps},
          {"nvme_cpu_gbps", &LinkRates::nvme_cpu_gbps}};
}

// The calibration file's "spread": {what: relative spread >= 0}.
Status read_spread(const json& v, const std::string& where, LinkRates* r) {
  if (!v.is_object()) {
    return invalid_argument("calibration file %s: \"spread\" is %s, expected an object", where.c_str(),
                            v.dump().c_str());
  }
  r->spread.clear();
  for (auto e = v.begin(); e != v.end(); ++e) {
    if (!e->is_number() || !(e->get<double>() >= 0) || !std::isfinite(e->get<double>())) {
      return invalid_argument(
          "calibration file %s: spread[\"%s\"] is %s, expected a relative spread (a number >= 0)",
          where.c_str(), e.key().c_str(), e->dump().c_str());
    }
    r->spread.emplace_back(e.key(), e->get<double>());
  }
  return Status::ok();
}

}  // namespace

std::vector<size_t> Repeated::sorted() const {
  std::vector<size_t> order(samples_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return samples_[a] < samples_[b]; });
  return order;
}

size_t Repeated::tightest(const std::vector<size_t>& order, double* spread) const {
  const size_t n = order.size();
  const size_t w = std::min(n, static_cast<size_t>(std::max(2, p_.window)));
  *spread = std::numeric_limits<double>::infinity();
  size_t best = 0;
  if (n < 2) return 0;
  for (size_t i = 0; i + w <= n; ++i) {
    const double lo = samples_[order[i]], hi = samples_[order[i + w - 1]], mid = samples_[order[i + w / 2]];
    const double s = mid > 0 ? (hi - lo) / mid : std::numeric_limits<double>::infinity();
    if (s < *spread) *spread = s, best = i;
  }
  return best;
}

bool Repeated::stable() const {
  if (samples_.size() < static_cast<size_t>(std::max(2, p_.window))) return false;
  return spread() <= p_.max_spread;
}

double Repeated::spread() const {
  double s = 0;
  (void)tightest(sorted(), &s);
  return s;
}

size_t Repeated::median_index() const {
  if (samples_.empty()) return 0;
  const std::vector<size_t> order = sorted();
  double s = 0;
  const size_t start = tightest(order, &s);
  const size_t w = std::min(order.size(), static_cast<size_t>(std::max(2, p_.window)));
  return order[start + w / 2];
}

Status check_stable(const Repeated& r, const std::string& what) {
  if (r.stable()) return Status::ok();
  const int w = std::max(2, r.policy().window);
  return unsupported(
      "%s: the closest %d of %zu timed samples spread by %.1f%%, more than the %.1f%% a calibration "
      "trusts (--calibrate-max-spread %g): something else is running here, or the machine's speed "
      "swings; run it on a quiet machine (or allow a larger spread)",
      what.c_str(), std::min<int>(w, static_cast<int>(r.samples())), r.samples(), 100 * r.spread(),
      100 * r.policy().max_spread, r.policy().max_spread);
}

double two_spread(double a, double b) {
  const double mean = (a + b) / 2;
  return mean > 0 ? std::abs(a - b) / mean : std::numeric_limits<double>::infinity();
}

Status check_drift(double first, double again, double max_spread, const std::string& what) {
  const double s = two_spread(first, again);
  if (s <= max_spread) return Status::ok();
  return unsupported(
      "%s: %.4g at the start of the calibration and %.4g at its end, %.1f%% apart, more than the %.1f%% "
      "a calibration trusts (--calibrate-max-spread %g): this machine's speed changed while it was "
      "measured (another process, a clock that dropped); run it on a quiet machine",
      what.c_str(), first, again, 100 * s, 100 * max_spread, max_spread);
}

double LinkRates::flops_at(int64_t micro_batch) const {
  for (const auto& [m, f] : flops_by_micro_batch) {
    if (m == micro_batch) return f;
  }
  return flops;
}

double LinkRates::nvme_at(bool write, int64_t block, int64_t depth) const {
  const double base = write ? nvme_write_gbps : nvme_read_gbps;
  if (io_sweep.empty() || block <= 0 || depth <= 0) return base;
  auto rate = [&](const IoPoint& p) { return write ? p.write_gbps : p.read_gbps; };
  double chosen = 0, top = 0, env = 0;
  for (const IoPoint& p : io_sweep) {
    if (p.block_size <= 0 || p.queue_depth <= 0 || !(rate(p) > 0)) continue;
    if (p.block_size == aio_block_size && p.queue_depth == aio_queue_depth) chosen = rate(p);
    top = std::max(top, rate(p));
    double r = rate(p);
    if (p.block_size > block) r *= static_cast<double>(block) / static_cast<double>(p.block_size);
    if (p.queue_depth > depth) r *= static_cast<double>(depth) / static_cast<double>(p.queue_depth);
    env = std::max(env, r);
  }
  if (chosen <= 0) chosen = top;
  return chosen > 0 ? base * env / chosen : base;
}

Status LinkRates::validate() const {
  for (const auto& [key, field] : rate_keys()) {
    const double v = this->*field;
    if (!std::isfinite(v) || v <= 0)
      return invalid_argument("rate %s is %g: expected a positive number", key, v);
  }
  return Status::ok();
}

std::string LinkRates::to_json() const {
  json j;
  j["version"] = 1;
  if (!host.empty()) j["host"] = host;
  for (const auto& [key, field] : rate_keys()) j[key] = this->*field;
  if (!io_sweep.empty()) {
    json pts = json::array();
    for (const IoPoint& p : io_sweep) {
      pts.push_back({{"block_size", p.block_size},
                     {"queue_depth", p.queue_depth},
                     {"read_gbps", p.read_gbps},
                     {"write_gbps", p.write_gbps}});
    }
    j["io_sweep"] = pts;
  }
  if (aio_block_size > 0) {
    j["aio_block_size"] = aio_block_size;
    j["aio_queue_depth"] = aio_queue_depth;
  }
  if (!flops_by_micro_batch.empty()) {
    json f = json::object();
    for (const auto& [m, v] : flops_by_micro_batch) f[std::to_string(m)] = v;
    j["flops_by_micro_batch"] = f;
  }
  if (!spread.empty()) {
    json f = json::object();
    for (const auto& [what, v] : spread) f[what] = v;
    j["spread"] = f;
  }
  return j.dump(2) + "\n";
}

Status apply_calibration_json(const std::string& text, const std::string& where, LinkRates* rates) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("calibration file %s: not valid JSON", where.c_str());
  if (!j.is_object()) return invalid_argument("calibration file %s: expected a JSON object", where.c_str());
  LinkRates r = *rates;
  const auto keys = rate_keys();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "version") {
      if (!it->is_number_integer() || it->get<int64_t>() != 1) {
        return invalid_argument("calibration file %s: \"version\" is %s, expected 1", where.c_str(),
                                it->dump().c_str());
      }
      continue;
    }
    if (k == "host") {
      if (!it->is_string()) {
        return invalid_argument("calibration file %s: \"host\" is %s, expected a string", where.c_str(),
                                it->dump().c_str());
      }
      r.host = it->get<std::string>();
      continue;
    }
    if (k == "aio_block_size" || k == "aio_queue_depth") {
      const int64_t max = k == "aio_block_size" ? (int64_t{1} << 30) : 65536;
      if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > max ||
          (k == "aio_block_size" && it->get<int64_t>() % 4096 != 0)) {
        return invalid_argument(
            "calibration file %s: \"%s\" is %s, expected %s", where.c_str(), k.c_str(), it->dump().c_str(),
            k == "aio_block_size" ? "a multiple of 4096 up to 1 GiB" : "an integer in [1, 65536]");
      }
      (k == "aio_block_size" ? r.aio_block_size : r.aio_queue_depth) = it->get<int64_t>();
      continue;
    }
    if (k == "flops_by_micro_batch") {
      if (!it->is_object()) {
        return invalid_argument("calibration file %s: \"flops_by_micro_batch\" is %s, expected an object",
                                where.c_str(), it->dump().c_str());
      }
      r.flops_by_micro_batch.clear();
      for (auto e = it->begin(); e != it->end(); ++e) {
        char* end = nullptr;
        const long long m = std::strtoll(e.key().c_str(), &end, 10);
        const bool key_ok = !e.key().empty() && end != nullptr && *end == '\0' && m > 0 && m <= (1 << 20);
        const bool val_ok = e->is_number() && e->get<double>() > 0 && std::isfinite(e->get<double>());
        if (!key_ok || !val_ok) {
          return invalid_argument(
              "calibration file %s: flops_by_micro_batch[\"%s\"] is %s, expected a micro-batch (a positive "
              "integer) mapped to a positive FLOP rate",
              where.c_str(), e.key().c_str(), e->dump().c_str());
        }
        r.flops_by_micro_batch.emplace_back(static_cast<int64_t>(m), e->get<double>());
      }
      continue;
    }
    if (k == "spread") {
      ZOE_RETURN_IF_ERROR(read_spread(*it, where, &r));
      continue;
    }
    if (k == "io_sweep") {
      if (!it->is_array()) {
        return invalid_argument("calibration file %s: \"io_sweep\" is %s, expected an array", where.c_str(),
                                it->dump().c_str());
      }
      r.io_sweep.clear();
      for (size_t i = 0; i < it->size(); ++i) {
        const json& e = (*it)[i];
        IoPoint p;
        bool ok = e.is_object() && e.size() == 4;
        for (const char* f : {"block_size", "queue_depth"}) {
          ok = ok && e.contains(f) && e[f].is_number_integer() && e[f].get<int64_t>() > 0;
        }
        for (const char* f : {"read_gbps", "write_gbps"}) {
          ok = ok && e.contains(f) && e[f].is_number() && e[f].get<double>() > 0 &&
               std::isfinite(e[f].get<double>());
        }
        if (!ok) {
          return invalid_argument(
              "calibration file %s: io_sweep[%zu] is %s, expected {block_size, queue_depth, read_gbps, "
              "write_gbps} with positive values",
              where.c_str(), i, e.dump().c_str());
        }
        p.block_size = e["block_size"].get<int64_t>();
        p.queue_depth = e["queue_depth"].get<int64_t>();
        p.read_gbps = e["read_gbps"].get<double>();
        p.write_gbps = e["write_gbps"].get<double>();
        r.io_sweep.push_back(p);
      }
      continue;
    }
    bool known = false;
    for (const auto& [key, field] : keys) {
      if (k != key) continue;
      known = true;
      if (!it->is_number() || !(it->get<double>() > 0) || !std::isfinite(it->get<double>())) {
        return invalid_argument("calibration file %s: \"%s\" is %s, expected a positive number",
                                where.c_str(), key, it->dump().c_str());
      }
      r.*field = it->get<double>();
    }
    if (!known) {
      std::string names =
          "version, host, io_sweep, aio_block_size, aio_queue_depth, flops_by_micro_batch, spread";
      for (const auto& kv : keys) names += std::string(", ") + kv.first;
      return invalid_argument("calibration file %s: unknown key \"%s\" (expected %s)", where.c_str(),
                              k.c_str(), names.c_str());
    }
  }
  *rates = r;
  return Status::ok();
}

Status apply_calibration_file(const std::string& path, LinkRates* rates) {
  ZOE_ASSIGN_OR_RETURN(std::string text,
                       read_input_file(path, "calibration file", config::JsonLimits{}.max_bytes));
  return apply_calibration_json(text, path, rates);
}

}  // namespace zoe::plan
