// Helpers of `zoe train`'s run: host-memory and save-dir checks before anything is allocated,
// --dump-batches, and the summary's formatting.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "model/gpt_trainer.h"
#include "zoe/cli.h"
#include "zoe/zoe.h"

namespace zoe::cli {

// --dump-batches: one JSON object per line for each micro-batch trained on, in order, so that
// another framework can feed the same tokens (format in docs/train-json.md).
class BatchDump {
 public:
  // path "" writes nothing. Errors name the file.
  explicit BatchDump(const std::string& path) : path_(path) {
    if (path.empty()) return;
    f_ = fopen(path.c_str(), "w");
    if (!f_) fail(sys_error("create --dump-batches file", path, errno));
  }
  ~BatchDump() {
    if (f_) fclose(f_);
  }
  BatchDump(const BatchDump&) = delete;
  BatchDump& operator=(const BatchDump&) = delete;
  void write(int step, int rank, int micro, int batch, int T, const std::vector<int32_t>& tokens,
             const std::vector<int32_t>& targets) {
    if (!f_) return;
    fprintf(f_, "{\"step\":%d,\"rank\":%d,\"micro\":%d,\"batch\":%d,\"seq\":%d", step, rank, micro, batch, T);
    auto rows = [&](const char* key, const std::vector<int32_t>& v) {
      fprintf(f_, ",\"%s\":[", key);
      for (int b = 0; b < batch; ++b) {
        fputs(b ? ",[" : "[", f_);
        for (int t = 0; t < T; ++t) {
          fprintf(f_, t ? ",%d" : "%d", v[static_cast<size_t>(b) * static_cast<size_t>(T) + t]);
        }
        fputc(']', f_);
      }
      fputc(']', f_);
    };
    rows("tokens", tokens);
    rows("targets", targets);
    fputs("}\n", f_);
    if (ferror(f_)) fail(sys_error("write --dump-batches file", path_, errno));
  }
  void close() {
    if (!f_) return;
    const bool bad = ferror(f_) != 0;
    const int rc = fclose(f_);
    f_ = nullptr;
    if (bad || rc != 0) fail(sys_error("write --dump-batches file", path_, errno));
  }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

// Bytes as printable ASCII: control bytes other than a line break and bytes >= 0x7f as \xNN.
std::string escape_bytes(const std::string& s);
// Each line of text after `prefix`.
void print_indented(const std::string& text, const char* prefix);
// Refuses (exit 1) a run whose host allocations cannot fit, before making them.
void check_host_memory(const Config& cfg, const model::GptConfig& mc, int micro, int T);
// Refuses a run whose address-space limit (RLIMIT_AS, `ulimit -v`) leaves too little room for a
// step beside what the engine and the model have mapped: a GEMM buffer that cannot be mapped makes
// OpenBLAS retry forever. Call before step 0, with the model's CPU threads.
void check_address_space(int threads);
// Creates --save-dir and probes that it takes files (exit 1 naming it otherwise).
void prepare_save_dir(const std::string& dir);
double mean_over_ranks(Runtime& rt, double v);
std::string fmt_eta(double s);

}  // namespace zoe::cli
