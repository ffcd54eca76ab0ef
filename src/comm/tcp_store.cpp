// A client of torch's TCPStore (torch.distributed.TCPStore, the store torchrun's agent serves at
// MASTER_ADDR:MASTER_PORT), speaking its wire protocol: a query byte, then each key or value as a
// little-endian uint64 length and its bytes. A new connection first sends VALIDATE and the
// protocol's magic number; set is SET key value (no answer); get is WAIT 1 key (answered with one
// byte, STOP_WAITING, once the key exists) and then GET key (answered with the value). Only these
// four queries are used, whose codes have not changed since torch 2.0. One connection per store,
// its queries serialised by a mutex; a query that fails or waits past its timeout leaves the
// connection unusable, and every later query says so.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "comm/communicator.h"

namespace zoe::comm {
namespace {

constexpr uint8_t kValidate = 0, kSet = 1, kGet = 3, kWait = 6;
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
constexpr uint8_t kStopWaiting = 0;

using Clock = std::chrono::steady_clock;

int64_t ms_left(Clock::time_point deadline) {
  return std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
}

class TcpStore final : public KeyValueStore {
 public:
  TcpStore(int fd, std::string where) : fd_(fd), where_(std::move(where)) {}
  ~TcpStore() override {
    if (fd_ >= 0) close(fd_);
  }

  Status set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string msg(1, static_cast<char>(kSet));
    append_string(&msg, key);
    append_string(&msg, value);
    return fail_if_bad(send_all(msg), "setting " + key);
  }

  Result<std::string> get(const std::string& key, int64_t timeout_ms) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    std::string msg(1, static_cast<char>(kWait));
    append_u64(&msg, 1);
    append_string(&msg, key);
    ZOE_RETURN_IF_ERROR(fail_if_bad(send_all(msg), "waiting for " + key));
    std::string answer;
    Status s = recv_all(&answer, 1, deadline);
    if (s.is_ok() && static_cast<uint8_t>(answer[0]) != kStopWaiting)
      s = make_status(StatusCode::kIoError, "unexpected answer %d to a wait", static_cast<int>(answer[0]));
    if (!s.is_ok() && ms_left(deadline) == 0) {
      broken_ = "a wait timed out";
      return make_status(StatusCode::kIoError,
                         "store %s: key %s was not set within %.1f s (a rank did not come?)", where_.c_str(),
                         key.c_str(), timeout_ms / 1000.0);
    }
    ZOE_RETURN_IF_ERROR(fail_if_bad(s, "waiting for " + key));
    msg.assign(1, static_cast<char>(kGet));
    append_string(&msg, key);
    ZOE_RETURN_IF_ERROR(fail_if_bad(send_all(msg), "getting " + key));
    const Clock::time_point later = Clock::now() + std::chrono::seconds(60);
    std::string len;
    ZOE_RETURN_IF_ERROR(fail_if_bad(recv_all(&len, 8, later), "getting " + key));
    uint64_t n = 0;
    std::memcpy(&n, len.data(), 8);
    if (n > (uint64_t{1} << 30))
      return fail_if_bad(
          make_status(StatusCode::kIoError, "a value of %llu bytes", static_cast<unsigned long long>(n)),
          "getting " + key);
    std::string value;
    ZOE_RETURN_IF_ERROR(fail_if_bad(recv_all(&value, static_cast<size_t>(n), later), "getting " + key));
    return value;
  }

  Status validate() {
    std::string msg(1, static_cast<char>(kValidate));
    msg.append(reinterpret_cast<const char*>(&kValidationMagic), 4);
    return fail_if_bad(send_all(msg), "validating the connection");
  }

 private:
  static void append_u64(std::string* m, uint64_t v) { m->append(reinterpret_cast<const char*>(&v), 8); }
  static void append_string(std::string* m, const std::string& s) {
    append_u64(m, s.size());
    m->append(s);
  }

  // A failed query leaves the connection unusable (a half-sent query, an answer not read).
  Status fail_if_bad(Status s, const std::string& what) {
    if (s.is_ok()) return s;
    if (broken_.empty()) broken_ = s.message();
    return make_status(StatusCode::kIoError, "store %s: %s: %s", where_.c_str(), what.c_str(),
                       s.message().c_str());
  }

  Status send_all(const std::string& m) {
    if (!broken_.empty())
      return make_status(StatusCode::kIoError, "the connection is unusable after an earlier failure (%s)",
                         broken_.c_str());
    size_t off = 0;
    while (off < m.size()) {
      const ssize_t n = ::send(fd_, m.data() + off, m.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return make_status(StatusCode::kIoError, "send: %s", strerror(errno));
      off += static_cast<size_t>(n);
    }
    return Status::ok();
  }

  Status recv_all(std::string* out, size_t n, Clock::time_point deadline) {
    out->resize(n);
    size_t off = 0;
    while (off < n) {
      pollfd p{fd_, POLLIN, 0};
      const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms_left(deadline), 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return make_status(StatusCode::kIoError, "no answer in time");
      if (r < 0) return make_status(StatusCode::kIoError, "poll: %s", strerror(errno));
      const ssize_t got = ::recv(fd_, out->data() + off, n - off, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got == 0) return make_status(StatusCode::kIoError, "the store closed the connection");
      if (got < 0) return make_status(StatusCode::kIoError, "recv: %s", strerror(errno));
      off += static_cast<size_t>(got);
    }
    return Status::ok();
  }

  std::mutex mu_;
  int fd_;
  const std::string where_;
  std::string broken_;  // why the connection is unusable ("" while it is fine)
};

// One connection attempt to any of host:port's addresses: the socket, or -1 with errno set.
int connect_once(const std::string& host, int port, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    *why = std::string("cannot resolve it: ") + gai_strerror(rc);
    return -2;
  }
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      *why = strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  return fd;
}

std::string local_address_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  const void* addr = ss.ss_family == AF_INET6
                         ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr)
                         : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr);
  return inet_ntop(ss.ss_family, addr, text, sizeof text) ? text : "";
}

}  // namespace

Result<std::shared_ptr<KeyValueStore>> connect_tcp_store(const std::string& host, int port, double timeout_s,
                                                         std::string* local_address) {
  if (host.empty()) return invalid_argument("connect_tcp_store: no host");
  if (port <= 0 || port > 65535)
    return invalid_argument("connect_tcp_store: port %d is not a TCP port", port);
  const std::string where = host + ":" + std::to_string(port);
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::string why;
  int fd = -1;
  while (true) {  // the store may come up after this process: retry until the deadline
    fd = connect_once(host, port, &why);
    if (fd >= 0 || fd == -2 || ms_left(deadline) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (fd < 0)
    return make_status(StatusCode::kIoError, "cannot reach the store at %s within %.0f s: %s", where.c_str(),
                       timeout_s, why.c_str());
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (local_address != nullptr) *local_address = local_address_of(fd);
  auto store = std::make_shared<TcpStore>(fd, where);
  ZOE_RETURN_IF_ERROR(store->validate());
  return std::shared_ptr<KeyValueStore>(std::move(store));
}

}  // namespace zoe::comm
