// Heartbeat: the TCP star beside MPI that finds a lost rank (see heartbeat.h).
#include "comm/heartbeat.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>

namespace zoe::comm {

namespace {

// Every message is one frame: a type, a flag, two bytes and a rank.
constexpr size_t kFrame = 8;
constexpr char kBeat = 'H';  // about = the sender's rank (the first one also says who connected)
constexpr char kBye = 'B';   // the sender leaves; flag: its signal, bytes 2-3: its exit status if said
constexpr char kLeft = 'G';  // rank 0 relays: rank `about` left; the rest as in its goodbye
constexpr char kLost = 'L';  // rank 0 relays: rank `about` is lost; flag 1: its connection closed

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string frame(char type, char flag, int32_t about) {
  std::string f(kFrame, '\0');
  f[0] = type;
  f[1] = flag;
  std::memcpy(&f[4], &about, sizeof about);
  return f;
}

// A goodbye (kBye, or rank 0's kLeft relaying one) carrying how the program ended.
std::string departure_frame(char type, int32_t about, const Departure& d) {
  std::string f = frame(type, static_cast<char>(d.signal & 0x7f), about);
  f[2] = d.exit_status >= 0 ? 1 : 0;
  f[3] = static_cast<char>(d.exit_status >= 0 ? d.exit_status & 0xff : 0);
  return f;
}

Departure frame_departure(const std::string& f) {
  Departure d;
  d.signal = static_cast<unsigned char>(f[1]);
  if (f[2] & 1) d.exit_status = static_cast<unsigned char>(f[3]);
  return d;
}

Status sys_error(const char* what) {
  const int err = errno;
  return Status(StatusCode::kIoError, std::string("heartbeat: ") + what + ": " + strerror(err), err);
}

// The IPv4 addresses of this host's interfaces that are up, loopback last.
std::vector<std::string> local_addresses() {
  std::vector<std::string> out, loop;
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {"127.0.0.1"};
  for (struct ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<struct sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    ((a->ifa_flags & IFF_LOOPBACK) ? loop : out).push_back(text);
  }
  freeifaddrs(list);
  out.insert(out.end(), loop.begin(), loop.end());
  return out;
}

// Rank 0's listening socket on every interface, an ephemeral port.
Result<int> listen_any(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return sys_error("socket");
  struct sockaddr_in a {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<struct sockaddr*>(&a), sizeof a) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<struct sockaddr*>(&a), &len) != 0) {
    Status s = sys_error("bind/listen on an ephemeral port");
    close(fd);
    return s;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// A non-blocking connect to addr:port that gives up after timeout_s. -1 when it fails.
int connect_within(const std::string& addr, int port, double timeout_s) {
  struct sockaddr_in a {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, addr.c_str(), &a.sin_addr) != 1) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<struct sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINPROGRESS) {
      close(fd);
      return -1;
    }
    struct pollfd p {
      fd, POLLOUT, 0
    };
    int err = 0;
    socklen_t len = sizeof err;
    if (poll(&p, 1, static_cast<int>(timeout_s * 1000)) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      close(fd);
      return -1;
    }
  }
  return fd;
}

void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Reads exactly one frame from a blocking-with-deadline socket (setting up only).
bool read_frame_within(int fd, std::string* out, double timeout_s) {
  out->clear();
  const int64_t deadline = now_ns() + static_cast<int64_t>(timeout_s * 1e9);
  char buf[kFrame];
  while (out->size() < kFrame) {
    struct pollfd p {
      fd, POLLIN, 0
    };
    const int64_t left_ms = (deadline - now_ns()) / 1000000;
    if (left_ms <= 0 || poll(&p, 1, static_cast<int>(left_ms)) != 1) return false;
    ssize_t n = recv(fd, buf, kFrame - out->size(), 0);
    if (n <= 0) return false;
    out->append(buf, static_cast<size_t>(n));
  }
  return true;
}

int32_t frame_about(const std::string& f) {
  int32_t about = 0;
  std::memcpy(&about, f.data() + 4, sizeof about);
  return about;
}

}  // namespace

Heartbeat::Heartbeat(int rank, int size, std::vector<std::string> hosts, const HeartbeatOptions& options,
                     LostHandler on_lost)
    : rank_(rank),
      size_(size),
      hosts_(std::move(hosts)),
      options_(options),
      on_lost_(std::move(on_lost)),
      timeout_s_(options.timeout_s) {}

Heartbeat::~Heartbeat() { stop(); }

Result<std::unique_ptr<Heartbeat>> Heartbeat::start(int rank, int size, const std::string& host,
                                                    const HeartbeatExchange& ex,
                                                    const HeartbeatOptions& options, LostHandler on_lost) {
  std::vector<std::string> hosts;
  ZOE_RETURN_IF_ERROR(ex.gather_hosts(host, &hosts));
  std::unique_ptr<Heartbeat> hb(new Heartbeat(rank, size, hosts, options, std::move(on_lost)));
  // Rank 0 listens and says where; the others connect to the first address that answers (the
  // loopback first when they share rank 0's host).
  int listen_fd = -1, port = 0;
  std::string text;
  std::string why;
  if (rank == 0) {
    auto l = listen_any(&port);
    if (l.is_ok()) {
      listen_fd = l.value();
      std::ostringstream os;
      os << port;
      for (const auto& a : local_addresses()) os << ' ' << a;
      text = os.str();
    } else {
      why = l.status().message();
    }
  }
  ZOE_RETURN_IF_ERROR(ex.share_from_rank0(&text));
  Status setup = rank == 0 ? hb->accept_all(listen_fd, text.empty() ? why : "")
                           : hb->connect_to_rank0(text, hosts[0] == host);
  if (listen_fd >= 0) close(listen_fd);
  bool all = false;
  ZOE_RETURN_IF_ERROR(ex.all_ok(setup.is_ok(), &all));
  if (!setup.is_ok()) return setup;
  if (!all) {
    return make_status(StatusCode::kIoError, "heartbeat: another rank could not reach rank 0 (on %s)",
                       hosts[0].c_str());
  }
  if (pipe2(hb->wake_, O_CLOEXEC | O_NONBLOCK) != 0) return sys_error("pipe2");
  hb->thread_ = std::make_unique<std::thread>([p = hb.get()] { p->run(); });
  return hb;
}

Status Heartbeat::accept_all(int listen_fd, const std::string& why_not) {
  if (listen_fd < 0)
    return make_status(StatusCode::kIoError, "heartbeat: rank 0 cannot listen: %s", why_not.c_str());
  const int64_t deadline = now_ns() + static_cast<int64_t>(options_.connect_timeout_s * 1e9);
  std::vector<bool> seen(size_, false);
  for (int got = 1; got < size_;) {
    struct pollfd p {
      listen_fd, POLLIN, 0
    };
    const int64_t left_ms = (deadline - now_ns()) / 1000000;
    if (left_ms <= 0 || poll(&p, 1, static_cast<int>(left_ms)) != 1) {
      return make_status(StatusCode::kIoError,
                         "heartbeat: only %d of the %d other ranks connected to rank 0 within %.0f s",
                         got - 1, size_ - 1, options_.connect_timeout_s);
    }
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::string f;
    const int32_t who =
        read_frame_within(fd, &f, options_.connect_timeout_s) && f[0] == kBeat ? frame_about(f) : -1;
    if (who <= 0 || who >= size_ || seen[who]) {
      close(fd);  // not one of ours
      continue;
    }
    seen[who] = true;
    tune_socket(fd);
    peers_.push_back(Peer{fd, who, now_ns(), false, {}});
    ++got;
  }
  return Status::ok();
}

Status Heartbeat::connect_to_rank0(const std::string& text, bool same_host) {
  std::istringstream is(text);
  int port = 0;
  std::vector<std::string> addrs;
  if (!(is >> port)) return make_status(StatusCode::kIoError, "heartbeat: rank 0 gave no address");
  for (std::string a; is >> a;) addrs.push_back(a);
  if (same_host) addrs.insert(addrs.begin(), "127.0.0.1");
  const int64_t deadline = now_ns() + static_cast<int64_t>(options_.connect_timeout_s * 1e9);
  while (now_ns() < deadline) {
    for (const auto& a : addrs) {
      int fd = connect_within(a, port, 2.0);
      if (fd < 0) continue;
      const std::string hello = frame(kBeat, 0, rank_);
      if (send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) {
        close(fd);
        continue;
      }
      tune_socket(fd);
      peers_.push_back(Peer{fd, 0, now_ns(), false, {}});
      return Status::ok();
    }
    usleep(100000);
  }
  return make_status(StatusCode::kIoError,
                     "heartbeat: rank %d cannot reach rank 0 on %s at port %d (addresses %s)", rank_,
                     hosts_[0].c_str(), port, text.c_str());
}

void Heartbeat::send_all(char type, int32_t about) {
  const std::string f = frame(type, 0, about);
  for (auto& p : peers_) {
    // A full buffer (the link is down) drops the frame: silence is what the peer should see.
    if (p.fd >= 0 && !p.done) (void)!send(p.fd, f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

// Takes the whole frames of peer i's input. false when a loss was declared.
bool Heartbeat::take_frames(Peer& p) {
  while (p.pending.size() >= kFrame && !p.done) {
    const std::string f = p.pending.substr(0, kFrame);
    p.pending.erase(0, kFrame);
    if (f[0] == kBye) {
      p.done = true;
      note_left(p.rank, frame_departure(f), false);
    } else if (f[0] == kLeft && p.rank == 0) {
      note_left(frame_about(f), frame_departure(f), true);
    } else if (f[0] == kLost && p.rank == 0 && frame_about(f) == left_.rank) {
      // Rank 0 lost a rank this one knows left: the reason is its departure, said here as rank 0
      // said it (the two time out together; either may speak first).
      declare_lost(left_.rank, left_reason(now_ns(), left_.at_ns, timeout_s_.load()), true);
      return false;
    } else if (f[0] == kLost && p.rank == 0) {
      declare_lost(frame_about(f),
                   f[1] ? "rank 0 saw its connection close (the process ended)"
                        : "rank 0 heard no heartbeat from it within zoe.comm_timeout_s",
                   true);
      return false;
    }
  }
  return true;
}

// Reads what peer i sent. false when a loss was declared (it closed without a goodbye, or rank 0
// relayed one).
bool Heartbeat::read_peer(size_t i, int64_t now) {
  Peer& p = peers_[i];
  char buf[256];
  for (;;) {
    ssize_t n = recv(p.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      p.pending.append(buf, static_cast<size_t>(n));
      p.last_ns = now;
      if (!take_frames(p)) return false;
      if (p.done) return true;  // a goodbye: what follows is its close
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n < 0 && errno == EINTR) continue;
    // EOF or a reset without a goodbye: the process is gone.
    declare_lost(p.rank, "its connection closed (the process ended)", false);
    return false;
  }
}

// A peer said goodbye (or rank 0 relays one). Rank 0 tells the others: a collective of theirs
// waits for that peer too. The first one is watched (check_waiting_for_left).
void Heartbeat::note_left(int peer, const Departure& d, bool relayed) {
  if (rank_ == 0 && !relayed) {
    const std::string f = departure_frame(kLeft, peer, d);
    for (auto& p : peers_) {
      if (p.rank != peer && p.fd >= 0 && !p.done)
        (void)!send(p.fd, f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }
  if (left_.rank >= 0 || peer < 0 || peer >= size_) return;
  left_.rank = peer;
  left_.at_ns = now_ns();
  left_.how = d;
  left_.relayed = relayed;
}

// A peer left and this rank has waited in a collective for the timeout since then: the collective
// waits for a rank that will not come (it left alone: an error of its own, or a stop of its own).
void Heartbeat::check_waiting_for_left(int64_t now, double timeout) {
  if (left_.rank < 0 || timeout <= 0 || !options_.waiting_since) return;
  const int64_t since = options_.waiting_since();
  if (since == 0) return;
  const int64_t from = std::max(since, left_.at_ns);
  if (static_cast<double>(now - from) * 1e-9 <= timeout) return;
  declare_lost(left_.rank, left_reason(now, from, timeout), left_.relayed);
}

std::string Heartbeat::left_reason(int64_t now, int64_t from, double timeout) const {
  const std::string how = describe_departure(left_.how);
  char why[320];
  snprintf(why, sizeof why,
           "it left the job%s%s%s, and this rank has waited for it in a collective for %.1f s since it left "
           "(zoe.comm_timeout_s is %g)",
           how.empty() ? "" : " (", how.c_str(), how.empty() ? "" : ")",
           static_cast<double>(now - from) * 1e-9, timeout);
  return why;
}

void Heartbeat::declare_lost(int peer, const std::string& why, bool relayed) {
  if (lost_.exchange(true)) return;
  if (rank_ == 0) {
    // Everyone else learns it from here: their collectives wait for the lost rank too.
    const std::string f = frame(kLost, why.find("closed") != std::string::npos ? 1 : 0, peer);
    for (auto& p : peers_) {
      if (p.rank != peer && p.fd >= 0 && !p.done)
        (void)!send(p.fd, f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    // No wait: the kernel sends what send() took even after the process exits, ahead of the close.
  }
  LostRank l;
  l.rank = peer;
  l.host = peer >= 0 && peer < static_cast<int>(hosts_.size()) ? hosts_[peer] : "?";
  l.why = why;
  l.relayed = relayed;
  if (on_lost_) on_lost_(l);
}

void Heartbeat::run() {
  int64_t next_send = 0;
  std::vector<struct pollfd> fds;
  while (!stopping_.load() && !lost_.load()) {
    const double t = timeout_s_.load();
    const double interval = options_.interval_s > 0 ? options_.interval_s
                            : t > 0                 ? std::clamp(t / 10.0, 0.01, 1.0)
                                                    : 1.0;
    const int64_t now = now_ns();
    const bool silent = silent_.load();
    if (!silent && now >= next_send) {
      send_all(kBeat, rank_);
      next_send = now + static_cast<int64_t>(interval * 1e9);
    }
    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    for (const auto& p : peers_) fds.push_back(pollfd{p.done || silent ? -1 : p.fd, POLLIN, 0});
    const int wait_ms = static_cast<int>(std::max<int64_t>(1, (next_send - now) / 1000000));
    if (poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) break;
    if (silent) continue;
    const int64_t after = now_ns();
    for (size_t i = 0; i < peers_.size() && !lost_.load(); ++i) {
      if (!peers_[i].done && (fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) read_peer(i, after);
    }
    const double timeout = timeout_s_.load();
    for (size_t i = 0; i < peers_.size() && !lost_.load() && timeout > 0; ++i) {
      const Peer& p = peers_[i];
      const double quiet = static_cast<double>(after - p.last_ns) * 1e-9;
      if (!p.done && quiet > timeout) {
        char why[160];
        snprintf(why, sizeof why, "no heartbeat for %.1f s (zoe.comm_timeout_s is %g)", quiet, timeout);
        declare_lost(p.rank, why, false);
      }
    }
    if (!lost_.load()) check_waiting_for_left(after, timeout);
  }
}

void Heartbeat::close_all() {
  for (auto& p : peers_) {
    if (p.fd >= 0) close(p.fd);
    p.fd = -1;
  }
}

void Heartbeat::stop() {
  if (!thread_) {
    close_all();
    return;
  }
  stopping_.store(true);
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  thread_->join();
  thread_.reset();
  if (!lost_.load() && !silent_.load()) {
    Departure d;
    d.exit_status = departure_code_.load();
    d.signal = departure_signal_.load();
    const std::string f = departure_frame(kBye, rank_, d);
    for (auto& p : peers_) {
      if (p.fd >= 0 && !p.done) (void)!send(p.fd, f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }
  close_all();
  for (int& fd : wake_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

void Heartbeat::drop_for_test() {
  silent_.store(true);
  stopping_.store(true);
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (thread_) thread_->join();
  thread_.reset();
  for (auto& p : peers_) {
    // A reset rather than a goodbye: SO_LINGER 0 sends RST, as the kernel does for a killed process
    // with unread data; a plain close sends FIN, which reads as EOF too.
    struct linger l {
      1, 0
    };
    if (p.fd >= 0) setsockopt(p.fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  close_all();
}

void Heartbeat::set_timeout(double seconds) { timeout_s_.store(seconds); }

void Heartbeat::set_departure(const Departure& d) {
  departure_code_.store(d.exit_status);
  departure_signal_.store(d.signal);
}

std::string describe_departure(const Departure& d) {
  std::string out;
  if (d.signal > 0)
    out = std::string("stopped by ") + (d.signal == SIGINT    ? "SIGINT"
                                        : d.signal == SIGTERM ? "SIGTERM"
                                                              : "signal " + std::to_string(d.signal));
  if (d.exit_status >= 0)
    out += (out.empty() ? "" : ", ") + std::string("exit status ") + std::to_string(d.exit_status);
  return out;
}

namespace {
std::mutex g_mu;
Heartbeat* g_live = nullptr;
std::atomic<size_t (*)()> g_cleanup{nullptr};
std::mutex g_collective_mu;  // a collective is a call of microseconds at least: a lock is free
int g_collectives = 0;
std::atomic<int64_t> g_collective_since{0};
}  // namespace

WaitingInCollective::WaitingInCollective() {
  std::lock_guard<std::mutex> lock(g_collective_mu);
  if (g_collectives++ == 0) g_collective_since.store(now_ns());
}

WaitingInCollective::~WaitingInCollective() {
  std::lock_guard<std::mutex> lock(g_collective_mu);
  if (--g_collectives == 0) g_collective_since.store(0);
}

int64_t WaitingInCollective::since() { return g_collective_since.load(); }

void set_departure(const Departure& d) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_live) g_live->set_departure(d);
}

void set_live_heartbeat(Heartbeat* hb) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_live = hb;
}

void set_lost_rank_cleanup(size_t (*cleanup)()) { g_cleanup.store(cleanup); }

size_t run_lost_rank_cleanup() {
  size_t (*fn)() = g_cleanup.load();
  return fn ? fn() : 0;
}

void set_comm_timeout(double seconds) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_live) g_live->set_timeout(seconds);
}

double comm_timeout() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_live ? g_live->timeout() : 0.0;
}

}  // namespace zoe::comm
