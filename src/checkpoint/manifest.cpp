// The checkpoint manifest: JSON form, parsing with errors that name the key, consistency checks.
#include <cinttypes>
#include <set>

#include "checkpoint/checkpoint.h"

namespace zoe::ckpt {

using nlohmann::json;

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "f32") return 4;
  if (dtype == "bf16" || dtype == "f16") return 2;
  return 0;
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
  }
  j["modules"] = jm;
  json jt = json::array();
  for (const auto& t : tensors) {
    jt.push_back({{"rank", t.rank},
                  {"module", t.module},
                  {"kind", t.kind},
                  {"dtype", t.dtype},
                  {"begin", t.begin},
                  {"count", t.count},
                  {"offset", t.offset},
                  {"bytes", t.bytes}});
  }
  j["tensors"] = jt;
  json jf = json::array();
  for (const auto& f : files) jf.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", f.xxh64}});
  j["files"] = jf;
  j["engine"] = engine;
  j["trainer"] = trainer;
  return j;
}

namespace {

// Typed access to one key of a JSON object; errors say "<where>: key <path>: expected ...".
class Fields {
 public:
  Fields(const json& j, std::string where, std::string path)
      : j_(j), where_(std::move(where)), path_(std::move(path)) {}

  Status check_object() const {
    if (!j_.is_object()) return bad("", "an object");
    return Status::ok();
  }
  template <typename T>
  Status get(const char* key, T* out) const {
    auto it = j_.find(key);
    if (it == j_.end()) return corruption("%s: key '%s' is missing", where_.c_str(), full(key).c_str());
    if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) return bad(key, "a string");
    } else if constexpr (std::is_unsigned_v<T>) {
      if (!it->is_number_unsigned()) return bad(key, "a non-negative integer");
    } else {
      if (!it->is_number_integer()) return bad(key, "an integer");
    }
    *out = it->template get<T>();
    return Status::ok();
  }
  Result<const json*> array(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end()) return corruption("%s: key '%s' is missing", where_.c_str(), full(key).c_str());
    if (!it->is_array()) return bad(key, "an array");
    return &*it;
  }
  Status bad(const char* key, const char* expected) const {
    return corruption("%s: key '%s': expected %s", where_.c_str(), full(key).c_str(), expected);
  }
  std::string full(const char* key) const {
    if (!*key) return path_.empty() ? "(top level)" : path_;
    return path_.empty() ? key : path_ + "." + key;
  }

 private:
  const json& j_;
  std::string where_, path_;
};

std::string item(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

}  // namespace

Result<Manifest> Manifest::from_json(const json& j, const std::string& where) {
  Manifest m;
  Fields top(j, where, "");
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
  if (auto it = j.find("format"); it != j.end() && *it != "zoe-checkpoint") {
    return top.bad("format", "\"zoe-checkpoint\"");
  }
  ZOE_RETURN_IF_ERROR(top.get("world_size", &m.world_size));
  if (m.world_size < 1) return top.bad("world_size", "a positive integer");
  ZOE_RETURN_IF_ERROR(top.get("stage", &m.stage));
  ZOE_RETURN_IF_ERROR(top.get("step", &m.step));

  ZOE_ASSIGN_OR_RETURN(const json* jm, top.array("modules"));
  for (size_t i = 0; i < jm->size(); ++i) {
    Fields f((*jm)[i], where, item("modules", i));
    ZOE_RETURN_IF_ERROR(f.check_object());
    ModuleInfo mi;
    ZOE_RETURN_IF_ERROR(f.get("name", &mi.name));
    ZOE_RETURN_IF_ERROR(f.get("padded", &mi.padded));
    ZOE_ASSIGN_OR_RETURN(const json* jp, f.array("params"));
    for (size_t k = 0; k < jp->size(); ++k) {
      Fields g((*jp)[k], where, item(item("modules", i) + ".params", k));
      ZOE_RETURN_IF_ERROR(g.check_object());
      ParamInfo p;
      ZOE_RETURN_IF_ERROR(g.get("name", &p.name));
      ZOE_RETURN_IF_ERROR(g.get("offset", &p.offset));
      ZOE_RETURN_IF_ERROR(g.get("numel", &p.numel));
      ZOE_ASSIGN_OR_RETURN(const json* js, g.array("shape"));
      uint64_t prod = 1;
      for (const auto& d : *js) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          return g.bad("shape", "an array of non-negative integers");
        p.shape.push_back(d.get<int64_t>());
        prod *= static_cast<uint64_t>(d.get<int64_t>());
      }
      if (prod != p.numel) {
        return corruption("%s: %s: shape has %" PRIu64 " elements but numel is %" PRIu64, where.c_str(),
                          g.full("").c_str(), prod, p.numel);
      }
      if (p.offset + p.numel > mi.padded) {
        return corruption("%s: %s: elements [%" PRIu64 ", %" PRIu64 ") lie past the module's %" PRIu64
                          " (padded)",
                          where.c_str(), g.full("").c_str(), p.offset, p.offset + p.numel, mi.padded);
      }
      mi.params.push_back(std::move(p));
    }
    m.modules.push_back(std::move(mi));
  }

  ZOE_ASSIGN_OR_RETURN(const json* jf, top.array("files"));
  std::set<std::string> names;
  for (size_t i = 0; i < jf->size(); ++i) {
    Fields f((*jf)[i], where, item("files", i));
    ZOE_RETURN_IF_ERROR(f.check_object());
    FileInfo fi;
    ZOE_RETURN_IF_ERROR(f.get("name", &fi.name));
    ZOE_RETURN_IF_ERROR(f.get("bytes", &fi.bytes));
    ZOE_RETURN_IF_ERROR(f.get("xxh64", &fi.xxh64));
    if (fi.name.empty() || fi.name.find('/') != std::string::npos || fi.name == "." || fi.name == "..") {
      return f.bad("name", "a file name without '/'");
    }
    if (fi.xxh64.size() != 16) return f.bad("xxh64", "16 hex digits");
    names.insert(fi.name);
    m.files.push_back(std::move(fi));
  }

  ZOE_ASSIGN_OR_RETURN(const json* jt, top.array("tensors"));
  for (size_t i = 0; i < jt->size(); ++i) {
    Fields f((*jt)[i], where, item("tensors", i));
    ZOE_RETURN_IF_ERROR(f.check_object());
    TensorRecord t;
    ZOE_RETURN_IF_ERROR(f.get("rank", &t.rank));
    ZOE_RETURN_IF_ERROR(f.get("module", &t.module));
    ZOE_RETURN_IF_ERROR(f.get("kind", &t.kind));
    ZOE_RETURN_IF_ERROR(f.get("dtype", &t.dtype));
    ZOE_RETURN_IF_ERROR(f.get("begin", &t.begin));
    ZOE_RETURN_IF_ERROR(f.get("count", &t.count));
    ZOE_RETURN_IF_ERROR(f.get("offset", &t.offset));
    ZOE_RETURN_IF_ERROR(f.get("bytes", &t.bytes));
    if (t.rank < 0 || t.rank >= m.world_size) return f.bad("rank", "a rank below world_size");
    if (t.module >= m.modules.size()) return f.bad("module", "the index of a module in 'modules'");
    size_t eb = dtype_bytes(t.dtype);
    if (eb == 0) return f.bad("dtype", "\"f32\", \"bf16\" or \"f16\"");
    if (t.bytes != t.count * eb) return f.bad("bytes", "count x the dtype's size");
    if (t.begin + t.count > m.modules[t.module].padded) {
      return f.bad("count", "a range inside the module's padded size");
    }
    char name[32];
    snprintf(name, sizeof(name), "rank-%05d.bin", t.rank);
    if (!names.count(name)) {
      return corruption("%s: %s is in rank %d's file %s, which 'files' does not list", where.c_str(),
                        f.full("").c_str(), t.rank, name);
    }
    m.tensors.push_back(std::move(t));
  }
  if (auto it = j.find("engine"); it != j.end()) m.engine = *it;
  if (auto it = j.find("trainer"); it != j.end()) m.trainer = *it;
  return m;
}

}  // namespace zoe::ckpt
