// Training text for `zoe train`: a byte-level tokenizer (token = byte, vocabulary 256), text
// files, and a built-in synthetic corpus of additions ("4821+377=5198") generated from a seed,
// each split into a training part and a held-out part.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zoe/status.h"

namespace zoe::data {

struct Corpus {
  std::string name;            // the file path, or "arithmetic(seed=N)"
  std::vector<uint8_t> train;  // token ids (bytes)
  std::vector<uint8_t> eval;
  bool arithmetic = false;  // lines "a+b=c\n": exact-match accuracy applies
};

// The text of `path`; the last eval_fraction of it (at a line break when there is one) is held
// out. Errors: a missing or unreadable file (named), one too short for a window of `min_tokens`
// tokens in both parts, or one holding more than max_bytes (checked before reading a regular
// file; a device or pipe such as /dev/zero is read no further than that). The corpus takes about
// twice the file's size while it loads.
Result<Corpus> load_text_file(const std::string& path, size_t min_tokens, double eval_fraction = 0.05,
                              size_t max_bytes = size_t{1} << 30);

// Of the words in `text` (runs of two or more ASCII letters, compared without case), the fraction
// that also occur as words in `corpus`: how much of a generated sample is the corpus's vocabulary
// rather than noise. 0 when text has no word; *words (when given) receives how many it has.
double known_word_fraction(const std::string& text, const std::vector<uint8_t>& corpus,
                           size_t* words = nullptr);

// `lines` additions of numbers below 10^digits, generated from seed; the eval part uses
// different random problems (its own stream), not a suffix of the same ones.
Corpus make_arithmetic(uint64_t seed, size_t lines, int digits = 3, size_t eval_lines = 256);

// batch windows of T + 1 tokens: tokens = window[0..T), targets = window[1..T+1). The windows'
// starting points depend only on (seed, step, rank, micro): runs are reproducible and the same
// whatever the placement of the model's states.
void sample_batch(const std::vector<uint8_t>& data, int batch, int T, uint64_t seed, uint64_t step, int rank,
                  int micro, std::vector<int32_t>* tokens, std::vector<int32_t>* targets);

// Evaluation windows for arithmetic: each starts at a line start. answer_mask[i] is 1 where
// targets[i] is a character of an answer (after '=' up to and including '\n') whose whole line
// lies inside the window; line_id[i] numbers those lines (-1 elsewhere).
void arithmetic_eval_batch(const std::vector<uint8_t>& data, int batch, int T, size_t first_window,
                           std::vector<int32_t>* tokens, std::vector<int32_t>* targets,
                           std::vector<int32_t>* line_id);

}  // namespace zoe::data
