// The process's runtime for engine tests: one per process (MPI is initialised once), created on
// first use, from MPI under mpirun and local otherwise. Aborts when it cannot be created.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "zoe/runtime.h"

namespace zoe::test {

inline Runtime& shared_runtime() {
  static std::unique_ptr<Runtime> rt = [] {
    auto r = Runtime::init();
    if (!r.is_ok()) {
      fprintf(stderr, "runtime: %s\n", r.status().to_string().c_str());
      abort();
    }
    return std::move(r).value();
  }();
  return *rt;
}

}  // namespace zoe::test
