// `zoe ckpt`: inspect, verify and consolidate checkpoints written by Engine::save.
#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "core/units.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace zoe::cli {
namespace {

using nlohmann::json;

uint64_t file_bytes(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

json describe(const ckpt::Reader& r) {
  const ckpt::Manifest& m = r.manifest();
  json j;
  j["path"] = r.path();
  j["format_version"] = m.format_version;
  j["world_size"] = m.world_size;
  j["stage"] = m.stage;
  j["step"] = m.step;
  uint64_t params = 0, elements = 0;
  json mods = json::array();
  for (const auto& mod : m.modules) {
    uint64_t e = 0;
    for (const auto& p : mod.params) e += p.numel;
    params += mod.params.size();
    elements += e;
    mods.push_back(
        {{"name", mod.name}, {"params", mod.params.size()}, {"elements", e}, {"padded", mod.padded}});
  }
  j["modules"] = mods;
  j["params"] = params;
  j["elements"] = elements;
  json files = json::array();
  json mf = {{"name", ckpt::kManifestName}, {"bytes", file_bytes(r.path() + "/" + ckpt::kManifestName)}};
  if (!r.manifest_xxh64().empty()) mf["xxh64"] = r.manifest_xxh64();  // checked by Reader::open
  files.push_back(mf);
  uint64_t total = 0;
  for (const auto& f : m.files) {
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", f.xxh64}});
    total += f.bytes;
  }
  j["files"] = files;
  j["bytes"] = total;
  std::map<int, std::pair<uint64_t, uint64_t>> per_rank;  // rank -> tensors, bytes
  std::map<std::string, uint64_t> kinds;
  for (const auto& t : m.tensors) {
    per_rank[t.rank].first++;
    per_rank[t.rank].second += t.bytes;
    kinds[t.kind] += t.count;
  }
  json ranks = json::array();
  for (int rank = 0; rank < m.world_size; ++rank) {
    ranks.push_back({{"rank", rank}, {"tensors", per_rank[rank].first}, {"bytes", per_rank[rank].second}});
  }
  j["ranks"] = ranks;
  j["kinds"] = kinds;
  j["engine"] = m.engine;
  j["trainer"] = m.trainer;
  return j;
}

void print_inspect(const json& j) {
  printf("checkpoint  %s\n", j["path"].get<std::string>().c_str());
  printf("format      version %d, world size %d, ZeRO stage %d, step %" PRId64 "\n",
         j["format_version"].get<int>(), j["world_size"].get<int>(), j["stage"].get<int>(),
         j["step"].get<int64_t>());
  printf("modules     %zu (%" PRIu64 " parameters, %" PRIu64 " elements)\n", j["modules"].size(),
         j["params"].get<uint64_t>(), j["elements"].get<uint64_t>());
  std::string kinds;
  for (auto& [k, v] : j["kinds"].items()) kinds += (kinds.empty() ? "" : ", ") + k;
  printf("states      %s\n\n", kinds.c_str());
  Table files({{"file", "", 18, true}, {"size", "bytes", 14}, {"xxh64", "", 18}});
  files.print_header(stdout);
  for (const auto& f : j["files"]) {
    files.print_row(stdout, {f["name"].get<std::string>(), format_bytes(f["bytes"].get<uint64_t>()),
                             f.value("xxh64", std::string("-"))});
  }
  printf("\n");
  Table ranks({{"rank", "", 6}, {"tensors", "", 9}, {"size", "bytes", 14}});
  ranks.print_header(stdout);
  for (const auto& r : j["ranks"]) {
    ranks.print_row(stdout,
                    {std::to_string(r["rank"].get<int>()), std::to_string(r["tensors"].get<uint64_t>()),
                     format_bytes(r["bytes"].get<uint64_t>())});
  }
}

void add_inspect(CLI::App& ckpt) {
  struct Opts {
    std::string dir;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = ckpt.add_subcommand("inspect",
                                      "Show a checkpoint: files and sizes, world size, stage, step, "
                                      "modules and parameters, tensors per rank");
  cmd->add_option("dir", o->dir, "A save directory (its `latest`) or a checkpoint directory")->required();
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    auto r = value_or_fail(ckpt::Reader::open(o->dir));
    json j = describe(*r);
    if (o->json)
      print_json(j);
    else
      print_inspect(j);
  });
}

void add_verify(CLI::App& ckpt) {
  struct Opts {
    std::string dir;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = ckpt.add_subcommand("verify",
                                      "Re-read every file of a checkpoint and check its xxh64; exit 1 "
                                      "naming the first file that does not match");
  cmd->add_option("dir", o->dir, "A save directory (its `latest`) or a checkpoint directory")->required();
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    auto r = value_or_fail(ckpt::Reader::open(o->dir));
    const auto& files = r->manifest().files;
    json jf = json::array();
    Status first;
    uint64_t bytes = 0;
    for (size_t i = 0; i < files.size(); ++i) {
      Status s = r->verify_file(i);
      json e = {
          {"name", files[i].name}, {"bytes", files[i].bytes}, {"xxh64", files[i].xxh64}, {"ok", s.is_ok()}};
      if (!s.is_ok()) e["error"] = s.message();
      jf.push_back(e);
      bytes += files[i].bytes;
      if (!o->json) {
        printf("%-6s %-18s %12s  %s\n", s.is_ok() ? "OK" : "FAILED", files[i].name.c_str(),
               format_bytes(files[i].bytes).c_str(), files[i].xxh64.c_str());
      }
      if (!s.is_ok() && first.is_ok()) first = s;
    }
    if (o->json) {
      print_json({{"path", r->path()}, {"ok", first.is_ok()}, {"bytes", bytes}, {"files", jf}});
    } else if (first.is_ok()) {
      printf("verified %zu files, %s: OK\n", files.size(), format_bytes(bytes).c_str());
    }
    if (!first.is_ok()) fail(first);
  });
}

void add_consolidate(CLI::App& ckpt) {
  struct Opts {
    std::string dir, out, dtype = "fp32";
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = ckpt.add_subcommand("consolidate",
                                      "Write the full parameters (master weights, else the "
                                      "compute copy) as one safetensors file, streaming");
  cmd->add_option("dir", o->dir, "A save directory (its `latest`) or a checkpoint directory")->required();
  cmd->add_option("--out", o->out, "The .safetensors file to write (replaced atomically)")->required();
  cmd->add_option("--dtype", o->dtype, "fp32|bf16|fp16 (default fp32)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    auto r = value_or_fail(ckpt::Reader::open(o->dir));
    Status s = ckpt::consolidate(*r, o->out, o->dtype);
    if (!s.is_ok()) fail(s);
    uint64_t params = 0;
    for (const auto& m : r->manifest().modules) params += m.params.size();
    uint64_t bytes = file_bytes(o->out);
    if (o->json) {
      print_json(
          {{"path", r->path()}, {"out", o->out}, {"dtype", o->dtype}, {"tensors", params}, {"bytes", bytes}});
    } else {
      printf("wrote %s: %" PRIu64 " tensors, %s (%s) from %s\n", o->out.c_str(), params,
             format_bytes(bytes).c_str(), o->dtype.c_str(), r->path().c_str());
    }
  });
}

}  // namespace

void add_ckpt_command(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Checkpoints: inspect, verify, consolidate");
  ckpt->require_subcommand(1);
  add_inspect(*ckpt);
  add_verify(*ckpt);
  add_consolidate(*ckpt);
}

}  // namespace zoe::cli
