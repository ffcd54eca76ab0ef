// Corpus loading, the arithmetic generator, and deterministic batch sampling.
#include "data/corpus.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "core/units.h"

namespace zoe::data {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void append_problems(std::vector<uint8_t>* out, uint64_t seed, size_t lines, int digits) {
  uint64_t mod = 1;
  for (int i = 0; i < digits; ++i) mod *= 10;
  char buf[64];
  for (size_t i = 0; i < lines; ++i) {
    uint64_t a = mix(seed * 2 + i * 7919) % mod, b = mix(seed * 2 + 1 + i * 104729) % mod;
    int n = snprintf(buf, sizeof(buf), "%llu+%llu=%llu\n", static_cast<unsigned long long>(a),
                     static_cast<unsigned long long>(b), static_cast<unsigned long long>(a + b));
    out->insert(out->end(), buf, buf + n);
  }
}

}  // namespace

Result<Corpus> load_text_file(const std::string& path, size_t min_tokens, double eval_fraction,
                              size_t max_bytes) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found("data file %s does not exist", path.c_str());
    return sys_error("open data file", path, errno);
  }
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) return sys_error("stat data file", path, errno);
  if (S_ISDIR(st.st_mode)) return invalid_argument("data file %s is a directory", path.c_str());
  // size: "" when unknown (a device or pipe read past the cap).
  auto too_big = [&](const std::string& size) {
    return invalid_argument("data file %s holds %s%smore than the %zu bytes (%s) zoe loads", path.c_str(),
                            size.c_str(), size.empty() ? "" : ": ", max_bytes,
                            format_bytes(max_bytes).c_str());
  };
  std::vector<uint8_t> all;
  if (S_ISREG(st.st_mode)) {
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size > max_bytes) return too_big(std::to_string(size) + " bytes (" + format_bytes(size) + ")");
    all.reserve(size);
  }
  // Devices and pipes have no size: read at most one chunk past the cap.
  std::vector<uint8_t> buf(1 << 20);
  for (;;) {
    ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("read data file", path, all.size(), buf.size(), errno);
    }
    if (n == 0) break;
    if (all.size() + static_cast<size_t>(n) > max_bytes) return too_big("");
    all.insert(all.end(), buf.begin(), buf.begin() + n);
  }
  size_t cut = static_cast<size_t>(static_cast<double>(all.size()) * (1.0 - eval_fraction));
  while (cut < all.size() && cut > 0 && all[cut - 1] != '\n' && all.size() - cut > min_tokens + 1) ++cut;
  Corpus c;
  c.name = path;
  c.train.assign(all.begin(), all.begin() + static_cast<ptrdiff_t>(cut));
  c.eval.assign(all.begin() + static_cast<ptrdiff_t>(cut), all.end());
  if (c.train.size() < min_tokens + 1 || c.eval.size() < min_tokens + 1) {
    return invalid_argument(
        "data file %s has %zu bytes: too short for windows of %zu tokens in both the training part "
        "and the held-out %.0f%% (need at least %zu bytes)",
        path.c_str(), all.size(), min_tokens + 1, eval_fraction * 100,
        static_cast<size_t>(static_cast<double>(min_tokens + 1) /
                            std::min(eval_fraction, 1 - eval_fraction)) +
            1);
  }
  return c;
}

Corpus make_arithmetic(uint64_t seed, size_t lines, int digits, size_t eval_lines) {
  Corpus c;
  // The default (3 digits) keeps its historical name.
  c.name = (digits == 3 ? std::string("arithmetic") : "arithmetic-" + std::to_string(digits) + "digit") +
           "(seed=" + std::to_string(seed) + ")";
  c.arithmetic = true;
  append_problems(&c.train, seed, lines, digits);
  append_problems(&c.eval, mix(seed ^ 0xe7a1ull), eval_lines, digits);
  return c;
}

void sample_batch(const std::vector<uint8_t>& data, int batch, int T, uint64_t seed, uint64_t step, int rank,
                  int micro, std::vector<int32_t>* tokens, std::vector<int32_t>* targets) {
  tokens->resize(static_cast<size_t>(batch * T));
  targets->resize(static_cast<size_t>(batch * T));
  const size_t span = data.size() - static_cast<size_t>(T) - 1;
  for (int b = 0; b < batch; ++b) {
    uint64_t h = mix(seed ^ mix(step * 1000003 + static_cast<uint64_t>(rank) * 10007 +
                                static_cast<uint64_t>(micro) * 101 + static_cast<uint64_t>(b)));
    size_t start = static_cast<size_t>(h % (span + 1));
    for (int t = 0; t < T; ++t) {
      (*tokens)[static_cast<size_t>(b * T + t)] = data[start + static_cast<size_t>(t)];
      (*targets)[static_cast<size_t>(b * T + t)] = data[start + static_cast<size_t>(t) + 1];
    }
  }
}

void arithmetic_eval_batch(const std::vector<uint8_t>& data, int batch, int T, size_t first_window,
                           std::vector<int32_t>* tokens, std::vector<int32_t>* targets,
                           std::vector<int32_t>* line_id) {
  std::vector<size_t> starts{0};
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    if (data[i] == '\n') starts.push_back(i + 1);
  }
  tokens->assign(static_cast<size_t>(batch * T), '\n');
  targets->assign(static_cast<size_t>(batch * T), -1);
  line_id->assign(static_cast<size_t>(batch * T), -1);
  int next_line = 0;
  for (int b = 0; b < batch; ++b) {
    // Window b starts at the line (first_window + b * 4) of the held-out problems, wrapping.
    size_t start = starts[(first_window + static_cast<size_t>(b) * 4) % starts.size()];
    for (int t = 0; t < T && start + static_cast<size_t>(t) + 1 < data.size(); ++t) {
      (*tokens)[static_cast<size_t>(b * T + t)] = data[start + static_cast<size_t>(t)];
      (*targets)[static_cast<size_t>(b * T + t)] = data[start + static_cast<size_t>(t) + 1];
    }
    // Mark the answer characters of every line that ends inside the window: positions from
    // the '=' up to the one before the '\n' predict the digits of the sum and the '\n'.
    auto at = [&](int t) { return data[start + static_cast<size_t>(t)]; };
    const int limit = static_cast<int>(std::min<size_t>(static_cast<size_t>(T), data.size() - start - 1));
    for (int t = 0; t < limit; ++t) {
      if (at(t) != '=') continue;
      int u = t;
      while (u < limit && at(u) != '\n') ++u;
      if (u < limit && u > t) {
        for (int k = t; k < u; ++k) (*line_id)[static_cast<size_t>(b * T + k)] = next_line;
        ++next_line;
      }
      t = u;
    }
  }
}

}  // namespace zoe::data
