// Helpers of `zoe train`'s run: host-memory and save-dir checks before anything is allocated,
// --dump-batches, and the summary's formatting.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt_trainer.h"
#include "zoe/cli.h"
#include "zoe/files.h"
#include "zoe/zoe.h"

namespace zoe::cli {

// --dump-batches: one JSON object per line for each micro-batch trained on, in order, so that
// another framework can feed the same tokens (format in docs/train-json.md). Written through
// zoe/files.h's OutputFile: the file appears at close(), whole; a run that fails leaves no file
// (and whatever was at the path before).
class BatchDump {
 public:
  // path "" writes nothing. Errors name the flag and the file.
  explicit BatchDump(const std::string& path) {
    if (!path.empty()) out_.emplace(value_or_fail(OutputFile::create(path, "--dump-batches")));
  }
  void write(int step, int rank, int micro, int batch, int T, const std::vector<int32_t>& tokens,
             const std::vector<int32_t>& targets) {
    if (!out_) return;
    buf_ += fmt("{\"step\":%d,\"rank\":%d,\"micro\":%d,\"batch\":%d,\"seq\":%d", step, rank, micro, batch, T);
    auto rows = [&](const char* key, const std::vector<int32_t>& v) {
      buf_ += fmt(",\"%s\":[", key);
      for (int b = 0; b < batch; ++b) {
        buf_ += b ? ",[" : "[";
        for (int t = 0; t < T; ++t) {
          buf_ += fmt(t ? ",%d" : "%d", v[static_cast<size_t>(b) * static_cast<size_t>(T) + t]);
        }
        buf_ += ']';
      }
      buf_ += ']';
    };
    rows("tokens", tokens);
    rows("targets", targets);
    buf_ += "}\n";
    if (buf_.size() >= (1u << 20)) flush();
  }
  void close() {
    if (!out_) return;
    flush();
    Status s = out_->commit();
    out_.reset();
    if (!s.is_ok()) fail(s);
  }

 private:
  void flush() {
    Status s = out_->write(buf_);
    buf_.clear();
    if (!s.is_ok()) fail(s);
  }
  std::optional<OutputFile> out_;
  std::string buf_;
};

// Bytes as printable ASCII: control bytes other than a line break and bytes >= 0x7f as \xNN.
std::string escape_bytes(const std::string& s);
// Each line of text after `prefix`.
void print_indented(const std::string& text, const char* prefix);
// Refuses (exit 1) a run whose host allocations cannot fit, before making them. With activation
// checkpointing (ckpt), the model's workspace and the checkpoints kept in memory (all of them but
// those the activation store may put on NVMe beyond its host budget).
void check_host_memory(const Config& cfg, const model::GptConfig& mc, int micro, int T, bool ckpt);
// Refuses a run whose address-space limit (RLIMIT_AS, `ulimit -v`) leaves too little room for a
// step beside what the engine and the model have mapped: a GEMM buffer that cannot be mapped makes
// OpenBLAS retry forever. Call before step 0, with the model's CPU threads.
void check_address_space(int threads);
// Creates --save-dir and probes that it takes files (exit 1 naming it otherwise).
void prepare_save_dir(const std::string& dir);
double mean_over_ranks(Runtime& rt, double v);
std::string fmt_eta(double s);

}  // namespace zoe::cli
