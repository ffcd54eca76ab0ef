// _zoe: the pybind11 glue between the zoe C++ engine and the `zoe` Python package (PyTorch
// front-end), over the public API only (include/zoe/, linked as zoe::zoe): what a user's own
// binding could do. All C++ the front-end needs lives here.
//
// Errors: every failed Status becomes a zoe.ZoeError whose text is Status::to_string() (the code,
// the message and its context lines). Buffers reach Python over the engine's own memory (no copy),
// valid until the matching release()/reduce_grads(): host-addressable ones (the CPU device) as
// NumPy arrays, which the Python side wraps with torch.from_numpy; device memory (CUDA) as a
// DeviceView exposing __cuda_array_interface__ (version 3), which torch.as_tensor wraps. bf16
// comes as int16 either way (viewed as bf16 in torch). Nothing here needs CUDA's headers: a
// device buffer is passed on as its address.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <optional>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "zoe/activations.h"
#include "zoe/zoe.h"

namespace py = pybind11;

namespace {

struct ZoeErrorTag {};
py::handle g_zoe_error;  // zoe.ZoeError (a RuntimeError)

[[noreturn]] void raise(const zoe::Status& s) {
  PyErr_SetString(g_zoe_error.ptr(), s.to_string().c_str());
  throw py::error_already_set();
}

void check(const zoe::Status& s) {
  if (!s.is_ok()) raise(s);
}

template <typename T>
T take(zoe::Result<T> r) {
  if (!r.is_ok()) raise(r.status());
  return std::move(r).value();
}

const char* py_dtype_name(zoe::ComputeDType d) {
  switch (d) {
    case zoe::ComputeDType::kF32:
      return "f32";
    case zoe::ComputeDType::kBF16:
      return "bf16";
    case zoe::ComputeDType::kF16:
      return "f16";
  }
  return "?";
}

// A flat NumPy view of n elements at p (no copy; `owner` keeps nothing alive: the engine's
// contract says how long p is valid). bf16 comes as int16 (torch 1.13 has no uint16).
py::array host_view(void* p, size_t n, zoe::ComputeDType d) {
  // One owner-less base for every view, leaked on purpose (it must outlive the interpreter's
  // last array).
  static int dummy = 0;
  static py::capsule& no_owner = *new py::capsule(&dummy, [](void*) {});
  const auto shape = std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)};
  switch (d) {
    case zoe::ComputeDType::kF32:
      return py::array_t<float>(shape, static_cast<float*>(p), no_owner);
    case zoe::ComputeDType::kBF16:
      return py::array_t<int16_t>(shape, static_cast<int16_t*>(p), no_owner);
    case zoe::ComputeDType::kF16:
      return py::array(py::dtype("float16"), shape, p, no_owner);
  }
  return py::array();
}

// A flat view of n elements of device memory (CUDA) at ptr, for torch.as_tensor(v, device=...)
// through __cuda_array_interface__ (no copy). It owns nothing: the engine's contract says how
// long ptr is valid. The engine's fetch()/grads() return once the buffer is complete (the
// engine's streams synchronized), so the interface says stream None: no synchronization is
// needed before reading it. The other way round, the caller's kernels must have finished with a
// buffer before it goes back (release, reduce_grads): the Python side synchronizes torch's
// stream there.
struct DeviceView {
  uintptr_t ptr = 0;
  size_t numel = 0;
  zoe::ComputeDType dtype = zoe::ComputeDType::kF32;

  // The element type as __cuda_array_interface__ spells it (bf16 as int16, as on the host).
  const char* typestr() const {
    switch (dtype) {
      case zoe::ComputeDType::kF32:
        return "<f4";
      case zoe::ComputeDType::kBF16:
        return "<i2";
      case zoe::ComputeDType::kF16:
        return "<f2";
    }
    return "?";
  }

  py::dict interface() const {
    py::dict d;
    d["version"] = 3;
    d["shape"] = py::make_tuple(numel);
    d["typestr"] = typestr();
    d["data"] = py::make_tuple(ptr, false);
    d["strides"] = py::none();
    d["stream"] = py::none();
    return d;
  }
};

zoe::ComputeDType dtype_from_name(const std::string& name) {
  if (name == "f32") return zoe::ComputeDType::kF32;
  if (name == "bf16") return zoe::ComputeDType::kBF16;
  if (name == "f16") return zoe::ComputeDType::kF16;
  raise(zoe::invalid_argument("DeviceView: dtype '%s' is not one of f32, bf16, f16", name.c_str()));
}

// A view of one engine buffer: NumPy over host memory, DeviceView over device memory.
py::object view(const zoe::TensorView& v) {
  if (v.host_addressable) return host_view(v.data, v.numel, v.dtype);
  return py::cast(DeviceView{reinterpret_cast<uintptr_t>(v.data), v.numel, v.dtype});
}

py::list views(const zoe::ModuleParams& mp) {
  py::list out;
  for (const zoe::TensorView& v : mp.tensors) out.append(view(v));
  return out;
}

// The runtime of this process (one per process: MPI is initialised once).
std::shared_ptr<zoe::Runtime>& runtime_slot() {
  static std::shared_ptr<zoe::Runtime> rt;
  return rt;
}

std::shared_ptr<zoe::Runtime> get_runtime(bool force_local) {
  auto& rt = runtime_slot();
  if (!rt) rt = std::shared_ptr<zoe::Runtime>(take(zoe::Runtime::init(force_local)).release());
  return rt;
}

// read_module_master's arrays: 4096-byte aligned (the engine reads whole chunks from NVMe into
// them, with no copy), and the last one given back kept for the next read, so a stream of modules
// reuses pages already faulted in instead of the kernel's handing out (and zeroing) fresh ones at
// every module. The GIL guards it.
class ReadArrays : public std::enable_shared_from_this<ReadArrays> {
 public:
  ~ReadArrays() { std::free(kept_); }
  // An array of n floats whose memory goes back to this pool when the last view of it goes.
  py::array_t<float> take(size_t n) {
    const size_t bytes = (std::max<size_t>(n, 1) * sizeof(float) + 4095) & ~size_t{4095};
    void* mem = nullptr;
    size_t have = bytes;
    if (kept_ && kept_bytes_ >= bytes && kept_bytes_ - bytes <= bytes) {  // at most twice what is asked
      mem = kept_;
      have = kept_bytes_;
      kept_ = nullptr;
    } else {
      mem = std::aligned_alloc(4096, bytes);
      if (!mem) throw std::bad_alloc();
      live_ += bytes;
      peak_ = std::max(peak_, live_);
    }
    struct Owner {
      std::weak_ptr<ReadArrays> pool;
      void* mem;
      size_t bytes;
    };
    py::capsule owner(new Owner{weak_from_this(), mem, have}, [](void* p) {
      std::unique_ptr<Owner> o(static_cast<Owner*>(p));
      if (auto pool = o->pool.lock()) {
        pool->give_back(o->mem, o->bytes);
      } else {
        std::free(o->mem);
      }
    });
    return py::array_t<float>({static_cast<py::ssize_t>(n)}, {static_cast<py::ssize_t>(sizeof(float))},
                              static_cast<float*>(mem), owner);
  }
  // Frees the array kept (the end of a stream).
  void drop() { release(&kept_, kept_bytes_); }
  // The bytes of these arrays alive at once at most (the one kept included), since the start.
  size_t peak_bytes() const { return peak_; }

 private:
  void release(void** mem, size_t bytes) {
    if (!*mem) return;
    std::free(*mem);
    *mem = nullptr;
    live_ -= bytes;
  }
  void give_back(void* mem, size_t bytes) {
    if (kept_ && kept_bytes_ >= bytes) {
      release(&mem, bytes);
      return;
    }
    release(&kept_, kept_bytes_);
    kept_ = mem;
    kept_bytes_ = bytes;
  }
  void* kept_ = nullptr;
  size_t kept_bytes_ = 0;
  size_t live_ = 0, peak_ = 0;
};

// An engine with what it refers to: the runtime outlives it; the config is kept for its keys.
class PyEngine {
 public:
  PyEngine(std::shared_ptr<zoe::Runtime> rt, zoe::Config cfg) : rt_(std::move(rt)), cfg_(std::move(cfg)) {
    eng_ = take(zoe::Engine::create(*rt_, cfg_));
  }

  zoe::Engine& e() {
    if (!eng_) {
      PyErr_SetString(g_zoe_error.ptr(), "invalid argument: the engine was closed");
      throw py::error_already_set();
    }
    return *eng_;
  }
  void close() { eng_.reset(); }

  const zoe::Config& cfg() const { return cfg_; }
  int rank() const { return rt_->rank(); }
  int world_size() const { return rt_->world_size(); }
  int local_rank() const { return rt_->local_rank(); }
  ReadArrays& read_arrays() { return *read_arrays_; }

 private:
  std::shared_ptr<ReadArrays> read_arrays_ = std::make_shared<ReadArrays>();
  std::shared_ptr<zoe::Runtime> rt_;
  zoe::Config cfg_;
  std::unique_ptr<zoe::Engine> eng_;
};

// Every StepStats field (zoe/step_stats.h), by name; high_water as {"device", "host", "nvme"}.
py::dict stats_dict(const zoe::StepStats& s) {
  py::dict d;
  zoe::for_each_field(s, [&](const char* name, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, uint64_t*> || std::is_array_v<std::remove_reference_t<decltype(value)>>) {
      py::dict tiers;
      tiers["device"] = value[0];
      tiers["host"] = value[1];
      tiers["nvme"] = value[2];
      d[name] = tiers;
    } else {
      d[name] = value;
    }
  });
  return d;
}

// The full fp32 parameters of a checkpoint ("<module>.<param>" -> array of the param's shape;
// from the master copy, or the compute copy when there is none) and its trainer state (JSON).
// kind "exp_avg" / "exp_avg_sq": Adam's m or v instead (dequantized; the parameters without them,
// frozen ones, are left out).
py::tuple read_checkpoint(const std::string& dir, const std::string& kind) {
  auto reader = take(zoe::CheckpointReader::open(dir));
  const auto& params = reader->params();
  py::dict out;
  for (size_t i = 0; i < params.size(); ++i) {
    const zoe::CheckpointParam& p = params[i];
    std::vector<py::ssize_t> shape(p.shape.begin(), p.shape.end());
    py::array_t<float> a(shape);
    if (a.size() != static_cast<py::ssize_t>(p.numel)) {
      raise(zoe::corruption("%s: parameter %s: shape has %zd elements, numel is %llu", reader->path().c_str(),
                            p.full_name().c_str(), a.size(), static_cast<unsigned long long>(p.numel)));
    }
    zoe::Status s;
    {
      py::gil_scoped_release nogil;
      s = reader->read_state_f32(i, kind, a.mutable_data());
    }
    if (kind != "master" && s.code() == zoe::StatusCode::kNotFound) continue;
    check(s);
    out[py::str(p.full_name())] = a;
  }
  return py::make_tuple(out, reader->trainer_state_json(), reader->step());
}

// A summary of a parsed config, by the keys' JSON paths.
py::dict config_summary(const zoe::Config& c) {
  py::dict d;
  d["stage"] = c.stage();
  d["gradient_accumulation_steps"] = c.gradient_accumulation_steps();
  d["train_micro_batch_size_per_gpu"] = c.micro_batch();
  d["train_batch_size"] = c.train_batch_size();
  d["fp16"] = take(c.get_bool("fp16.enabled"));
  d["bf16"] = take(c.get_bool("bf16.enabled"));
  d["gradient_clipping"] = take(c.get_double("gradient_clipping"));
  d["offload_optimizer"] = zoe::offload_name(c.offload_optimizer());
  d["offload_param"] = zoe::offload_name(c.offload_param());
  d["device_budget_bytes"] = c.device_budget();
  d["device"] = c.device();
  d["json"] = c.to_json();
  return d;
}

// DeviceView: what views() returns for device memory (built here too, for tests of the interface).
void bind_device_view(py::module_& m) {
  py::class_<DeviceView>(m, "DeviceView",
                         "A flat view of engine device memory (no copy) for torch.as_tensor(v, device=...) "
                         "through __cuda_array_interface__; valid as the engine's buffer it shows.")
      .def(py::init([](uintptr_t ptr, size_t numel, const std::string& dtype) {
             return DeviceView{ptr, numel, dtype_from_name(dtype)};
           }),
           py::arg("ptr"), py::arg("numel"), py::arg("dtype"))
      .def_readonly("ptr", &DeviceView::ptr)
      .def_readonly("numel", &DeviceView::numel)
      .def_property_readonly("dtype", [](const DeviceView& v) { return py_dtype_name(v.dtype); })
      .def_property_readonly("__cuda_array_interface__", &DeviceView::interface)
      .def("__repr__", [](const DeviceView& v) {
        return "DeviceView(ptr=" + std::to_string(v.ptr) + ", numel=" + std::to_string(v.numel) +
               ", dtype=" + py_dtype_name(v.dtype) + ")";
      });
}

// fill_normal(out, mean, std, seed) and fill_uniform(out, low, high, seed): `Fill` over the whole
// contiguous float32 array, the GIL released.
template <void (*Fill)(float*, size_t, float, float, uint64_t)>
void fill_with(py::array_t<float, py::array::c_style> out, float a, float b, uint64_t seed) {
  float* p = out.mutable_data();
  const size_t n = static_cast<size_t>(out.size());
  py::gil_scoped_release unlocked;
  Fill(p, n, a, b, seed);
}

// The module-level functions: the runtime, configs, checkpoints.
void bind_functions(py::module_& m) {
  m.def(
      "runtime",
      [](bool force_local) {
        auto rt = get_runtime(force_local);
        return py::make_tuple(rt->rank(), rt->world_size());
      },
      py::arg("force_local") = false,
      "Initialises this process's runtime once (MPI under mpirun/srun, gloo under torchrun); returns (rank, "
      "world_size).");
  m.def(
      "check_launcher", [] { check(zoe::check_launcher()); },
      "Refuses torchrun's variables in a zoe built without gloo (ZoeError saying what to do).");
  m.def(
      "shutdown_runtime", [] { runtime_slot().reset(); },
      "Drops the runtime (after every engine is closed).");

  m.def(
      "fill_normal", fill_with<&zoe::fill_normal>, py::arg("out").noconvert(), py::arg("mean"),
      py::arg("std"), py::arg("seed"),
      "Fills a contiguous float32 array with normal(mean, std) values of the stream `seed` (zoe/random.h).");
  m.def("fill_uniform", fill_with<&zoe::fill_uniform>, py::arg("out").noconvert(), py::arg("low"),
        py::arg("high"), py::arg("seed"),
        "Fills a contiguous float32 array with uniform values in [low, high) of the stream `seed`.");

  m.def(
      "parse_config",
      [](const std::string& text, int world) {
        return config_summary(take(zoe::Config::parse(text, world)));
      },
      py::arg("text"), py::arg("world_size") = 1,
      "Parses and validates a DeepSpeed-style JSON config; a summary dict (ZoeError on a bad key).");

  m.def("read_checkpoint", &read_checkpoint, py::arg("dir"), py::arg("kind") = "master",
        "(params, trainer_json, step) of a checkpoint: full fp32 parameters named <module>.<param> (kind "
        "\"master\"), or Adam's m or v (\"exp_avg\", \"exp_avg_sq\").");
}

// Engine: construction, modules and their initial values.
void bind_engine_setup(py::class_<PyEngine>& c) {
  c.def(py::init([](const std::string& config_text, bool force_local) {
          auto rt = get_runtime(force_local);
          auto cfg = take(zoe::Config::parse(config_text, rt->world_size()));
          return std::make_unique<PyEngine>(rt, std::move(cfg));
        }),
        py::arg("config_text"), py::arg("force_local") = false)
      .def_property_readonly("rank", &PyEngine::rank)
      .def_property_readonly("world_size", &PyEngine::world_size)
      .def_property_readonly("local_rank", &PyEngine::local_rank)
      // zoe.device as configured ("auto", "cpu" or "cuda"; the engine runs on CUDA only for "cuda").
      .def("device", [](PyEngine& self) { return self.cfg().device(); })
      .def("close", &PyEngine::close)
      .def(
          "add_module",
          [](PyEngine& self, const std::string& name,
             const std::vector<std::pair<std::string, std::vector<int64_t>>>& ps, bool frozen, bool held) {
            std::vector<zoe::ParamSpec> specs;
            for (const auto& [n, shape] : ps) specs.push_back({n, shape});
            zoe::ModuleOptions opts;
            opts.frozen = frozen;
            opts.held = held;
            check(self.e().add_module(name, specs, opts));
          },
          py::arg("name"), py::arg("params"), py::arg("frozen") = false, py::arg("held") = false)
      .def("module_frozen", [](PyEngine& self, size_t i) { return self.e().module_frozen(i); })
      .def(
          "initialize",
          [](PyEngine& self, const std::function<py::object(size_t, size_t)>& fn) {
            // fn(module, param) returns a float32 array-like of the parameter's numel elements.
            std::string error;
            zoe::Status s = self.e().initialize([&](size_t mi, size_t pi, float* data, size_t n) {
              if (!error.empty()) return;
              try {
                auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(fn(mi, pi));
                if (!a || static_cast<size_t>(a.size()) != n) {
                  error = "initialize: the value of parameter " + std::to_string(pi) + " of module " +
                          self.e().module_name(mi) + " has " + (a ? std::to_string(a.size()) : "no") +
                          " elements, expected " + std::to_string(n);
                  return;
                }
                std::memcpy(data, a.data(), n * sizeof(float));
              } catch (py::error_already_set& e) {
                error = std::string("initialize: ") + e.what();
              }
            });
            if (!error.empty()) raise(zoe::invalid_argument("%s", error.c_str()));
            check(s);
          },
          py::arg("init"))
      .def("num_modules", [](PyEngine& self) { return self.e().num_modules(); })
      .def("module_name", [](PyEngine& self, size_t i) { return self.e().module_name(i); })
      .def("compute_dtype", [](PyEngine& self) { return py_dtype_name(self.e().compute_dtype()); })
      .def("gradient_accumulation_steps",
           [](PyEngine& self) { return self.cfg().gradient_accumulation_steps(); })
      .def("stage", [](PyEngine& self) { return self.cfg().stage(); })
      // Any config key by its JSON path, as JSON text (Config::get): the one way a key reaches Python.
      .def(
          "config_value", [](PyEngine& self, const std::string& key) { return take(self.cfg().get(key)); },
          py::arg("key"));
}

// Engine: one training step's calls (the GIL released while the engine works).
void bind_engine_step(py::class_<PyEngine>& c) {
  c.def("loss_scale", [](PyEngine& self) { return self.e().loss_scale(); })
      .def("fetch",
           [](PyEngine& self, size_t i) {
             zoe::Result<zoe::ModuleParams> r = zoe::invalid_argument("unreached");
             {
               py::gil_scoped_release nogil;
               r = self.e().fetch(i);
             }
             return views(take(std::move(r)));
           })
      .def("release", [](PyEngine& self, size_t i) { check(self.e().release(i)); })
      .def("grads",
           [](PyEngine& self, size_t i) {
             auto r = self.e().grads(i);
             return views(take(std::move(r)));
           })
      .def(
          "reduce_grads",
          [](PyEngine& self, size_t i, std::optional<std::vector<bool>> has_grad) {
            zoe::Status s;
            {
              py::gil_scoped_release nogil;
              s = has_grad ? self.e().reduce_grads(i, *has_grad) : self.e().reduce_grads(i);
            }
            check(s);
          },
          py::arg("m"), py::arg("has_grad") = py::none())
      .def("step", [](PyEngine& self) {
        zoe::Result<zoe::StepStats> r = zoe::invalid_argument("unreached");
        {
          py::gil_scoped_release nogil;
          r = self.e().step();
        }
        return stats_dict(take(std::move(r)));
      });
}

// Engine: checkpoints, master values and sizes.
void bind_engine_state(py::class_<PyEngine>& c) {
  c.def("read_master",
        [](PyEngine& self, size_t mi, size_t pi, size_t numel) {
          py::array_t<float> a(static_cast<py::ssize_t>(numel));
          zoe::Status s;
          {
            py::gil_scoped_release nogil;
            s = self.e().read_master(mi, pi, a.mutable_data());
          }
          check(s);
          return a;
        })
      .def("read_module_master",
           [](PyEngine& self, size_t mi, size_t numel) {
             py::array_t<float> a = self.read_arrays().take(numel);
             zoe::Status s;
             {
               py::gil_scoped_release nogil;
               s = self.e().read_module_master(mi, a.mutable_data());
             }
             check(s);
             return a;
           })
      .def("drop_read_arrays", [](PyEngine& self) { self.read_arrays().drop(); })
      .def("read_arrays_peak_bytes", [](PyEngine& self) { return self.read_arrays().peak_bytes(); })
      .def(
          "save",
          [](PyEngine& self, const std::string& dir, const std::string& tag, const std::string& state,
             bool async) {
            zoe::Status s;
            {
              py::gil_scoped_release nogil;
              s = self.e().save(dir, tag, state, async);
            }
            check(s);
          },
          py::arg("dir"), py::arg("tag"), py::arg("trainer_state_json"), py::arg("async_") = false)
      .def("finish_save",
           [](PyEngine& self) {
             zoe::Status s;
             {
               py::gil_scoped_release nogil;
               s = self.e().finish_save();
             }
             check(s);
           })
      .def("load",
           [](PyEngine& self, const std::string& dir) {
             zoe::Result<std::string> r = zoe::invalid_argument("unreached");
             {
               py::gil_scoped_release nogil;
               r = self.e().load(dir);
             }
             return take(std::move(r));
           })
      .def("sleep",
           [](PyEngine& self) {
             zoe::Status s;
             {
               py::gil_scoped_release nogil;
               s = self.e().sleep();
             }
             check(s);
           })
      .def("wake",
           [](PyEngine& self) {
             zoe::Status s;
             {
               py::gil_scoped_release nogil;
               s = self.e().wake();
             }
             check(s);
           })
      .def("is_asleep", [](PyEngine& self) { return self.e().is_asleep(); })
      .def("steps_taken", [](PyEngine& self) { return self.e().steps_taken(); })
      .def("model_state_bytes", [](PyEngine& self) { return self.e().model_state_bytes(); })
      .def("device_budget_bytes", [](PyEngine& self) { return self.e().device_budget_bytes(); })
      .def("num_params", [](PyEngine& self) { return self.e().num_params(); })
      .def("memory_in_use", [](PyEngine& self) {
        zoe::MemoryUse u = self.e().memory_in_use();
        py::dict d;
        d["device"] = u.device;
        d["device_partitions"] = u.device_partitions;
        d["host"] = u.host;
        d["nvme"] = u.nvme;
        d["partition_pins"] = u.partition_pins;
        return d;
      });
}

// Engine::activations() (zoe/activations.h): the activation store, by addresses in the engine
// device's memory given as integers (a torch tensor's data_ptr()). It reaches the store through
// its engine at each call, so a closed engine raises instead of leaving a dangling store.
struct PyActivations {
  PyEngine* eng;
  zoe::ActivationStore& s() { return eng->e().activations(); }
};

py::dict activation_stats_dict(const zoe::ActivationStats& a) {
  py::dict d;
  d["checkpoint_bytes"] = a.checkpoint_bytes;
  py::dict tiers;
  tiers["device"] = a.tier_bytes[0];
  tiers["host"] = a.tier_bytes[1];
  tiers["nvme"] = a.tier_bytes[2];
  d["tier_bytes"] = tiers;
  d["high_water_device"] = a.high_water_device;
  d["high_water_host"] = a.high_water_host;
  d["high_water_nvme"] = a.high_water_nvme;
  d["bytes_device_to_host"] = a.bytes_device_to_host;
  d["bytes_host_to_device"] = a.bytes_host_to_device;
  d["bytes_nvme_write"] = a.bytes_nvme_write;
  d["bytes_nvme_read"] = a.bytes_nvme_read;
  d["t_stall"] = a.t_stall;
  return d;
}

// The store's calls; save and load release the GIL (they may wait for I/O).
void bind_activations(py::module_& m, py::class_<PyEngine>& engine) {
  py::class_<PyActivations>(
      m, "ActivationStore",
      "The engine's activation store (Engine::activations()): tensors saved in the forward "
      "and loaded back in the backward, through the device, pinned host memory and NVMe.")
      .def("offload", [](PyActivations& a) { return zoe::activation_offload_name(a.s().offload()); })
      .def(
          "plan",
          [](PyActivations& a, const std::vector<uint64_t>& sizes) {
            check(a.s().plan(sizes.data(), sizes.size()));
          },
          py::arg("sizes"))
      .def(
          "save",
          [](PyActivations& a, uintptr_t src, uint64_t bytes) {
            zoe::Result<zoe::ActivationId> r = zoe::invalid_argument("unreached");
            {
              py::gil_scoped_release nogil;
              r = a.s().save(reinterpret_cast<const void*>(src), bytes);
            }
            return take(std::move(r)).value;
          },
          py::arg("src"), py::arg("bytes"))
      .def(
          "load",
          [](PyActivations& a, uint64_t id, uintptr_t dst) {
            zoe::Status s;
            {
              py::gil_scoped_release nogil;
              s = a.s().load(zoe::ActivationId{id}, reinterpret_cast<void*>(dst));
            }
            check(s);
          },
          py::arg("id"), py::arg("dst"))
      .def("end_micro_batch",
           [](PyActivations& a) {
             zoe::Status s;
             {
               py::gil_scoped_release nogil;
               s = a.s().end_micro_batch();
             }
             check(s);
           })
      .def("stats", [](PyActivations& a) { return activation_stats_dict(a.s().stats()); });
  engine.def(
      "activations", [](PyEngine& self) { return PyActivations{&self}; }, py::keep_alive<0, 1>());
}

}  // namespace

// pybind11 before 2.12 reads numpy 1.x's array descriptor: under numpy 2 an array it creates gets
// the wrong strides (read_master's arrays came back as their first element repeated). Refused at
// import rather than answered wrongly: the extension built against Debian's pybind11-dev serves
// Debian's numpy; `pip install .` builds it with PyPI's pybind11.
static void require_numpy_abi() {
#if PYBIND11_VERSION_MAJOR < 2 || (PYBIND11_VERSION_MAJOR == 2 && PYBIND11_VERSION_MINOR < 12)
  const std::string v = py::str(py::module_::import("numpy").attr("__version__"));
  if (atoi(v.c_str()) >= 2) {
    const std::string msg = "zoe's extension was built with pybind11 " +
                            std::to_string(PYBIND11_VERSION_MAJOR) + "." +
                            std::to_string(PYBIND11_VERSION_MINOR) + ", which does not know numpy " + v +
                            "'s arrays (pybind11 2.12 or newer does): install zoe into this interpreter with "
                            "`pip install .`, or build with pybind11 >= 2.12 (cmake -Dpybind11_DIR=...)";
    PyErr_SetString(PyExc_ImportError, msg.c_str());
    throw py::error_already_set();
  }
#endif
}

PYBIND11_MODULE(_zoe, m) {
  m.doc() = "zoe's C++ engine, bound for the zoe PyTorch front-end";
  require_numpy_abi();
  static py::exception<ZoeErrorTag> err(m, "ZoeError", PyExc_RuntimeError);
  g_zoe_error = err;
  bind_functions(m);
  bind_device_view(m);
  py::class_<PyEngine> engine(m, "Engine");
  bind_engine_setup(engine);
  bind_engine_step(engine);
  bind_engine_state(engine);
  bind_activations(m, engine);
}
