// The ordered host reduction every host collective uses: element-wise over rows in row (rank) order.
//
//   out[i] = op(...op(op(rows[0][i], rows[1][i]), rows[2][i])..., rows[n-1][i])
//
// Sums of fp32 add in fp32 in that order; bf16/fp16 are widened to fp32 (exact), summed in fp32 in
// that order and rounded once to nearest even; fp64 in fp64; u8 and i64 wrap around (two's
// complement). Max is exact for every type; a NaN anywhere gives NaN (the first one in row order,
// quieted for bf16/fp16); between +0 and -0 the earlier row wins. So the result depends only on the
// inputs and their order, never on timing: a multi-rank MpiComm reduction equals this function run
// on all ranks' inputs in one process.
#pragma once

#include <cstddef>

#include "comm/communicator.h"

namespace zoe::comm {

// `out` may be one of the rows (each element is read from every row before it is written).
void reduce_rows(const void* const* rows, int nrows, size_t count, void* out, CommType type, ReduceOp op);

}  // namespace zoe::comm
