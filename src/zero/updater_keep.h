// The states of a chunk's untouched parameters (no rank gave them a gradient this step), kept across
// the update's kernel and put back (Updater's ChunkUpdater, updater.cpp): per range the master and
// the per-element states, and for packed states (int8/int4 blocks, optim/lowbit.h) the whole blocks
// the ranges touch (updater_keep.cpp).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "optim/lowbit.h"
#include "zoe/status.h"

namespace zoe::zero {

struct UntouchedKeep {
  std::vector<std::pair<size_t, size_t>> ranges;  // elements
  std::vector<std::pair<size_t, size_t>> blocks;  // packed states: the blocks they touch
  std::vector<char> saved;                        // per range: master, states; then the blocks' m, v
  std::vector<char> conv;                         // the kept masters in the compute dtype
};

// Appends to k->saved the packed blocks of ea (and eas, when not null) that k->ranges touch, over a
// chunk of n elements in format f, and lists them in k->blocks.
void keep_packed_blocks(optim::StateFormat f, size_t n, const void* ea, const void* eas, UntouchedKeep* k);

// Puts the kept blocks back from `at` (where keep_packed_blocks' bytes start in k.saved): a block
// wholly untouched as it was; one shared with updated elements merged value by value (kinds[s]: the
// map of state s) and encoded again with its new scale.
Status restore_packed_blocks(optim::StateFormat f, const optim::StateKind kinds[2], size_t n, void* ea,
                             void* eas, const char* at, const UntouchedKeep& k);

}  // namespace zoe::zero
