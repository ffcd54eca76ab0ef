// AlignedBuffer / BufferPool tests, including the RLIMIT_MEMLOCK message.
#include <gtest/gtest.h>

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "io/buffer.h"
#include "tests/util/status_test_util.h"
#include "tests/util/test_util.h"

namespace zoe::io {
namespace {

TEST(AlignedBuffer, AlignmentAndSizes) {
  for (size_t n : {size_t{1}, size_t{4096}, size_t{100000}, size_t{3} << 20}) {
    auto b = AlignedBuffer::allocate(n);
    ASSERT_OK(b);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
    EXPECT_EQ(b->size(), n);
    memset(b->data(), 7, n);
  }
  auto big = AlignedBuffer::allocate(4 << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big->data()) % (2 << 20), 0u)
      << "large buffers start on a 2 MiB page";
  AlignedBuffer moved = std::move(big).value();
  EXPECT_NE(moved.data(), nullptr);
}

TEST(AlignedBuffer, Pinned) {
  auto b = AlignedBuffer::allocate(4 << 20, PinMode::kLock);
  if (!b.is_ok()) GTEST_SKIP() << b.status().to_string();
  EXPECT_EQ(b->pinned(), PinMode::kLock);
}

// Drops CAP_IPC_LOCK from this (child) process so RLIMIT_MEMLOCK applies even to root.
bool drop_ipc_lock() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
  return syscall(SYS_capset, &hdr, data) == 0;
}

TEST(AlignedBuffer, MemlockLimitMessageExplainsWhatToDo) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer turns mlock into a no-op";
#endif
  std::string got = test::run_in_child([] {
    struct rlimit lim = {64 * 1024, 64 * 1024};
    if (!drop_ipc_lock() || setrlimit(RLIMIT_MEMLOCK, &lim) != 0) return std::string("SKIP");
    auto b = AlignedBuffer::allocate(16 << 20, PinMode::kLock);
    return b.is_ok() ? std::string("OK") : b.status().to_string();
  });
  if (got == "SKIP") GTEST_SKIP() << "cannot drop CAP_IPC_LOCK here";
  EXPECT_NE(got.find("permission denied"), std::string::npos) << got;
  EXPECT_NE(got.find("ulimit -l"), std::string::npos) << got;
  EXPECT_NE(got.find("64 KiB"), std::string::npos) << got;
  EXPECT_NE(got.find("pin_memory"), std::string::npos) << got;
}

TEST(BufferPool, AcquireRelease) {
  auto p = BufferPool::create(1 << 20, 3, PinMode::kNone);
  ASSERT_OK(p);
  BufferPool& pool = *p.value();
  char* a = pool.acquire();
  char* b = pool.acquire();
  char* c = pool.try_acquire();
  EXPECT_NE(c, nullptr);
  EXPECT_EQ(pool.try_acquire(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 4096, 0u);
  std::thread t([&] { pool.release(b); });
  char* d = pool.acquire();  // blocks until the release
  t.join();
  EXPECT_EQ(d, b);
  pool.release(a);
  pool.release(c);
  pool.release(d);
  EXPECT_EQ(pool.free_count(), 3u);
  EXPECT_FALSE(BufferPool::create(1000, 2, PinMode::kNone).is_ok());
}

}  // namespace
}  // namespace zoe::io
