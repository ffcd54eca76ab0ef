// Rank 0's scratch directory on every rank, for checkpoint tests under mpirun (every rank saves to
// and loads from one directory).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tests/util/status_test_util.h"
#include "tests/zero/shared_runtime.h"
#include "zero/engine_internal.h"

namespace zoe::test {

inline std::string rank0_dir(const std::string& mine) {
  Runtime& rt = shared_runtime();
  std::string dir = mine;
  int64_t len = static_cast<int64_t>(dir.size());
  EXPECT_OK(zero::runtime_comm(rt).broadcast(&len, 1, comm::CommType::kI64, 0).wait());
  dir.resize(static_cast<size_t>(len));
  EXPECT_OK(zero::runtime_comm(rt).broadcast(dir.data(), dir.size(), comm::CommType::kU8, 0).wait());
  return dir;
}

}  // namespace zoe::test
