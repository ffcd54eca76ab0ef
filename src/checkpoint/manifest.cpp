// The checkpoint manifest: JSON form, typed parsing with errors that name the JSON path,
// structural checks, and loading with its checksum, size and nesting guards.
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <map>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "checkpoint/xxh64.h"
#include "core/log.h"

namespace zoe::ckpt {

using nlohmann::json;

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "f32") return 4;
  if (dtype == "bf16" || dtype == "f16") return 2;
  return 0;
}

const char* state_dtype(optim::StateFormat f) {
  switch (f) {
    case optim::StateFormat::kF32:
      return "f32";
    case optim::StateFormat::kBF16:
      return "bf16";
    case optim::StateFormat::kInt8:
      return kInt8StateDtype;
    case optim::StateFormat::kInt4:
      return kInt4StateDtype;
  }
  return "f32";
}

bool packed_dtype(const std::string& dtype, optim::StateFormat* format) {
  optim::StateFormat f;
  if (dtype == kInt8StateDtype) {
    f = optim::StateFormat::kInt8;
  } else if (dtype == kInt4StateDtype) {
    f = optim::StateFormat::kInt4;
  } else {
    return false;
  }
  if (format) *format = f;
  return true;
}

uint64_t dtype_block_elems(const std::string& dtype) {
  optim::StateFormat f;
  if (packed_dtype(dtype, &f)) return optim::state_block_elems(f);
  return dtype_bytes(dtype) ? 1 : 0;
}

uint64_t tensor_bytes(const std::string& dtype, uint64_t count) {
  optim::StateFormat f;
  if (packed_dtype(dtype, &f)) return optim::state_bytes(f, static_cast<size_t>(count));
  return count * dtype_bytes(dtype);
}

std::string record_dtype_problem(const std::string& kind, const std::string& dtype, uint64_t begin) {
  if (!packed_dtype(dtype)) {
    if (dtype_bytes(dtype)) return "";
    return "dtype '" + dtype + "' is none of f32, bf16, f16, " + kInt8StateDtype + ", " + kInt4StateDtype;
  }
  if (kind != "exp_avg" && kind != "exp_avg_sq" && kind != "sum") {
    return "dtype '" + dtype + "' (packed) holds only 'exp_avg', 'exp_avg_sq' and 'sum' states, not '" +
           kind + "'";
  }
  const uint64_t b = dtype_block_elems(dtype);
  if (begin % b != 0) {
    return "begin " + std::to_string(begin) + " is not a multiple of " + dtype + "'s block of " +
           std::to_string(b) + " elements";
  }
  return "";
}

json Manifest::to_json() const {
  json j;
  j["format"] = "zoe-checkpoint";
  j["format_version"] = format_version;
  j["world_size"] = world_size;
  j["stage"] = stage;
  j["step"] = step;
  json jm = json::array();
  for (const auto& m : modules) {
    json params = json::array();
    for (const auto& p : m.params) {
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"numel", p.numel}});
    }
    jm.push_back({{"name", m.name}, {"padded", m.padded}, {"params", params}});
    if (m.frozen) jm.back()["frozen"] = true;
  }
  j["modules"] = jm;
  json jt = json::array();
  for (const auto& t : tensors) {
    json r = {{"rank", t.rank},   {"module", t.module}, {"kind", t.kind},     {"dtype", t.dtype},
              {"begin", t.begin}, {"count", t.count},   {"offset", t.offset}, {"bytes", t.bytes}};
    if (!t.xxh64.empty()) r["xxh64"] = t.xxh64;
    jt.push_back(std::move(r));
  }
  j["tensors"] = jt;
  json jf = json::array();
  for (const auto& f : files) jf.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", f.xxh64}});
  j["files"] = jf;
  j["engine"] = engine.is_null() ? json::object() : engine;
  j["trainer"] = trainer.is_null() ? json::object() : trainer;
  return j;
}

// ---- JsonFields ----

namespace {

// "string \"f64\"", "number 3.5": the value as JSON, ASCII only (control characters and the like
// escaped by the dump), shortened.
std::string shown(const json& v) {
  constexpr size_t kMax = 48;
  std::string text = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (text.size() > kMax) text = text.substr(0, kMax) + "... (" + std::to_string(text.size()) + " bytes)";
  const std::string type = v.is_number() ? "number" : v.type_name();
  return type + " " + text;
}

}  // namespace

Status JsonFields::check_object() const {
  if (!j_.is_object()) return bad("", "an object");
  return Status::ok();
}

Result<const json*> JsonFields::array(const char* key) const {
  if (!has(key)) return missing(key);
  const json& v = j_.at(key);
  if (!v.is_array()) return bad(key, "an array");
  return &v;
}

Status JsonFields::bad(const char* key, const std::string& expected) const {
  const json* v = &j_;
  if (*key && j_.is_object() && j_.contains(key)) v = &j_.at(key);
  return corruption("%s: key '%s': expected %s, found %s", where_.c_str(), full(key).c_str(),
                    expected.c_str(), shown(*v).c_str());
}

Status JsonFields::missing(const char* key) const {
  return corruption("%s: key '%s' is missing", where_.c_str(), full(key).c_str());
}

std::string JsonFields::full(const char* key) const {
  if (!*key) return path_.empty() ? "(top level)" : path_;
  return path_.empty() ? key : path_ + "." + key;
}

Status JsonFields::convert(const char* key, const json& v, std::string* out) const {
  if (!v.is_string()) return bad(key, "a string");
  *out = v.get<std::string>();
  return Status::ok();
}

Status JsonFields::convert(const char* key, const json& v, bool* out) const {
  if (!v.is_boolean()) return bad(key, "true or false");
  *out = v.get<bool>();
  return Status::ok();
}

Status JsonFields::convert(const char* key, const json& v, double* out) const {
  if (!v.is_number()) return bad(key, "a number");
  *out = v.get<double>();
  return Status::ok();
}

// ---- from_json ----

namespace {

// Element counts and byte sizes are below 2^56 (64 PiB), so sums of two never overflow.
constexpr uint64_t kMaxCount = uint64_t{1} << 56;

std::string item(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

std::string rank_file_name(int rank) {
  char buf[32];
  snprintf(buf, sizeof(buf), "rank-%05d.bin", rank);
  return buf;
}

// get() then a bound: "a count below 2^56" reads better than the type's whole range.
Status get_count(const JsonFields& f, const char* key, uint64_t* out) {
  ZOE_RETURN_IF_ERROR(f.get(key, out));
  if (*out >= kMaxCount) return f.bad(key, "a count below 2^56");
  return Status::ok();
}

Status check_modules(const json& j, const std::string& where, Manifest* m) {
  JsonFields top(j, where, "");
  ZOE_ASSIGN_OR_RETURN(const json* jm, top.array("modules"));
  for (size_t i = 0; i < jm->size(); ++i) {
    JsonFields f((*jm)[i], where, item("modules", i));
    ZOE_RETURN_IF_ERROR(f.check_object());
    ModuleInfo mi;
    ZOE_RETURN_IF_ERROR(f.get("name", &mi.name));
    ZOE_RETURN_IF_ERROR(get_count(f, "padded", &mi.padded));
    ZOE_RETURN_IF_ERROR(f.get_optional("frozen", &mi.frozen));
    ZOE_ASSIGN_OR_RETURN(const json* jp, f.array("params"));
    for (size_t k = 0; k < jp->size(); ++k) {
      JsonFields g((*jp)[k], where, item(item("modules", i) + ".params", k));
      ZOE_RETURN_IF_ERROR(g.check_object());
      ParamInfo p;
      ZOE_RETURN_IF_ERROR(g.get("name", &p.name));
      ZOE_RETURN_IF_ERROR(get_count(g, "offset", &p.offset));
      ZOE_RETURN_IF_ERROR(get_count(g, "numel", &p.numel));
      ZOE_ASSIGN_OR_RETURN(const json* js, g.array("shape"));
      uint64_t prod = 1;
      for (size_t d = 0; d < js->size(); ++d) {
        const json& v = (*js)[d];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
            static_cast<uint64_t>(v.get<int64_t>()) >= kMaxCount) {
          return corruption("%s: key '%s[%zu]': expected a dimension in [0, 2^56), found %s", where.c_str(),
                            g.full("shape").c_str(), d, shown(v).c_str());
        }
        const auto dim = static_cast<uint64_t>(v.get<int64_t>());
        p.shape.push_back(static_cast<int64_t>(dim));
        prod = (dim != 0 && prod > kMaxCount / dim) ? kMaxCount : prod * dim;
      }
      if (prod != p.numel) {
        return corruption("%s: key '%s': shape has %" PRIu64 " elements but numel is %" PRIu64, where.c_str(),
                          g.full("numel").c_str(), prod, p.numel);
      }
      if (p.offset + p.numel > mi.padded) {
        return corruption("%s: key '%s': elements [%" PRIu64 ", %" PRIu64 ") lie past the module's %" PRIu64
                          " (padded)",
                          where.c_str(), g.full("offset").c_str(), p.offset, p.offset + p.numel, mi.padded);
      }
      mi.params.push_back(std::move(p));
    }
    // Parameters are disjoint ranges of the flat group.
    std::vector<size_t> order(mi.params.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return mi.params[a].offset < mi.params[b].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
      const ParamInfo& a = mi.params[order[k - 1]];
      const ParamInfo& b = mi.params[order[k]];
      if (a.numel > 0 && b.numel > 0 && b.offset < a.offset + a.numel) {
        return corruption(
            "%s: key '%s': elements [%" PRIu64 ", %" PRIu64 ") overlap %s's [%" PRIu64 ", %" PRIu64 ")",
            where.c_str(), (item(item("modules", i) + ".params", order[k]) + ".offset").c_str(), b.offset,
            b.offset + b.numel, item(item("modules", i) + ".params", order[k - 1]).c_str(), a.offset,
            a.offset + a.numel);
      }
    }
    m->modules.push_back(std::move(mi));
  }
  return Status::ok();
}

Status check_files(const json& j, const std::string& where, Manifest* m,
                   std::map<int, size_t>* file_of_rank) {
  JsonFields top(j, where, "");
  ZOE_ASSIGN_OR_RETURN(const json* jf, top.array("files"));
  for (size_t i = 0; i < jf->size(); ++i) {
    JsonFields f((*jf)[i], where, item("files", i));
    ZOE_RETURN_IF_ERROR(f.check_object());
    FileInfo fi;
    ZOE_RETURN_IF_ERROR(f.get("name", &fi.name));
    ZOE_RETURN_IF_ERROR(get_count(f, "bytes", &fi.bytes));
    ZOE_RETURN_IF_ERROR(f.get("xxh64", &fi.xxh64));
    int rank = -1;
    char tail = 0;
    if (sscanf(fi.name.c_str(), "rank-%d.bi%c", &rank, &tail) != 2 || rank < 0 || rank >= m->world_size ||
        fi.name != rank_file_name(rank)) {
      return f.bad("name", "rank-NNNNN.bin of a rank below world_size " + std::to_string(m->world_size));
    }
    if (!detail::is_hex64(fi.xxh64)) return f.bad("xxh64", "16 lower-case hex digits");
    if (!file_of_rank->emplace(rank, i).second) {
      return f.bad("name", "a file that 'files' lists once (it is also " +
                               item("files", file_of_rank->at(rank)) + ")");
    }
    m->files.push_back(std::move(fi));
  }
  return Status::ok();
}

// A record's dtype: known, and a packed one only on the moments, from a block boundary.
Status check_record_dtype(const JsonFields& f, const TensorRecord& t) {
  if (dtype_block_elems(t.dtype) == 0) {
    return f.bad("dtype", std::string("\"f32\", \"bf16\", \"f16\", \"") + kInt8StateDtype + "\" or \"" +
                              kInt4StateDtype + "\"");
  }
  if (!packed_dtype(t.dtype)) return Status::ok();
  if (t.kind != "exp_avg" && t.kind != "exp_avg_sq" && t.kind != "sum") {
    return f.bad("dtype", "\"f32\", \"bf16\" or \"f16\" for a '" + t.kind + "' state (" + t.dtype +
                              " holds only 'exp_avg', 'exp_avg_sq' and 'sum')");
  }
  const uint64_t b = dtype_block_elems(t.dtype);
  if (t.begin % b != 0) {
    return f.bad("begin", "a multiple of " + t.dtype + "'s block of " + std::to_string(b) + " elements");
  }
  return Status::ok();
}

Status check_tensors(const json& j, const std::string& where, Manifest* m,
                     const std::map<int, size_t>& file_of_rank) {
  JsonFields top(j, where, "");
  ZOE_ASSIGN_OR_RETURN(const json* jt, top.array("tensors"));
  for (size_t i = 0; i < jt->size(); ++i) {
    JsonFields f((*jt)[i], where, item("tensors", i));
    ZOE_RETURN_IF_ERROR(f.check_object());
    TensorRecord t;
    ZOE_RETURN_IF_ERROR(f.get("rank", &t.rank));
    ZOE_RETURN_IF_ERROR(f.get("module", &t.module));
    ZOE_RETURN_IF_ERROR(f.get("kind", &t.kind));
    ZOE_RETURN_IF_ERROR(f.get("dtype", &t.dtype));
    ZOE_RETURN_IF_ERROR(get_count(f, "begin", &t.begin));
    ZOE_RETURN_IF_ERROR(get_count(f, "count", &t.count));
    ZOE_RETURN_IF_ERROR(get_count(f, "offset", &t.offset));
    ZOE_RETURN_IF_ERROR(get_count(f, "bytes", &t.bytes));
    if (m->format_version >= 2) {
      ZOE_RETURN_IF_ERROR(f.get("xxh64", &t.xxh64));
      if (!detail::is_hex64(t.xxh64)) return f.bad("xxh64", "16 lower-case hex digits");
    } else {
      ZOE_RETURN_IF_ERROR(f.get_optional("xxh64", &t.xxh64));
    }
    if (t.rank < 0 || t.rank >= m->world_size) return f.bad("rank", "a rank below world_size");
    if (t.module >= m->modules.size()) return f.bad("module", "the index of a module in 'modules'");
    if (t.kind.empty()) return f.bad("kind", "a state's name");
    ZOE_RETURN_IF_ERROR(check_record_dtype(f, t));
    if (t.bytes != tensor_bytes(t.dtype, t.count)) {
      const std::string want = std::to_string(tensor_bytes(t.dtype, t.count));
      return f.bad("bytes", packed_dtype(t.dtype)
                                ? "the bytes of count elements of " + t.dtype + " (" + want + ")"
                                : "count x the dtype's size (" + want + ")");
    }
    if (t.begin + t.count > m->modules[t.module].padded) {
      return f.bad("count", "a range inside the module's padded size (" +
                                std::to_string(m->modules[t.module].padded) + ")");
    }
    if (t.offset % kTensorAlign != 0) return f.bad("offset", "a multiple of " + std::to_string(kTensorAlign));
    auto fi = file_of_rank.find(t.rank);
    if (fi == file_of_rank.end()) {
      return corruption("%s: %s is in rank %d's file %s, which 'files' does not list", where.c_str(),
                        item("tensors", i).c_str(), t.rank, rank_file_name(t.rank).c_str());
    }
    const FileInfo& file = m->files[fi->second];
    if (t.offset + t.bytes > file.bytes) {
      return f.bad("offset", "bytes [offset, offset + " + std::to_string(t.bytes) + ") inside " + file.name +
                                 " (" + std::to_string(file.bytes) + " bytes)");
    }
    m->tensors.push_back(std::move(t));
  }
  // Within each file, tensors are disjoint byte ranges.
  std::vector<size_t> order(m->tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const TensorRecord &x = m->tensors[a], &y = m->tensors[b];
    return x.rank != y.rank ? x.rank < y.rank : x.offset < y.offset;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorRecord& a = m->tensors[order[k - 1]];
    const TensorRecord& b = m->tensors[order[k]];
    if (a.rank == b.rank && a.bytes > 0 && b.bytes > 0 && b.offset < a.offset + a.bytes) {
      return corruption("%s: key '%s': bytes [%" PRIu64 ", %" PRIu64 ") of %s overlap %s's [%" PRIu64
                        ", %" PRIu64 ")",
                        where.c_str(), (item("tensors", order[k]) + ".offset").c_str(), b.offset,
                        b.offset + b.bytes, rank_file_name(b.rank).c_str(),
                        item("tensors", order[k - 1]).c_str(), a.offset, a.offset + a.bytes);
    }
  }
  return Status::ok();
}

// The engine's and the trainer's step counters against the top-level one.
Status check_sections(const json& j, const std::string& where, Manifest* m) {
  JsonFields top(j, where, "");
  if (top.has("engine")) {
    JsonFields e(j.at("engine"), where, "engine");
    ZOE_RETURN_IF_ERROR(e.check_object());
    int64_t steps = m->step;
    ZOE_RETURN_IF_ERROR(e.get_optional("steps", &steps));
    if (steps != m->step) return e.bad("steps", "the top-level step (" + std::to_string(m->step) + ")");
    m->engine = j.at("engine");
  }
  if (top.has("trainer")) {
    JsonFields t(j.at("trainer"), where, "trainer");
    ZOE_RETURN_IF_ERROR(t.check_object());
    int64_t step = m->step;
    ZOE_RETURN_IF_ERROR(t.get_optional("step", &step));
    if (step < m->step) {
      return t.bad("step", "a count of iterations >= the optimizer steps taken (step " +
                               std::to_string(m->step) + ")");
    }
    m->trainer = j.at("trainer");
  }
  return Status::ok();
}

}  // namespace

Result<Manifest> Manifest::from_json(const json& j, const std::string& where) {
  Manifest m;
  JsonFields top(j, where, "");
  ZOE_RETURN_IF_ERROR(top.check_object());
  // The version first: a newer writer may have changed everything else.
  ZOE_RETURN_IF_ERROR(top.get("format_version", &m.format_version));
  if (m.format_version > kFormatVersion) {
    return unsupported(
        "%s: format_version %d was written by a newer zoe (this zoe reads up to %d); "
        "upgrade zoe to load it",
        where.c_str(), m.format_version, kFormatVersion);
  }
  if (m.format_version < 1) return top.bad("format_version", "a version >= 1");
  if (top.has("format")) {
    std::string format;
    ZOE_RETURN_IF_ERROR(top.get("format", &format));
    if (format != "zoe-checkpoint") return top.bad("format", "\"zoe-checkpoint\"");
  }
  ZOE_RETURN_IF_ERROR(top.get("world_size", &m.world_size));
  if (m.world_size < 1) return top.bad("world_size", "a positive integer");
  ZOE_RETURN_IF_ERROR(top.get("stage", &m.stage));
  if (m.stage < 0 || m.stage > 3) return top.bad("stage", "a ZeRO stage, 0 to 3");
  ZOE_RETURN_IF_ERROR(top.get("step", &m.step));
  if (m.step < 0) return top.bad("step", "a non-negative step count");

  ZOE_RETURN_IF_ERROR(check_modules(j, where, &m));
  std::map<int, size_t> file_of_rank;
  ZOE_RETURN_IF_ERROR(check_files(j, where, &m, &file_of_rank));
  ZOE_RETURN_IF_ERROR(check_tensors(j, where, &m, file_of_rank));
  ZOE_RETURN_IF_ERROR(check_sections(j, where, &m));
  return m;
}

// ---- loading ----

namespace {

// Nesting depth of [ and { outside strings; a first pass, so that the parser (and later a
// recursive dump or copy) never meets a document nested deeper than kManifestMaxDepth.
Status check_depth(const std::string& text, const std::string& path) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kManifestMaxDepth) {
        return corruption("%s nests deeper than %d levels at byte %zu (corrupted?)", path.c_str(),
                          kManifestMaxDepth, i);
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return Status::ok();
}

// manifest.xxh64: "<16 hex digits>  manifest.json\n".
Result<std::string> read_checksum_file(const std::string& path) {
  ZOE_ASSIGN_OR_RETURN(std::string text, detail::read_small_file(path, 4096));
  const std::string want_tail = std::string("  ") + kManifestName;
  std::string line = text;
  if (!line.empty() && line.back() == '\n') line.pop_back();
  if (line.size() != 16 + want_tail.size() || line.compare(16, std::string::npos, want_tail) != 0 ||
      !detail::is_hex64(line.substr(0, 16))) {
    return corruption("%s is corrupt: expected \"<16 hex digits>  %s\", found %s", path.c_str(),
                      kManifestName, detail::printable(text).c_str());
  }
  return line.substr(0, 16);
}

bool file_exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

}  // namespace

Result<Manifest> load_manifest(const std::string& dir, std::string* checksum) {
  const std::string mpath = dir + "/" + kManifestName;
  const std::string cpath = dir + "/" + kManifestChecksumName;
  ZOE_ASSIGN_OR_RETURN(std::string text, detail::read_small_file(mpath, kManifestMaxBytes));
  std::string want;
  const bool has_checksum = file_exists(cpath);
  if (has_checksum) {
    ZOE_ASSIGN_OR_RETURN(want, read_checksum_file(cpath));
    detail::Xxh64 h;
    h.update(text.data(), text.size());
    const std::string got = detail::hex64(h.digest());
    if (got != want) {
      return corruption(
          "checksum mismatch in %s: %s says xxh64 %s, its %zu bytes have %s: the manifest was "
          "modified or damaged after checkpoint %s was written",
          mpath.c_str(), kManifestChecksumName, want.c_str(), text.size(), got.c_str(), dir.c_str());
    }
  }
  ZOE_RETURN_IF_ERROR(check_depth(text, mpath));
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e400
    return corruption("%s is not valid JSON (truncated or corrupted?): %s", mpath.c_str(), e.what());
  }
  ZOE_ASSIGN_OR_RETURN(Manifest m, Manifest::from_json(j, mpath));
  if (!has_checksum) {
    if (m.format_version >= 2) {
      return corruption(
          "%s is missing: format %d manifests are checksummed, so %s cannot be trusted (checkpoint "
          "%s is damaged)",
          cpath.c_str(), m.format_version, mpath.c_str(), dir.c_str());
    }
    ZOE_LOG_WARN(
        "%s was written by an older zoe (format %d) without %s: its manifest cannot be verified "
        "(re-save the checkpoint to protect it)",
        mpath.c_str(), m.format_version, kManifestChecksumName);
  }
  if (checksum) *checksum = want;
  return m;
}

}  // namespace zoe::ckpt
