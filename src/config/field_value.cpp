// One table field's value by its kind: checked and normalised from the file (read_value), stored
// into its Config member (store_value) and taken back out for to_json (load_value).
#include <cctype>
#include <set>
#include <type_traits>

#include "config/config_table.h"
#include "core/units.h"

namespace zoe::config::detail {

namespace {

constexpr int64_t kMaxInt = INT64_MAX;

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
  return s;
}

// "0, 1, 2" or "\"a\", \"b\"" (sep ", "), or "\"a\" or \"b\"" (last " or ").
std::string choice_list(const std::vector<Json>& choices, bool last_or) {
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) list += last_or && i + 1 == choices.size() ? " or " : ", ";
    list += describe(choices[i]);
  }
  return list;
}

Result<Json> read_choice(const Field& f, const Json& v, const std::string& path) {
  if (f.kind == Kind::kIntChoice) {
    auto x = to_int(v, path, INT64_MIN, INT64_MAX);
    if (x.is_ok()) {
      for (const Json& a : f.choices) {
        if (a.get<int64_t>() == x.value()) return a;
      }
    }
    return invalid_argument("%s: %s is not one of %s", path.c_str(), describe(v).c_str(),
                            choice_list(f.choices, false).c_str());
  }
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    for (const auto& [value, why] : f.refused_values) {
      if (s == value || (f.fold_case && lower(s) == lower(value)))
        return invalid_argument("%s: \"%s\" is refused: %s (choose one of %s)", path.c_str(), s.c_str(),
                                why.c_str(), choice_list(f.choices, false).c_str());
    }
    for (const Json& a : f.choices) {
      const std::string& c = a.get_ref<const std::string&>();
      if (s == c || (f.fold_case && lower(s) == lower(c))) return a;
    }
  } else if (f.string_type_message) {
    return invalid_argument("%s: %s is not a string (expected %s)", path.c_str(), describe(v).c_str(),
                            choice_list(f.choices, true).c_str());
  }
  return invalid_argument("%s: %s is not one of %s%s", path.c_str(), describe(v).c_str(),
                          choice_list(f.choices, false).c_str(), f.fold_case ? " (case-insensitive)" : "");
}

Result<Json> read_bytes(const Json& v, const std::string& path) {
  if (v.is_string()) {
    auto b = parse_bytes(v.get<std::string>());
    if (!b.is_ok() || b.value() > static_cast<uint64_t>(kMaxInt)) {
      return invalid_argument(
          "%s: %s is not a byte size (expected bytes >= 0 or a string like \"256MiB\", \"64GiB\")",
          path.c_str(), describe(v).c_str());
    }
    return Json(static_cast<int64_t>(b.value()));
  }
  ZOE_ASSIGN_OR_RETURN(int64_t n, to_int(v, path, 0, kMaxInt));
  return Json(n);
}

// A directory or a list of distinct, non-empty ones. Whether they exist is check_paths' question.
Result<Json> read_paths(const Json& v, const std::string& path) {
  std::vector<std::string> dirs;
  if (v.is_string()) {
    dirs.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string()) {
        return invalid_argument("%s[%zu]: %s is not a string (expected a directory path)", path.c_str(), i,
                                describe(v[i]).c_str());
      }
      dirs.push_back(v[i].get<std::string>());
    }
  } else {
    return invalid_argument("%s: %s is not a path (expected a directory or a list of directories)",
                            path.c_str(), describe(v).c_str());
  }
  std::set<std::string> seen;
  for (const auto& d : dirs) {
    if (d.empty()) return invalid_argument("%s: an empty string is not a directory", path.c_str());
    if (!seen.insert(d).second) return invalid_argument("%s: '%s' is listed twice", path.c_str(), d.c_str());
  }
  if (dirs.empty()) return invalid_argument("%s: [] (expected at least one directory)", path.c_str());
  return Json(dirs);
}

Offload device_named(const std::string& name) {
  for (auto d : {Offload::kCpu, Offload::kNvme}) {
    if (name == offload_name(d)) return d;
  }
  return Offload::kNone;
}

}  // namespace

Result<Json> read_value(const Field& f, const Json& v, const std::string& path, ReadContext* ctx) {
  switch (f.kind) {
    case Kind::kBool: {
      ZOE_ASSIGN_OR_RETURN(bool b, to_bool(v, path, ctx));
      return Json(b);
    }
    case Kind::kInt: {
      ZOE_ASSIGN_OR_RETURN(int64_t x, to_int(v, path, f.min, f.max));
      return Json(x);
    }
    case Kind::kDouble: {
      ZOE_ASSIGN_OR_RETURN(double d, to_double(v, path, f.range, f.fp32));
      return Json(d);
    }
    case Kind::kIntChoice:
    case Kind::kChoice:
    case Kind::kDevice:
      return read_choice(f, v, path);
    case Kind::kBytes:
      return read_bytes(v, path);
    case Kind::kPaths:
      return read_paths(v, path);
    case Kind::kPair: {
      if (!v.is_array() || v.size() != 2) {
        return invalid_argument("%s: %s is not a pair (expected %s)", path.c_str(), describe(v).c_str(),
                                f.expected.c_str());
      }
      ZOE_ASSIGN_OR_RETURN(double a, to_double(v[0], path + "[0]", f.range, f.fp32));
      ZOE_ASSIGN_OR_RETURN(double b, to_double(v[1], path + "[1]", f.range, f.fp32));
      return Json::array({a, b});
    }
    case Kind::kAny:
      return v;
    case Kind::kFeatureBlock: {
      if (!v.is_object()) {
        return invalid_argument("%s: %s is not an object (expected {...})", path.c_str(),
                                describe(v).c_str());
      }
      auto e = v.find("enabled");
      if (e == v.end()) return Json(false);
      if (e->is_null()) {
        return invalid_argument(
            "%s.enabled: null is not a value zoe reads (give true or false, or leave the "
            "key out for false)",
            path.c_str());
      }
      ZOE_ASSIGN_OR_RETURN(bool on, to_bool(*e, path + ".enabled", nullptr));
      return Json(on);
    }
  }
  return invalid_argument("%s: unknown field kind", path.c_str());
}

void store_value(const Field& f, const Json& v, Config* c) {
  std::visit(
      [&](auto ref) {
        using Ref = decltype(ref);
        if constexpr (std::is_same_v<Ref, std::monostate>) {
          // No member: a rule reads the value, or it has no effect.
        } else if constexpr (std::is_same_v<Ref, DoublePair (*)(Config&)>) {
          DoublePair p = ref(*c);
          p.first = v[0].get<double>();
          p.second = v[1].get<double>();
        } else {
          auto& out = ref(*c);
          using T = std::remove_reference_t<decltype(out)>;
          if constexpr (std::is_same_v<T, Offload>) {
            out = device_named(v.get<std::string>());
          } else {
            out = v.get<T>();
          }
        }
      },
      f.member);
}

Json load_value(const Field& f, const Config& c) {
  // The accessors take a Config& to serve store_value too; here they are only read through.
  Config& cc = const_cast<Config&>(c);
  return std::visit(
      [&](auto ref) -> Json {
        using Ref = decltype(ref);
        if constexpr (std::is_same_v<Ref, std::monostate>) {
          return nullptr;
        } else if constexpr (std::is_same_v<Ref, DoublePair (*)(Config&)>) {
          DoublePair p = ref(cc);
          return Json::array({p.first, p.second});
        } else {
          const auto& in = ref(cc);
          using T = std::remove_cv_t<std::remove_reference_t<decltype(in)>>;
          if constexpr (std::is_same_v<T, Offload>) {
            return offload_name(in);
          } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            // One directory as a string, as DeepSpeed writes it; several as a list; none: absent.
            if (in.empty()) return nullptr;
            if (in.size() == 1) return in[0];
            return in;
          } else {
            return in;
          }
        }
      },
      f.member);
}

}  // namespace zoe::config::detail
