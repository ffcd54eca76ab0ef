// zoe::Config and its Builder from the configuration layer alone (this suite links zoe_config, not
// the engine): a built config reads back what was set, a setter re-validates the whole config and
// changes nothing on an error, any key is reachable by its JSON path, and ConfigAccess gives the
// internal config.
#include <gtest/gtest.h>

#include <string>

#include "config/public_config.h"
#include "tests/util/status_test_util.h"
#include "zoe/config.h"

namespace zoe {
namespace {

TEST(PublicConfig, BuilderReadsBackWhatWasSet) {
  auto c = Config::Builder().micro_batch(2).gradient_accumulation_steps(3).stage(2).lr(1e-3).build(2);
  ASSERT_OK(c);
  EXPECT_EQ(c.value().micro_batch(), 2);
  EXPECT_EQ(c.value().gradient_accumulation_steps(), 3);
  EXPECT_EQ(c.value().train_batch_size(), 12);
  EXPECT_EQ(c.value().stage(), 2);
  EXPECT_EQ(c.value().lr(), 1e-3);
  EXPECT_EQ(c.value().world_size(), 2);
  EXPECT_EQ(ConfigAccess::get(c.value()).zero.stage, 2);
}

TEST(PublicConfig, SetterRefusesAndKeepsTheConfig) {
  auto parsed = Config::parse("{}");
  ASSERT_OK(parsed);
  Config c = parsed.value();
  ASSERT_OK(c.set_stage(3));
  Status s = c.set_stage(7);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("zero_optimization.stage"), std::string::npos) << s.to_string();
  EXPECT_EQ(c.stage(), 3);
}

TEST(PublicConfig, AnyKeyByItsPath) {
  auto parsed = Config::parse("{}");
  ASSERT_OK(parsed);
  Config c = parsed.value();
  ASSERT_OK(c.set("zero_optimization.stage", "1"));
  auto stage = c.get_int("zero_optimization.stage");
  ASSERT_OK(stage);
  EXPECT_EQ(stage.value(), 1);
  auto missing = c.get("zero_optimization.no_such_key");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// A default-constructed Config is the config of an empty file: its setters work (they re-check the
// whole config, which the raw defaults of the internal struct would fail).
TEST(PublicConfig, DefaultConstructedIsTheEmptyFilesConfig) {
  Config c;
  ASSERT_OK(c.set_stage(3));
  EXPECT_EQ(c.stage(), 3);
  auto parsed = Config::parse("{}");
  ASSERT_OK(parsed);
  EXPECT_EQ(Config().train_batch_size(), parsed.value().train_batch_size());
  EXPECT_EQ(Config().micro_batch(), parsed.value().micro_batch());
}

}  // namespace
}  // namespace zoe
