// Tests of the cores a process may use: affinity and cgroup CPU quotas (v2 cpu.max, v1 quota and
// period), and that a process's own affinity mask is honoured.
#include <gtest/gtest.h>
#include <sched.h>

#include "core/cpu.h"

namespace zoe {
namespace {

TEST(CpuAllowance, TheLowerOfAffinityAndTheCgroupQuota) {
  // No limit: every online CPU.
  CpuAllowance a = cpu_allowance_from(64, 64, "max 100000");
  EXPECT_EQ(a.usable, 64);
  EXPECT_EQ(a.quota, 0.0);
  EXPECT_EQ(a.limited_by, "");
  // taskset -c 0,1 on a 64-CPU host.
  a = cpu_allowance_from(64, 2, "max 100000");
  EXPECT_EQ(a.usable, 2);
  EXPECT_EQ(a.limited_by, "affinity");
  // docker --cpus 1.5 (cgroup v2): two threads, not 64.
  a = cpu_allowance_from(64, 64, "150000 100000");
  EXPECT_DOUBLE_EQ(a.quota, 1.5);
  EXPECT_EQ(a.usable, 2);
  EXPECT_EQ(a.limited_by, "cgroup quota");
  // A quota of 4 cores under an affinity of 3 CPUs: 3.
  a = cpu_allowance_from(64, 3, "400000 100000");
  EXPECT_EQ(a.usable, 3);
  EXPECT_EQ(a.limited_by, "affinity");
  // cgroup v1: quota -1 is none; 50000/100000 is half a core, still one thread.
  a = cpu_allowance_from(8, 8, "", "-1", "100000");
  EXPECT_EQ(a.usable, 8);
  a = cpu_allowance_from(8, 8, "", "50000", "100000");
  EXPECT_EQ(a.usable, 1);
  EXPECT_DOUBLE_EQ(a.quota, 0.5);
  // Unreadable or malformed files: no quota; an unknown affinity: every online CPU.
  a = cpu_allowance_from(4, 0, "garbage");
  EXPECT_EQ(a.usable, 4);
  a = cpu_allowance_from(0, 0, "");
  EXPECT_EQ(a.usable, 1);
}

TEST(CpuAllowance, ThisProcessUsesNoMoreThanItsAffinity) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const CpuAllowance& a = cpu_allowance();
  EXPECT_EQ(a.affinity, CPU_COUNT(&set));
  EXPECT_GE(a.usable, 1);
  EXPECT_LE(a.usable, CPU_COUNT(&set));
  EXPECT_EQ(usable_cores(), a.usable);
}

}  // namespace
}  // namespace zoe
