// Engine::save / Engine::load: every rank streams its states from their tiers into a checkpoint,
// and restores them into any world size and placement.
#include <cmath>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <type_traits>

#include "checkpoint/checkpoint.h"
#include "zero/engine_impl.h"

namespace zoe {

namespace {

const char* ckpt_dtype(DType d) { return d == DType::kF32 ? "f32" : d == DType::kBF16 ? "bf16" : "f16"; }

// The checkpoint dtype of optimizer state k as the Updater stores it: the master "f32"/"bf16";
// m and v "f32", "bf16", or packed blocks "int8b256"/"int4b128" (checkpoint.h).
std::string state_dtype(const zero::Updater& u, zero::OptState k) {
  if (k == zero::OptState::kMaster) return u.master_format() == optim::MasterFormat::kBF16 ? "bf16" : "f32";
  return ckpt::state_dtype(u.state_format());
}

// Rank 0's string on every rank.
Result<std::string> broadcast_string(comm::Communicator& c, std::string s) {
  int64_t n = static_cast<int64_t>(s.size());
  ZOE_RETURN_IF_ERROR(c.broadcast(&n, 1, comm::CommType::kI64, 0).wait());
  s.resize(static_cast<size_t>(n));
  if (n > 0)
    ZOE_RETURN_IF_ERROR(c.broadcast(s.data(), static_cast<size_t>(n), comm::CommType::kU8, 0).wait());
  return s;
}

// Every rank's string, on every rank.
Result<std::vector<std::string>> all_gather_strings(comm::Communicator& c, const std::string& s) {
  int64_t n = static_cast<int64_t>(s.size());
  std::vector<int64_t> lens(static_cast<size_t>(c.size()));
  ZOE_RETURN_IF_ERROR(c.all_gather(&n, lens.data(), 1, comm::CommType::kI64).wait());
  int64_t maxn = *std::max_element(lens.begin(), lens.end());
  std::string mine = s;
  mine.resize(static_cast<size_t>(maxn));
  std::string all(static_cast<size_t>(maxn) * static_cast<size_t>(c.size()), '\0');
  if (maxn > 0) {
    ZOE_RETURN_IF_ERROR(
        c.all_gather(mine.data(), all.data(), static_cast<size_t>(maxn), comm::CommType::kU8).wait());
  }
  std::vector<std::string> out;
  for (int r = 0; r < c.size(); ++r) {
    out.push_back(all.substr(static_cast<size_t>(r) * static_cast<size_t>(maxn),
                             static_cast<size_t>(lens[static_cast<size_t>(r)])));
  }
  return out;
}

// The first error of any rank, on every rank, so that no rank waits for the others forever.
Status agree(comm::Communicator& c, Status local, const std::string& what) {
  std::string msg = local.is_ok() ? "" : local.to_string();
  auto all = all_gather_strings(c, msg);
  if (!all.is_ok()) return all.status();
  for (int r = 0; r < c.size(); ++r) {
    const std::string& m = all.value()[static_cast<size_t>(r)];
    if (m.empty()) continue;
    if (!local.is_ok()) return std::move(local).with_context(what);
    return io_error("rank %d: %s", r, m.c_str()).with_context(what);
  }
  return Status::ok();
}

// Elements per piece of a checkpoint transfer: the swapper's chunk (whose I/O alignment it
// needs), else 4 Mi elements; a multiple of 2048, so every piece is whole 4 KiB blocks.
size_t save_chunk_elems(const Engine::Impl& I) { return I.update->io_chunk_elems(); }

constexpr zero::OptState kStates[3] = {zero::OptState::kMaster, zero::OptState::kExpAvg,
                                       zero::OptState::kExpAvgSq};
// The states a checkpoint holds for the optimizer in use: the master, then its states (AdamW 2,
// Lion and Adagrad 1), named as optim::optimizer_state_name() says.
int saved_states(const zero::Updater& u) { return 1 + u.state_count(); }
const char* state_kind(const zero::Updater& u, int k) {
  return k == 0 ? "master" : optim::optimizer_state_name(u.optimizer(), k - 1);
}

}  // namespace

int64_t Engine::steps_taken() const { return impl_->update ? impl_->update->steps() : 0; }

namespace {

// Writes this rank's states into the checkpoint's temporary directory; only reads the states.
Status write_rank_file(Engine::Impl& I, const std::string& tmp, std::vector<ckpt::TensorRecord>* records,
                       ckpt::FileInfo* file) {
  ZOE_ASSIGN_OR_RETURN(auto w, ckpt::RankWriter::create(tmp, I.ctx.shape.rank));
  const size_t es = I.ctx.shape.esize();
  std::vector<char> buf;
  std::vector<float> f32;
  // States stream through one chunk-sized buffer: host memory stays bounded whatever the model.
  const size_t chunk = save_chunk_elems(I);
  for (uint32_t m = 0; m < I.modules.size(); ++m) {
    const zero::ModuleId id(m);
    const zero::ModuleLayout& mod = I.modules[id];
    if (I.ctx.shape.stage == 0 && I.ctx.shape.rank != 0)
      continue;  // at stage 0 every rank holds everything: rank 0 writes it
    // Compute parameters of the owned range, from wherever they live (n elements from b).
    auto param_chunk = [&](size_t b, size_t n) -> Result<const void*> {
      buf.resize(n * es);
      ZOE_RETURN_IF_ERROR(I.homes->read_owned(id, b, n, buf.data()));
      return static_cast<const void*>(buf.data());
    };
    ZOE_RETURN_IF_ERROR(w->begin_tensor(m, "param", ckpt_dtype(I.ctx.shape.cdt), mod.opt_begin, mod.opt_n));
    for (size_t b = 0; b < mod.opt_n; b += chunk) {
      const size_t n = std::min(chunk, mod.opt_n - b);
      ZOE_ASSIGN_OR_RETURN(const void* h, param_chunk(b, n));
      ZOE_RETURN_IF_ERROR(w->append(h, n * es));
    }
    ZOE_RETURN_IF_ERROR(w->end_tensor());
    if (mod.frozen) {
      // Its values are its compute parameters: those, as fp32, in the master slot; no m, no v.
      ZOE_RETURN_IF_ERROR(w->begin_tensor(m, "master", "f32", mod.opt_begin, mod.opt_n));
      for (size_t b = 0; b < mod.opt_n; b += chunk) {
        const size_t n = std::min(chunk, mod.opt_n - b);
        ZOE_ASSIGN_OR_RETURN(const void* h, param_chunk(b, n));
        f32.resize(n);
        ZOE_RETURN_IF_ERROR(
            optim::convert_with_norm(h, I.ctx.shape.cdt, f32.data(), DType::kF32, n, false).status());
        ZOE_RETURN_IF_ERROR(w->append(f32.data(), n * 4));
      }
      ZOE_RETURN_IF_ERROR(w->end_tensor());
      continue;
    }
    // The master and the optimizer's states, as stored (packed m and v as their blocks).
    for (int k = 0; k < saved_states(*I.update); ++k) {
      ZOE_RETURN_IF_ERROR(w->begin_tensor(m, state_kind(*I.update, k), state_dtype(*I.update, kStates[k]),
                                          mod.opt_begin, mod.opt_n));
      for (size_t b = 0; b < mod.opt_n; b += chunk) {
        const size_t n = std::min(chunk, mod.opt_n - b);
        buf.resize(I.update->state_size(kStates[k], n));
        ZOE_RETURN_IF_ERROR(I.update->read_state(id, kStates[k], b, n, buf.data()));
        ZOE_RETURN_IF_ERROR(w->append(buf.data(), buf.size()));
      }
      ZOE_RETURN_IF_ERROR(w->end_tensor());
    }
  }
  return w->finish(records, file);
}

std::string records_to_json(const std::vector<ckpt::TensorRecord>& records, const ckpt::FileInfo& file) {
  nlohmann::json mine = {{"file", {{"name", file.name}, {"bytes", file.bytes}, {"xxh64", file.xxh64}}},
                         {"tensors", nlohmann::json::array()}};
  for (const auto& r : records) {
    mine["tensors"].push_back({{"rank", r.rank},
                               {"module", r.module},
                               {"kind", r.kind},
                               {"dtype", r.dtype},
                               {"begin", r.begin},
                               {"count", r.count},
                               {"offset", r.offset},
                               {"bytes", r.bytes},
                               {"xxh64", r.xxh64}});
  }
  return mine.dump();
}

// After every rank has written its file: rank 0 gathers the records, writes the manifest and
// commits. Runs on the caller's thread (it uses collectives).
Status commit_save(Engine::Impl& I, const std::string& save_dir, const std::string& tag,
                   const std::string& tmp, int64_t steps, const std::string& trainer, Status written,
                   const std::string& records_json) {
  comm::Communicator& c = *I.ctx.comm;
  Status s = agree(c, written, "writing checkpoint " + tag);
  if (!s.is_ok()) {
    if (I.ctx.shape.rank == 0) ckpt::abort_checkpoint(tmp);
    return s;
  }
  ZOE_ASSIGN_OR_RETURN(auto gathered, all_gather_strings(c, records_json));
  Status commit;
  if (I.ctx.shape.rank == 0) {
    ckpt::Manifest man;
    man.world_size = I.ctx.shape.world;
    man.stage = I.ctx.shape.stage;
    man.step = steps;
    for (const auto& mod : I.modules.all()) {
      ckpt::ModuleInfo mi;
      mi.name = mod.name;
      mi.padded = mod.padded;
      mi.frozen = mod.frozen;
      for (size_t p = 0; p < mod.specs.size(); ++p) {
        mi.params.push_back({mod.specs[p].name, mod.specs[p].shape, mod.offset[p], mod.numel[p]});
      }
      man.modules.push_back(std::move(mi));
    }
    for (const auto& g : gathered) {
      auto j = nlohmann::json::parse(g);
      if (!j["file"]["name"].get<std::string>().empty()) {
        man.files.push_back({j["file"]["name"], j["file"]["bytes"], j["file"]["xxh64"]});
      }
      for (const auto& t : j["tensors"]) {
        man.tensors.push_back({t["rank"], t["module"], t["kind"], t["dtype"], t["begin"], t["count"],
                               t["offset"], t["bytes"], t["xxh64"]});
      }
    }
    zero::LossScaler::State ls = I.update->scaler().state();
    man.engine = {{"steps", steps},
                  {"precision", ckpt_dtype(I.ctx.shape.cdt)},
                  {"optimizer", optim::optimizer_kind_name(I.update->optimizer())},
                  {"bf16_optimizer_states", I.ctx.cfg->zoe.bf16_optimizer_states},
                  {"optimizer_states", optim::state_format_name(I.update->state_format())},
                  {"master_weights", optim::master_format_name(I.update->master_format())},
                  {"loss_scaler",
                   {{"scale", ls.scale},
                    {"iter", ls.iter},
                    {"last_overflow", ls.last_overflow},
                    {"delayed_shift", ls.delayed_shift}}}};
    // The updates each parameter sat out (its AdamW bias correction counts its own), where any did.
    const auto& skipped = I.update->skipped_steps();
    if (std::any_of(skipped.begin(), skipped.end(), [](const auto& v) {
          return std::any_of(v.begin(), v.end(), [](int64_t k) { return k != 0; });
        }))
      man.engine["skipped_steps"] = skipped;
    // Adam-mini: the blocks' mean second moments (one float a block; the same on every rank).
    if (I.update->optimizer() == optim::OptimizerKind::kAdamMini)
      man.engine["adam_mini_v"] = I.update->adam_mini_v();
    man.trainer = nlohmann::json::parse(trainer.empty() ? "{}" : trainer, nullptr, false);
    if (man.trainer.is_discarded()) man.trainer = nlohmann::json::object();
    commit = ckpt::commit_checkpoint(save_dir, tag, tmp, man);
    if (!commit.is_ok()) ckpt::abort_checkpoint(tmp);
  }
  return agree(c, commit, "committing checkpoint " + tag);
}

}  // namespace

Status Engine::finish_save() {
  Impl& I = *impl_;
  if (!I.async_save) return Status::ok();
  std::unique_ptr<Impl::AsyncSave> a = std::move(I.async_save);
  a->thread.join();
  return commit_save(I, a->save_dir, a->tag, a->tmp, a->steps, a->trainer, a->status,
                     std::string(a->records_json.begin(), a->records_json.end()));
}

Status Engine::claim_save_dir(const std::string& save_dir) {
  Impl& I = *impl_;
  Status s;  // rank 0's: every rank returns the same answer
  if (I.ctx.shape.rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(save_dir, ec);
    s = ec ? sys_error("mkdir -p", save_dir, ec.value()) : ckpt::hold_save_dir(save_dir);
  }
  if (I.ctx.shape.world > 1) {
    // The code and the message travel, not to_string(): that would print the code twice.
    const std::string mine =
        s.is_ok() ? std::string() : std::to_string(static_cast<int>(s.code())) + " " + s.message();
    ZOE_ASSIGN_OR_RETURN(const std::string got, broadcast_string(*I.ctx.comm, mine));
    if (I.ctx.shape.rank != 0 && !got.empty()) {
      const size_t sp = got.find(' ');
      s = Status(static_cast<StatusCode>(std::stoi(got.substr(0, sp))), got.substr(sp + 1));
    }
  }
  return std::move(s).with_context("claiming " + save_dir);
}

Status Engine::save(const std::string& save_dir, const std::string& tag,
                    const std::string& trainer_state_json, bool async) {
  Impl& I = *impl_;
  if (!I.initialized) return invalid_argument("save() before initialize()");
  ZOE_RETURN_IF_ERROR(I.awake("save()"));
  ZOE_RETURN_IF_ERROR_CTX(I.update->finish(), "finishing the optimizer step before saving");
  ZOE_RETURN_IF_ERROR(finish_save());
  ZOE_RETURN_IF_ERROR(I.grads->complete(true));
  // A checkpoint holds the states of the last step taken (after the accumulations above: the last
  // of them may have speculated).
  I.update->unspeculate_all();
  for (zero::ModuleId m : I.modules.ids()) {
    if (I.grads->unreduced(m) || I.gather->in_use(m)) {
      return invalid_argument("save(): call it between steps (module %s is in use)",
                              I.modules[m].name.c_str());
    }
  }
  comm::Communicator& c = *I.ctx.comm;
  // Rank 0 creates the temporary directory; every rank writes its own file into it.
  std::string tmp;
  Status s;
  if (I.ctx.shape.rank == 0) {
    auto t = ckpt::begin_checkpoint(save_dir, tag);
    if (t.is_ok())
      tmp = t.value();
    else
      s = t.status();
  }
  ZOE_RETURN_IF_ERROR(agree(c, s, "starting checkpoint " + tag + " in " + save_dir));
  ZOE_ASSIGN_OR_RETURN(tmp, broadcast_string(c, tmp));
  if (!async) {
    std::vector<ckpt::TensorRecord> records;
    ckpt::FileInfo file;
    Status w = write_rank_file(I, tmp, &records, &file);
    return commit_save(I, save_dir, tag, tmp, I.update->steps(), trainer_state_json, w,
                       w.is_ok() ? records_to_json(records, file) : "");
  }
  auto a = std::make_unique<Impl::AsyncSave>();
  a->save_dir = save_dir;
  a->tag = tag;
  a->tmp = tmp;
  a->trainer = trainer_state_json;
  a->steps = I.update->steps();
  Impl::AsyncSave* ap = a.get();
  a->thread = std::thread([&I, ap] {
    std::vector<ckpt::TensorRecord> records;
    ckpt::FileInfo file;
    ap->status = write_rank_file(I, ap->tmp, &records, &file);
    if (ap->status.is_ok()) {
      std::string j = records_to_json(records, file);
      ap->records_json.assign(j.begin(), j.end());
    }
  });
  I.async_save = std::move(a);
  return Status::ok();
}

namespace {

// The model must be the same one; world size, stage and placement may differ.
Status check_same_model(const zero::ModuleTable& modules, const ckpt::Reader& rdr) {
  const ckpt::Reader* rd = &rdr;
  const ckpt::Manifest& man = rd->manifest();
  if (man.modules.size() != modules.size()) {
    return invalid_argument("checkpoint %s has %zu modules, the model has %zu", rd->path().c_str(),
                            man.modules.size(), modules.size());
  }
  for (size_t m = 0; m < modules.size(); ++m) {
    const auto& a = man.modules[m];
    const auto& b = modules[zero::ModuleId(m)];
    bool same = a.name == b.name && a.params.size() == b.specs.size();
    for (size_t p = 0; same && p < b.specs.size(); ++p) {
      same = a.params[p].name == b.specs[p].name && a.params[p].shape == b.specs[p].shape &&
             a.params[p].offset == b.offset[p];
    }
    if (!same) {
      return invalid_argument(
          "checkpoint %s: module %zu (%s) does not match the model's %s (names or shapes differ)",
          rd->path().c_str(), m, a.name.c_str(), b.name.c_str());
    }
  }
  return Status::ok();
}

// The optimizer whose states the checkpoint holds (engine.optimizer; a checkpoint without it is
// AdamW's) must be the engine's: Lion's m is no AdamW m, nor Adagrad's sum.
Status check_same_optimizer(const ckpt::JsonFields& e, const zero::Updater& u, const std::string& path) {
  std::string saved = "AdamW";
  ZOE_RETURN_IF_ERROR(e.get_optional("optimizer", &saved));
  auto kind = optim::parse_optimizer_kind(saved);
  if (!kind.is_ok()) return e.bad("optimizer", "\"AdamW\", \"Lion\", \"Adagrad\", \"Muon\" or \"AdamMini\"");
  if (kind.value() == u.optimizer()) return Status::ok();
  return invalid_argument(
      "checkpoint %s holds the optimizer states of optimizer.type \"%s\", and this engine runs "
      "optimizer.type "
      "\"%s\": load it with optimizer.type \"%s\" (or export its parameters and start the new optimizer "
      "from them)",
      path.c_str(), optim::optimizer_kind_name(kind.value()), optim::optimizer_kind_name(u.optimizer()),
      optim::optimizer_kind_name(kind.value()));
}

}  // namespace

// engine.<key>: an array (per module) of arrays of numbers (integers where T is), into out; absent:
// out stays empty. Anything else is a corruption error naming the key and `expected`.
template <class T>
static Status read_per_module(const ckpt::JsonFields& e, const nlohmann::json& engine, const char* key,
                              const char* expected, std::vector<std::vector<T>>* out) {
  if (!e.has(key)) return Status::ok();
  const nlohmann::json& j = engine.at(key);
  bool ok = j.is_array();
  for (const auto& mj : ok ? j : nlohmann::json::array()) {
    ok = ok && mj.is_array();
    for (const auto& v : ok ? mj : nlohmann::json::array())
      ok = ok && (std::is_integral_v<T> ? v.is_number_integer() : v.is_number());
  }
  if (!ok) return e.bad(key, expected);
  *out = j.get<std::vector<std::vector<T>>>();
  return Status::ok();
}

Result<std::string> Engine::load(const std::string& dir) {
  Impl& I = *impl_;
  if (!I.initialized) return invalid_argument("load() before initialize()");
  ZOE_RETURN_IF_ERROR(I.awake("load()"));
  ZOE_RETURN_IF_ERROR_CTX(I.update->finish(), "finishing the optimizer step before loading");
  ZOE_RETURN_IF_ERROR(finish_save());
  ZOE_RETURN_IF_ERROR(I.grads->complete(true));
  I.update->unspeculate_all();
  ZOE_RETURN_IF_ERROR(I.gather->discard());  // they hold the parameters being replaced
  comm::Communicator& c = *I.ctx.comm;
  std::unique_ptr<ckpt::Reader> rd;
  Status s;
  {
    auto r = ckpt::Reader::open(dir);
    if (r.is_ok())
      rd = std::move(r).value();
    else
      s = r.status();
  }
  if (s.is_ok()) s = rd->check_complete();
  if (s.is_ok() && I.ctx.shape.rank == 0) s = rd->verify();
  ZOE_RETURN_IF_ERROR(agree(c, s, "loading checkpoint " + dir));
  const ckpt::Manifest& man = rd->manifest();
  ZOE_RETURN_IF_ERROR(check_same_model(I.modules, *rd));
  // Typed reads: a field of the wrong type is a corruption error naming it, never an exception.
  // (load_manifest already checked that engine is an object and engine.steps equals step.)
  const std::string mpath = rd->path() + "/" + ckpt::kManifestName;
  const nlohmann::json engine = man.engine.is_null() ? nlohmann::json::object() : man.engine;
  ckpt::JsonFields e(engine, mpath, "engine");
  int64_t steps = man.step;
  ZOE_RETURN_IF_ERROR(e.get_optional("steps", &steps));
  ZOE_RETURN_IF_ERROR(check_same_optimizer(e, *I.update, rd->path()));
  // engine.skipped_steps (absent: no parameter sat out an update).
  std::vector<std::vector<int64_t>> skipped;
  ZOE_RETURN_IF_ERROR(read_per_module(
      e, engine, "skipped_steps", "an array (per module) of arrays (per parameter) of integers", &skipped));
  // engine.adam_mini_v (Adam-mini only; check_same_optimizer above says the types agree).
  std::vector<std::vector<float>> mini_v;
  const bool has_mini = e.has("adam_mini_v");
  ZOE_RETURN_IF_ERROR(read_per_module(e, engine, "adam_mini_v",
                                      "an array (per module) of arrays (per block) of numbers", &mini_v));
  if (!has_mini && I.update->optimizer() == optim::OptimizerKind::kAdamMini && steps > 0)
    return e.bad("adam_mini_v",
                 "Adam-mini's block moments (a checkpoint of optimizer.type AdamMini has them)");
  zero::LossScaler::State ls{1.0, 0, -1, 1};
  const bool has_scaler = e.has("loss_scaler");
  if (has_scaler) {
    ckpt::JsonFields l(man.engine.at("loss_scaler"), mpath, "engine.loss_scaler");
    ZOE_RETURN_IF_ERROR(l.check_object());
    ZOE_RETURN_IF_ERROR(l.get_optional("scale", &ls.scale));
    ZOE_RETURN_IF_ERROR(l.get_optional("iter", &ls.iter));
    ZOE_RETURN_IF_ERROR(l.get_optional("last_overflow", &ls.last_overflow));
    ZOE_RETURN_IF_ERROR(l.get_optional("delayed_shift", &ls.delayed_shift));
    if (!zero::LossScaler::fits_fp32(ls.scale)) {
      return l.bad("scale",
                   "a positive loss scale that is a normal fp32 number (>= 1.17549e-38, <= 3.40282e+38)");
    }
  }
  const size_t es = I.ctx.shape.esize();
  const size_t chunk = save_chunk_elems(I);
  auto load_all = [&]() -> Status {
    std::vector<char> buf;
    for (uint32_t m = 0; m < I.modules.size(); ++m) {
      const zero::ModuleId id(m);
      const zero::ModuleLayout& mod = I.modules[id];
      // The checkpoint holds [0, its padded size); padding beyond it (another world size) is zero.
      const uint64_t saved = man.modules[m].padded;
      // A module saved frozen has no optimizer states: they start at zero when it is trained now.
      const bool no_moments = man.modules[m].frozen;
      // bytes: what `out` holds for count elements in dt.
      auto read = [&](const char* kind, const std::string& dt, uint64_t begin, uint64_t count, size_t bytes,
                      void* out) -> Status {
        memset(out, 0, bytes);
        const bool state = strcmp(kind, "param") != 0 && strcmp(kind, "master") != 0;
        if (begin >= saved || (no_moments && state)) return Status::ok();
        return rd->read_range(m, kind, begin, std::min<uint64_t>(count, saved - begin), dt, out);
      };
      // Compute parameters: what this rank holds (its partition at stage 3, else the whole
      // module), a piece at a time.
      const size_t held = mod.partitioned_params ? mod.part : mod.padded;
      const uint64_t from = mod.partitioned_params ? mod.opt_begin : 0;
      for (size_t b = 0; b < held; b += chunk) {
        const size_t n = std::min(chunk, held - b);
        buf.resize(n * es);
        ZOE_RETURN_IF_ERROR(read("param", ckpt_dtype(I.ctx.shape.cdt), from + b, n, n * es, buf.data()));
        ZOE_RETURN_IF_ERROR(I.homes->write_held(id, b, n, buf.data()));
      }
      for (int k = 0; k < saved_states(*I.update) && !mod.frozen; ++k) {  // a frozen one: its parameters only
        const std::string dt = state_dtype(*I.update, kStates[k]);
        for (size_t b = 0; b < mod.opt_n; b += chunk) {
          const size_t n = std::min(chunk, mod.opt_n - b);
          buf.resize(I.update->state_size(kStates[k], n));
          ZOE_RETURN_IF_ERROR(
              read(state_kind(*I.update, k), dt, mod.opt_begin + b, n, buf.size(), buf.data()));
          ZOE_RETURN_IF_ERROR(I.update->write_state(id, kStates[k], b, n, buf.data()));
        }
      }
    }
    return Status::ok();
  };
  ZOE_RETURN_IF_ERROR(agree(c, load_all(), "restoring the states of checkpoint " + rd->path()));
  I.grads->forget_accumulated();  // gradients of a step in progress are not part of a checkpoint
  I.update->set_steps(steps);
  ZOE_RETURN_IF_ERROR_CTX(I.update->set_skipped_steps(std::move(skipped)),
                          "checkpoint " + rd->path() + ": engine.skipped_steps");
  if (has_mini)
    ZOE_RETURN_IF_ERROR_CTX(I.update->set_adam_mini_v(mini_v),
                            "checkpoint " + rd->path() + ": engine.adam_mini_v");
  if (has_scaler) I.update->scaler().set_state(ls);
  return man.trainer.dump();
}

}  // namespace zoe
