// The engine's module table: each module's parameters and the flat layout the placement gave it,
// addressed by a ModuleId. The table holds no state that changes during training; each part of
// the engine keeps its own per-module state (engine_impl.h lists them).
//
// Three integers used to be one: a module's index, the tier manager's item id of its stage-3
// partition and the optimizer swapper's group id of its NVMe states. They are distinct types
// now, and the mapping between them is the two named functions below, so a mix-up does not
// compile.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "config/config.h"
#include "offload/optimizer_swapper.h"
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

// The tier manager's item holding module m's stage-3 partition.
inline offload::ItemId tier_item(ModuleId m) { return offload::ItemId(m.index); }
// The optimizer swapper's group holding module m's NVMe-resident optimizer states.
inline offload::GroupId swap_group(ModuleId m) { return offload::GroupId(m.index); }
// The module of a swapper group (the swapper hands chunks by group).
inline ModuleId module_of(offload::GroupId g) { return ModuleId(static_cast<size_t>(g.value)); }

// Swapper state indices of an NVMe-offloaded module.
inline constexpr size_t kMasterState = 0, kAvgState = 1, kAvgSqState = 2, kGradState = 3;

struct ModuleLayout {
  std::string name;
  std::vector<ParamSpec> specs;
  std::vector<size_t> numel, offset;
  size_t total = 0, padded = 0, part = 0;  // from the placement
  bool partitioned_params = false;         // stage 3 and not persistent
  size_t opt_begin = 0, opt_n = 0;         // the flat range this rank's optimizer owns
  // Where this module's optimizer states and accumulated gradients live: the device (kNone),
  // host RAM (kCpu) or NVMe (kNvme, as swapper group swap_group(m)).
  config::OffloadDevice opt_home = config::OffloadDevice::kNone;
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
