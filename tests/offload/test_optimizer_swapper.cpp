// OptimizerSwapper tests: bit-identical to the in-memory update, bounded buffers, faults mid-pipeline.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "offload/optimizer_swapper.h"
#include "tests/offload/offload_fixture.h"
#include "tests/util/status_test_util.h"

namespace zoe::offload {
namespace {

// An Adam-shaped elementwise update on fp32 p, m, v with a read-only fp32 gradient. Any
// deterministic per-element function will do: the swapper must not change a single bit.
void adamish(float* p, float* m, float* v, const float* g, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    m[i] = 0.9f * m[i] + 0.1f * g[i];
    v[i] = 0.999f * v[i] + 0.001f * g[i] * g[i];
    p[i] -= 1e-3f * m[i] / (std::sqrt(v[i]) + 1e-8f);
  }
}

std::vector<float> series(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<int32_t>(x >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  return v;
}

SwapperOptions adam_options(size_t buffers, size_t buffer_bytes) {
  SwapperOptions o;
  o.states = {{StateKind::kMaster, 4, true},
              {StateKind::kAdamM, 4, true},
              {StateKind::kAdamV, 4, true},
              {StateKind::kGrad, 4, false}};
  o.buffer_count = buffers;
  o.buffer_bytes = buffer_bytes;
  o.pin = io::PinMode::kNone;
  return o;
}

// Hands group 1's state k to the swapper chunk by chunk, from src, copied or borrowed.
Status write_chunks(OptimizerSwapper& w, size_t k, const float* src, size_t n, bool borrowed) {
  const size_t c = w.chunk_elems();
  for (size_t b = 0; b < n; b += c) {
    const size_t m = std::min(c, n - b);
    Status st = borrowed ? w.write_state_borrowed(GroupId{1}, k, src + b, b, m)
                         : w.write_state_async(GroupId{1}, k, src + b, b, m);
    if (!st.is_ok()) return st;
  }
  return Status::ok();
}

// 12 buffers of 64 KiB over the rig's store (nvme) or host memory, with group 1 of n elements.
std::unique_ptr<OptimizerSwapper> group_swapper(Rig& r, bool nvme, size_t n) {
  auto sw = OptimizerSwapper::create(nvme ? r.store.get() : nullptr, adam_options(12, 64 * 1024));
  Status st = sw.is_ok() ? sw.value()->add_group(GroupId{1}, n) : sw.status();
  if (!st.is_ok()) {
    ADD_FAILURE() << st.message();
    return nullptr;
  }
  return std::move(sw).value();
}

ChunkUpdate adam_update() {
  return [](const ChunkView& c) {
    adamish(static_cast<float*>(c.data[0]), static_cast<float*>(c.data[1]), static_cast<float*>(c.data[2]),
            static_cast<const float*>(c.data[3]), c.n);
    return Status::ok();
  };
}

struct Case {
  std::vector<size_t> sizes = {100003, 5000, 1, 65536};  // larger than a buffer, odd, tiny, exact
};

class SwapperTest : public testing::TestWithParam<size_t> {};  // buffer_count

TEST_P(SwapperTest, BitIdenticalToInMemoryUpdate) {
  Rig r;
  ASSERT_TRUE(r.init(MiB(), 64 * MiB()));
  auto sw = OptimizerSwapper::create(r.store.get(), adam_options(GetParam(), 64 * 1024));
  ASSERT_OK(sw);
  auto host = OptimizerSwapper::create(nullptr, adam_options(GetParam(), 64 * 1024));
  ASSERT_OK(host);
  Case c;
  std::vector<std::vector<float>> ref[4];
  for (size_t g = 0; g < c.sizes.size(); ++g) {
    size_t n = c.sizes[g];
    ASSERT_OK(sw.value()->add_group(GroupId{g}, n));
    ASSERT_OK(host.value()->add_group(GroupId{g}, n));
    for (size_t k = 0; k < 4; ++k) {
      auto v = series(n, static_cast<uint32_t>(g * 10 + k));
      if (k == 2) {
        for (auto& f : v) f = f * f;  // v >= 0
      }
      ASSERT_OK(sw.value()->write_state(GroupId{g}, k, v.data()));
      ASSERT_OK(host.value()->write_state(GroupId{g}, k, v.data()));
      ref[k].push_back(std::move(v));
    }
  }
  for (int step = 0; step < 3; ++step) {
    ASSERT_OK(sw.value()->step(adam_update()));
    ASSERT_OK(host.value()->step(adam_update()));
    for (size_t g = 0; g < c.sizes.size(); ++g)
      adamish(ref[0][g].data(), ref[1][g].data(), ref[2][g].data(), ref[3][g].data(), c.sizes[g]);
  }
  EXPECT_EQ(sw.value()->free_slots(), sw.value()->slots());
  for (size_t g = 0; g < c.sizes.size(); ++g) {
    for (size_t k = 0; k < 4; ++k) {
      std::vector<float> a(c.sizes[g]), b(c.sizes[g]);
      ASSERT_OK(sw.value()->read_state(GroupId{g}, k, a.data()));
      ASSERT_OK(host.value()->read_state(GroupId{g}, k, b.data()));
      EXPECT_EQ(test::first_mismatch(a.data(), ref[k][g].data(), a.size() * 4), -1)
          << "nvme group " << g << " state " << k;
      EXPECT_EQ(test::first_mismatch(b.data(), ref[k][g].data(), b.size() * 4), -1)
          << "host group " << g << " state " << k;
    }
  }
  const SwapperStats& st = sw.value()->last_stats();
  EXPECT_GT(st.chunks, 8u);
  EXPECT_GT(st.bytes_read, st.bytes_written);  // gradients are read, not written
}

INSTANTIATE_TEST_SUITE_P(BufferCounts, SwapperTest, testing::Values(4, 8, 12, 24));

TEST(Swapper, RangedStateTransfers) {
  Rig r;
  ASSERT_TRUE(r.init(MiB(), 64 * MiB()));
  for (bool nvme : {true, false}) {
    auto sw = OptimizerSwapper::create(nvme ? r.store.get() : nullptr, adam_options(8, 64 * 1024));
    ASSERT_OK(sw);
    const size_t n = 100003, c = sw.value()->chunk_elems();
    ASSERT_OK(sw.value()->add_group(GroupId{1}, n));
    auto v = series(n, 9);
    // Written in chunk-aligned pieces, read back whole and in pieces.
    for (size_t b = 0; b < n; b += 2 * c)
      ASSERT_OK(sw.value()->write_state(GroupId{1}, 0, v.data() + b, b, 2 * c));
    std::vector<float> whole(n), part(n);
    ASSERT_OK(sw.value()->read_state(GroupId{1}, 0, whole.data()));
    for (size_t b = 0; b < n; b += c) ASSERT_OK(sw.value()->read_state(GroupId{1}, 0, part.data() + b, b, c));
    EXPECT_EQ(test::first_mismatch(whole.data(), v.data(), n * 4), -1);
    EXPECT_EQ(test::first_mismatch(part.data(), v.data(), n * 4), -1);
    EXPECT_EQ(sw.value()->read_state(GroupId{1}, 0, part.data(), 5, c).code(), StatusCode::kInvalidArgument);
  }
}

TEST(Swapper, AsynchronousChunkWritesLandBeforeReadsAndTheStep) {
  // Chunks written behind the caller (more of them than the slots): a read of the state, and the
  // step's reads, see every one; a write error is reported once, by the step, and not swallowed
  // by a read on the way.
  Rig r;
  ASSERT_TRUE(r.init(MiB(), 64 * MiB()));
  for (bool nvme : {true, false}) {
    const size_t n = 100003;
    auto sw = group_swapper(r, nvme, n);
    ASSERT_NE(sw, nullptr);
    OptimizerSwapper& w = *sw;
    const size_t c = w.chunk_elems();
    ASSERT_GT((n + c - 1) / c, w.slots());
    auto g = series(n, 11);
    ASSERT_OK(write_chunks(w, 3, g.data(), n, false));
    std::vector<float> back(n);
    ASSERT_OK(w.read_state(GroupId{1}, 3, back.data()));
    EXPECT_EQ(test::first_mismatch(back.data(), g.data(), n * 4), -1) << (nvme ? "nvme" : "host");
    // The step reads the gradient state as written.
    ASSERT_OK(write_chunks(w, 3, g.data(), n, false));
    std::vector<float> seen(n);
    ASSERT_OK(w.step([&](const ChunkView& v) {
      memcpy(seen.data() + v.begin, v.data[3], v.n * 4);
      return Status::ok();
    }));
    EXPECT_EQ(test::first_mismatch(seen.data(), g.data(), n * 4), -1) << (nvme ? "nvme" : "host");
    // Not one chunk: refused.
    EXPECT_EQ(w.write_state_async(GroupId{1}, 3, g.data(), 5, c).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(w.write_state_async(GroupId{1}, 3, g.data(), 0, c + 1).code(), StatusCode::kInvalidArgument);
    if (!nvme) continue;
    r.faults.clear();  // counts from here
    r.faults.add(io::FaultKind::kEio, 2, 1, io::IoOp::kWrite);
    ASSERT_OK(write_chunks(w, 3, g.data(), n, false));
    Status rd = w.read_state(GroupId{1}, 0, back.data());  // a read on the way fails too, and keeps the error
    EXPECT_FALSE(rd.is_ok());
    Status st = w.step(adam_update());
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("writing optimizer state chunk 1@"), std::string::npos) << st.message();
    EXPECT_EQ(w.free_slots(), w.slots());
    r.faults.clear();
    EXPECT_OK(w.wait_async_writes());  // reported once
    EXPECT_OK(w.step(adam_update()));
  }
}

TEST(Swapper, BorrowedChunkWritesLandAsCopiedOnes) {
  // write_state_borrowed: from an aligned source, its whole-block chunks are written from the
  // source itself, an unaligned source and the ragged last chunk are copied; either way the state
  // reads back as the source once wait_async_writes() returns, and a write error is reported.
  // More chunks than kMaxBorrowedWrites: the borrowed writes wait for each other too.
  Rig r;
  ASSERT_TRUE(r.init(MiB(), 64 * MiB()));
  for (bool nvme : {true, false}) {
    const size_t n = 400003;
    auto sw = group_swapper(r, nvme, n);
    ASSERT_NE(sw, nullptr);
    OptimizerSwapper& w = *sw;
    const size_t c = w.chunk_elems();
    ASSERT_EQ(c * 4 % 4096, 0u);
    ASSERT_GT(n / c, kMaxBorrowedWrites);
    auto g = series(n, 13);
    std::unique_ptr<float, void (*)(void*)> mem(
        static_cast<float*>(std::aligned_alloc(4096, ((n + 1) * 4 + 4095) / 4096 * 4096)), std::free);
    ASSERT_NE(mem, nullptr);
    for (size_t shift : {size_t{0}, size_t{1}}) {  // aligned, then one element off
      float* src = mem.get() + shift;
      memcpy(src, g.data(), n * 4);
      ASSERT_OK(write_chunks(w, 0, src, n, true));
      ASSERT_OK(w.wait_async_writes());
      memset(src, 0xff, n * 4);  // the source may change now
      std::vector<float> back(n);
      ASSERT_OK(w.read_state(GroupId{1}, 0, back.data()));
      EXPECT_EQ(test::first_mismatch(back.data(), g.data(), n * 4), -1) << (nvme ? "nvme" : "host") << shift;
      // Read into aligned memory (whole chunks straight into it, the ragged last one through a
      // slot) and one element off (every chunk through a slot): the same values.
      ASSERT_OK(w.read_state(GroupId{1}, 0, src));
      EXPECT_EQ(test::first_mismatch(src, g.data(), n * 4), -1) << (nvme ? "nvme" : "host") << shift;
      memset(src, 0xff, n * 4);
      ASSERT_OK(w.read_state(GroupId{1}, 0, src, c, n - c));  // from the second chunk to the end
      EXPECT_EQ(test::first_mismatch(src, g.data() + c, (n - c) * 4), -1)
          << (nvme ? "nvme" : "host") << shift;
    }
    if (!nvme) continue;
    r.faults.clear();
    r.faults.add(io::FaultKind::kEio, 1, 1, io::IoOp::kWrite);
    memcpy(mem.get(), g.data(), n * 4);
    ASSERT_OK(write_chunks(w, 0, mem.get(), n, true));
    Status st = w.wait_async_writes();
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("writing optimizer state chunk 1@"), std::string::npos) << st.message();
    r.faults.clear();
  }
}

TEST(Swapper, PreloadedChunksGiveTheSameUpdateAndKeepWhatWasHandedOver) {
  // The step's first chunks read ahead, their gradient handed over from memory: the same bits as
  // a plain step. Dropped before the step (a write of another state), the handed-over gradient
  // is written home, not lost.
  for (const int variant : {0, 1, 2}) {  // 0: plain; 1: preloaded and filled; 2: filled, then dropped
    Rig r;
    ASSERT_TRUE(r.init(MiB(), 64 * MiB()));
    auto sw = OptimizerSwapper::create(r.store.get(), adam_options(16, 64 * 1024));
    ASSERT_OK(sw);
    OptimizerSwapper& w = *sw.value();
    const size_t n = 50000, c = w.chunk_elems();
    ASSERT_OK(w.add_group(GroupId{1}, n));
    ASSERT_OK(w.add_group(GroupId{2}, 7000));
    for (size_t k = 0; k < 3; ++k) {
      ASSERT_OK(w.write_state(GroupId{1}, k, series(n, 20 + k).data()));
      ASSERT_OK(w.write_state(GroupId{2}, k, series(7000, 30 + k).data()));
    }
    const auto g1 = series(n, 40), g2 = series(7000, 41);
    ASSERT_OK(w.write_state(GroupId{2}, 3, g2.data()));
    if (variant == 0) {
      ASSERT_OK(w.write_state(GroupId{1}, 3, g1.data()));
    } else {
      w.preload(w.slots() - 1);
      ASSERT_EQ(w.preloaded(), w.slots() - 1);
      for (size_t b = 0; b < n; b += c) {
        const size_t m = std::min(c, n - b);
        if (!w.fill_preloaded(GroupId{1}, b, 3, g1.data() + b, m)) {
          ASSERT_OK(w.write_state_async(GroupId{1}, 3, g1.data() + b, b, m));
        }
      }
      EXPECT_FALSE(w.fill_preloaded(GroupId{1}, 0, 3, g1.data(), c)) << "handed over twice";
      EXPECT_FALSE(w.fill_preloaded(GroupId{2}, 0, 3, g2.data(), 7000)) << "not preloaded";
      if (variant == 2) {
        ASSERT_OK(w.write_state(GroupId{2}, 3, g2.data()));  // drops the preloaded chunks
        EXPECT_EQ(w.preloaded(), 0u);
      }
    }
    ASSERT_OK(w.step(adam_update()));
    EXPECT_EQ(w.free_slots(), w.slots());
    std::vector<float> p1(n), p2(7000);
    ASSERT_OK(w.read_state(GroupId{1}, 0, p1.data()));
    ASSERT_OK(w.read_state(GroupId{2}, 0, p2.data()));
    // The in-memory reference: the same update on the same inputs.
    auto rp = series(n, 20), rm = series(n, 21), rv = series(n, 22);
    adamish(rp.data(), rm.data(), rv.data(), g1.data(), n);
    auto sp = series(7000, 30), sm = series(7000, 31), sv = series(7000, 32);
    adamish(sp.data(), sm.data(), sv.data(), g2.data(), 7000);
    EXPECT_EQ(test::first_mismatch(p1.data(), rp.data(), n * 4), -1) << "variant " << variant;
    EXPECT_EQ(test::first_mismatch(p2.data(), sp.data(), 7000 * 4), -1) << "variant " << variant;
  }
}

TEST(Swapper, TooFewBuffersIsAClearError) {
  auto sw = OptimizerSwapper::create(nullptr, adam_options(3, 64 * 1024));
  ASSERT_FALSE(sw.is_ok());
  EXPECT_NE(sw.status().message().find("buffer_count 3 is smaller than the 4 optimizer states"),
            std::string::npos)
      << sw.status().message();
}

void run_fault(io::FaultKind kind, io::IoOp op, uint64_t nth) {
  Rig r;
  ASSERT_TRUE(r.init(MiB(), 64 * MiB()));
  auto sw = OptimizerSwapper::create(r.store.get(), adam_options(12, 64 * 1024));
  ASSERT_OK(sw);
  ASSERT_OK(sw.value()->add_group(GroupId{1}, 300000));
  r.faults.add(kind, nth, 1, op);
  Status s = sw.value()->step(adam_update());
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("optimizer sub-group"), std::string::npos) << s.message();
  EXPECT_EQ(sw.value()->free_slots(), sw.value()->slots()) << "a buffer leaked";
  // Every completion arrives (a lost one would hang here until the test's timeout); the engine
  // finishes its own bookkeeping just after the callbacks the swapper waited for.
  (void)r.engine->drain();
  EXPECT_EQ(r.engine->outstanding(), 0u);
  r.faults.clear();
  EXPECT_OK(sw.value()->step(adam_update()));  // usable afterwards
}

TEST(Swapper, ReadErrorMidPipeline) { run_fault(io::FaultKind::kEio, io::IoOp::kRead, 9); }
TEST(Swapper, WriteErrorMidPipeline) { run_fault(io::FaultKind::kEio, io::IoOp::kWrite, 7); }
TEST(Swapper, EnospcOnWrite) { run_fault(io::FaultKind::kEnospc, io::IoOp::kWrite, 3); }

TEST(Swapper, CorruptReadIsACorruptionErrorNamingItemAndState) {
  Rig r;
  ASSERT_TRUE(r.init(MiB(), 64 * MiB()));
  ASSERT_TRUE(r.swap->checksum());
  auto sw = OptimizerSwapper::create(r.store.get(), adam_options(12, 64 * 1024));
  ASSERT_OK(sw);
  const size_t n = 300000;
  ASSERT_OK(sw.value()->add_group(GroupId{1}, n));
  std::vector<std::vector<float>> init(4);
  for (size_t k = 0; k < 4; ++k) {
    init[k] = series(n, static_cast<uint32_t>(k + 1));
    if (k == 2) {
      for (auto& f : init[k]) f = f * f;
    }
    ASSERT_OK(sw.value()->write_state(GroupId{1}, k, init[k].data()));
  }
  // Reads go 4 states per chunk; the 10th read answered is one of the third chunk's (which state
  // depends on the order the kernel answers in).
  r.faults.add(io::FaultKind::kCorruptRead, 10);
  Status s = sw.value()->step(adam_update());
  EXPECT_EQ(r.faults.injected(), 1u);
  ASSERT_EQ(s.code(), StatusCode::kCorruption) << s.to_string();
  EXPECT_NE(s.message().find("checksum mismatch reading nvme tier item 1 state "), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("while reading optimizer sub-group 1 at element "), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find(r.swap->files()[0]->path()), std::string::npos) << s.message();
  EXPECT_EQ(sw.value()->free_slots(), sw.value()->slots()) << "a buffer leaked";
  (void)r.engine->drain();
  // The bad bytes never reached the disk: every state reads back clean, and a step works.
  r.faults.clear();
  std::vector<float> got(n);
  for (size_t k = 0; k < 4; ++k)
    EXPECT_OK(sw.value()->read_state(GroupId{1}, k, got.data())) << "state " << k;
  EXPECT_OK(sw.value()->step(adam_update()));
  EXPECT_GT(r.swap->verified_bytes(), 0u);
}

TEST(Swapper, UpdateErrorStopsThePass) {
  Rig r;
  ASSERT_TRUE(r.init(MiB(), 64 * MiB()));
  auto sw = OptimizerSwapper::create(r.store.get(), adam_options(12, 64 * 1024));
  ASSERT_OK(sw);
  ASSERT_OK(sw.value()->add_group(GroupId{1}, 300000));
  int calls = 0;
  Status s = sw.value()->step([&](const ChunkView& c) {
    return ++calls == 4 ? invalid_argument("non-finite gradients") : Status::ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("updating optimizer sub-group 1 at element"), std::string::npos) << s.message();
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(sw.value()->free_slots(), sw.value()->slots());
}

TEST(Swapper, NvmeBudgetIsEnforced) {
  Rig r;
  ASSERT_TRUE(r.init(MiB(), 64 * MiB(), {}, /*nvme_budget=*/MiB()));
  auto sw = OptimizerSwapper::create(r.store.get(), adam_options(12, 64 * 1024));
  ASSERT_OK(sw);
  Status s = sw.value()->add_group(GroupId{1}, 100000);  // 4 states x 400 KB > 1 MiB
  EXPECT_EQ(s.code(), StatusCode::kOutOfBudget);
  EXPECT_NE(s.message().find("nvme tier"), std::string::npos) << s.message();
  EXPECT_EQ(r.store->used_bytes(), 0u);  // nothing half-registered
}

// Packed low-bit states (blocks of codes and scale, optim/lowbit.h's int8: 260 bytes per 256
// elements) move through the swapper as whole blocks: written and read back byte for byte over
// ranges of chunks, a partial last block included, handed to the update chunk by chunk at the
// same bytes, and written back from it; on NVMe and in host memory alike.
TEST(Swapper, BlockedStatesMoveAsWholeBlocks) {
  for (bool nvme : {true, false}) {
    SCOPED_TRACE(nvme ? "nvme" : "host");
    Rig r;
    ASSERT_TRUE(r.init(MiB(), 64 * MiB()));
    SwapperOptions o;
    o.states = {{StateKind::kMaster, 2, true, 1},
                {StateKind::kAdamM, 260, true, 256},
                {StateKind::kGrad, 4, false, 1}};
    o.buffer_count = 9;
    o.buffer_bytes = 64 * 1024;
    auto created = OptimizerSwapper::create(nvme ? r.store.get() : nullptr, o);
    ASSERT_OK(created);
    OptimizerSwapper& w = *created.value();
    const size_t c = w.chunk_elems();
    ASSERT_EQ(c % 4096, 0u);
    ASSERT_LE((c / 256) * 260, o.buffer_bytes);
    const size_t n = 2 * c + 1000;  // a partial chunk whose last block is partial too
    ASSERT_OK(w.add_group(GroupId{1}, n));
    const size_t blocks = (n + 255) / 256;
    std::vector<uint8_t> packed(blocks * 260);
    for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>(i * 131 + 7);
    ASSERT_OK(w.write_state(GroupId{1}, 1, packed.data()));
    std::vector<uint8_t> back(packed.size());
    ASSERT_OK(w.read_state(GroupId{1}, 1, back.data()));
    EXPECT_EQ(back, packed);
    // One chunk from the middle.
    std::vector<uint8_t> one((c / 256) * 260);
    ASSERT_OK(w.read_state(GroupId{1}, 1, one.data(), c, c));
    EXPECT_EQ(0, memcmp(one.data(), packed.data() + (c / 256) * 260, one.size()));
    // The update sees each chunk's blocks and what it writes goes home.
    size_t seen = 0;
    ASSERT_OK(w.step([&](const ChunkView& v) -> Status {
      const size_t first_block = v.begin / 256, nb = (v.n + 255) / 256;
      EXPECT_EQ(0, memcmp(v.data[1], packed.data() + first_block * 260, nb * 260)) << v.begin;
      auto* d = static_cast<uint8_t*>(v.data[1]);
      for (size_t i = 0; i < nb * 260; ++i) d[i] ^= 0x5a;
      seen += v.n;
      return Status::ok();
    }));
    EXPECT_EQ(seen, n);
    ASSERT_OK(w.read_state(GroupId{1}, 1, back.data()));
    for (size_t i = 0; i < packed.size(); ++i) ASSERT_EQ(back[i], packed[i] ^ 0x5a) << i;
    // An asynchronous write of the last (partial) chunk.
    std::vector<uint8_t> last(((n - 2 * c) + 255) / 256 * 260, 0x33);
    ASSERT_OK(w.write_state_async(GroupId{1}, 1, last.data(), 2 * c, n - 2 * c));
    ASSERT_OK(w.wait_async_writes());
    ASSERT_OK(w.read_state(GroupId{1}, 1, back.data()));
    EXPECT_EQ(0, memcmp(back.data() + (2 * c / 256) * 260, last.data(), last.size()));
  }
}

// A block size that does not tile a chunk is refused.
TEST(Swapper, BlocksMustTileAChunk) {
  SwapperOptions o;
  o.states = {{StateKind::kAdamM, 260, true, 300}};
  o.buffer_count = 3;
  o.buffer_bytes = 64 * 1024;
  auto created = OptimizerSwapper::create(nullptr, o);
  ASSERT_FALSE(created.is_ok());
  EXPECT_NE(created.status().message().find("do not divide 4096"), std::string::npos)
      << created.status().message();
}

}  // namespace
}  // namespace zoe::offload
