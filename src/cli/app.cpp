// The CLI frame's registry of commands and run(): zoe's common options, parsing, and the one place
// where a command's error becomes a message and an exit code.
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
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

// A thread that could not start (std::thread's EAGAIN), or another resource the system refused:
// what failed and the limit to change.
std::string system_error_message(const std::system_error& e) {
  const int err = e.code().value();
  std::string m = e.what();
  if (err != EAGAIN) {
    return m + " (errno " + std::to_string(err) +
           "): out of a system resource; the process may be at its address-space limit (ulimit -v)";
  }
  m = "could not start a thread (" + m + ", errno " + std::to_string(err) + "): ";
  struct rlimit nproc {};
  if (getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY) {
    m += "this user may run at most " + std::to_string(nproc.rlim_cur) +
         " processes and threads together (ulimit -u), and zoe needs a few threads more than that leaves; "
         "raise the limit (ulimit -u, or nproc in /etc/security/limits.conf) or end some of this user's "
         "processes";
  } else {
    m += "the system refused a new thread; raise the thread limits (ulimit -u, "
         "/proc/sys/kernel/threads-max) or the address-space limit (ulimit -v)";
  }
  return m;
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
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // CLI11's own refusals (a value it cannot convert, a missing or unknown option) carry the same
    // prefix as every other error.
    fflush(stdout);
    fprintf(stderr, "%s: error: %s\nRun with --help for more information.\n", app.get_name().c_str(),
            e.what());
    return kExitUsage;
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
    fflush(stdout);
    fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), system_error_message(e).c_str());
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
