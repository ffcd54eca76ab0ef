// zoe::CheckpointReader (include/zoe/checkpoint.h) over ckpt::Reader: the manifest's parameters
// as a flat list, each read whole in fp32 from the master copy or, without one, the compute copy.
#include <utility>

#include "checkpoint/checkpoint.h"
#include "zoe/checkpoint.h"

namespace zoe {

struct CheckpointReader::Impl {
  std::unique_ptr<ckpt::Reader> reader;
  std::string kind;  // "master" when the checkpoint has masters, else "param"
  std::vector<CheckpointParam> params;
  std::vector<uint32_t> module_of;  // params[i]'s module index in the manifest
  std::vector<uint64_t> offset_of;  // params[i]'s first element in its module's flat group
};

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::open(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  ZOE_ASSIGN_OR_RETURN(impl->reader, ckpt::Reader::open(dir));
  impl->kind = impl->reader->has_kind("master") ? "master" : "param";
  const auto& modules = impl->reader->manifest().modules;
  for (size_t m = 0; m < modules.size(); ++m) {
    for (const auto& p : modules[m].params) {
      impl->params.push_back({modules[m].name, p.name, p.shape, p.numel});
      impl->module_of.push_back(static_cast<uint32_t>(m));
      impl->offset_of.push_back(p.offset);
    }
  }
  return std::unique_ptr<CheckpointReader>(new CheckpointReader(std::move(impl)));
}

const std::string& CheckpointReader::path() const { return impl_->reader->path(); }
int64_t CheckpointReader::step() const { return impl_->reader->manifest().step; }
int CheckpointReader::world_size() const { return impl_->reader->manifest().world_size; }
int CheckpointReader::stage() const { return impl_->reader->manifest().stage; }
std::string CheckpointReader::trainer_state_json() const { return impl_->reader->manifest().trainer.dump(); }
const std::vector<CheckpointParam>& CheckpointReader::params() const { return impl_->params; }

Status CheckpointReader::read_f32(size_t index, float* out) const {
  if (index >= impl_->params.size()) {
    return invalid_argument("checkpoint %s: parameter index %zu out of range (%zu parameters)",
                            path().c_str(), index, impl_->params.size());
  }
  const CheckpointParam& p = impl_->params[index];
  Status s = impl_->reader->read_range(impl_->module_of[index], impl_->kind, impl_->offset_of[index], p.numel,
                                       "f32", out);
  if (!s.is_ok()) return std::move(s).with_context("reading parameter " + p.full_name() + " of " + path());
  return Status::ok();
}

Status CheckpointReader::read_state_f32(size_t index, const std::string& kind, float* out) const {
  if (kind == "master") return read_f32(index, out);
  if (kind != "exp_avg" && kind != "exp_avg_sq") {
    return invalid_argument("checkpoint %s: state kind '%s' (expected master, exp_avg or exp_avg_sq)",
                            path().c_str(), kind.c_str());
  }
  if (index >= impl_->params.size()) {
    return invalid_argument("checkpoint %s: parameter index %zu out of range (%zu parameters)",
                            path().c_str(), index, impl_->params.size());
  }
  const CheckpointParam& p = impl_->params[index];
  if (!impl_->reader->has_kind(kind) || impl_->reader->manifest().modules[impl_->module_of[index]].frozen) {
    return not_found("checkpoint %s holds no %s (of %s)", path().c_str(), kind.c_str(),
                     p.full_name().c_str());
  }
  Status s =
      impl_->reader->read_range(impl_->module_of[index], kind, impl_->offset_of[index], p.numel, "f32", out);
  if (!s.is_ok())
    return std::move(s).with_context("reading " + kind + " of " + p.full_name() + " of " + path());
  return Status::ok();
}

Status CheckpointReader::verify() const { return impl_->reader->verify(); }

}  // namespace zoe
