// zoe::Runtime from the communication layer alone (this suite links zoe_comm, not the engine): a
// local runtime is rank 0 of a world of one, its host collectives leave values as they are, a
// broadcast from a rank that does not exist is refused naming the root, and RuntimeAccess reaches
// its communicator.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "comm/runtime_impl.h"
#include "tests/util/status_test_util.h"
#include "zoe/runtime.h"

namespace zoe {
namespace {

TEST(Runtime, LocalIsRankZeroOfOne) {
  auto rt = Runtime::init(/*force_local=*/true);
  ASSERT_OK(rt);
  EXPECT_EQ(rt.value()->rank(), 0);
  EXPECT_EQ(rt.value()->world_size(), 1);
  EXPECT_EQ(rt.value()->local_rank(), 0);
  EXPECT_EQ(RuntimeAccess::comm(*rt.value()).size(), 1);
}

TEST(Runtime, HostCollectivesOfOneRank) {
  auto rt = Runtime::init(/*force_local=*/true);
  ASSERT_OK(rt);
  Runtime& r = *rt.value();
  auto avg = r.average(3.5);
  ASSERT_OK(avg);
  EXPECT_EQ(avg.value(), 3.5);
  std::vector<double> v = {1.0, -2.0, 4.5};
  ASSERT_OK(r.sum(&v));
  EXPECT_EQ(v, (std::vector<double>{1.0, -2.0, 4.5}));
  int x = 7;
  ASSERT_OK(r.broadcast(&x, sizeof(x), 0));
  EXPECT_EQ(x, 7);
  ASSERT_OK(r.barrier());
}

TEST(Runtime, BroadcastFromNoRankNamesTheRoot) {
  auto rt = Runtime::init(/*force_local=*/true);
  ASSERT_OK(rt);
  int x = 0;
  Status s = rt.value()->broadcast(&x, sizeof(x), 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("root 1 is not a rank (world size 1)"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace zoe
