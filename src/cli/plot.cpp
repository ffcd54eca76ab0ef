// write_plot: the JSON to a temporary file, then python3 zoe_plot.py on it, its stderr captured.
#include "zoe/cli.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "zoe/files.h"

namespace zoe::cli {
namespace {

constexpr int kExitNoMatplotlib = 3;  // zoe_plot.py's exit code when matplotlib is missing

bool is_file(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string exe_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.find_last_of('/'));
}

Result<std::string> find_script() {
  const char* env = getenv("ZOE_PLOT_SCRIPT");
  if (env && *env) {
    if (!is_file(env)) return not_found("$ZOE_PLOT_SCRIPT %s is not a file", env);
    return std::string(env);
  }
  std::vector<std::string> tried;
#ifdef ZOE_PLOT_SCRIPT_DEFAULT
  tried.push_back(ZOE_PLOT_SCRIPT_DEFAULT);
#endif
  tried.push_back(exe_dir() + "/zoe_plot.py");
  std::string list;
  for (const auto& p : tried) {
    if (is_file(p)) return p;
    list += (list.empty() ? "" : ", ") + p;
  }
  return not_found("the plotting script zoe_plot.py is in none of %s (set $ZOE_PLOT_SCRIPT)", list.c_str());
}

// Runs `python script args...`, its stdout and stderr captured; `what` names the job in errors.
Status run_script(const std::vector<std::string>& script_args, const std::string& what) {
  const char* py_env = getenv("ZOE_PYTHON");
  const std::string python = py_env && *py_env ? py_env : "/usr/bin/python3";
  if (access(python.c_str(), X_OK) != 0) {
    return not_found(
        "%s needs python3 with matplotlib: %s is not an executable (%s); Debian: apt-get "
        "install python3 python3-matplotlib, or set $ZOE_PYTHON",
        what.c_str(), python.c_str(), strerror(errno));
  }
  ZOE_ASSIGN_OR_RETURN(std::string script, find_script());
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return sys_error("pipe", "(plot output)", errno);
  std::vector<std::string> args = {python, script};
  args.insert(args.end(), script_args.begin(), script_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return sys_error("fork", python, errno);
  }
  if (pid == 0) {
    dup2(pipefd[1], STDOUT_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    execv(python.c_str(), argv.data());
    _exit(127);
  }
  close(pipefd[1]);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = read(pipefd[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (out.size() < 16384) out.append(buf, static_cast<size_t>(n));
  }
  close(pipefd[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return Status::ok();
  if (WIFEXITED(st) && WEXITSTATUS(st) == kExitNoMatplotlib) {
    return unsupported(
        "%s needs matplotlib, which %s cannot import; Debian: apt-get install "
        "python3-matplotlib (%s)",
        what.c_str(), python.c_str(), out.c_str());
  }
  const std::string how = WIFEXITED(st) ? "exited " + std::to_string(WEXITSTATUS(st))
                                        : "was killed by signal " + std::to_string(WTERMSIG(st));
  return internal_error("%s: %s %s %s: %s", what.c_str(), python.c_str(), script.c_str(), how.c_str(),
                        out.empty() ? "(no output)" : out.c_str());
}

}  // namespace

Status plot_available() { return run_script({"--check"}, "plotting"); }

Status write_plot(const std::string& kind, const std::string& json_text, const std::string& png_path,
                  PlotSize size) {
  if (kind != "train" && kind != "bench-io" && kind != "tune") {
    return invalid_argument("write_plot: kind '%s': expected train, bench-io or tune", kind.c_str());
  }
  // The script draws into a temporary beside png_path, renamed over it once complete.
  ZOE_ASSIGN_OR_RETURN(OutputFile png, OutputFile::create(png_path, "plot"));
  ZOE_RETURN_IF_ERROR(png.close_temp());
  const char* tmpdir = getenv("TMPDIR");
  std::string tmpl = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/zoe-plot-XXXXXX.json";
  int fd = mkstemps(tmpl.data(), 5);
  if (fd < 0) return sys_error("mkstemps (the plot's JSON)", tmpl, errno);
  struct Unlink {
    std::string p;
    ~Unlink() { unlink(p.c_str()); }
  } unlink_json{tmpl};
  for (size_t done = 0; done < json_text.size();) {
    ssize_t n = write(fd, json_text.data() + done, json_text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = n < 0 ? errno : ENOSPC;
      close(fd);
      return sys_error("write", tmpl, done, json_text.size() - done, e);
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  ZOE_RETURN_IF_ERROR(run_script({"--kind", kind, "--width", std::to_string(size.width), "--height",
                                  std::to_string(size.height), tmpl, png.temp_path()},
                                 "plotting " + png_path));
  return png.commit();
}

}  // namespace zoe::cli
