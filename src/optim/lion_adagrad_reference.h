// The plain scalar references the Lion and Adagrad kernels are tested against (llm.c style).
//
// Written from the formulas of lion_adagrad.h for clarity, not speed: one element at a time, in
// the formulas' order, no FMA (-ffp-contract=off), constants from make_lion_constants() /
// make_adagrad_constants() like the kernels, conversions from core/dtype.h, stochastic
// rounding from ref::sr_hash (adam_reference.h).
#pragma once

#include "optim/lion_adagrad.h"

namespace zoe::optim::ref {

// Same contracts as optim::lion_step / optim::adagrad_step; single-threaded. Errors: the
// hyperparameter checks.
Status lion_step(const LionArgs& args);
Status adagrad_step(const AdagradArgs& args);

}  // namespace zoe::optim::ref
