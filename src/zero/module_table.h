// The engine's module table: each module's parameters and the flat layout the placement gave it,
// addressed by a ModuleId. The table holds no state that changes during training; each part of
// the engine keeps its own per-module state (engine_impl.h lists them).
//
// A module's index is a ModuleId of its own type; the tier manager's item of its stage-3
// partition is ParamHomes' business, and the optimizer swapper's group of its NVMe states the
// Updater's (each maps a ModuleId to its own id privately).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "offload/tier.h"
#include "zoe/tensor.h"

namespace zoe::zero {

// A module's index in the table (forward order of add_module).
struct ModuleId {
  size_t index = 0;
  constexpr explicit ModuleId(size_t i) : index(i) {}
  friend constexpr bool operator==(ModuleId a, ModuleId b) { return a.index == b.index; }
  friend constexpr bool operator!=(ModuleId a, ModuleId b) { return a.index != b.index; }
};

struct ModuleLayout {
  std::string name;
  std::vector<ParamSpec> specs;
  std::vector<size_t> numel, offset;
  size_t total = 0, padded = 0, part = 0;  // from the placement
  bool partitioned_params = false;         // stage 3 and not persistent
  size_t opt_begin = 0, opt_n = 0;         // the flat range this rank's optimizer owns
  // Where this module's optimizer states and accumulated gradients live (the Updater's).
  offload::Tier opt_home = offload::Tier::kDevice;
  // Where its stage-3 partition lives between uses (partitioned_params only; ParamHomes').
  offload::Tier param_home = offload::Tier::kDevice;
  // Registered frozen (ModuleOptions::frozen): compute parameters only. No optimizer states, no
  // gradient buffer or accumulator; opt_begin/opt_n still name this rank's share (what it
  // checkpoints), and opt_home means nothing.
  bool frozen = false;
  bool held = false;  // ModuleOptions::held: the placement keeps room for it beside the others
};

class ModuleTable {
 public:
  size_t size() const { return mods_.size(); }
  bool empty() const { return mods_.empty(); }
  bool valid(size_t index) const { return index < mods_.size(); }
  ModuleLayout& operator[](ModuleId m) { return mods_[m.index]; }
  const ModuleLayout& operator[](ModuleId m) const { return mods_[m.index]; }
  void add(ModuleLayout mod) { mods_.push_back(std::move(mod)); }
  const std::vector<ModuleLayout>& all() const { return mods_; }
  std::vector<ModuleLayout>& all() { return mods_; }

  // for (ModuleId m : table.ids()): every module in forward order.
  struct Iter {
    size_t i;
    ModuleId operator*() const { return ModuleId(i); }
    Iter& operator++() {
      ++i;
      return *this;
    }
    bool operator!=(const Iter& o) const { return i != o.i; }
  };
  struct Range {
    size_t n;
    Iter begin() const { return {0}; }
    Iter end() const { return {n}; }
  };
  Range ids() const { return {mods_.size()}; }

 private:
  std::vector<ModuleLayout> mods_;
};

}  // namespace zoe::zero
