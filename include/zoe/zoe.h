// zoe's public C++ API, all of it: #include <zoe/zoe.h> and link zoe::zoe (find_package(zoe)).
//   zoe/status.h      Status and Result<T>: how every expected failure travels
//   zoe/dtype.h       ComputeDType and the fp32 <-> bf16/fp16 conversions
//   zoe/config.h      Config (DeepSpeed-compatible JSON, or Config::Builder; any key by its path)
//   zoe/runtime.h     Runtime: ranks (MPI under mpirun) and host collectives
//   zoe/engine.h      Engine: modules, fetch/gather, grads, step, checkpoints, stats
//   zoe/checkpoint.h  CheckpointReader: a saved checkpoint's parameters and trainer state
// Nothing here includes a header from zoe's sources; the headers need C++17.
#pragma once

#include "zoe/activations.h"
#include "zoe/checkpoint.h"
#include "zoe/config.h"
#include "zoe/dtype.h"
#include "zoe/engine.h"
#include "zoe/random.h"
#include "zoe/runtime.h"
#include "zoe/status.h"

namespace zoe {
// The library's version (the project version in CMakeLists.txt).
inline constexpr int kVersionMajor = 0, kVersionMinor = 1, kVersionPatch = 0;
}  // namespace zoe
