// Corpus loading, the arithmetic generator, and deterministic batch sampling.
#include "model/corpus.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "core/units.h"
#include "zoe/files.h"

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

namespace {

// Appends the bytes of the regular file `path` to *all; fails past max_bytes in all. A FIFO, a
// device or a socket is refused without blocking (zoe/files.h's open_input_file).
Status append_file(const std::string& path, size_t max_bytes, std::vector<uint8_t>* all) {
  ZOE_ASSIGN_OR_RETURN(int fd, open_input_file(path, "data file"));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) return sys_error("stat data file", path, errno);
  // size: "" when unknown (a device or pipe read past the cap).
  auto too_big = [&](const std::string& size) {
    return invalid_argument("data file %s holds %s%smore than the %zu bytes (%s) zoe loads", path.c_str(),
                            size.c_str(), size.empty() ? "" : ": ", max_bytes,
                            format_bytes(max_bytes).c_str());
  };
  if (S_ISREG(st.st_mode)) {
    const auto size = static_cast<uint64_t>(st.st_size);
    if (all->size() + size > max_bytes) {
      return too_big(all->empty() ? std::to_string(size) + " bytes (" + format_bytes(size) + ")"
                                  : "with the files before it ");
    }
    all->reserve(all->size() + size);
  }
  std::vector<uint8_t> buf(1 << 20);
  for (;;) {
    ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("read data file", path, all->size(), buf.size(), errno);
    }
    if (n == 0) break;
    if (all->size() + static_cast<size_t>(n) > max_bytes) return too_big("");
    all->insert(all->end(), buf.begin(), buf.begin() + n);
  }
  return Status::ok();
}

// The regular files directly in `dir` (not hidden, not symbolic links: a link to a sibling would
// repeat it), sorted by name.
Result<std::vector<std::string>> text_files_in(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) return sys_error("list data directory", dir, errno);
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string p = dir + "/" + e->d_name;
    struct stat st {};
    if (lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) names.push_back(p);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  if (names.empty()) return invalid_argument("data directory %s holds no regular file", dir.c_str());
  return names;
}

}  // namespace

Result<Corpus> load_text_file(const std::string& path, size_t min_tokens, double eval_fraction,
                              size_t max_bytes) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return not_found("data file %s does not exist", path.c_str());
    return sys_error("stat data file", path, errno);
  }
  std::vector<uint8_t> all;
  Corpus c;
  c.name = path;
  if (S_ISDIR(st.st_mode)) {
    ZOE_ASSIGN_OR_RETURN(std::vector<std::string> files, text_files_in(path));
    for (const std::string& f : files) {
      if (!all.empty() && all.back() != '\n') all.push_back('\n');
      ZOE_RETURN_IF_ERROR(append_file(f, max_bytes, &all));
    }
    c.name = path + " (" + std::to_string(files.size()) + " files)";
  } else {
    ZOE_RETURN_IF_ERROR(append_file(path, max_bytes, &all));
  }
  size_t cut = static_cast<size_t>(static_cast<double>(all.size()) * (1.0 - eval_fraction));
  while (cut < all.size() && cut > 0 && all[cut - 1] != '\n' && all.size() - cut > min_tokens + 1) ++cut;
  c.train.assign(all.begin(), all.begin() + static_cast<ptrdiff_t>(cut));
  c.eval.assign(all.begin() + static_cast<ptrdiff_t>(cut), all.end());
  if (c.train.size() < min_tokens + 1 || c.eval.size() < min_tokens + 1) {
    return invalid_argument(
        "data %s has %zu bytes: too short for windows of %zu tokens in both the training part "
        "and the held-out %.0f%% (need at least %zu bytes)",
        path.c_str(), all.size(), min_tokens + 1, eval_fraction * 100,
        static_cast<size_t>(static_cast<double>(min_tokens + 1) /
                            std::min(eval_fraction, 1 - eval_fraction)) +
            1);
  }
  return c;
}

namespace {

template <typename It, typename F>
void for_each_word(It begin, It end, F&& f) {
  std::string w;
  auto flush = [&] {
    if (w.size() >= 2) f(w);
    w.clear();
  };
  for (It it = begin; it != end; ++it) {
    const auto ch = static_cast<unsigned char>(*it);
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) {
      w.push_back(static_cast<char>(ch | 0x20));
    } else {
      flush();
    }
  }
  flush();
}

}  // namespace

double known_word_fraction(const std::string& text, const std::vector<uint8_t>& corpus, size_t* words) {
  std::unordered_set<std::string> vocab;
  for_each_word(corpus.begin(), corpus.end(), [&](const std::string& w) { vocab.insert(w); });
  size_t total = 0, known = 0;
  for_each_word(text.begin(), text.end(), [&](const std::string& w) {
    ++total;
    known += vocab.count(w);
  });
  if (words) *words = total;
  return total ? static_cast<double>(known) / static_cast<double>(total) : 0.0;
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
