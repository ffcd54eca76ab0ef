// The CLI frame's registry of commands and run(): zoe's common options, parsing, and the one place
// where a command's error becomes a message and an exit code.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>
#include <map>
#include <new>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/log.h"
#include "zoe/cli.h"
#include "zoe/features.h"

namespace zoe::cli {
namespace {

struct Entry {
  int order;
  size_t seq;  // registration order, for equal `order`
  std::string group, group_help;
  AddCommand add;
};

// Function-local: registrars in other translation units run during static initialisation, in an
// order C++ does not fix.
std::vector<Entry>& registry() {
  static std::vector<Entry> r;
  return r;
}

}  // namespace

CommandRegistrar::CommandRegistrar(int order, const char* group, const char* group_help, AddCommand add) {
  auto& r = registry();
  r.push_back({order, r.size(), group ? group : "", group_help ? group_help : "", add});
}

void add_registered_commands(CLI::App& app) {
  std::vector<Entry> r = registry();
  std::sort(r.begin(), r.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.order, a.seq) < std::tie(b.order, b.seq);
  });
  std::map<std::string, CLI::App*> groups;
  for (const Entry& e : r) {
    if (e.group.empty()) {
      e.add(app);
      continue;
    }
    CLI::App*& g = groups[e.group];
    if (!g) {
      g = app.add_subcommand(e.group, e.group_help);
      g->require_subcommand(1);
    }
    e.add(*g);
  }
}

int run(CLI::App& app, int argc, char** argv) {
  // Under `ulimit -f` a write past the limit raises SIGXFSZ, which would kill the program (rc 153)
  // before the write's EFBIG reaches the error message that names the file.
  signal(SIGXFSZ, SIG_IGN);
  app.set_version_flag("--version", app.get_name() + " " + ZOE_VERSION_STRING);
  app.require_subcommand(1);
  std::string log_level;
  app.add_option("--log-level", log_level, "error|warn|info|debug|trace (default: $ZOE_LOG_LEVEL or warn)");
  app.parse_complete_callback([&] {
    if (!log_level.empty()) {
      LogLevel l;
      if (!parse_log_level(log_level.c_str(), &l)) {
        throw CLI::ValidationError("--log-level", "expected error, warn, info, debug or trace");
      }
      set_log_level(l);
    }
  });
  // No exception ends the program with abort(): the last resort prints what it was and exits 1.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  } catch (const CommandError& e) {
    fflush(stdout);
    if (e.status.code() == StatusCode::kCancelled) {
      fprintf(stderr, "%s: %s\n", app.get_name().c_str(), e.status.message().c_str());  // a signal, as asked
    } else {
      fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), e.status.to_string().c_str());
    }
    return e.exit_code;
  } catch (const std::bad_alloc&) {
    fflush(stdout);
    fprintf(stderr,
            "%s: error: out of memory (an allocation failed; a size from a flag or the config may be "
            "too large for this host)\n",
            app.get_name().c_str());
    return kExitFailure;
  } catch (const std::system_error& e) {
    // A thread that could not start (EAGAIN), or another resource the system refused.
    fflush(stdout);
    fprintf(stderr,
            "%s: error: %s (errno %d): out of a system resource; the process may be at its address-space "
            "(ulimit -v) or thread-count (ulimit -u) limit\n",
            app.get_name().c_str(), e.what(), e.code().value());
    return kExitFailure;
  } catch (const std::exception& e) {
    fflush(stdout);
    fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), e.what());
    return kExitFailure;
  } catch (...) {
    fflush(stdout);
    fprintf(stderr, "%s: error: an unknown exception ended the command\n", app.get_name().c_str());
    return kExitFailure;
  }
  return 0;
}

}  // namespace zoe::cli
