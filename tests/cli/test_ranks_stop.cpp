// A job of several ranks under mpirun on this host, one of whose ranks alone is signalled (a batch
// system signals them one at a time): every rank stops after the same step, within the heartbeat's
// bound (ZOE_COMM_TIMEOUT_S), each naming the signal and the rank it reached; SIGTERM's checkpoint
// is that step's and verifies. Before, the signalled rank stopped alone and waited in MPI_Finalize
// while the others waited for it in a collective: the job never ended (or a save of one rank met
// the other's step in MPI and crashed it). A rank that fails alone ends the job the same way.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/cli/run_zoe.h"

namespace {

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

using Clock = std::chrono::steady_clock;

// The heartbeat's bound for these runs (ZOE_COMM_TIMEOUT_S, seconds): the job must end within it.
constexpr int kBoundS = 10;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The parent of `pid` from /proc/PID/stat (0 when it is gone).
pid_t parent_of(pid_t pid) {
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  int ppid = 0;
  char state = 0;
  return sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 ? ppid : 0;
}

bool descends_from(pid_t pid, pid_t ancestor) {
  for (int depth = 0; pid > 1 && depth < 8; ++depth) {
    pid = parent_of(pid);
    if (pid == ancestor) return true;
  }
  return false;
}

#ifdef ZOE_MPIEXEC
// `mpirun -np N <shell wrapper> zoe ARGS...` in the background, stderr to a file. The wrapper
// runs `shell` first in each rank's shell (OMPI_COMM_WORLD_RANK names the rank there).
class MpiJob {
 public:
  MpiJob(int np, const std::vector<std::string>& args, const std::string& err_path,
         const std::string& shell = "")
      : err_path_(err_path) {
    std::string cmd = shell + " exec " + std::string(ZOE_BIN);
    for (const auto& a : args) cmd += " '" + a + "'";
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);  // a group of its own: the destructor ends mpirun and what it started
      int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDERR_FILENO);
      int null = open("/dev/null", O_WRONLY);
      dup2(null, STDOUT_FILENO);
      setenv("ZOE_COMM_TIMEOUT_S", std::to_string(kBoundS).c_str(), 1);
      setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
      const std::string np_s = std::to_string(np);
      execl(ZOE_MPIEXEC, ZOE_MPIEXEC, "--allow-run-as-root", "--bind-to", "none", "--mca", "btl",
            "self,vader", "-np", np_s.c_str(), "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~MpiJob() {
    if (pid_ > 0 && !reaped_) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string err() const { return read_text(err_path_); }
  // Waits (up to 120 s) until stderr holds `text`; false at once when the job ended first.
  bool wait_for(const std::string& text) {
    for (int i = 0; i < 1200; ++i) {
      if (err().find(text) != std::string::npos) return true;
      if (poll_exit()) return err().find(text) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  // The pid of rank r: a zoe process under mpirun whose environment says OMPI_COMM_WORLD_RANK=r.
  pid_t rank_pid(int r) const {
    const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(r);
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string name = e.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::error_code ec;
      if (std::filesystem::read_symlink(e.path() / "exe", ec) != std::filesystem::path(ZOE_BIN) || ec)
        continue;
      if (!descends_from(std::stoi(name), pid_)) continue;
      std::string env = read_text(e.path() / "environ");
      for (size_t at = 0; at < env.size();) {
        const size_t end = env.find('\0', at);
        if (env.compare(at, (end == std::string::npos ? env.size() : end) - at, want) == 0)
          return std::stoi(name);
        if (end == std::string::npos) break;
        at = end + 1;
      }
    }
    return -1;
  }
  // mpirun's exit code once it ended within `seconds`; -1 when it still runs then.
  int wait_exit(double seconds) {
    const auto t0 = Clock::now();
    while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds) {
      if (poll_exit()) return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }

 private:
  bool poll_exit() {
    if (!reaped_ && waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
    return reaped_;
  }
  std::string err_path_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

// The steps after which each rank said it stopped ("stopped by SIG after step N of").
std::vector<int> stopped_steps(const std::string& err, const std::string& sig) {
  std::vector<int> steps;
  const std::regex re("zoe: stopped by " + sig + " after step ([0-9]+) of ");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator(); ++it)
    steps.push_back(std::stoi((*it)[1]));
  return steps;
}

// Two ranks train; `sig` goes to rank 1 alone once training runs. Returns the job's stderr.
std::string signal_one_rank(int sig, const std::string& save_dir, int* rc, double* took) {
  zoe::test::ScratchDir d("ranks-stop");
  const std::string err_path = d.file("stderr");
  MpiJob job(2,
             {"train", "--preset", "tiny", "--seq", "16", "--eval-batches", "1", "--steps", "1000000",
              "--threads", "1", "--save-every", "20", "--save-dir", save_dir},
             err_path);
  EXPECT_TRUE(job.wait_for("step 3/")) << job.err();
  const pid_t rank1 = job.rank_pid(1);
  EXPECT_GT(rank1, 0) << "no zoe process of rank 1 under mpirun";
  const auto t0 = Clock::now();
  if (rank1 > 0) kill(rank1, sig);
  *rc = job.wait_exit(kBoundS);
  *took = std::chrono::duration<double>(Clock::now() - t0).count();
  return job.err();
}

TEST(RanksStop, SigtermToOneRankStopsEveryRankAfterTheSameStep) {
  zoe::test::ScratchDir d("ranks-term");
  int rc = -1;
  double took = 0;
  const std::string err = signal_one_rank(SIGTERM, d.file("ck"), &rc, &took);
  ASSERT_EQ(rc, 143) << "a SIGTERM to rank 1 alone: the job should end with 143 within " << kBoundS
                     << " s (ZOE_COMM_TIMEOUT_S); it "
                     << (rc < 0 ? "still ran" : "ended with " + std::to_string(rc)) << " after " << took
                     << " s:\n"
                     << err;
  // Both ranks stopped after the same step and say which rank the signal reached.
  const std::vector<int> steps = stopped_steps(err, "SIGTERM");
  ASSERT_EQ(steps.size(), 2u) << err;
  EXPECT_EQ(steps[0], steps[1]) << err;
  EXPECT_HAS(err, "(the signal reached rank 1 of 2; every rank stops after this step)");
  // SIGTERM's checkpoint is that step's, written by both ranks, and verifies.
  char tag[32];
  snprintf(tag, sizeof tag, "step-%06d", steps[0]);
  EXPECT_HAS(err, std::string("checkpoint ") + tag + " saved in " + d.file("ck"));
  EXPECT_EQ(read_text(d.file("ck/latest")).substr(0, 11), tag);
  CmdResult v = zoe("ckpt verify " + d.file("ck"));
  EXPECT_EQ(v.rc, 0) << v.out << v.err;
  EXPECT_HAS(v.out, "verified 2 files");
}

TEST(RanksStop, SigintToOneRankStopsEveryRankAfterTheSameStep) {
  zoe::test::ScratchDir d("ranks-int");
  int rc = -1;
  double took = 0;
  const std::string err = signal_one_rank(SIGINT, d.file("ck"), &rc, &took);
  ASSERT_EQ(rc, 130) << "a SIGINT to rank 1 alone: the job should end with 130 within " << kBoundS
                     << " s (ZOE_COMM_TIMEOUT_S); it "
                     << (rc < 0 ? "still ran" : "ended with " + std::to_string(rc)) << " after " << took
                     << " s:\n"
                     << err;
  const std::vector<int> steps = stopped_steps(err, "SIGINT");
  ASSERT_EQ(steps.size(), 2u) << err;
  EXPECT_EQ(steps[0], steps[1]) << err;
  EXPECT_HAS(err, "(the signal reached rank 1 of 2; every rank stops after this step)");
  EXPECT_EQ(err.find("checkpoint step-"), std::string::npos) << "SIGINT saves no checkpoint: " << err;
}

// A rank that fails alone (its swap file cut short under it: an I/O error of its own) leaves with
// exit status 1 while the other waits for it in the step's collective: that rank ends within the
// bound, naming it and its status. Before, the failed rank sat in MPI_Finalize and the job hung.
TEST(RanksStop, AnErrorOnOneRankEndsTheJobWithinTheBound) {
  zoe::test::ScratchDir d("ranks-err");
  std::filesystem::create_directories(d.file("nv/0"));
  std::filesystem::create_directories(d.file("nv/1"));
  MpiJob job(
      2,
      {"train", "--preset", "tiny", "--seq", "16", "--eval-batches", "1", "--steps", "1000000", "--threads",
       "1", "--offload", "nvme", "--device-budget", "1MiB", "--nvme-path", d.file("nv/{rank}")},
      d.file("stderr"));
  ASSERT_TRUE(job.wait_for("step 3/")) << job.err();
  int cut = 0;
  for (const auto& f : std::filesystem::directory_iterator(d.file("nv/1"))) {
    if (f.path().extension() == ".swap") cut += truncate(f.path().c_str(), 0) == 0;
  }
  ASSERT_GT(cut, 0) << "rank 1 has no swap file to cut";
  // Rank 1 reads the cut file within a step or two; the job ends kBoundS later.
  const int rc = job.wait_exit(kBoundS + 20);
  const std::string err = job.err();
  ASSERT_EQ(rc, 1) << "the job should end within " << kBoundS
                   << " s (ZOE_COMM_TIMEOUT_S) of rank 1's error; it "
                   << (rc < 0 ? "still ran" : "ended with " + std::to_string(rc)) << ":\n"
                   << err;
  EXPECT_HAS(err, "zoe: rank 0 (host ");
  EXPECT_HAS(err, "rank 1 (host ");
  EXPECT_HAS(err,
             "was lost: it left the job (exit status 1), and this rank has waited for it in a collective");
}
#endif

}  // namespace
