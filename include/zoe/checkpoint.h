// zoe::CheckpointReader: the parameters and trainer state of a checkpoint Engine::save() wrote,
// read without an Engine (for consolidation into another framework's format, inspection, tests):
//
//   auto r = zoe::CheckpointReader::open("ckpt").value();   // a save directory (its latest) or
//   for (size_t i = 0; i < r->params().size(); ++i) {        // one checkpoint directory
//     const auto& p = r->params()[i];                        // "<module>.<param>", its shape
//     std::vector<float> v(p.numel);
//     r->read_f32(i, v.data());                              // the full, unpartitioned values
//   }
//
// Contracts
//   Validity: open() checks the manifest (its checksum, its JSON, every record's consistency) and
//     that every rank file is there with its size; read_f32() reads the bytes the manifest points
//     at (verify() re-reads every byte and compares the checksums). Errors name the file: a
//     corrupt `latest`, manifest or rank file, a truncated file, a missing one.
//   World size: a checkpoint saved by any number of ranks reads whole here (the reader assembles
//     each parameter from whichever rank files hold its pieces).
//   Values: read_f32() gives the fp32 master copy when the checkpoint has one (mixed precision,
//     an optimizer that keeps masters), else the compute copy converted to fp32.
//   Thread-safety: every const method may be called from several threads at once (reads are
//     pread(2) on shared descriptors, no shared buffers). The files stay open until destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zoe/status.h"

namespace zoe {

// One parameter as the checkpoint records it.
struct CheckpointParam {
  std::string module;  // the module's name, as given to Engine::add_module
  std::string name;    // the parameter's name within its module
  std::vector<int64_t> shape;
  uint64_t numel = 0;  // the product of shape

  // "<module>.<param>": the name `zoe train` and the Python front-end's consolidate() use.
  std::string full_name() const { return module + "." + name; }
};

class CheckpointReader {
 public:
  // dir: a save directory (the checkpoint its `latest` names) or one checkpoint directory.
  static Result<std::unique_ptr<CheckpointReader>> open(const std::string& dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const;  // the checkpoint directory opened
  int64_t step() const;             // optimizer steps taken when it was saved
  int world_size() const;           // ranks that saved it
  int stage() const;                // their ZeRO stage
  // The trainer state passed to Engine::save(), as JSON text (an object).
  std::string trainer_state_json() const;

  // Every parameter, module by module in registration order, each module's in its order.
  const std::vector<CheckpointParam>& params() const;
  // The full fp32 values of params()[index] (numel floats into out). kInvalidArgument for an
  // index out of range; I/O and corruption errors name the file and the parameter.
  Status read_f32(size_t index, float* out) const;
  // The optimizer's state `kind` of params()[index] in fp32: "master" (as read_f32 reads it, the
  // compute copy where there is no master), "exp_avg" or "exp_avg_sq" (Adam's m and v, dequantized
  // when stored packed). kNotFound naming the kind when the checkpoint holds none (a frozen module,
  // a checkpoint without moments).
  Status read_state_f32(size_t index, const std::string& kind, float* out) const;
  // Re-reads every file and compares its xxh64 and each tensor's with the manifest.
  Status verify() const;

  struct Impl;  // internal (src/checkpoint/public_reader.cpp)

 private:
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zoe
