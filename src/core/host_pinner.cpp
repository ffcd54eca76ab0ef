// The process-wide device pinner.
#include "core/host_pinner.h"

#include <atomic>

namespace zoe {
namespace {
std::atomic<HostPinner*> g_pinner{nullptr};
}

void set_host_pinner(HostPinner* p) { g_pinner.store(p, std::memory_order_release); }
HostPinner* host_pinner() { return g_pinner.load(std::memory_order_acquire); }

}  // namespace zoe
