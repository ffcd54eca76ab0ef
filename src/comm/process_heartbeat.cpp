// The process's heartbeat beside its first host communicator of several ranks (MpiComm under
// mpirun/srun, GlooComm under torchrun): set up once over the communicator's transport, and on a
// lost rank one line naming it and its host, this rank's swap files removed, and out at once (a
// collective would wait for the lost rank: forever under MPI, gloo's long timeout under torchrun).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/heartbeat.h"
#include "comm/ordered.h"
#include "core/log.h"

namespace zoe::comm {
namespace {

struct ProcessHeartbeat {
  std::mutex mu;
  bool tried = false;
  std::unique_ptr<Heartbeat> heartbeat;  // lives until exit
};

ProcessHeartbeat& process_heartbeat() {
  static ProcessHeartbeat* p = new ProcessHeartbeat();  // never destroyed: used from atexit
  return *p;
}

// ZOE_COMM_TIMEOUT_S: the heartbeat's timeout until a config sets zoe.comm_timeout_s; 0: no heartbeat.
double env_comm_timeout(int rank) {
  const char* env = getenv("ZOE_COMM_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return kDefaultCommTimeoutS;
  char* end = nullptr;
  const double v = strtod(env, &end);
  if (end == env || *end != '\0' || !(v >= 0) || v > 86400) {
    if (rank == 0) {
      ZOE_LOG_WARN("ZOE_COMM_TIMEOUT_S=%s is not a number of seconds in [0, 86400]; using %g", env,
                   kDefaultCommTimeoutS);
    }
    return kDefaultCommTimeoutS;
  }
  return v;
}

void exit_for_lost_rank(int rank, const std::string& host, const LostRank& lost) {
  const size_t removed = run_lost_rank_cleanup();
  fprintf(stderr,
          "zoe: rank %d (host %s): rank %d (host %s) was lost: %s; removed %zu swap file(s); exiting\n", rank,
          host.c_str(), lost.rank, lost.host.c_str(), lost.why.c_str(), removed);
  fflush(stderr);
  _exit(1);
}

void stop_heartbeat_at_exit() {
  ProcessHeartbeat& p = process_heartbeat();
  std::unique_ptr<Heartbeat> hb;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    hb = std::move(p.heartbeat);
  }
  set_live_heartbeat(nullptr);
  if (hb) hb->stop();  // a goodbye: a rank that leaves normally is not lost
}

// The setup's three exchanges over the transport's byte collectives.
HeartbeatExchange exchange_over(ByteTransport& t, int rank, int size) {
  HeartbeatExchange ex;
  ex.share_from_rank0 = [&t](std::string* text) -> Status {
    uint64_t len = text->size();
    ZOE_RETURN_IF_ERROR(t.broadcast(&len, sizeof len, 0));
    text->resize(static_cast<size_t>(len));
    return len == 0 ? Status::ok() : t.broadcast(text->data(), text->size(), 0);
  };
  ex.gather_hosts = [&t, rank, size](const std::string& mine, std::vector<std::string>* all) -> Status {
    std::vector<char> buf(static_cast<size_t>(size) * 256, '\0');
    std::memcpy(buf.data() + static_cast<size_t>(rank) * 256, mine.data(),
                std::min<size_t>(mine.size(), 255));
    ZOE_RETURN_IF_ERROR(t.all_gather(buf.data() + static_cast<size_t>(rank) * 256, buf.data(), 256));
    all->clear();
    for (int r = 0; r < size; ++r) all->emplace_back(buf.data() + static_cast<size_t>(r) * 256);
    return Status::ok();
  };
  ex.all_ok = [&t, rank, size](bool mine, bool* all) -> Status {
    std::vector<char> oks(static_cast<size_t>(size), 0);
    oks[static_cast<size_t>(rank)] = mine ? 1 : 0;
    ZOE_RETURN_IF_ERROR(t.all_gather(oks.data() + rank, oks.data(), 1));
    *all = std::all_of(oks.begin(), oks.end(), [](char c) { return c != 0; });
    return Status::ok();
  };
  return ex;
}

}  // namespace

void start_process_heartbeat(ByteTransport& t, int rank, int size) {
  ProcessHeartbeat& p = process_heartbeat();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.tried || size <= 1) return;
  p.tried = true;
  HeartbeatOptions o;
  o.timeout_s = env_comm_timeout(rank);
  o.waiting_since = [] { return WaitingInCollective::since(); };
  if (o.timeout_s <= 0) return;  // every rank reads the same environment
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  const std::string host = name;
  auto hb = Heartbeat::start(rank, size, host, exchange_over(t, rank, size), o,
                             [rank, host](const LostRank& lost) { exit_for_lost_rank(rank, host, lost); });
  if (!hb.is_ok()) {
    if (rank == 0) {
      ZOE_LOG_WARN("%s; a lost rank will not be detected (set ZOE_COMM_TIMEOUT_S=0 to skip the heartbeat)",
                   hb.status().message().c_str());
    }
    return;
  }
  p.heartbeat = std::move(hb).value();
  set_live_heartbeat(p.heartbeat.get());
  std::atexit(stop_heartbeat_at_exit);
}

}  // namespace zoe::comm
