// The config table's rows, checked as data: defaults agree with Config{}, paths are unique, and
// every warn / refuse / ignore row and every alias does what its disposition says through parse.
// Also the LR schedule as a pure function of the scheduler section.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "config/config_table.h"
#include "config/lr_schedule.h"
#include "tests/util/status_test_util.h"

namespace zoe::config {
namespace {

using detail::config_fields;
using detail::Disposition;
using detail::Field;
using detail::Kind;
using nlohmann::json;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// A config text with `value` at the dotted `path` (and a scheduler type when the path needs one).
std::string config_with(const std::string& path, const json& value) {
  json j = json::object();
  json* node = &j;
  std::string rest = path;
  for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
    node = &(*node)[rest.substr(0, dot)];
  }
  (*node)[rest] = value;
  if (path.rfind("scheduler.", 0) == 0) j["scheduler"]["type"] = "WarmupLR";
  return j.dump();
}

// A value of row `f` that is valid and differs from its default (null: the kind has none).
json other_value(const Field& f) {
  switch (f.kind) {
    case Kind::kBool:
      return !f.default_value.get<bool>();
    case Kind::kInt: {
      // The next integers up (or down from the maximum), the first with an effect.
      const int64_t d = f.default_value.get<int64_t>();
      for (int64_t step = 1; step <= 3; ++step) {
        const json v = d < f.max ? d + step : d - step;
        if (!f.has_effect || f.has_effect(v)) return v;
      }
      return nullptr;
    }
    case Kind::kDouble: {
      const double d = f.default_value.get<double>();
      const double v = d == 0 ? 0.5 : d / 2;
      return f.range.contains(v) ? v : d * 2;
    }
    case Kind::kAny:
      return "something";
    case Kind::kFeatureBlock:
      return json{{"enabled", true}, {"anything", 1}};
    default:
      return nullptr;
  }
}

TEST(ConfigTable, DefaultsAreTheStructs) {
  const Config defaults;
  int checked = 0;
  for (const Field& f : config_fields()) {
    if (std::holds_alternative<std::monostate>(f.member)) continue;
    EXPECT_EQ(detail::load_value(f, defaults), f.default_value) << f.path;
    ++checked;
  }
  EXPECT_GE(checked, 60);
}

TEST(ConfigTable, EverySpellingIsOneRow) {
  std::set<std::string> seen;
  for (const Field& f : config_fields()) {
    EXPECT_TRUE(seen.insert(f.path).second) << "twice: " << f.path;
    for (const auto& a : f.aliases) EXPECT_TRUE(seen.insert(a).second) << "twice: " << a;
    EXPECT_EQ(detail::find_field(f.path), &f);
    if (f.disposition == Disposition::kRefuse) {
      EXPECT_FALSE(f.why.empty()) << f.path << ": a refusal says why";
    }
  }
  EXPECT_EQ(detail::find_field("no.such.key"), nullptr);
}

TEST(ConfigTable, WarnRowsAreListedInUnimplemented) {
  int checked = 0;
  for (const Field& f : config_fields()) {
    if (f.disposition != Disposition::kWarn) continue;
    const json v = other_value(f);
    ASSERT_FALSE(v.is_null()) << f.path;
    auto r = Config::parse(config_with(f.path, v));
    ASSERT_OK(r) << f.path;
    ASSERT_EQ(r->unimplemented.size(), 1u) << f.path;
    EXPECT_EQ(r->unimplemented[0].rfind(f.path, 0), 0u) << r->unimplemented[0];
    if (!f.why.empty()) {
      EXPECT_HAS(r->unimplemented[0], f.why);
    }
    if (f.kind != Kind::kAny) {
      // The value without effect is not listed.
      auto d = Config::parse(config_with(f.path, f.default_value));
      ASSERT_OK(d) << f.path;
      EXPECT_TRUE(d->unimplemented.empty()) << f.path;
    }
    ++checked;
  }
  EXPECT_GE(checked, 15);
  // mics_shard_size: 0 and -1 both mean "no MiCS".
  EXPECT_TRUE(Config::parse(config_with("zero_optimization.mics_shard_size", 0))->unimplemented.empty());
}

TEST(ConfigTable, RefuseRowsAreUnsupportedErrors) {
  int checked = 0;
  for (const Field& f : config_fields()) {
    if (f.disposition != Disposition::kRefuse) continue;
    auto r = Config::parse(config_with(f.path, other_value(f)));
    ASSERT_FALSE(r.is_ok()) << f.path;
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported) << r.status().to_string();
    const std::string at = f.kind == Kind::kFeatureBlock ? f.path + ".enabled: " : f.path + ": ";
    EXPECT_HAS(r.status().message(), at);
    EXPECT_HAS(r.status().message(), "is not supported by zoe (" + f.why + ")");
    if (f.kind != Kind::kAny) {
      auto d = Config::parse(
          config_with(f.path, f.kind == Kind::kFeatureBlock ? json{{"enabled", false}} : f.default_value));
      EXPECT_OK(d) << f.path;
    }
    ++checked;
  }
  EXPECT_GE(checked, 12);
}

TEST(ConfigTable, IgnoreRowsAcceptAnything) {
  const json anything = json::array({1, json{{"nested", "x"}, {"enabled", true}}});
  int checked = 0;
  for (const Field& f : config_fields()) {
    if (f.disposition != Disposition::kIgnore) continue;
    auto r = Config::parse(config_with(f.path, anything));
    ASSERT_OK(r) << f.path;
    EXPECT_TRUE(r->unimplemented.empty()) << f.path;
    EXPECT_TRUE(r.value() == Config::parse("{}").value()) << f.path;
    ++checked;
  }
  EXPECT_GE(checked, 25);
}

TEST(ConfigTable, AliasesReadAsTheirKeyAndDisagreementIsAnError) {
  int checked = 0;
  for (const Field& f : config_fields()) {
    for (const auto& alias : f.aliases) {
      const json v = other_value(f);
      ASSERT_FALSE(v.is_null()) << f.path;
      auto by_alias = Config::parse(config_with(alias, v));
      auto by_key = Config::parse(config_with(f.path, v));
      ASSERT_OK(by_alias) << alias;
      ASSERT_OK(by_key) << f.path;
      EXPECT_TRUE(by_alias.value() == by_key.value()) << alias;
      EXPECT_NE(detail::load_value(f, by_alias.value()), f.default_value) << alias;
      // Both spellings, agreeing: fine; disagreeing: an error naming both.
      json both = json::parse(config_with(f.path, v));
      both.merge_patch(json::parse(config_with(alias, v)));
      EXPECT_OK(Config::parse(both.dump())) << both.dump();
      both.merge_patch(json::parse(config_with(alias, f.default_value)));
      auto bad = Config::parse(both.dump());
      ASSERT_FALSE(bad.is_ok()) << both.dump();
      EXPECT_HAS(bad.status().message(),
                 f.path + " and " + alias + " (its older name) are both given, with different values");
      ++checked;
    }
  }
  EXPECT_GE(checked, 8);
}

TEST(LrSchedule, IsAPureFunctionOfTheSchedulerSection) {
  SchedulerConfig none;
  EXPECT_EQ(lr_at_step(none, 0.25, 1), 0.25);
  EXPECT_EQ(lr_at_iteration(none, 0.25, 100), 0.25);
  SchedulerConfig s;
  s.type = "WarmupDecayLR";
  s.warmup_min_lr = 0.0;
  s.warmup_max_lr = 1.0;
  s.warmup_num_steps = 10;
  s.warmup_type = "linear";
  s.total_num_steps = 110;
  EXPECT_DOUBLE_EQ(lr_at_iteration(s, 9.0, -1), 0.0);
  EXPECT_DOUBLE_EQ(lr_at_iteration(s, 9.0, 5), 0.5);
  EXPECT_DOUBLE_EQ(lr_at_iteration(s, 9.0, 35), 0.75);
  EXPECT_DOUBLE_EQ(lr_at_step(s, 9.0, 37), 0.75);  // update k runs at iteration k - 2
  Config c;
  c.scheduler = s;
  for (int64_t k : {1, 2, 7, 12, 37, 112, 500}) EXPECT_EQ(c.lr_at(k), lr_at_step(s, c.optimizer.lr, k)) << k;
}

}  // namespace
}  // namespace zoe::config
