// zoe/cli.h from an installed zoe: registered commands run through run() with zoe's exit codes,
// flag checks are usage errors, tables and fmt print what they are given. Compiled with only the
// installed headers (and CLI11's), linked only against libzoe.
#include <gtest/gtest.h>
#include <zoe/cli.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

namespace {

int g_ran = 0;
int g_n = 0;

void add_hello(CLI::App& parent) {
  CLI::App* c = parent.add_subcommand("hello", "counts a run");
  c->add_option("--n", g_n);
  c->callback([] {
    zoe::cli::check_flag_range("--n", g_n, 1, 3);
    ++g_ran;
  });
}
void add_fails(CLI::App& parent) {
  parent.add_subcommand("fails", "always fails")->callback([] {
    zoe::cli::fail(zoe::Status(zoe::StatusCode::kNotFound, "nothing here"));
  });
}
void add_inner(CLI::App& group) {
  group.add_subcommand("inner", "in a group")->callback([] { ++g_ran; });
}

const zoe::cli::CommandRegistrar kHello(2, "", "", add_hello);
const zoe::cli::CommandRegistrar kFails(1, "", "", add_fails);
const zoe::cli::CommandRegistrar kInner(3, "grp", "a group of commands", add_inner);

int run_args(std::vector<std::string> args) {
  CLI::App app{"a test program", "prog"};
  zoe::cli::add_registered_commands(app);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return zoe::cli::run(app, static_cast<int>(argv.size()), argv.data());
}

TEST(CliFrame, RegisteredCommandsRunWithZoesExitCodes) {
  g_ran = 0;
  EXPECT_EQ(run_args({"prog", "hello", "--n", "2"}), 0);
  EXPECT_EQ(g_ran, 1);
  EXPECT_EQ(run_args({"prog", "hello", "--n", "7"}), zoe::cli::kExitUsage);  // check_flag_range
  EXPECT_EQ(g_ran, 1);
  EXPECT_EQ(run_args({"prog", "fails"}), zoe::cli::kExitFailure);
  EXPECT_EQ(run_args({"prog", "hello", "--bogus"}), zoe::cli::kExitUsage);  // CLI11's parse error
  EXPECT_EQ(run_args({"prog", "--log-level", "loud", "hello", "--n", "1"}), zoe::cli::kExitUsage);
  EXPECT_EQ(run_args({"prog", "grp", "inner"}), 0);
  EXPECT_EQ(g_ran, 2);
  EXPECT_EQ(run_args({"prog", "grp"}), zoe::cli::kExitUsage);  // a group needs one of its commands
  EXPECT_EQ(run_args({"prog", "--version"}), 0);
}

TEST(CliFrame, ValueOrFailAndUsageFailCarryTheStatus) {
  try {
    (void)zoe::cli::value_or_fail(zoe::Result<int>(zoe::Status(zoe::StatusCode::kInvalidArgument, "bad")));
    FAIL() << "value_or_fail returned";
  } catch (const zoe::cli::CommandError& e) {
    EXPECT_EQ(e.exit_code, zoe::cli::kExitFailure);
    EXPECT_EQ(e.status.message(), "bad");
  }
  EXPECT_EQ(zoe::cli::value_or_fail(zoe::Result<int>(7)), 7);
  try {
    zoe::cli::check_flag_range("--k", 0, 1, 4);
    FAIL() << "check_flag_range accepted 0";
  } catch (const zoe::cli::CommandError& e) {
    EXPECT_EQ(e.exit_code, zoe::cli::kExitUsage);
    EXPECT_NE(e.status.message().find("--k 0 is out of range (expected an integer in [1, 4])"),
              std::string::npos)
        << e.status.message();
  }
  EXPECT_EQ(zoe::cli::parse_uint_flag("--seed", "42"), 42u);
  EXPECT_THROW(zoe::cli::parse_uint_flag("--seed", "-1"), zoe::cli::CommandError);
}

TEST(CliFrame, TableAndFmt) {
  EXPECT_EQ(zoe::cli::fmt("%d-%s", 3, "x"), "3-x");
  FILE* f = tmpfile();
  ASSERT_NE(f, nullptr);
  zoe::cli::Table t({{"name", "", 6, true}, {"value", "s", 8}});
  t.print_header(f);
  t.print_row(f, {"ab", "1.5"});
  rewind(f);
  std::string out(4096, '\0');
  out.resize(fread(out.data(), 1, out.size(), f));
  fclose(f);
  EXPECT_NE(out.find("name"), std::string::npos) << out;
  EXPECT_NE(out.find("value"), std::string::npos) << out;
  EXPECT_NE(out.find("ab"), std::string::npos) << out;
  EXPECT_NE(out.find("     1.5"), std::string::npos) << out;  // right-aligned in 8 columns
}

}  // namespace
