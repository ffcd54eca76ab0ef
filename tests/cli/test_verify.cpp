// `zoe verify` through the binary: "identical" (exit 0) for offloaded placements that zoe trains
// correctly (stage 3 with parameters and states on NVMe, stage 2 with states in host RAM and the
// layer-major schedule, low-bit states), "diverged" (exit 1) naming the first step and tensor when
// a test hook breaks one offload path on purpose, and clear errors for bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli/run_zoe.h"

namespace {

using nlohmann::json;

std::string write_config(const zoe::test::ScratchDir& d, const std::string& name, const std::string& zero,
                         int accum, const std::string& zoe_keys) {
  const std::string path = d.file(name);
  std::ofstream(path)
      << "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": " << accum
      << ", \"bf16\": {\"enabled\": true}, \"gradient_clipping\": 1.0,"
         " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"weight_decay\": 0.01}},"
         " \"zero_optimization\": "
      << zero << ", \"zoe\": {" << zoe_keys << "}}";
  return path;
}

TEST(VerifyCli, IdenticalForCorrectPlacementsDivergedForABrokenOne) {
  zoe::test::ScratchDir d("verify");
  const std::string nvme = "{\"device\": \"nvme\", \"nvme_path\": \"" + d.path() + "\"}";
  const std::string s3 =
      write_config(d, "s3.json",
                   "{\"stage\": 3, \"stage3_param_persistence_threshold\": 0, \"offload_param\": " + nvme +
                       ", \"offload_optimizer\": " + nvme + "}",
                   1, "\"device_budget\": \"4MiB\"");
  const std::string s2 =
      write_config(d, "s2.json", "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}", 3,
                   "\"schedule\": \"layer-major\"");
  const std::string lowbit =
      write_config(d, "lowbit.json", "{\"stage\": 2, \"offload_optimizer\": " + nvme + "}", 2,
                   "\"optimizer_states\": \"int8\", \"master_weights\": \"bf16\"");
  for (const std::string& cfg : {s3, s2, lowbit}) {
    CmdResult r = zoe("verify --config " + cfg + " --preset tiny --steps 3 --json");
    ASSERT_EQ(r.rc, 0) << cfg << "\n" << r.out << r.err;
    json j = json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_EQ(j["verdict"], "identical") << cfg;
    EXPECT_TRUE(j["first_divergence"].is_null()) << cfg;
    EXPECT_EQ(j["losses"]["configured"], j["losses"]["reference"]) << cfg;
    EXPECT_EQ(j["losses"]["configured"].size(), 3u);
  }
  // The hook negates one element of block.0's gradient sum in step 2 where the sums are
  // offloaded: the norm stays, the loss of step 2 too (it came before the update), and the first
  // difference is block.0's first parameter's master after step 2.
  for (const std::string& cfg : {s3, s2}) {
    CmdResult r =
        zoe("verify --config " + cfg + " --preset tiny --steps 3 --json", "ZOE_TEST_FLIP_GRAD_SUM=block.0@2");
    EXPECT_EQ(r.rc, 1) << cfg << "\n" << r.out << r.err;
    json j = json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_EQ(j["verdict"], "diverged") << cfg;
    EXPECT_EQ(j["first_divergence"]["step"], 2) << j.dump();
    EXPECT_EQ(j["first_divergence"]["tensor"], "block.0.ln1_g.master") << j.dump();
    EXPECT_EQ(j["differing_elements"], 1) << j.dump();
    EXPECT_NE(
        r.err.find("trains differently from the reference placement (first at step 2, block.0.ln1_g.master)"),
        std::string::npos)
        << r.err;
  }
  CmdResult text = zoe("verify --config " + s3 + " --preset tiny --steps 2");
  EXPECT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("zoe verify: identical."), std::string::npos) << text.out;
}

#ifdef ZOE_MPIEXEC
// Two ranks against the one-rank reference: the gradients are summed in another order, so the
// verdict is "within_tolerance" (with the first bitwise difference named), and a broken offload
// path (the test hook) is still "diverged", named, beyond the tolerance.
TEST(VerifyCli, TwoRanksAgreeWithinToleranceAndABrokenPathDiverges) {
  zoe::test::ScratchDir d("verify");
  const std::string nvme = "{\"device\": \"nvme\", \"nvme_path\": \"" + d.path() + "\"}";
  // fp32 compute: the tolerance that catches one wrong element (bf16's is coarser; the command's help).
  const std::string s3 = d.file("s3.json");
  std::ofstream(s3)
      << "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2, "
         "\"gradient_clipping\": 1.0, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": "
         "0.001, \"weight_decay\": 0.01}}, \"zero_optimization\": {\"stage\": 3, "
         "\"stage3_param_persistence_threshold\": 0, \"offload_param\": "
      << nvme << ", \"offload_optimizer\": " << nvme << "}, \"zoe\": {\"device_budget\": \"4MiB\"}}";
  const std::string mpi = std::string(ZOE_MPIEXEC) +
                          " --oversubscribe --allow-run-as-root --bind-to none --mca btl "
                          "self,vader -np 2 ";
  const std::string args = "verify --config " + s3 + " --preset tiny --steps 3 --json --work-dir " + d.path();
  CmdResult r = zoe(args, mpi, 300);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  json j = json::parse(r.out, nullptr, false);  // rank 0 alone prints
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["verdict"], "within_tolerance") << j.dump();
  EXPECT_TRUE(j["first_divergence"].is_null());
  EXPECT_FALSE(j["first_difference"].is_null());
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["losses"]["configured"].size(), 3u);
  CmdResult broken = zoe(args, "ZOE_TEST_FLIP_GRAD_SUM=block.0@2 " + mpi, 300);
  EXPECT_NE(broken.rc, 0) << broken.out << broken.err;
  json b = json::parse(broken.out, nullptr, false);
  ASSERT_FALSE(b.is_discarded()) << broken.out << broken.err;
  EXPECT_EQ(b["verdict"], "diverged") << b.dump();
  EXPECT_EQ(b["first_divergence"]["step"], 2) << b.dump();
  EXPECT_EQ(b["first_divergence"]["tensor"], "block.0.ln1_g.master") << b.dump();
}
#endif

TEST(VerifyCli, BadInputNamesWhatToChange) {
  zoe::test::ScratchDir d("verify");
  CmdResult none = zoe("verify --preset tiny");
  EXPECT_EQ(none.rc, 2);
  EXPECT_NE(none.err.find("--config is required"), std::string::npos) << none.err;
  CmdResult missing = zoe("verify --config " + d.file("absent.json"));
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("absent.json"), std::string::npos) << missing.err;
  const std::string cfg = write_config(d, "c.json", "{\"stage\": 1}", 1, "");
  CmdResult preset = zoe("verify --config " + cfg + " --preset huge");
  EXPECT_EQ(preset.rc, 2);
  EXPECT_NE(preset.err.find("--preset huge is not one of"), std::string::npos) << preset.err;
  // --hf-config goes to zoe's Python package; without an interpreter the error says what to set.
  CmdResult both = zoe("verify --config " + cfg + " --preset tiny --hf-config " + d.file("config.json"));
  EXPECT_EQ(both.rc, 2);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
  CmdResult no_python = zoe("verify --config " + cfg + " --hf-config " + d.file("config.json"),
                            "ZOE_PYTHON=/nonexistent/python");
  EXPECT_EQ(no_python.rc, 1);
  EXPECT_NE(no_python.err.find("set ZOE_PYTHON to a Python with zoe and transformers"), std::string::npos)
      << no_python.err;
}

}  // namespace
