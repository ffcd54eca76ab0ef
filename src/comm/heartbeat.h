// Heartbeat: lost-rank detection beside MPI, on a TCP channel of its own. MPI's collectives have no
// timeout: a rank whose node is lost (killed, or its link down) leaves the others waiting forever
// in MPI_Allgather. Each rank's heartbeat thread exchanges a small message with rank 0 every
// interval (a star: rank 0 accepts one connection from every other rank); a peer silent for
// timeout_s, or whose connection closes without saying goodbye, is lost. Rank 0 relays a loss to
// every other rank, so a rank that does not watch the lost one learns of it too. The thread does
// nothing but socket I/O, so a long step (an NVMe stall, a slow optimizer) never looks like a loss.
//
// A rank that leaves says goodbye, with its exit status and the signal that stopped it where its
// program said them (set_departure); rank 0 relays a goodbye to the other ranks. A goodbye is not a
// loss by itself (the ranks of a finished job leave one by one), but a rank that has waited in a
// collective for timeout_s since a peer left waits for a rank that will never come: that peer is
// lost too (a rank that failed alone, or stopped alone, and sits in MPI_Finalize).
//
// On a loss the handler runs once, on the heartbeat thread (MpiComm's prints one line naming the
// lost rank and its host, removes the swap files through the cleanup hook and ends the job).
// Thread-safe: set_timeout, set_departure and stop may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "zoe/status.h"

namespace zoe::comm {

// The default of zoe.comm_timeout_s (and ZOE_COMM_TIMEOUT_S): seconds of silence after which a rank
// is lost. Long enough for a stalled node's kernel to answer, short enough to end a dead job well
// within a minute.
constexpr double kDefaultCommTimeoutS = 30.0;

struct LostRank {
  int rank = -1;         // the lost rank
  std::string host;      // its hostname (as it reported it at start)
  std::string why;       // "no heartbeat for 30 s" / "its connection closed"
  bool relayed = false;  // learned from rank 0 rather than seen here
};

struct HeartbeatOptions {
  double timeout_s = kDefaultCommTimeoutS;  // > 0
  double interval_s = 0;                    // 0: timeout_s / 10, at most 1 s and at least 10 ms
  double connect_timeout_s = 30;            // setting up: rank 0 waits this long for every other rank
  // Since when this rank has waited in a collective (steady-clock ns; 0: it does not wait in one
  // now). Empty: never (a peer that left is then not watched).
  std::function<int64_t()> waiting_since;
};

// What a rank's goodbye says about how its program ended (-1 / 0: not said).
struct Departure {
  int exit_status = -1;  // 0..255
  int signal = 0;        // the signal that stopped it (SIGINT, SIGTERM), 0: none
};
// "exit status 1", "stopped by SIGTERM, exit status 143", "" when nothing was said.
std::string describe_departure(const Departure& d);

// How the ranks set the channel up; MPI in production, threads of one process in tests.
struct HeartbeatExchange {
  // Rank 0's text (its port and addresses) to every rank: rank 0 passes its own, the others get it.
  std::function<Status(std::string* text)> share_from_rank0;
  // Every rank's hostname, in rank order (the caller's own at index rank).
  std::function<Status(const std::string& mine, std::vector<std::string>* all)> gather_hosts;
  // true on every rank when every rank passes true.
  std::function<Status(bool mine, bool* all)> all_ok;
};

class Heartbeat {
 public:
  using LostHandler = std::function<void(const LostRank&)>;
  // Collective: every rank calls it. Fails (on every rank) when a rank cannot reach rank 0.
  static Result<std::unique_ptr<Heartbeat>> start(int rank, int size, const std::string& host,
                                                  const HeartbeatExchange& exchange,
                                                  const HeartbeatOptions& options, LostHandler on_lost);
  ~Heartbeat();  // stop()
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Says goodbye to the peers (a rank that leaves normally is not lost) and joins the thread.
  void stop();
  // From now on a peer silent for `seconds` is lost (> 0).
  void set_timeout(double seconds);
  // What this rank's goodbye will say.
  void set_departure(const Departure& d);
  double timeout() const { return timeout_s_.load(); }
  const std::vector<std::string>& hosts() const { return hosts_; }

  // Tests: stop sending and reading (a link gone down, seen from the peers), or close every
  // connection at once without a goodbye (a killed process).
  void go_silent_for_test() { silent_.store(true); }
  void drop_for_test();

 private:
  Heartbeat(int rank, int size, std::vector<std::string> hosts, const HeartbeatOptions& options,
            LostHandler on_lost);
  Status accept_all(int listen_fd, const std::string& why_not);
  Status connect_to_rank0(const std::string& text, bool same_host);
  void run();
  void send_all(char type, int32_t about);
  struct Peer;
  bool read_peer(size_t i, int64_t now_ns);
  bool take_frames(Peer& p);
  void declare_lost(int peer, const std::string& why, bool relayed);
  void note_left(int peer, const Departure& d, bool relayed);
  void check_waiting_for_left(int64_t now, double timeout);
  // Why the peer that left (left_) is lost: its departure, and the wait since `from`.
  std::string left_reason(int64_t now, int64_t from, double timeout) const;
  void close_all();

  const int rank_, size_;
  const std::vector<std::string> hosts_;
  const HeartbeatOptions options_;
  const LostHandler on_lost_;
  std::atomic<double> timeout_s_;
  std::atomic<bool> stopping_{false}, silent_{false}, lost_{false};
  int wake_[2] = {-1, -1};  // a pipe: stop() wakes the thread's poll
  // The peers: rank 0 has size-1 (ranks 1..size-1), the others one (rank 0). Thread only after start.
  struct Peer {
    int fd = -1;
    int rank = -1;
    int64_t last_ns = 0;  // when it last spoke
    bool done = false;    // said goodbye, or lost: no longer watched
    std::string pending;  // a partial message
  };
  std::vector<Peer> peers_;
  std::unique_ptr<std::thread> thread_;
  std::atomic<int> departure_code_{-1}, departure_signal_{0};
  // The first peer that left (thread only): its rank (-1: none yet), when, and what it said.
  struct Left {
    int rank = -1;
    int64_t at_ns = 0;
    Departure how;
    bool relayed = false;
  } left_;
};

class ByteTransport;
// The process's heartbeat beside its first host communicator of several ranks (MpiComm, GlooComm),
// started once over that communicator's transport `t` (collective: every rank calls it, before the
// communicator's worker uses `t`). ZOE_COMM_TIMEOUT_S (default kDefaultCommTimeoutS; 0: none) is its
// timeout until a config sets zoe.comm_timeout_s. When it cannot be set up the run goes on without
// it and rank 0 warns. On a loss: one line naming the lost rank and its host, this rank's swap
// files removed (set_lost_rank_cleanup), and _exit(1).
void start_process_heartbeat(ByteTransport& t, int rank, int size);
// The process's heartbeat (MpiComm starts one with the first communicator), for the functions
// below; nullptr: none.
void set_live_heartbeat(Heartbeat* hb);

// The loss handler MpiComm installs calls this before it exits (the Runtime sets it to remove the
// process's swap files); it returns how many files it removed.
void set_lost_rank_cleanup(size_t (*cleanup)());
// Runs the cleanup hook (0 without one).
size_t run_lost_rank_cleanup();
// What the live heartbeat's goodbye will say (a program's last words: its exit status, and the
// signal that stopped it). Without a live heartbeat, nothing.
void set_departure(const Departure& d);
// Collectives mark the time this process waits in them (the heartbeat's waiting_since under MPI):
// one guard around each blocking collective call, on any thread.
class WaitingInCollective {
 public:
  WaitingInCollective();
  ~WaitingInCollective();
  WaitingInCollective(const WaitingInCollective&) = delete;
  WaitingInCollective& operator=(const WaitingInCollective&) = delete;
  // Since when this process has waited in at least one collective (steady-clock ns); 0: none now.
  static int64_t since();
};
// zoe.comm_timeout_s of a config: the live heartbeat's timeout from now on (0 stops watching).
void set_comm_timeout(double seconds);
// The heartbeat's timeout in effect now; 0 when there is no heartbeat (one rank, no MPI, or
// ZOE_COMM_TIMEOUT_S=0).
double comm_timeout();

}  // namespace zoe::comm
