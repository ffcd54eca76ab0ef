// GlooComm: host collectives over gloo's TCP transport (Debian's libgloo-dev), run in order by
// one worker thread per communicator; the ranks meet through a KeyValueStore (torch's TCPStore
// under torchrun, an in-process store in tests).
//
// The collectives are ordered.h's fixed-order ones, gloo moving the bytes (gloo::alltoall,
// gloo::allgather, gloo::broadcast): the same bits as MpiComm for the same inputs, whatever gloo's
// algorithms. gloo reports a peer that is gone (a closed connection, or nothing within
// GlooCommOptions::timeout_s) by throwing; each call here turns that into a kIoError Status that
// fails the collective and, by the queue's rule, every one queued after it.
#include "zoe/features.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_internal.h"
#include "comm/heartbeat.h"
#include "comm/ordered.h"

#if ZOE_HAVE_GLOO
#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace zoe::comm {

#if ZOE_HAVE_GLOO
namespace {

constexpr size_t kDefaultChunkBytes = 8u << 20;

// gloo's rendezvous through zoe's store. gloo's interface has no error returns: a failed call throws.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<KeyValueStore> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = store_->set(key, std::string(data.begin(), data.end()));
    if (!s.is_ok()) throw gloo::IoException(s.message());
  }
  std::vector<char> get(const std::string& key) override {
    Result<std::string> v = store_->get(key, timeout_.count());
    if (!v.is_ok()) throw gloo::IoException(v.status().message());
    return std::vector<char>(v.value().begin(), v.value().end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const std::string& k : keys) {
      Result<std::string> v = store_->get(k, timeout.count());
      if (!v.is_ok()) throw gloo::IoException(v.status().message());
    }
  }

 private:
  std::shared_ptr<KeyValueStore> store_;
  std::chrono::milliseconds timeout_;
};

// Runs one gloo call; what it throws becomes kIoError naming the call.
template <typename F>
Status gloo_try(const char* what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return make_status(StatusCode::kIoError, "gloo %s: %s", what, e.what());
  }
  return Status::ok();
}

// The bytes gloo moves for the ordered collectives (ordered.h).
class GlooTransport final : public ByteTransport {
 public:
  GlooTransport(std::shared_ptr<gloo::Context> ctx, int rank, int size)
      : ctx_(std::move(ctx)), rank_(rank), size_(size) {}
  Status all_gather(const void* send, void* recv, size_t bytes) override {
    return gloo_try("allgather", [&] {
      gloo::AllgatherOptions o(ctx_);
      auto* out = static_cast<char*>(recv);
      if (send != out + rank_ * bytes) o.setInput(const_cast<char*>(static_cast<const char*>(send)), bytes);
      o.setOutput(out, bytes * size_);
      gloo::allgather(o);
    });
  }
  Status all_to_all(const void* send, void* recv, size_t bytes) override {
    return gloo_try("alltoall", [&] {
      gloo::AlltoallOptions o(ctx_);
      o.setInput(const_cast<char*>(static_cast<const char*>(send)), bytes * size_);
      o.setOutput(static_cast<char*>(recv), bytes * size_);
      gloo::alltoall(o);
    });
  }
  Status broadcast(void* buf, size_t bytes, int root) override {
    return gloo_try("broadcast", [&] {
      gloo::BroadcastOptions o(ctx_);
      o.setOutput(static_cast<char*>(buf), bytes);
      o.setRoot(root);
      gloo::broadcast(o);
    });
  }
  Status barrier() override {
    return gloo_try("barrier", [&] {
      gloo::BarrierOptions o(ctx_);
      gloo::barrier(o);
    });
  }

 private:
  std::shared_ptr<gloo::Context> ctx_;
  const int rank_, size_;
};

// ordered.h's host communicator over gloo; the gloo context (its connections) goes with it.
class GlooComm final : public OrderedHostComm {
 public:
  GlooComm(std::shared_ptr<gloo::Context> ctx, int rank, int size, int local_rank, size_t chunk_bytes)
      : OrderedHostComm(std::make_unique<GlooTransport>(std::move(ctx), rank, size), rank, size, local_rank,
                        chunk_bytes, static_cast<size_t>(INT_MAX), "gloo", "zoe-comm-gloo") {}
};

// The ranks' full mesh over gloo's TCP transport, met through the store.
Result<std::shared_ptr<gloo::Context>> connect_gloo(const GlooCommOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size)
    return invalid_argument("create_gloo_comm: rank %d is not in a world of %d", o.rank, o.size);
  if (!o.store) return invalid_argument("create_gloo_comm: no store to meet the other ranks through");
  if (!(o.timeout_s > 0))
    return invalid_argument("create_gloo_comm: timeout_s %g is not positive", o.timeout_s);
  std::string host = o.hostname;
  if (host.empty()) {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    host = name;
  }
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  Status s = gloo_try("rendezvous", [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    StoreAdapter adapter(o.store, timeout);
    gloo::rendezvous::PrefixStore prefixed(o.prefix, adapter);
    ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    ctx->setTimeout(timeout);
    ctx->connectFullMesh(prefixed, device);
    if (o.collective_timeout_s > 0)
      ctx->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(o.collective_timeout_s * 1000)));
  });
  if (!s.is_ok()) {
    return s.with_context("rank " + std::to_string(o.rank) + " of " + std::to_string(o.size) +
                          " connected to the others from " + host);
  }
  return std::shared_ptr<gloo::Context>(std::move(ctx));
}

std::unique_ptr<Communicator> make_gloo_comm(std::shared_ptr<gloo::Context> ctx, const GlooCommOptions& o) {
  const size_t chunk = o.chunk_bytes > 0 ? o.chunk_bytes : kDefaultChunkBytes;
  return std::make_unique<GlooComm>(std::move(ctx), o.rank, o.size, o.local_rank, chunk);
}

}  // namespace

Result<std::unique_ptr<Communicator>> create_gloo_comm(const GlooCommOptions& o) {
  ZOE_ASSIGN_OR_RETURN(auto ctx, connect_gloo(o));
  return make_gloo_comm(std::move(ctx), o);
}

namespace {

// A number each torchrun communicator of this process takes in turn: every rank creates them in
// the same order, so the n-th ones of all ranks share their keys' prefix.
std::atomic<int> g_torchrun_comms{0};

}  // namespace

Result<std::unique_ptr<Communicator>> create_torchrun_comm(const LaunchEnv& env, double timeout_s) {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port_text = std::getenv("MASTER_PORT");
  if (addr == nullptr || *addr == '\0' || port_text == nullptr || *port_text == '\0')
    return invalid_argument(
        "WORLD_SIZE=%d is set (torchrun), but MASTER_ADDR or MASTER_PORT is not: zoe's ranks meet through "
        "torch's TCPStore there. torchrun sets both; a process started by hand needs them set to the "
        "store's host and port",
        env.torch_world);
  char* end = nullptr;
  const long port = std::strtol(port_text, &end, 10);
  if (end == port_text || *end != '\0' || port <= 0 || port > 65535)
    return invalid_argument("MASTER_PORT=%s is not a TCP port (1-65535)", port_text);
  if (env.torch_rank < 0 || env.torch_rank >= env.torch_world)
    return invalid_argument("RANK=%d is not a rank of WORLD_SIZE=%d (torchrun sets both)", env.torch_rank,
                            env.torch_world);
  std::string local;
  ZOE_ASSIGN_OR_RETURN(auto store, connect_tcp_store(addr, static_cast<int>(port), timeout_s, &local));
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  GlooCommOptions o;
  o.rank = env.torch_rank;
  o.size = env.torch_world;
  o.local_rank = env.torch_local_rank >= 0 ? env.torch_local_rank : 0;
  o.store = std::move(store);
  o.prefix =
      "zoe/" + std::string(restart != nullptr ? restart : "0") + "/" + std::to_string(g_torchrun_comms++);
  o.hostname = local;
  o.timeout_s = timeout_s;
  o.collective_timeout_s = 86400;  // a lost rank is the heartbeat's to find
  ZOE_ASSIGN_OR_RETURN(auto ctx, connect_gloo(o));
  {
    GlooTransport t(ctx, o.rank, o.size);  // the heartbeat's setup, before the communicator's worker starts
    start_process_heartbeat(t, o.rank, o.size);
  }
  return make_gloo_comm(std::move(ctx), o);
}

#else  // !ZOE_HAVE_GLOO

Result<std::unique_ptr<Communicator>> create_torchrun_comm(const LaunchEnv& env, double /*timeout_s*/) {
  return check_not_torchrun(env).is_ok()
             ? unsupported("create_torchrun_comm: zoe was built without gloo (apt-get install libgloo-dev)")
             : check_not_torchrun(env);
}

Result<std::unique_ptr<Communicator>> create_gloo_comm(const GlooCommOptions& /*o*/) {
  return unsupported(
      "create_gloo_comm: zoe was built without gloo (apt-get install libgloo-dev, then reconfigure)");
}

#endif

}  // namespace zoe::comm
