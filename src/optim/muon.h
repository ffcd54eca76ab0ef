// Muon (MomentUm Orthogonalized by Newton-Schulz; Jordan et al. 2024, torch.optim.Muon) on the
// CPU, for the engine's update of offloaded shards (zero/updater_muon.cpp).
//
// THE UPDATE of one 2-D parameter W (rows x cols) with gradient G, as torch.optim.Muon (torch
// 2.9+, nesterov, adjust_lr_fn "original") and DeepSpeed's muon_update compute it:
//   buf = lerp(buf, G, 1 - mu)                   momentum (per element)
//   U   = nesterov ? lerp(G, buf, mu) : buf      (per element)
//   O   = NS(U) * sqrt(max(1, rows / cols))      Newton-Schulz on the WHOLE matrix
//   W   = W * (1 - lr*wd) - lr * O
// NS (torch's _zeropower_via_newtonschulz): X = U (transposed when rows > cols, so X has at most
// as many rows as columns), X /= max(|X|_F, eps); ns_steps times:
//   A = X X^T;  B = b*A + c*A A;  X = a*X + B X          (a, b, c) = (3.4445, -4.7750, 2.0315)
// then transposed back.
//
// The three phases are separate calls because the engine runs them at different places: the
// momentum on each rank's owned elements, NS on whole matrices (gathered from the ranks), the
// apply on the owned elements again.
//
// ARITHMETIC. torch runs NS in bf16 (its matmuls round every product matrix to bf16); zoe runs it
// in fp32 (OpenBLAS sgemm, in fixed 64-row pieces so the bits do not depend on the thread count).
// So zoe's O is closer to the exact NS than the reference's; tests/python/test_torch_muon.py
// shows the two references (bf16 and fp32 NS) differ by more than zoe differs from the fp32 one.
// The per-element phases run plain fp32 operations in a fixed order with no FMA (this unit is
// compiled with -ffp-contract=off): the same bits on every CPU path and for any chunking.
#pragma once

#include <cstddef>
#include <string>

#include "optim/adam.h"
#include "zoe/status.h"

namespace zoe::optim {

// Hyperparameters of the Muon group (DeepSpeed's optimizer.params names: muon_lr, momentum,
// weight_decay; the rest are torch.optim.Muon's defaults and not in a DeepSpeed config).
struct MuonParams {
  float lr = 0.02f;
  float momentum = 0.95f;
  float weight_decay = 0.0f;
  bool nesterov = true;
  int ns_steps = 5;
  float ns_eps = 1e-7f;
  float a = 3.4445f, b = -4.7750f, c = 2.0315f;
};

// Per element i < n: gs = g[i]*grad_scale; buf[i] = lerp(buf[i], gs, 1 - mu); u[i] = nesterov ?
// lerp(gs, buf[i], mu) : buf[i]. lerp(x, y, w) as torch computes it: x + w*(y - x) for w < 0.5,
// else y - (y - x)*(1 - w).
void muon_momentum(const float* g, float grad_scale, float* buf, float* u, size_t n, const MuonParams& p);

// out = NS(u) * sqrt(max(1, rows/cols)) for the row-major rows x cols matrix u (out may be u).
// Errors: rows or cols 0; ns_steps < 0. exec.pool spreads the matrix products over its threads.
Status newton_schulz(const float* u, size_t rows, size_t cols, const MuonParams& p, float* out,
                     const Exec& exec = {});

// Per element: p[i] = p[i]*(1 - lr*wd) - lr*o[i] (o already scaled by newton_schulz).
void muon_apply(float* param, const float* o, size_t n, const MuonParams& p);

// Whether Muon updates a parameter (DeepSpeed's use_muon): 2 or more dimensions, and a name (the
// full "<module>.<param>") that contains neither "embed" nor "lm_head"; the rest get an AdamW.
bool is_muon_matrix(const std::string& full_name, size_t dims);

// Floating-point operations of newton_schulz on a rows x cols matrix (for the plan's cost).
double newton_schulz_flops(size_t rows, size_t cols, int ns_steps);

}  // namespace zoe::optim
