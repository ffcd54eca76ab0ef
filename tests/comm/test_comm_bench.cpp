// The collectives benchmark's parts in one process (sizes, ops, nccl-tests' bus factors, the
// expected results and their wrong-element count, a sweep on LocalComm) and the launcher's
// environment: MPI's variables first, Slurm's as fallbacks, torchrun's joined over gloo (refused
// in a zoe built without it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "comm/comm_bench.h"
#include "comm/communicator.h"
#include "tests/util/status_test_util.h"
#include "zoe/features.h"

namespace zoe::comm {
namespace {

using bench::Op;

TEST(CommBench, SizesRangeListAndOne) {
  auto r = bench::parse_sizes("1KiB..16KiB", 1u << 30);
  ASSERT_OK(r);
  EXPECT_EQ(*r, (std::vector<uint64_t>{1024, 2048, 4096, 8192, 16384}));
  r = bench::parse_sizes("1000..5000", 1u << 30);  // not powers of two: doubling from A, at most B
  ASSERT_OK(r);
  EXPECT_EQ(*r, (std::vector<uint64_t>{1000, 2000, 4000}));
  r = bench::parse_sizes("1MiB", 1u << 30);
  ASSERT_OK(r);
  EXPECT_EQ(*r, (std::vector<uint64_t>{1u << 20}));
  r = bench::parse_sizes("64KiB,4KiB,64KiB", 1u << 30);  // sorted, duplicates dropped
  ASSERT_OK(r);
  EXPECT_EQ(*r, (std::vector<uint64_t>{4096, 65536}));
  for (const char* bad : {"0..1KiB", "4KiB..1KiB", "x..1KiB", "", "1KiB..", "2GiB", "0"}) {
    auto b = bench::parse_sizes(bad, 1u << 30);
    ASSERT_FALSE(b.is_ok()) << bad;
    EXPECT_NE(b.status().message().find("--sizes"), std::string::npos) << b.status().to_string();
  }
}

TEST(CommBench, OpsByName) {
  auto r = bench::parse_ops("broadcast,allreduce,broadcast");
  ASSERT_OK(r);
  EXPECT_EQ(*r, (std::vector<Op>{Op::kBroadcast, Op::kAllReduce}));
  auto bad = bench::parse_ops("allreduce,alltoall");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("\"alltoall\""), std::string::npos) << bad.status().to_string();
  for (Op op : bench::kAllOps) {
    auto one = bench::parse_ops(bench::op_name(op));
    ASSERT_OK(one);
    EXPECT_EQ(one->at(0), op);
  }
}

TEST(CommBench, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bench::bus_factor(Op::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bench::bus_factor(Op::kReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bench::bus_factor(Op::kAllGather, 2), 0.5);
  EXPECT_DOUBLE_EQ(bench::bus_factor(Op::kBroadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bench::bus_factor(Op::kAllReduce, 1), 0.0);
}

TEST(CommBench, ElementCountsAreWholePartsPerRank) {
  EXPECT_EQ(bench::element_count(Op::kAllReduce, 4096, 3), 1024u);
  EXPECT_EQ(bench::element_count(Op::kAllGather, 4096, 3), 1023u);  // 341 per rank
  EXPECT_EQ(bench::element_count(Op::kReduceScatter, 4, 4), 4u);    // at least one per rank
  EXPECT_EQ(bench::element_count(Op::kBroadcast, 1, 2), 1u);
}

// count_wrong against results computed here element by element; one changed element is one wrong.
TEST(CommBench, WrongElementsAreCounted) {
  const int ranks = 3;
  const uint64_t count = 30, part = count / ranks;
  for (Op op : bench::kAllOps) {
    for (int rank = 0; rank < ranks; ++rank) {
      std::vector<float> out(op == Op::kReduceScatter ? part : count);
      for (uint64_t i = 0; i < out.size(); ++i) {
        float v = 0;
        if (op == Op::kAllReduce || op == Op::kReduceScatter) {
          const uint64_t g = op == Op::kAllReduce ? i : static_cast<uint64_t>(rank) * part + i;
          for (int q = 0; q < ranks; ++q) v += bench::input_value(q, g);
        } else if (op == Op::kAllGather) {
          v = bench::input_value(static_cast<int>(i / part), i % part);
        } else {
          v = bench::input_value(0, i);
        }
        out[i] = v;
      }
      EXPECT_EQ(bench::count_wrong(op, rank, ranks, count, out.data()), 0u) << bench::op_name(op);
      out[out.size() / 2] += 1;
      out[0] = -1;
      EXPECT_EQ(bench::count_wrong(op, rank, ranks, count, out.data()), 2u) << bench::op_name(op);
    }
  }
  // Ranks' inputs differ, so a rank's own data where another's belongs is wrong.
  EXPECT_NE(bench::input_value(0, 5), bench::input_value(1, 5));
}

TEST(CommBench, OneRankSweepOnLocalComm) {
  auto comm = create_local_comm();
  bench::Config c;
  c.sizes = {4, 4096, 1u << 20};
  c.iters = 3;
  c.warmup = 1;
  size_t points = 0;
  c.on_point = [&](Op, uint64_t, size_t i, size_t n) {
    EXPECT_EQ(i, points++);
    EXPECT_EQ(n, 12u);
  };
  auto r = bench::run(*comm, *comm, bench::host_memory(), c);
  ASSERT_OK(r);
  EXPECT_EQ(points, 12u);
  EXPECT_EQ(r->ranks, 1);
  EXPECT_EQ(r->nodes, 1);
  EXPECT_EQ(r->backend, "local");
  ASSERT_EQ(r->hosts.size(), 1u);
  ASSERT_EQ(r->rows.size(), 12u);
  for (const bench::Row& row : r->rows) {
    EXPECT_EQ(row.wrong, 0u) << bench::op_name(row.op) << " " << row.bytes;
    EXPECT_EQ(row.bytes, row.count * 4);
    EXPECT_GT(row.time_us, 0);
    EXPECT_NEAR(row.algbw_gbps, row.bytes / (row.time_us * 1e-6) / 1e9, 1e-9 * row.algbw_gbps);
    EXPECT_DOUBLE_EQ(row.busbw_gbps, row.algbw_gbps * bench::bus_factor(row.op, 1));
  }
  EXPECT_EQ(bench::count_nodes({"a", "b", "a", "c"}), 3);
}

// ---------------------------------------------------------------------------------------------
// The launcher's environment

GetEnv env_of(std::map<std::string, std::string> vars) {
  auto held = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [held](const char* name) -> const char* {
    auto it = held->find(name);
    return it == held->end() ? nullptr : it->second.c_str();
  };
}

TEST(LaunchEnv, MpiVariablesComeBeforeSlurms) {
  LaunchEnv e = resolve_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", "3"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                           {"OMPI_COMM_WORLD_SIZE", "4"},
                                           {"SLURM_PROCID", "0"},
                                           {"SLURM_LOCALID", "0"},
                                           {"SLURM_NTASKS", "8"},
                                           {"SLURM_STEP_ID", "0"}}));
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.size, 4);
  EXPECT_STREQ(e.size_from, "OMPI_COMM_WORLD_SIZE");
  EXPECT_TRUE(e.mpi);
  EXPECT_TRUE(launched_by_mpi(e));
}

TEST(LaunchEnv, SlurmFillsWhatMpiLeavesOut) {
  // srun with PMI-2: PMI_RANK and PMI_SIZE, no local rank; Slurm's gives it.
  LaunchEnv e = resolve_launch_env(env_of({{"PMI_RANK", "5"},
                                           {"PMI_SIZE", "6"},
                                           {"SLURM_PROCID", "5"},
                                           {"SLURM_LOCALID", "2"},
                                           {"SLURM_NTASKS", "6"},
                                           {"SLURM_STEP_ID", "1"}}));
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.size, 6);
  EXPECT_STREQ(e.size_from, "PMI_SIZE");
  // srun without PMI variables: Slurm's alone, and a step of several tasks goes through MPI.
  e = resolve_launch_env(
      env_of({{"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}}));
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.size, 4);
  EXPECT_STREQ(e.size_from, "SLURM_NTASKS");
  EXPECT_FALSE(e.mpi);
  EXPECT_TRUE(e.slurm);
  EXPECT_TRUE(launched_by_mpi(e));
  // A batch script (no job step) or a step of one task runs alone.
  e = resolve_launch_env(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}));
  EXPECT_FALSE(launched_by_mpi(e));
  e = resolve_launch_env(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_ID", "0"}}));
  EXPECT_FALSE(launched_by_mpi(e));
  // Nothing, or values that are not integers: -1.
  e = resolve_launch_env(env_of({{"SLURM_PROCID", "x"}, {"SLURM_LOCALID", ""}, {"SLURM_NTASKS", "-2"}}));
  EXPECT_EQ(e.rank, -1);
  EXPECT_EQ(e.local_rank, -1);
  EXPECT_EQ(e.size, -1);
  EXPECT_FALSE(launched_by_mpi(e));
}

TEST(LaunchEnv, WorldOfOneUnderALauncherOfSeveralIsRefused) {
  LaunchEnv e =
      resolve_launch_env(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}}));
  Status s = check_world_matches_launcher(e, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("SLURM_NTASKS=4"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("srun --mpi=pmix"), std::string::npos) << s.to_string();
  EXPECT_OK(check_world_matches_launcher(e, 4));
  EXPECT_OK(check_world_matches_launcher(resolve_launch_env(env_of({})), 1));
}

TEST(LaunchEnv, TorchrunIsJoinedWithGlooAndRefusedWithout) {
  LaunchEnv e = resolve_launch_env(
      env_of({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"LOCAL_RANK", "1"}, {"TORCHELASTIC_RUN_ID", "none"}}));
  EXPECT_EQ(e.torch_world, 2);
  EXPECT_EQ(e.torch_rank, 1);
  EXPECT_EQ(e.torch_local_rank, 1);
  EXPECT_TRUE(launched_by_torchrun(e));
  Status s = check_not_torchrun(e);
  if (ZOE_HAVE_GLOO) {
    EXPECT_OK(s);  // create_launcher_comm joins torchrun's world over gloo
  } else {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    for (const char* want : {"WORLD_SIZE=2", "libgloo-dev", "mpirun -np 2", "srun -n 2"})
      EXPECT_NE(s.message().find(want), std::string::npos) << want << ": " << s.to_string();
  }
  // Under an MPI launcher, or a world of one, or WORLD_SIZE alone: not torchrun's world.
  LaunchEnv mpi =
      resolve_launch_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}));
  EXPECT_FALSE(launched_by_torchrun(mpi));
  EXPECT_OK(check_not_torchrun(mpi));
  EXPECT_FALSE(launched_by_torchrun(resolve_launch_env(env_of({{"WORLD_SIZE", "1"}, {"RANK", "0"}}))));
  EXPECT_FALSE(launched_by_torchrun(resolve_launch_env(env_of({{"WORLD_SIZE", "4"}}))));
}

TEST(LaunchEnv, TorchrunWithoutItsStoreVariablesNamesThem) {
  if (!ZOE_HAVE_GLOO) GTEST_SKIP() << "zoe built without gloo";
  LaunchEnv e = resolve_launch_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"LOCAL_RANK", "0"}}));
  unsetenv("MASTER_ADDR");
  auto r = create_torchrun_comm(e, 1.0);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("MASTER_ADDR or MASTER_PORT"), std::string::npos)
      << r.status().to_string();
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "70000", 1);
  r = create_torchrun_comm(e, 1.0);
  EXPECT_NE(r.status().message().find("MASTER_PORT=70000 is not a TCP port"), std::string::npos)
      << r.status().to_string();
  setenv("MASTER_PORT", "1", 1);  // nothing listens there: refused within the timeout, naming it
  r = create_torchrun_comm(e, 1.0);
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("127.0.0.1:1"), std::string::npos) << r.status().to_string();
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
}

}  // namespace
}  // namespace zoe::comm
