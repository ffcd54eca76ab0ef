// Which update the engine runs (the config's optimizer.type) and what states it keeps per element
// beside the master: AdamW m and v (adam.h, lowbit.h), Lion m, Adagrad the sum of g^2
// (lion_adagrad.h), Muon its momentum and, for the parameters its auxiliary AdamW updates, v
// (muon.h: the same two states as AdamW; the matrices' v is unused), Adam-mini m (adam_mini.h: its
// v is one float a block, kept beside the states). "Adam" and "AdamW" are one
// kind: the same states, the decay decided by AdamParams::adamw.
#pragma once

#include <cstdint>
#include <string>

#include "zoe/status.h"

namespace zoe::optim {

enum class OptimizerKind : uint8_t { kAdamW = 0, kLion = 1, kAdagrad = 2, kMuon = 3, kAdamMini = 4 };

// States per element beside the master: AdamW 2 (m, v), Lion 1 (m), Adagrad 1 (the sum), Muon 2
// (its momentum or the auxiliary AdamW's m, and that AdamW's v), Adam-mini 1 (m).
constexpr int optimizer_state_count(OptimizerKind k) {
  return k == OptimizerKind::kAdamW || k == OptimizerKind::kMuon ? 2 : 1;
}

// The config's spelling of the kind: "AdamW", "Lion", "Adagrad", "Muon".
constexpr const char* optimizer_kind_name(OptimizerKind k) {
  return k == OptimizerKind::kLion       ? "Lion"
         : k == OptimizerKind::kAdagrad  ? "Adagrad"
         : k == OptimizerKind::kMuon     ? "Muon"
         : k == OptimizerKind::kAdamMini ? "AdamMini"
                                         : "AdamW";
}

// The checkpoint's name of state i (0-based, < optimizer_state_count): AdamW "exp_avg",
// "exp_avg_sq"; Lion "exp_avg" (lion-pytorch's name of its m); Adagrad "sum" (torch's); Muon
// "exp_avg" (torch.optim.Muon's momentum_buffer for its matrices) and "exp_avg_sq".
constexpr const char* optimizer_state_name(OptimizerKind k, int i) {
  return k == OptimizerKind::kAdagrad ? "sum" : i == 0 ? "exp_avg" : "exp_avg_sq";
}

// The kind of an optimizer.type as the config stores it ("Adam", "AdamW", "Lion", "Adagrad",
// "Muon", "AdamMini"; any case). Error: any other type.
inline Result<OptimizerKind> parse_optimizer_kind(std::string type) {
  for (char& c : type) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (type == "adam" || type == "adamw") return OptimizerKind::kAdamW;
  if (type == "lion") return OptimizerKind::kLion;
  if (type == "adagrad") return OptimizerKind::kAdagrad;
  if (type == "muon") return OptimizerKind::kMuon;
  if (type == "adammini") return OptimizerKind::kAdamMini;
  return invalid_argument(
      "optimizer.type \"%s\": zoe runs \"Adam\", \"AdamW\", \"Lion\", \"Adagrad\", \"Muon\" and \"AdamMini\"",
      type.c_str());
}

}  // namespace zoe::optim
