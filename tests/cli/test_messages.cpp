// End-to-end tests of the zoe CLI's error messages: each names the flag, key or file at fault and
// says the true reason, once.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/xxh64.h"
#include "tests/cli/run_zoe.h"
#include "tests/util/test_util.h"

namespace {

using nlohmann::json;

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// A save directory another writer holds: the message says so once, with its code once.
TEST(Messages, SaveDirLockSaysItsContextOnce) {
  zoe::test::ScratchDir d("lock");
  const std::string lock_path = d.file(".zoe-lock");
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  const std::string who = "pid 4242 host elsewhere since 2026-01-01 00:00:00\n";
  ASSERT_EQ(write(fd, who.data(), who.size()), static_cast<ssize_t>(who.size()));
  CmdResult r = zoe("train --preset tiny --steps 1 --quiet --save-dir " + d.path());
  close(fd);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find(
                "zoe: error: already exists: save directory " + d.path() +
                " is in use by another writer (\"pid 4242 host elsewhere since 2026-01-01 00:00:00\" holds " +
                lock_path + ")"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(count_of(r.err, "already exists"), 1u) << r.err;
  EXPECT_EQ(count_of(r.err, "claiming " + d.path()), 1u) << r.err;
}

// An NVMe directory that cannot hold files: the message names the flag (or key), the directory and
// the true reason, not the ENOENT of the swap file's open.
TEST(Messages, UnusableNvmePathSaysWhy) {
  CmdResult r = zoe("train --preset tiny --steps 1 --quiet --offload nvme --nvme-path /proc");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("'/proc' is on procfs, a kernel pseudo file system"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--nvme-path"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("No such file or directory"), std::string::npos) << r.err;
  r = zoe("train --preset tiny --steps 1 --quiet --offload nvme --nvme-path /sys/kernel");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("'/sys/kernel' is on sysfs"), std::string::npos) << r.err;
  zoe::test::ScratchDir d("nvme");
  std::ofstream(d.file("plain")) << "x";
  r = zoe("train --preset tiny --steps 1 --quiet --offload nvme --nvme-path " + d.file("plain"));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find(d.file("plain") + "' is not a directory"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--nvme-path"), std::string::npos) << r.err;
  // A config file's key is named the same way.
  std::ofstream(d.file("ds.json"))
      << R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/proc"}}})";
  r = zoe("train --preset tiny --steps 1 --quiet --config " + d.file("ds.json"));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("zero_optimization.offload_optimizer.nvme_path: '/proc' is on procfs"),
            std::string::npos)
      << r.err;
  // The other commands that take a directory for their files.
  for (const std::string cmd : {"bench io --size 4MiB --path /proc", "bench swap --params 1M --path /proc"}) {
    r = zoe(cmd);
    EXPECT_EQ(r.rc, 1) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("--path: '/proc' is on procfs"), std::string::npos) << cmd << ": " << r.err;
  }
  r = zoe("plan --nvme-path /proc");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("--nvme-path: '/proc' is on procfs"), std::string::npos) << r.err;
}

// The integer options a command's --help lists (CLI11 prints their type, INT or UINT).
std::vector<std::string> integer_options(const std::string& command) {
  CmdResult h = zoe(command + " --help");
  std::vector<std::string> flags;
  std::regex opt(R"(^\s+(--[a-z0-9-]+)\s+U?INT\b)");
  std::istringstream lines(h.out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, opt)) flags.push_back(m[1]);
  }
  return flags;
}

// Every integer flag of every command refuses a value out of its range, naming the flag, before
// the command does anything (exit 2). The flags are found from --help, so a new one is covered.
TEST(Messages, EveryIntegerFlagNamesItselfWhenOutOfRange) {
  const char* commands[][2] = {{"bench adam", ""},
                               {"bench engine", ""},
                               {"bench io", ""},
                               {"bench comm", ""},
                               {"bench swap", ""},
                               {"ckpt consolidate", " /nonexistent --out /nonexistent/x.safetensors"},
                               {"ckpt eval", " /nonexistent"},
                               {"plan", ""},
                               {"tune", ""},
                               {"train", ""}};
  size_t checked = 0;
  for (const auto& c : commands) {
    const std::vector<std::string> flags = integer_options(c[0]);
    EXPECT_FALSE(flags.empty()) << c[0];
    for (const std::string& flag : flags) {
      for (const char* bad : {"-1000000000", "99999999999999999999", "3x"}) {
        CmdResult r = zoe(std::string(c[0]) + c[1] + " " + flag + " " + bad, "", 60);
        EXPECT_EQ(r.rc, 2) << c[0] << " " << flag << " " << bad << ": " << r.err;
        EXPECT_NE(r.err.find("zoe: error: invalid argument: " + flag + " " + bad + " is "), std::string::npos)
            << c[0] << " " << flag << " " << bad << ": " << r.err;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 60u);
  CmdResult r = zoe("bench adam --threads -1");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--threads -1 is out of range (expected an integer in [0, 4096])"), std::string::npos)
      << r.err;
}

// Activation checkpointing's flags and keys: a bad value, offload without checkpointing, a host
// budget without offload and NVMe without a directory each name the flag or the key at fault.
TEST(Messages, ActivationFlagsAndKeysNameThemselves) {
  const std::string run = "train --preset tiny --steps 1 --quiet ";
  CmdResult r = zoe(run + "--activation-offload disk");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--activation-offload disk is not none, cpu or nvme"), std::string::npos) << r.err;
  r = zoe(run + "--activation-offload cpu");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(
      r.err.find("--activation-offload cpu needs activation checkpointing: give --activation-checkpointing"),
      std::string::npos)
      << r.err;
  r = zoe(run + "--activation-checkpointing --activation-offload cpu --activation-host-budget lots");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--activation-host-budget lots is not a byte size"), std::string::npos) << r.err;
  r = zoe(run + "--activation-checkpointing --activation-host-budget 1GiB");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--activation-host-budget 1GiB has no effect without activation offload"),
            std::string::npos)
      << r.err;
  zoe::test::ScratchDir d("act");
  std::ofstream(d.file("off.json")) << R"({"zoe": {"activation_offload": "cpu"}})";
  r = zoe(run + "--config " + d.file("off.json"));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("zoe.activation_offload cpu (or activation_checkpointing.cpu_checkpointing) in " +
                       d.file("off.json") + " needs activation checkpointing"),
            std::string::npos)
      << r.err;
  std::ofstream(d.file("nvme.json"))
      << R"({"activation_checkpointing": {}, "zoe": {"activation_offload": "nvme"}})";
  r = zoe(run + "--config " + d.file("nvme.json"));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("zoe.activation_offload: \"nvme\" needs zoe.activation_nvme_path"), std::string::npos)
      << r.err;
  r = zoe(run + "--config " + d.file("off.json") + " --activation-checkpointing --activation-offload nvme");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("needs zoe.activation_nvme_path"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--activation-offload with --config " + d.file("off.json")), std::string::npos)
      << r.err;
  r = zoe("plan --preset demo --activation-offload cpu");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("--activation-offload cpu needs --activation-checkpointing"), std::string::npos)
      << r.err;
  r = zoe("plan --preset demo --activation-checkpointing --activation-offload tape");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("--activation-offload tape: expected none, cpu or nvme"), std::string::npos) << r.err;
}

// nodes x gpus per node is computed in 64 bits and capped at 2^20 ranks, naming both flags.
// One block's input that cannot stay on the device beside the model: said in the flags' terms (the
// input's size, why it stays, what to change), never as zoe.activation_device_budget, a key the
// flags set.
TEST(Messages, AnActivationInputThatDoesNotFitSpeaksInFlags) {
  zoe::test::ScratchDir d("act-fit");
  const std::string run =
      "train --preset demo --context 2048 --seq 2048 --micro-batch 8 --steps 1 --quiet "
      "--activation-checkpointing --activation-offload nvme --offload nvme --nvme-path " +
      d.path() + " --device-budget ";
  // 16 MiB: the input is all of it; 19 MiB: what it leaves is less than the model needs.
  for (const std::string budget : {"16MiB", "19MiB"}) {
    CmdResult r = zoe(run + budget);
    EXPECT_NE(r.rc, 0) << budget << ": " << r.err;
    EXPECT_NE(
        r.err.find("one block's input is 16777216 bytes (16 MiB: --micro-batch 8 x --seq 2048 x width 256"),
        std::string::npos)
        << budget << ": " << r.err;
    EXPECT_NE(r.err.find("raise --device-budget"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--device-budget " + budget), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("zoe.activation_device_budget"), std::string::npos) << r.err;
  }
}

// A benchmark whose states cannot fit on --path is refused before anything is written.
TEST(Messages, BenchSwapChecksTheFreeSpaceFirst) {
  zoe::test::ScratchDir d("swap-space");
  CmdResult r = zoe("bench swap --params 1e15 --path " + d.path());
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("zoe: error: no space: --params 1000000000000000: the optimizer states need"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("on --path " + d.path()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("lower --params"), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::is_empty(d.path())) << "nothing written";
}

// A job waiting for another's lock on its swap directory (held while that one creates its swap
// files or removes large stale ones) says so after a few seconds, naming the directory and the
// holder's PID, then goes on once the lock is released.
TEST(Messages, AWaitForTheSwapDirectoryLockIsSaid) {
  zoe::test::ScratchDir d("dirlock");
  const int fd = open(d.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  std::thread release([fd] {
    sleep(5);
    close(fd);
  });
  CmdResult r = zoe("bench swap --params 1M --sub-group 1M --repeats 1 --path " + d.path());
  release.join();
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("waiting 3 s for the lock on swap directory " + d.path() + ", held by PID " +
                       std::to_string(getpid())),
            std::string::npos)
      << r.err;
}

TEST(Messages, PlanWorldSizeDoesNotWrap) {
  for (const std::string cmd : {"plan", "tune"}) {
    CmdResult r = zoe(cmd + " --nodes 65536 --gpus-per-node 65536");
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_NE(r.err.find("--nodes 65536 x --gpus-per-node 65536 is 4294967296 ranks: more than the 1048576"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("world size 0"), std::string::npos) << r.err;
  }
  CmdResult r = zoe("plan --nodes 1024 --gpus-per-node 1024 --json");  // 2^20: the most
  EXPECT_NE(r.err.find("planning"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("more than the 1048576"), std::string::npos) << r.err;
  // A large batch: tune searches the divisors of micro-batch x accumulation without a 2^40 loop.
  r = zoe("tune --micro-batch 1048576 --grad-accum 1048576 --json", "", 60);
  EXPECT_NE(r.rc, 124) << r.err;
}

// Every rate flag of plan and tune refuses 0, negative, nan and inf, naming itself.
TEST(Messages, RateFlagsRefuseNonPositiveAndNonFinite) {
  const char* flags[] = {"--nvme-read-gbps",  "--nvme-write-gbps", "--h2d-gbps",   "--cpu-adam-gbps",
                         "--flops",           "--net-gbps",        "--intra-gbps", "--device-mem-gbps",
                         "--local-copy-gbps", "--nvme-cpu-gbps"};
  for (const std::string cmd : {"plan", "tune"}) {
    for (const std::string flag : flags) {
      for (const std::string bad : {"0", "-2", "nan", "inf"}) {
        CmdResult r = zoe(cmd + " " + flag + " " + bad);
        EXPECT_EQ(r.rc, 2) << cmd << " " << flag << " " << bad << ": " << r.err;
        EXPECT_NE(r.err.find(flag + " " + bad + " is not a positive finite number"), std::string::npos)
            << cmd << " " << flag << " " << bad << ": " << r.err;
      }
    }
  }
  CmdResult r = zoe("plan --flops 2e14 --h2d-gbps 12.5 --json");
  EXPECT_NE(r.err.find("planning"), std::string::npos) << r.err;
}

// A Hugging Face config with huge dimensions is refused at once, naming the key and the cap.
TEST(Messages, HfConfigDimensionsAreCapped) {
  zoe::test::ScratchDir d("hf");
  auto run = [&](const std::string& name, const std::string& text) {
    std::ofstream(d.file(name)) << text;
    return zoe("plan --hf-config " + d.file(name), "", 30);
  };
  CmdResult r = run("layers.json",
                    R"({"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768,
                        "n_layer": 1000000000, "n_head": 12})");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("key \"n_layer\" of a gpt2 config is 1000000000, more than 65536"), std::string::npos)
      << r.err;
  r = run("vocab.json", R"({"model_type": "llama", "vocab_size": 4000000000, "hidden_size": 4096,
                            "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32})");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("key \"vocab_size\" of a llama config is 4000000000, more than 16777216"),
            std::string::npos)
      << r.err;
  r = run("width.json", R"({"model_type": "gpt_neox", "vocab_size": 50432, "hidden_size": 100000000,
                            "num_hidden_layers": 4, "num_attention_heads": 8})");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("key \"hidden_size\" of a gpt_neox config is 100000000, more than 1048576"),
            std::string::npos)
      << r.err;
  // Each key under its cap, the model over the parameter cap.
  r = run("params.json", R"({"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
                             "n_embd": 1048576, "n_layer": 65536, "n_head": 16})");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("parameters, more than 1000000000000000, the most zoe plans for"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("n_layer"), std::string::npos) << r.err;
}

// --help says which micro-batch a run gets with and without --config, and the run agrees.
TEST(Messages, TrainHelpTellsTheTrueMicroBatch) {
  CmdResult h = zoe("train --help");
  EXPECT_EQ(h.rc, 0);
  EXPECT_EQ(h.out.find("default 8, or the config's"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("default 8 without --config"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("else 1 as in DeepSpeed"), std::string::npos) << h.out;
  zoe::test::ScratchDir d("mb");
  std::ofstream(d.file("empty.json")) << "{}";
  CmdResult r = zoe("train --preset tiny --steps 1 --quiet --json --config " + d.file("empty.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["micro_batch"], 1) << r.out;
  r = zoe("train --preset tiny --steps 1 --quiet --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["micro_batch"], 8) << r.out;
}

// Rewrites a checkpoint's manifest.json through `edit`, with a manifest.xxh64 that matches, so that
// only its structure is wrong.
void rewrite_manifest(const std::string& ckpt_dir, const std::function<void(json&)>& edit) {
  const std::string mpath = ckpt_dir + "/manifest.json";
  std::ifstream in(mpath);
  json m = json::parse(in);
  edit(m);
  const std::string text = m.dump(1);
  std::ofstream(mpath, std::ios::trunc) << text;
  zoe::ckpt::detail::PortableXxh64 h;
  h.update(text.data(), text.size());
  char sum[17];
  snprintf(sum, sizeof(sum), "%016llx", static_cast<unsigned long long>(h.digest()));
  std::ofstream(ckpt_dir + "/manifest.xxh64", std::ios::trunc) << sum << "  manifest.json\n";
}

// `zoe ckpt verify` refuses the manifests --resume refuses (a tensor missing), naming it, and
// still passes a whole checkpoint.
TEST(Messages, CkptVerifyChecksStructureAsResumeDoes) {
  zoe::test::ScratchDir d("verify");
  const std::string save = d.file("save");
  CmdResult r = zoe("train --preset tiny --steps 1 --save-every 1 --quiet --save-dir " + save);
  ASSERT_EQ(r.rc, 0) << r.err;
  r = zoe("ckpt verify " + save);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find(": OK"), std::string::npos) << r.out;
  const std::string ckpt = save + "/step-000001";
  ASSERT_TRUE(std::filesystem::exists(ckpt + "/manifest.json"));
  std::filesystem::copy(ckpt, d.file("whole"), std::filesystem::copy_options::recursive);

  // One tensor dropped: the module's first "exp_avg" record.
  std::string dropped_module;
  rewrite_manifest(ckpt, [&](json& m) {
    auto& ts = m["tensors"];
    for (auto it = ts.begin(); it != ts.end(); ++it) {
      if ((*it)["kind"] == "exp_avg" && (*it)["begin"] == 0) {
        dropped_module = m["modules"][(*it)["module"].get<size_t>()]["name"];
        ts.erase(it);
        break;
      }
    }
  });
  ASSERT_FALSE(dropped_module.empty());
  CmdResult v = zoe("ckpt verify " + save);
  CmdResult l = zoe("train --preset tiny --steps 2 --save-every 1 --quiet --save-dir " + save + " --resume");
  EXPECT_EQ(v.rc, 1) << v.out << v.err;
  const std::string missing = "lists no tensor for element 0 (of ";
  const std::string which = ") of module '" + dropped_module + "' 'exp_avg' state";
  EXPECT_NE(v.err.find(missing), std::string::npos) << v.err;
  EXPECT_NE(v.err.find(which), std::string::npos) << v.err;
  EXPECT_EQ(l.rc, 1) << l.err;
  EXPECT_NE(l.err.find(missing), std::string::npos) << l.err;
  EXPECT_NE(l.err.find(which), std::string::npos) << l.err;

  // No tensors at all.
  rewrite_manifest(ckpt, [](json& m) { m["tensors"] = json::array(); });
  v = zoe("ckpt verify " + save + " --json");
  EXPECT_EQ(v.rc, 1) << v.err;
  EXPECT_NE(v.err.find("lists no tensor for element 0"), std::string::npos) << v.err;
  EXPECT_EQ(json::parse(v.out)["ok"], false) << v.out;
  l = zoe("train --preset tiny --steps 2 --save-every 1 --quiet --save-dir " + save + " --resume");
  EXPECT_EQ(l.rc, 1) << l.err;
  EXPECT_NE(l.err.find("lists no tensor for element 0"), std::string::npos) << l.err;

  // The untouched copy still verifies.
  r = zoe("ckpt verify " + d.file("whole"));
  EXPECT_EQ(r.rc, 0) << r.err;
}

// CLI11's own refusals (a value it cannot convert, an unknown flag, a flag without its value) carry
// the frame's "zoe: error:" prefix and the usage exit code, like every other error.
TEST(Messages, ParseErrorsCarryTheErrorPrefix) {
  CmdResult r = zoe("bench engine --stage 2147483648");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(
      r.err.find("zoe: error: invalid argument: --stage 2147483648 is out of range (expected an integer in "
                 "[0, 3])"),
      std::string::npos)
      << r.err;
  for (const std::string args :
       {"train --no-such-flag", "train --steps", "bench engine --modules", "frobnicate"}) {
    r = zoe(args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("zoe: error: ", 0), 0u) << args << ": " << r.err;
  }
  r = zoe("--help");  // help is not an error
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.find("error"), std::string::npos) << r.err;
}

// An empty item of a comma-separated list ("1KiB,,2KiB", "read,") is refused naming the flag, the
// text and the item's position, in every list a command takes, before anything runs.
TEST(Messages, EmptyListItemsAreRefused) {
  zoe::test::ScratchDir d("lists");
  const std::string io = "bench io --size 4MiB --loops 1 --warmup 0 --path " + d.path() + " ";
  const char* cases[][2] = {
      {"bench comm --iters 1 --warmup 0 --sizes 1KiB,,2KiB", "--sizes '1KiB,,2KiB': item 2 is empty"},
      {"bench comm --iters 1 --warmup 0 --sizes 4KiB --ops allreduce,",
       "--ops 'allreduce,': item 2 is empty"},
      {"bench engine --steps 1 --d 16 --offload none --modules 1,,2", "--modules '1,,2': item 2 is empty"},
      {"--bs 1MiB,,4MiB --qd 1 --rw read", "--bs '1MiB,,4MiB': item 2 is empty"},
      {"--bs 1MiB --qd ,1 --rw read", "--qd ',1': item 1 is empty"},
      {"--bs 1MiB --qd 1 --rw read,", "--rw 'read,': item 2 is empty"},
      {"--bs 1MiB --qd 1 --rw read --engine uring,,threads", "--engine 'uring,,threads': item 2 is empty"},
  };
  for (const auto& c : cases) {
    const std::string args = c[0][0] == '-' ? io + c[0] : c[0];
    CmdResult r = zoe(args, "", 120);
    EXPECT_NE(r.rc, 0) << args << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("zoe: error: invalid argument: " + std::string(c[1])), std::string::npos)
        << args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << args << ": ran anyway: " << r.out;
  }
}

// A size parser and the sizes zoe prints agree up to EiB: every size flag takes P/E (and PB/EB),
// and one beyond 64 bits is refused naming the flag.
TEST(Messages, SizesUpToExaBytes) {
  CmdResult r = zoe("plan --preset tiny --host-mem 4GiB --nvme-space 1EiB --json");
  EXPECT_EQ(r.rc, 0) << r.err;
  r = zoe("plan --preset tiny --host-mem 4GiB --nvme-space 16EiB");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--nvme-space"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'16EiB' is out of range for a byte size"), std::string::npos) << r.err;
  // Counts (bench swap --params) read the same letters as decimal multipliers, within 64 bits.
  zoe::test::ScratchDir d("sizes");
  r = zoe("bench swap --params 1e30G --path " + d.path());
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("zoe: error: invalid argument: --params 1e30G is out of range"), std::string::npos)
      << r.err;
  r = zoe("train --preset tiny --steps 1 --quiet --device-budget 10EB");  // a size, but beyond what zoe takes
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--device-budget 10EB is more than zoe takes (at most 9223372036854775807 bytes"),
            std::string::npos)
      << r.err;
  r = zoe("train --preset tiny --steps 1 --quiet --device-budget 1ZiB");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(
      r.err.find("--device-budget 1ZiB is not a byte size: '1ZiB': unknown size suffix 'ZiB' (use B, KiB, "
                 "MiB, GiB, TiB, PiB, EiB"),
      std::string::npos)
      << r.err;
}

std::string host_name() {
  char h[256] = {};
  gethostname(h, sizeof h - 1);
  return h;
}

// --nvme-path's placeholders and variables: --help says they are expanded (every command that takes
// the flag), and an error names the flag and the text as given, with the expansion, not the config
// key the flag became. A config file's directory is named by its key, the text and the expansion.
TEST(Messages, NvmePathNamesTheFlagAndTheTextGiven) {
  for (const std::string cmd : {"train", "plan", "tune"}) {
    CmdResult h = zoe(cmd + " --help");
    const size_t at = h.out.find("\n  --nvme-path");
    ASSERT_NE(at, std::string::npos) << cmd << ": " << h.out;
    const std::string line = h.out.substr(at, h.out.find("\n  -", at + 1) - at);
    for (const char* says : {"$VAR", "{rank}", "{local_rank}", "{host}"})
      EXPECT_NE(line.find(says), std::string::npos) << cmd << " --help: " << line;
  }
  zoe::test::ScratchDir d("nvme-text");
  setenv("ZOE_TEST_NVME_DIR", d.path().c_str(), 1);
  const std::string run = "train --preset tiny --steps 1 --quiet --offload nvme ";
  CmdResult r = zoe(run + "--nvme-path '$ZOE_TEST_NVME_DIR/missing'");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("zoe: error: not found: --nvme-path '$ZOE_TEST_NVME_DIR/missing': '" + d.path() +
                       "/missing' does not exist"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("zero_optimization"), std::string::npos) << r.err;
  r = zoe(run + "--nvme-path '" + d.path() + "/{node}'");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(
      r.err.find("--nvme-path: '" + d.path() + "/{node}': unknown placeholder {node} on host " + host_name()),
      std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("zero_optimization"), std::string::npos) << r.err;
  // plan and tune expand the flag on this host for their checks (the free space, the calibration).
  r = zoe("plan --preset tiny --host-mem 4GiB --nvme-path '$ZOE_TEST_NVME_DIR' --json");
  EXPECT_EQ(r.rc, 0) << r.err;
  r = zoe("plan --preset tiny --host-mem 4GiB --nvme-path '$ZOE_TEST_NVME_DIR/missing'");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("--nvme-path '$ZOE_TEST_NVME_DIR/missing': '" + d.path() + "/missing' does not exist"),
            std::string::npos)
      << r.err;
  unsetenv("ZOE_TEST_NVME_DIR");
  std::ofstream(d.file("ds.json"))
      << R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": ")"
      << d.path() << R"(/r{rank}"}}})";
  r = zoe("train --preset tiny --steps 1 --quiet --config " + d.file("ds.json"));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("zero_optimization.offload_optimizer.nvme_path '" + d.path() + "/r{rank}': '" +
                       d.path() + "/r0' does not exist"),
            std::string::npos)
      << r.err;
}

// Under a process limit that leaves no thread to start (`ulimit -u`), zoe says so and what to
// change, and exits 1: OpenBLAS's thread pool, which would end the program with its own message
// before main(), never starts. RLIMIT_NPROC binds only an unprivileged user: the command runs as a
// uid of no other process, whose limit of 2 is `timeout` and zoe.
TEST(Messages, ThreadLimitSaysWhatToChange) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's own threads (LeakSanitizer's at exit) need the processes the limit denies";
#endif
  if (geteuid() != 0 || system("command -v setpriv >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "needs root and setpriv to run zoe as an unprivileged user";
  const std::string as_user =
      "setpriv --reuid=54329 --regid=54329 --clear-groups bash -c 'ulimit -u 2 && exec \"$@\"' bash";
  CmdResult r = zoe("train --preset tiny --steps 1 --quiet", as_user);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("zoe: error: could not start a thread"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("this user may run at most 2 processes and threads together (ulimit -u)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("OpenBLAS"), std::string::npos) << r.err;
  r = zoe("info", as_user);  // a command that needs no thread runs
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.find("OpenBLAS"), std::string::npos) << r.err;
}

}  // namespace
