// The engine behind include/zoe/engine.h: a few parts, each owning its own state and its bytes
// behind its own header, and Engine::Impl, which owns the resources, builds the parts at
// initialize() and orders the calls.
//
//   engine_context.h   EngineContext: the resources (device, communicators, I/O, tier manager,
//                      swapper, pool, timeline) and the placement. The engine's alone.
//   part_resources.h   RunShape, DeviceMemory, HostArena: what parts are handed besides their
//                      own Resources (each part's header lists the handles it uses).
//   module_table.h     ModuleTable: each module's parameters and layout, by ModuleId.
//   step_clock.h       StepClock: the step's statistics and timing (a leaf).
//   param_homes.h      ParamHomes: where compute parameters live between uses; the only caller
//                      of the tier manager's per-partition calls.
//   updater.h          Updater: optimizer states and gradient sums wherever they live (the only
//                      user of the optimizer swapper in training), the update (serial,
//                      overlapped, speculative), the loss scaler and the step count;
//                      UpdateGate (update_gate.h).
//   grad_reducer.h     GradReducer: gradient buffers and reductions, handed to a GradSink.
//   param_gather.h     ParamGather: fetch/release, stage-3 gathers and their prefetch.
//   engine_checkpoint.cpp  save/load through src/checkpoint, streaming through the parts' calls.
//   engine_activations.cpp the activation store (offload/activation_store.h): its budgets beside
//                      the placement, and Engine::activations().
//   engine.cpp         creation, add_module, initialize(); engine_calls.cpp and engine_step.cpp
//                      the public calls (fetch, grads, reduce_grads, release, step, read_master).
//
// Calls between the parts (caller -> callee), with no cycle:
//   ParamGather -> PartitionSource (ParamHomes), UpdateGate, StepClock
//   GradReducer -> GradSink (the Updater), StepClock
//   Updater     -> UpdateTarget (ParamHomes), UpdateGate, StepClock
// (the interfaces: home_views.h and grad_sink.h; the part tests fake them)
//   ParamHomes  -> StepClock
// Engine (the public calls and engine_checkpoint.cpp) calls them all. ParamGather needs device
// memory freed at times; it asks through a callback the engine hands it (the engine completes
// GradReducer's reductions), not by calling GradReducer.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "io/buffer.h"
#include "zero/engine_context.h"
#include "zero/grad_reducer.h"
#include "zero/loss_scaler.h"
#include "zero/module_table.h"
#include "zero/param_gather.h"
#include "zero/param_homes.h"
#include "zero/step_clock.h"
#include "zero/updater.h"
#include "zoe/engine.h"

namespace zoe {

struct Engine::Impl {
  // An asynchronous checkpoint: written by its thread, committed by finish_save().
  struct AsyncSave {
    std::thread thread;
    std::string save_dir, tag, tmp, trainer;
    int64_t steps = 0;
    Status status;  // of the background write
    std::vector<char> records_json;
  };

  zero::EngineContext ctx;
  zero::ModuleTable modules;
  zero::StepClock clock;
  zero::LossScaler::Options scaler_options;  // the Updater's scaler, from the config
  // The parts, built by initialize() (build_parts) once the placement and the resources exist;
  // destroyed before the resources they use (declared after ctx). Null before initialize().
  std::unique_ptr<zero::ParamHomes> homes;
  std::unique_ptr<zero::Updater> update;
  std::unique_ptr<zero::GradReducer> grads;
  std::unique_ptr<zero::ParamGather> gather;
  std::unique_ptr<AsyncSave> async_save;
  bool initialized = false;

  // sleep()/wake() (engine_sleep.cpp): every device allocation's bytes while the engine is asleep,
  // in host memory or (`host` empty) in zoe's swap under `key`.
  struct SleepCopy {
    void* dev = nullptr;
    uint64_t bytes = 0;
    io::AlignedBuffer host;
    offload::StateKey key;
  };
  std::vector<SleepCopy> sleep_copies;
  bool asleep = false;
  uint64_t sleep_host_bytes = 0;  // of sleep_copies, in host memory
  // OK when awake; else "<what> while the engine is asleep: call wake() first".
  Status awake(const char* what) const;
  // Copies every device allocation out (sleep) or back (wake).
  Status copy_out(uint64_t host_room);
  Status copy_back();
  void drop_sleep_copies();

  // initialize(): each part, with the handles it uses.
  void build_parts();

  // engine.cpp: setup.
  Status setup_io();
  Status setup_tiers();
  Status check_nvme_space() const;
  // engine_activations.cpp: the activation store, its budgets planned beside the placement.
  Status setup_activations();
  // The placement, planned with the device's activation share kept out of its budget (a stage-3
  // tier manager's device cache would otherwise fill it): see engine_activations.cpp.
  Result<zero::Placement> plan_beside_activations(const std::vector<zero::ModuleShape>& shapes,
                                                  zero::PlanTarget target) const;
  Result<offload::ActivationStoreOptions> activation_options() const;
  // initialize()'s buffers for one module's fp32 values and their compute-dtype copy.
  // One module's initial values: fp32 and the compute dtype, 4096-byte aligned (the optimizer
  // swapper writes the masters to NVMe from `full` itself).
  struct PlaceScratch {
    std::unique_ptr<float, void (*)(void*)> full_mem{nullptr, std::free};
    std::unique_ptr<char, void (*)(void*)> cbuf_mem{nullptr, std::free};
    float* full = nullptr;
    char* cbuf = nullptr;
    Status allocate(size_t elems, size_t compute_bytes);
  };
  // Module m's initial values in s (the caller's init and its padding), then those values into
  // their homes (store_module, on the placing thread of place_all(): the optimizer's share, the
  // compute-dtype copy (compute_copy) and the compute parameters).
  Status fill_values(zero::ModuleId m, const std::function<void(size_t, size_t, float*, size_t)>& init,
                     PlaceScratch* s);
  Status compute_copy(zero::ModuleId m, const PlaceScratch& s);
  Status store_module(zero::ModuleId m, const PlaceScratch& s);
  // Every module's initial values in their homes: module i+1's values are computed on the caller's
  // thread while module i's are stored on a placing thread (two scratches).
  Status place_all(const std::function<void(size_t, size_t, float*, size_t)>& init);
  // A module index from the public API, checked: "what(m): there are N modules" otherwise.
  Result<zero::ModuleId> module_id(const char* what, size_t m) const;
  // Completes every reduction in flight: ParamGather's way to free device memory.
  Status make_room() { return grads->complete(true); }
  // Waits for everything in flight and frees device memory (no collectives): before the device goes.
  void shutdown();
};

}  // namespace zoe
