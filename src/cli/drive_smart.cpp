// `zoe info`'s drive: see drive_smart.h.
#include "cli/drive_smart.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/units.h"
#include "zoe/cli.h"

namespace zoe::cli {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// How long one SMART query may take before it is stopped: `zoe info` stays fast.
constexpr int kSmartTimeoutMs = 3000;
// NVMe's data units: thousands of 512-byte units.
constexpr double kNvmeDataUnit = 512000.0;

struct Disk {
  std::string name;  // "nvme0n1", "vda", "sda" (the whole disk, not a partition)
  std::string sys;   // its /sys/devices path
  std::string why;   // where there is no disk: why
};

// The whole disk holding `path`: its device number's /sys/dev/block entry, a partition's parent,
// and a device-mapper volume's first underlying device.
Disk disk_of(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return {"", "", fmt("%s: %s", path.c_str(), strerror(errno))};
  if (major(st.st_dev) == 0) {
    return {"", "",
            fmt("%s is on a file system with no block device (tmpfs, overlay, a network file system)",
                path.c_str())};
  }
  std::error_code ec;
  fs::path p = fs::canonical(fmt("/sys/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev)), ec);
  for (int depth = 0; !ec && depth < 4; ++depth) {
    if (fs::exists(p / "partition")) p = p.parent_path();
    const fs::path slaves = p / "slaves";
    if (!fs::is_directory(slaves, ec) || fs::is_empty(slaves, ec)) break;
    p = fs::canonical(fs::directory_iterator(slaves)->path(), ec);  // dm/md: the first device under it
  }
  if (ec) return {"", "", fmt("%s: no block device found in /sys (%s)", path.c_str(), ec.message().c_str())};
  return {p.filename().string(), p.string(), ""};
}

// `name` on $PATH, or "" where it is not installed.
std::string find_program(const std::string& name) {
  const char* env = getenv("PATH");
  std::string dirs = env ? env : "/usr/sbin:/usr/bin:/sbin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string file = dirs.substr(start, end - start) + "/" + name;
    if (end > start && access(file.c_str(), X_OK) == 0) return file;
    start = end + 1;
  }
  return "";
}

// Runs argv with stdin from /dev/null and stderr discarded; its stdout in *out. Stopped (SIGKILL)
// after kSmartTimeoutMs. "" on exit code 0 (smartctl's bit mask is read by the caller), else why.
std::string run_program(const std::vector<std::string>& argv, std::string* out, int* rc) {
  int fd[2];
  if (pipe2(fd, O_CLOEXEC) != 0) return fmt("pipe: %s", strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) return fmt("fork: %s", strerror(errno));
  if (pid == 0) {
    const int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(fd[1], 1);
    dup2(null, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fd[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kSmartTimeoutMs);
  bool late = false;
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    struct pollfd p = {fd[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) == 0) {
      late = true;
      break;
    }
    const ssize_t n = read(fd[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  close(fd[0]);
  if (late) kill(pid, SIGKILL);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (late) return fmt("%s did not answer within %d s", argv[0].c_str(), kSmartTimeoutMs / 1000);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return "";
}

// The figures of nvme-cli's `smart-log -o json` or smartctl's NVMe health log (data units written,
// percentage used) into *d; false where they are not there.
bool nvme_figures(const json& log, const char* used_key, json* d) {
  if (!log.is_object() || !log.contains("data_units_written") || !log["data_units_written"].is_number())
    return false;
  const double written = log["data_units_written"].get<double>() * kNvmeDataUnit;
  (*d)["bytes_written"] = written;
  if (log.contains(used_key) && log[used_key].is_number()) {
    const double used = log[used_key].get<double>() / 100.0;
    (*d)["endurance_used"] = used;
    if (used >= 0.01) (*d)["rated_bytes_written"] = written / used;
  }
  return true;
}

// smartctl's ATA attributes: Total_LBAs_Written (241) in 512-byte sectors.
bool ata_figures(const json& s, json* d) {
  if (!s.contains("ata_smart_attributes")) return false;
  for (const json& a : s["ata_smart_attributes"].value("table", json::array())) {
    if (a.value("id", 0) == 241 && a.contains("raw")) {
      (*d)["bytes_written"] = a["raw"].value("value", 0.0) * 512.0;
      return true;
    }
  }
  return false;
}

// Asks nvme-cli (an NVMe disk) or smartctl; "" where *d got figures, else why not.
std::string query_smart(const Disk& disk, json* d) {
  const std::string dev = "/dev/" + disk.name;
  const std::string nvme = find_program("nvme"), smartctl = find_program("smartctl");
  if (nvme.empty() && smartctl.empty()) return "nvme-cli and smartctl are not installed";
  std::string why;
  if (!nvme.empty() && disk.name.rfind("nvme", 0) == 0) {
    std::string out;
    int rc = -1;
    why = run_program({nvme, "smart-log", dev, "-o", "json"}, &out, &rc);
    const json log = json::parse(out, nullptr, false);
    const char* used =
        log.is_object() && log.contains("percentage_used") ? "percentage_used" : "percent_used";
    if (why.empty() && rc == 0 && nvme_figures(log, used, d)) {
      (*d)["smart"] = "nvme-cli";
      return "";
    }
    if (why.empty()) why = fmt("nvme smart-log %s failed (exit %d; it needs root)", dev.c_str(), rc);
  }
  if (smartctl.empty()) return why.empty() ? "smartctl is not installed" : why;
  std::string out;
  int rc = -1;
  const std::string w = run_program({smartctl, "-a", "--json", dev}, &out, &rc);
  const json s = json::parse(out, nullptr, false);
  if (w.empty() && s.is_object() &&
      (nvme_figures(s.value("nvme_smart_health_information_log", json()), "percentage_used", d) ||
       ata_figures(s, d))) {
    (*d)["smart"] = "smartctl";
    return "";
  }
  if (!w.empty()) return w;
  std::string msg;
  if (s.is_object() && s.contains("smartctl") && s["smartctl"].contains("messages")) {
    for (const json& m : s["smartctl"]["messages"]) msg += (msg.empty() ? "" : "; ") + m.value("string", "");
  }
  return fmt("smartctl -a %s gave no wear figures (exit %d%s%s)", dev.c_str(), rc, msg.empty() ? "" : ": ",
             msg.c_str());
}

}  // namespace

json drive_json(const std::string& path) {
  json d = {{"path", path},
            {"device", nullptr},
            {"smart", nullptr},
            {"reason", nullptr},
            {"bytes_written", nullptr},
            {"endurance_used", nullptr},
            {"rated_bytes_written", nullptr}};
  const Disk disk = disk_of(path);
  if (!disk.why.empty()) {
    d["reason"] = "no SMART data: " + disk.why;
    return d;
  }
  d["device"] = "/dev/" + disk.name;
  std::string kind;
  if (disk.sys.find("/virtio") != std::string::npos) kind = "a virtio disk";
  if (disk.name.rfind("loop", 0) == 0) kind = "a loop device";
  if (disk.name.rfind("zram", 0) == 0 || disk.name.rfind("ram", 0) == 0) kind = "a RAM disk";
  if (!kind.empty()) {
    d["reason"] = fmt("no SMART data: %s is %s", d["device"].get<std::string>().c_str(), kind.c_str());
    return d;
  }
  const std::string why = query_smart(disk, &d);
  if (!why.empty()) d["reason"] = "no SMART data: " + why;
  return d;
}

std::string drive_line(const json& d) {
  const std::string dev = d["device"].is_string() ? d["device"].get<std::string>() : std::string("-");
  std::string s = fmt("drive      %s (%s): ", d["path"].get<std::string>().c_str(), dev.c_str());
  if (!d["smart"].is_string()) return s + d["reason"].get<std::string>();
  s += fmt("%.4g TB written", d["bytes_written"].get<double>() / 1e12);
  if (d["endurance_used"].is_number())
    s += fmt(", %.0f%% of its rated endurance used", 100 * d["endurance_used"].get<double>());
  if (d["rated_bytes_written"].is_number())
    s += fmt(" (rated about %.4g TB written)", d["rated_bytes_written"].get<double>() / 1e12);
  return s + fmt(" (SMART, %s)", d["smart"].get<std::string>().c_str());
}

}  // namespace zoe::cli
