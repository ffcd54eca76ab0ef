// The engine's parts, each built alone from the narrow handles it is given (no Engine), with fakes
// for the other parts: ParamHomes over a tier manager, ParamGather over a fake PartitionSource,
// GradReducer over a fake GradSink, and the Updater over a fake UpdateTarget (states in host RAM,
// on NVMe and on the device) against a plain AdamW written here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "optim/cpu_pool.h"
#include "tests/offload/offload_fixture.h"
#include "tests/util/status_test_util.h"
#include "zero/grad_reducer.h"
#include "zero/param_gather.h"
#include "zero/param_homes.h"
#include "zero/updater.h"

namespace zoe::zero {
namespace {

using offload::Tier;

// A module of `n` elements in one parameter, laid out for one rank.
ModuleLayout layout(const std::string& name, size_t n, bool partitioned, Tier param_home, Tier opt_home) {
  ModuleLayout mod;
  mod.name = name;
  mod.specs = {ParamSpec{"w", {static_cast<int64_t>(n)}}};
  mod.numel = {n};
  mod.offset = {0};
  mod.total = mod.padded = mod.part = n;
  mod.partitioned_params = partitioned;
  mod.opt_begin = 0;
  mod.opt_n = n;
  mod.param_home = param_home;
  mod.opt_home = opt_home;
  return mod;
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 97) - 48) / 48.0f;
  return v;
}

// The resources a part may be handed, made here instead of by an engine: a CPU device (its ops in
// the deferred mode, so a missing synchronize reads stale bytes), a tier manager over a swap file,
// the local communicator, a CPU pool.
struct PartRig {
  offload::Rig rig;
  std::unique_ptr<optim::CpuPool> pool;
  std::unique_ptr<DeviceOps> ops;
  std::unique_ptr<DeviceMemory> mem;
  std::unique_ptr<comm::Communicator> comm = comm::create_local_comm();
  RunShape shape;
  ModuleTable modules;
  StepClock clock;

  bool init(int stage, DType cdt) {
    if (!rig.init(64 * offload::MiB(), 64 * offload::MiB())) return false;
    optim::CpuPool::Options po;
    po.threads = 1;
    auto p = optim::CpuPool::create(po);
    EXPECT_OK(p);
    if (!p.is_ok()) return false;
    pool = std::move(p).value();
    ops = make_cpu_ops(pool.get(), /*deferred=*/true);
    mem = std::make_unique<DeviceMemory>(*rig.device, *ops, cdt);
    shape.stage = stage;
    shape.cdt = cdt;
    return true;
  }
  ParamHomes::Resources homes_resources(Tier param_offload) {
    ParamHomes::Resources r;
    r.mem = mem.get();
    r.ops = ops.get();
    r.dcomm = comm.get();
    r.tm = rig.tm.get();
    r.param_offload = param_offload;
    return r;
  }
};

std::vector<char> compute_copy(const std::vector<float>& v, DType cdt) {
  std::vector<char> c(v.size() * dtype_size(cdt));
  store_compute(c.data(), v.data(), cdt, v.size());
  return c;
}

// ---------------------------------------------------------------------------------------------
// ParamHomes

TEST(Parts, ParamHomesKeepsEachModulesParametersInItsHome) {
  PartRig r;
  ASSERT_TRUE(r.init(3, DType::kBF16));
  const size_t n = 5000;
  r.modules.add(layout("nvme_part", n, true, Tier::kNvme, Tier::kDevice));
  r.modules.add(layout("host_part", n, true, Tier::kHost, Tier::kDevice));
  r.modules.add(layout("persistent", n, false, Tier::kDevice, Tier::kDevice));
  ParamHomes homes(r.shape, r.modules, r.clock, r.homes_resources(Tier::kNvme));
  std::vector<std::vector<char>> placed;
  for (ModuleId m : r.modules.ids()) {
    placed.push_back(compute_copy(ramp(n, 1.0f + static_cast<float>(m.index)), DType::kBF16));
    ASSERT_OK(homes.place(m, placed.back().data()));
  }
  ASSERT_OK(r.ops->synchronize());  // as the engine's placing does (its ops are asynchronous)
  EXPECT_TRUE(homes.has_partitions());
  for (ModuleId m : r.modules.ids()) {
    std::vector<char> got(n * 2);
    ASSERT_OK(homes.read_owned(m, 0, n, got.data()));
    EXPECT_EQ(got, placed[m.index]) << r.modules[m].name;
    // A range from the middle (on 4096-byte boundaries, as a checkpoint's pieces are).
    std::vector<char> part(2048 * 2);
    ASSERT_OK(homes.read_owned(m, 2048, 2048, part.data()));
    EXPECT_EQ(0, memcmp(part.data(), placed[m.index].data() + 4096, part.size())) << r.modules[m].name;
  }
  // The fp32 values, as a frozen module's master.
  std::vector<float> f32(n);
  ASSERT_OK(homes.read_owned_f32(ModuleId(2), f32.data()));
  std::vector<float> want = ramp(n, 3.0f);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(f32[i], bf16_to_f32(f32_to_bf16(want[i]))) << i;

  // A checkpoint's write of what the rank holds, read back.
  const std::vector<char> fresh = compute_copy(ramp(n, -0.5f), DType::kBF16);
  for (ModuleId m : r.modules.ids()) {
    ASSERT_OK(homes.write_held(m, 0, n, fresh.data()));
    std::vector<char> got(n * 2);
    ASSERT_OK(homes.read_owned(m, 0, n, got.data()));
    EXPECT_EQ(got, fresh) << r.modules[m].name;
  }

  // A pinned partition is on the device with its bytes, and counts as a pin until unpinned.
  double t_io = 0;
  auto pinned = homes.pin_partition(ModuleId(0), &t_io);
  ASSERT_OK(pinned);
  EXPECT_EQ(0, memcmp(pinned.value(), fresh.data(), fresh.size()));
  EXPECT_EQ(homes.pins(ModuleId(0)), 1u);
  homes.unpin_partition(ModuleId(0));
  EXPECT_EQ(homes.pins(ModuleId(0)), 0u);
  EXPECT_EQ(homes.pins(ModuleId(2)), 0u);  // persistent: not in the tier manager

  // The update's view of an offloaded partition: host memory, written home on release.
  EXPECT_FALSE(homes.owned_on_device(ModuleId(0)));
  EXPECT_TRUE(homes.owned_on_device(ModuleId(2)));
  auto out = homes.owned_compute(ModuleId(0), &t_io);
  ASSERT_OK(out);
  const std::vector<char> updated = compute_copy(ramp(n, 0.25f), DType::kBF16);
  memcpy(out.value(), updated.data(), updated.size());
  WritebackQueue wb;
  homes.release_owned(ModuleId(0), &t_io, &wb);
  wb.wait_all();
  ASSERT_OK(homes.drain());
  std::vector<char> got(n * 2);
  ASSERT_OK(homes.read_owned(ModuleId(0), 0, n, got.data()));
  EXPECT_EQ(got, updated);
  homes.free_device_memory();
}

// ---------------------------------------------------------------------------------------------
// ParamGather

// ParamHomes' side as ParamGather sees it, faked: each module's bytes in memory of its own, pins
// and reads counted.
struct FakeSource final : PartitionSource {
  std::vector<std::vector<float>> values;
  const ModuleTable* modules = nullptr;
  int pins = 0, reads = 0, prefetches = 0, settles = 0;
  bool traced = false;

  bool has_partitions() const override { return true; }
  void* persistent_params(ModuleId m) override { return values[m.index].data(); }
  Status settle(ModuleId) override {
    settles++;
    return Status::ok();
  }
  Status read_partition(ModuleId m, void* dst) override {
    reads++;
    memcpy(dst, values[m.index].data(), values[m.index].size() * 4);
    return Status::ok();
  }
  Result<void*> pin_partition(ModuleId m, double*) override {
    pins++;
    return static_cast<void*>(values[m.index].data());
  }
  void unpin_partition(ModuleId) override { pins--; }
  void prefetch_partition(ModuleId) override { prefetches++; }
  void end_trace() override { traced = true; }
};

TEST(Parts, ParamGatherFetchesWhatItsSourceHolds) {
  PartRig r;
  ASSERT_TRUE(r.init(3, DType::kF32));
  const size_t n = 3000;
  r.modules.add(layout("a", n, true, Tier::kNvme, Tier::kDevice));
  r.modules.add(layout("b", n, true, Tier::kHost, Tier::kDevice));
  r.modules.add(layout("c", n, false, Tier::kDevice, Tier::kDevice));
  FakeSource source;
  source.modules = &r.modules;
  for (ModuleId m : r.modules.ids()) source.values.push_back(ramp(n, 1.0f + static_cast<float>(m.index)));
  UpdateGate gate;
  ParamGather::Resources gr;
  gr.mem = r.mem.get();
  gr.dcomm = r.comm.get();
  TraceRecorder trace;
  gr.trace = &trace;
  gr.window = 0;
  gr.max_live = 1u << 30;
  gr.prefetch_bucket = 1 << 20;
  gr.in_place_pins = 3000 * 4;  // one partition pinned at a time
  ParamGather gather(r.shape, r.modules, source, gate, r.clock, gr);
  const ParamGather::MakeRoom no_room = [] { return Status::ok(); };
  for (int iteration = 0; iteration < 2; ++iteration) {
    for (ModuleId m : r.modules.ids()) {
      auto p = gather.fetch(m, no_room);
      ASSERT_OK(p);
      ASSERT_EQ(p.value().tensors.size(), 1u);
      EXPECT_EQ(0, memcmp(p.value().tensors[0].data, source.values[m.index].data(), n * 4))
          << r.modules[m].name;
      // At world size 1 a partitioned module is served in place: the partition's own bytes, pinned
      // until release (a gather would copy them); a persistent one is the source's own bytes too.
      EXPECT_EQ(p.value().tensors[0].data, source.values[m.index].data()) << r.modules[m].name;
      EXPECT_EQ(gather.in_use(m), r.modules[m].partitioned_params);
      EXPECT_EQ(source.pins, r.modules[m].partitioned_params ? 1 : 0);
      ASSERT_OK(gather.release(m));
      EXPECT_FALSE(gather.in_use(m));
      EXPECT_EQ(source.pins, 0);
    }
    if (iteration == 0) gather.end_recording();
  }
  EXPECT_TRUE(source.traced);
  EXPECT_EQ(source.settles, 6);  // every fetch settles its module's owed gather
  // The two partitioned modules, twice; the second time b's move had been started by a's fetch.
  EXPECT_EQ(r.clock.gathers_on_demand + r.clock.gathers_prefetched, 4u);
  EXPECT_EQ(r.clock.gathers_prefetched, 1u);
  EXPECT_GT(source.prefetches, 0);  // the second iteration moves the next partitions ahead
  EXPECT_EQ(source.reads, 0);       // no gather was queued ahead (window 0)
  // Two partitioned modules fetched together, beyond what the tier's share holds pinned: the
  // second is read into a copy (the same values), pinning nothing more.
  auto a = gather.fetch(ModuleId(0), no_room);
  auto b = gather.fetch(ModuleId(1), no_room);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(a.value().tensors[0].data, source.values[0].data());
  EXPECT_NE(b.value().tensors[0].data, source.values[1].data());
  EXPECT_EQ(0, memcmp(b.value().tensors[0].data, source.values[1].data(), n * 4));
  EXPECT_EQ(source.pins, 1);
  ASSERT_OK(gather.release(ModuleId(1)));
  ASSERT_OK(gather.release(ModuleId(0)));
  EXPECT_EQ(source.pins, 0);
  // Releasing what is not fetched is the caller's error, named.
  Status s = gather.release(ModuleId(1));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("release(b)"), std::string::npos) << s.message();
  gather.shutdown();
}

// ---------------------------------------------------------------------------------------------
// GradReducer

// Records what the reducer hands over; the norm it reports is the sum of the squares of the batch.
struct FakeSink final : GradSink {
  struct Call {
    size_t module;
    bool first, last;
    std::vector<float> values;
    std::vector<uint8_t> untouched;
  };
  std::vector<Call> calls;
  std::vector<size_t> zeroed;
  const ModuleTable* modules = nullptr;

  Status add_grads(ModuleId m, const GradBatch& b) override {
    const size_t n = (*modules)[m].opt_n;
    Call c{m.index, b.first, b.last, std::vector<float>(n), {}};
    memcpy(c.values.data(), b.src, n * 4);
    if (b.untouched) c.untouched = *b.untouched;
    double sq = 0;
    for (float v : c.values) sq += static_cast<double>(v) * v;
    for (size_t k = 0; k < optim::norm_chunks(n); ++k) b.norm[k] = k == 0 ? sq : 0.0;
    calls.push_back(std::move(c));
    return Status::ok();
  }
  Status zero_grads(ModuleId m) override {
    zeroed.push_back(m.index);
    return Status::ok();
  }
};

TEST(Parts, GradReducerHandsEachMicroBatchToItsSink) {
  PartRig r;
  ASSERT_TRUE(r.init(2, DType::kF32));
  const size_t n = 1000;
  r.modules.add(layout("x", n, false, Tier::kDevice, Tier::kHost));
  r.modules.add(layout("y", n, false, Tier::kDevice, Tier::kHost));
  ModuleLayout frozen = layout("z", n, false, Tier::kDevice, Tier::kHost);
  frozen.frozen = true;
  r.modules.add(frozen);
  FakeSink sink;
  sink.modules = &r.modules;
  GradReducer::Resources res;
  res.mem = r.mem.get();
  res.ops = r.ops.get();
  res.dcomm = r.comm.get();
  res.reduce_bucket = 256;
  res.micro_batches = 2;
  GradReducer reducer(r.shape, r.modules, sink, r.clock, res);
  const std::vector<float> g1 = ramp(n, 0.5f), g2 = ramp(n, -2.0f);
  for (const auto* g : {&g1, &g2}) {
    auto buf = reducer.grads(ModuleId(0));
    ASSERT_OK(buf);
    memcpy(buf.value().tensors[0].data, g->data(), n * 4);
    EXPECT_TRUE(reducer.unreduced(ModuleId(0)));
    const std::vector<uint8_t> has_grad = {1};
    ASSERT_OK(reducer.reduce(ModuleId(0), &has_grad));
  }
  ASSERT_OK(reducer.complete(true));
  ASSERT_EQ(sink.calls.size(), 2u);
  EXPECT_TRUE(sink.calls[0].first);
  EXPECT_FALSE(sink.calls[0].last);
  EXPECT_EQ(sink.calls[0].values, g1);
  EXPECT_FALSE(sink.calls[1].first);
  EXPECT_TRUE(sink.calls[1].last);
  EXPECT_EQ(sink.calls[1].values, g2);
  EXPECT_EQ(sink.calls[1].untouched, std::vector<uint8_t>{0});
  // The step's norm: the sink's sums for x, and zero sums for y, which no micro-batch reduced (the
  // frozen module has none).
  auto norm = reducer.local_norm();
  ASSERT_OK(norm);
  double want = 0;
  for (float v : g2) want += static_cast<double>(v) * v;
  EXPECT_EQ(norm.value().sum_sq, want);
  EXPECT_EQ(sink.zeroed, std::vector<size_t>{1});
  EXPECT_EQ(reducer.untouched(ModuleId(1)), std::vector<uint8_t>{1});
  // A frozen module has no gradients: refused, naming it.
  auto refused = reducer.grads(ModuleId(2));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("module z is frozen"), std::string::npos);
  reducer.end_step();
  reducer.shutdown();
}

// ---------------------------------------------------------------------------------------------
// Updater

// torch.optim.AdamW's update of one element, in double.
void adamw_reference(double* p, double* m, double* v, double g, const config::OptimizerConfig& o, double lr,
                     int64_t step) {
  *p -= lr * o.weight_decay * *p;
  *m = o.beta1 * *m + (1 - o.beta1) * g;
  *v = o.beta2 * *v + (1 - o.beta2) * g * g;
  const double mh = *m / (1 - std::pow(o.beta1, static_cast<double>(step)));
  const double vh = *v / (1 - std::pow(o.beta2, static_cast<double>(step)));
  *p -= lr * mh / (std::sqrt(vh) + o.eps);
}

// ParamHomes' side as the Updater sees it, faked: the owned range of each module in memory of its
// own (host memory: the CPU device's memory is host memory), its calls counted.
struct FakeTarget final : UpdateTarget {
  std::vector<std::vector<float>> owned;
  int open = 0, released = 0, gathered = 0;

  Result<void*> owned_compute(ModuleId m, double*) override {
    open++;
    return static_cast<void*>(owned[m.index].data());
  }
  bool owned_on_device(ModuleId) const override { return true; }
  void release_owned(ModuleId, double*, WritebackQueue*) override {
    open--;
    released++;
  }
  Status gather_updated(ModuleId) override {
    gathered++;
    return Status::ok();
  }
  void owe_gathers() override {}
  Status settle_all() override { return Status::ok(); }
  Status read_owned_f32(ModuleId m, float* out) override {
    memcpy(out, owned[m.index].data(), owned[m.index].size() * 4);
    return Status::ok();
  }
  Status read_owned(ModuleId m, size_t begin, size_t n, void* dst) override {
    memcpy(dst, owned[m.index].data() + begin, n * 4);
    return Status::ok();
  }
  Status drain() override { return Status::ok(); }
};

struct UpdaterRun {
  std::vector<float> master;
  std::vector<float> exp_avg;
};

// Two steps of one module whose states live in `home`, with two micro-batches a step; the master
// and m after them.
UpdaterRun run_updater(Tier home) {
  PartRig r;
  EXPECT_TRUE(r.init(1, DType::kF32));
  const size_t n = 40000;  // three swapper chunks
  r.modules.add(layout("m", n, false, Tier::kDevice, home));
  config::Config cfg;
  cfg.optimizer.beta1 = 0.8;
  cfg.optimizer.beta2 = 0.95;
  cfg.optimizer.eps = 1e-6;
  cfg.optimizer.weight_decay = 0.1;
  cfg.gradient_accumulation_steps = 2;
  cfg.zoe.overlap_step = false;
  FakeTarget homes;
  std::unique_ptr<offload::OptimizerSwapper> swapper;
  if (home == Tier::kNvme) {
    offload::SwapperOptions so;
    so.states = Updater::swapped_states(optim::OptimizerKind::kAdamW, optim::StateFormat::kF32,
                                        optim::MasterFormat::kF32, false);
    so.buffer_count = 12;
    so.buffer_bytes = 64 * 1024;
    auto sw = offload::OptimizerSwapper::create(r.rig.store.get(), so);
    EXPECT_OK(sw);
    if (!sw.is_ok()) return {};
    swapper = std::move(sw).value();
  }
  TraceRecorder trace;
  Updater::Resources ur;
  ur.mem = r.mem.get();
  ur.ops = r.ops.get();
  ur.pool = r.pool.get();
  ur.comm = r.comm.get();
  ur.swapper = swapper.get();
  ur.trace = &trace;
  ur.cfg = &cfg;
  Updater update(r.shape, r.modules, homes, r.clock, ur, LossScaler());
  const std::vector<float> init = ramp(n, 0.3f);
  homes.owned.push_back(init);
  EXPECT_OK(update.place(ModuleId(0), init.data()));
  EXPECT_OK(update.wait_placed());
  EXPECT_OK(r.ops->synchronize());
  std::vector<double> p(init.begin(), init.end()), m(n, 0.0), v(n, 0.0);
  const double lr = 0.01;
  for (int64_t step = 1; step <= 2; ++step) {
    const std::vector<float> a = ramp(n, 0.1f * static_cast<float>(step)), b = ramp(n, -0.3f);
    std::vector<double> norm(optim::norm_chunks(n));
    GradBatch gb;
    gb.src = a.data();
    gb.first = true;
    gb.norm = norm.data();
    EXPECT_OK(update.add_grads(ModuleId(0), gb));
    gb.src = b.data();
    gb.first = false;
    gb.last = true;
    const std::vector<uint8_t> untouched = {0};
    gb.untouched = &untouched;
    EXPECT_OK(update.add_grads(ModuleId(0), gb));
    const float scale = 0.5f;  // the step's average over the two micro-batches
    EXPECT_OK(update.apply(scale, lr));
    EXPECT_OK(update.finish());
    for (size_t i = 0; i < n; ++i) {
      const double g = static_cast<double>(static_cast<float>(a[i] + b[i])) * scale;
      adamw_reference(&p[i], &m[i], &v[i], g, cfg.optimizer, lr, step);
    }
  }
  EXPECT_EQ(update.steps(), 2);
  UpdaterRun out{std::vector<float>(n), std::vector<float>(n)};
  EXPECT_OK(update.read_master(ModuleId(0), 0, out.master.data()));
  EXPECT_OK(update.read_state(ModuleId(0), OptState::kExpAvg, 0, n, out.exp_avg.data()));
  for (size_t i = 0; i < n; i += 7) {
    EXPECT_NEAR(out.master[i], p[i], 1e-5 * (1 + std::fabs(p[i]))) << i;
    EXPECT_NEAR(out.exp_avg[i], m[i], 1e-6 * (1 + std::fabs(m[i]))) << i;
  }
  // The compute parameters went home, each step's range given back and gathered (stage 1).
  EXPECT_EQ(homes.owned[0], out.master);
  EXPECT_EQ(homes.open, 0);
  EXPECT_EQ(homes.released, 2);
  EXPECT_EQ(homes.gathered, 2);
  // A checkpoint's write of a state, read back.
  const std::vector<float> fresh = ramp(n, 7.0f);
  EXPECT_OK(update.write_state(ModuleId(0), OptState::kExpAvgSq, 0, n, fresh.data()));
  std::vector<float> back(n);
  EXPECT_OK(update.read_state(ModuleId(0), OptState::kExpAvgSq, 0, n, back.data()));
  EXPECT_EQ(back, fresh);
  update.shutdown();
  return out;
}

TEST(Parts, UpdaterTakesAdamWStepsWhereverItsStatesLive) {
  const UpdaterRun host = run_updater(Tier::kHost);
  const UpdaterRun nvme = run_updater(Tier::kNvme);
  const UpdaterRun device = run_updater(Tier::kDevice);
  ASSERT_FALSE(host.master.empty());
  // The same kernel over the same sums: offloaded or not, the same bits.
  EXPECT_EQ(nvme.master, host.master);
  EXPECT_EQ(nvme.exp_avg, host.exp_avg);
  EXPECT_EQ(device.master, host.master);
}

// An Updater's resources from the rig, without a swapper (states in host RAM), m and v in `states`.
Updater::Resources host_resources(PartRig& r, const config::Config& cfg, TraceRecorder& trace,
                                  optim::StateFormat states) {
  Updater::Resources ur;
  ur.mem = r.mem.get();
  ur.ops = r.ops.get();
  ur.pool = r.pool.get();
  ur.comm = r.comm.get();
  ur.trace = &trace;
  ur.cfg = &cfg;
  ur.states = states;
  return ur;
}

// Packed (int8) states in host RAM, a module of two parameters: "a" (300 elements: block 0 and
// part of block 1) and "b". Step 1 trains both; at step 2 `a` gets no gradient (untouched).
struct PackedRun {
  std::vector<float> master1, master2;  // after steps 1 and 2
  std::vector<uint8_t> m1, v1, m2, v2;  // m and v as stored
};
PackedRun run_packed(bool a_untouched) {
  PartRig r;
  EXPECT_TRUE(r.init(1, DType::kF32));
  const size_t n = 4096, na = 300;
  ModuleLayout mod = layout("m", n, false, Tier::kDevice, Tier::kHost);
  mod.specs = {ParamSpec{"a", {static_cast<int64_t>(na)}}, ParamSpec{"b", {static_cast<int64_t>(n - na)}}};
  mod.numel = {na, n - na};
  mod.offset = {0, na};
  r.modules.add(mod);
  config::Config cfg;
  cfg.zoe.overlap_step = false;
  FakeTarget homes;
  TraceRecorder trace;
  const Updater::Resources ur = host_resources(r, cfg, trace, optim::StateFormat::kInt8);
  Updater update(r.shape, r.modules, homes, r.clock, ur, LossScaler());
  const std::vector<float> init = ramp(n, 0.3f);
  homes.owned.push_back(init);
  EXPECT_OK(update.place(ModuleId(0), init.data()));
  PackedRun out;
  const size_t sb = optim::state_bytes(optim::StateFormat::kInt8, n);
  for (int step = 1; step <= 2; ++step) {
    std::vector<float> g = ramp(n, 0.05f * static_cast<float>(step));
    for (size_t i = 0; i < n; ++i) g[i] += 1e-4f * static_cast<float>(i % 13);  // v spans decades
    std::vector<double> norm(optim::norm_chunks(n));
    GradBatch gb;
    gb.src = g.data();
    gb.first = gb.last = true;
    gb.norm = norm.data();
    EXPECT_OK(update.add_grads(ModuleId(0), gb));
    update.set_untouched({step == 2 && a_untouched ? std::vector<uint8_t>{1, 0} : std::vector<uint8_t>{}});
    EXPECT_OK(update.apply(1.0f, 0.01));
    EXPECT_OK(update.finish());
    std::vector<float>& master = step == 1 ? out.master1 : out.master2;
    std::vector<uint8_t>& m = step == 1 ? out.m1 : out.m2;
    std::vector<uint8_t>& v = step == 1 ? out.v1 : out.v2;
    master.resize(n);
    m.resize(sb);
    v.resize(sb);
    EXPECT_OK(update.read_state(ModuleId(0), OptState::kMaster, 0, n, master.data()));
    EXPECT_OK(update.read_state(ModuleId(0), OptState::kExpAvg, 0, n, m.data()));
    EXPECT_OK(update.read_state(ModuleId(0), OptState::kExpAvgSq, 0, n, v.data()));
  }
  update.shutdown();
  return out;
}

std::vector<float> decode(optim::StateKind k, const std::vector<uint8_t>& s, size_t n) {
  std::vector<float> out(n);
  EXPECT_OK(optim::dequantize_state(k, optim::StateFormat::kInt8, s.data(), out.data(), n));
  return out;
}

TEST(Parts, UpdaterLeavesAnUntouchedParameterOfPackedStatesAsItWas) {
  const PackedRun all = run_packed(false), skip = run_packed(true);
  ASSERT_EQ(all.master2.size(), 4096u);
  const size_t na = 300, bb = 260;
  // Step 1 alike; at step 2 `a`'s master is its step-1 value, `b`'s the run's where `a` trained.
  EXPECT_EQ(skip.master1, all.master1);
  EXPECT_EQ(memcmp(skip.master2.data(), skip.master1.data(), na * 4), 0);
  EXPECT_EQ(memcmp(skip.master2.data() + na, all.master2.data() + na, (4096 - na) * 4), 0);
  EXPECT_NE(memcmp(all.master2.data(), all.master1.data(), na * 4), 0);
  // Block 0 (a's alone): m and v bytes as they were. Blocks 2.. (b's alone): as the other run's.
  EXPECT_EQ(memcmp(skip.m2.data(), skip.m1.data(), bb), 0);
  EXPECT_EQ(memcmp(skip.v2.data(), skip.v1.data(), bb), 0);
  EXPECT_EQ(memcmp(skip.m2.data() + 2 * bb, all.m2.data() + 2 * bb, all.m2.size() - 2 * bb), 0);
  EXPECT_EQ(memcmp(skip.v2.data() + 2 * bb, all.v2.data() + 2 * bb, all.v2.size() - 2 * bb), 0);
  // Block 1, shared: a's values kept and b's new ones, each within the block's quantization step.
  for (auto k : {optim::StateKind::kExpAvg, optim::StateKind::kExpAvgSq}) {
    const bool is_m = k == optim::StateKind::kExpAvg;
    const auto now = decode(k, is_m ? skip.m2 : skip.v2, 4096),
               before = decode(k, is_m ? skip.m1 : skip.v1, 4096),
               other = decode(k, is_m ? all.m2 : all.v2, 4096);
    float top = 0;
    for (size_t i = 256; i < 512; ++i) top = std::max({top, std::fabs(now[i]), std::fabs(other[i])});
    for (size_t i = 256; i < 512; ++i) {
      const float want = i < na ? before[i] : other[i];
      // Square-root (m) or fourth-root (v) companding: the error near the top is about 2/127 of
      // the largest value of the block, less further down.
      EXPECT_NEAR(now[i], want, 0.04f * top) << (is_m ? "m " : "v ") << i;
    }
  }
}

TEST(Parts, UpdaterNamesTheModuleOfANonFiniteState) {
  // A packed m whose stored block scale is NaN (a corrupted state) fails the step with an error
  // naming the module, never a silent value.
  PartRig r;
  ASSERT_TRUE(r.init(1, DType::kF32));
  const size_t n = 4096;
  r.modules.add(layout("blocks.3.mlp", n, false, Tier::kDevice, Tier::kHost));
  config::Config cfg;
  cfg.zoe.overlap_step = false;
  FakeTarget homes;
  TraceRecorder trace;
  const Updater::Resources ur = host_resources(r, cfg, trace, optim::StateFormat::kInt4);
  Updater update(r.shape, r.modules, homes, r.clock, ur, LossScaler());
  const std::vector<float> init = ramp(n, 0.3f);
  homes.owned.push_back(init);
  ASSERT_OK(update.place(ModuleId(0), init.data()));
  std::vector<uint8_t> m(optim::state_bytes(optim::StateFormat::kInt4, n), 0);
  const float nan = std::nanf("");
  memcpy(m.data() + 68 * 5, &nan, 4);  // block 5's scale
  ASSERT_OK(update.write_state(ModuleId(0), OptState::kExpAvg, 0, n, m.data()));
  const std::vector<float> g = ramp(n, 0.05f);
  std::vector<double> norm(optim::norm_chunks(n));
  GradBatch gb;
  gb.src = g.data();
  gb.first = gb.last = true;
  gb.norm = norm.data();
  ASSERT_OK(update.add_grads(ModuleId(0), gb));
  Status s = update.apply(1.0f, 0.01);
  if (s.is_ok()) s = update.finish();
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("blocks.3.mlp"), std::string::npos) << s.to_string();
  update.shutdown();
}

}  // namespace
}  // namespace zoe::zero
