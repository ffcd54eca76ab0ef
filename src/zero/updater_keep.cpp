// Keeping the untouched parameters' packed blocks across an update: see updater_keep.h.
#include "zero/updater_keep.h"

#include <algorithm>
#include <cstring>

namespace zoe::zero {

void keep_packed_blocks(optim::StateFormat f, size_t n, const void* ea, const void* eas, UntouchedKeep* k) {
  const size_t B = optim::state_block_elems(f), bb = optim::state_block_bytes(f);
  for (const auto& [b, e] : k->ranges) {
    const size_t fb = b / B, lb = (e + B - 1) / B;
    if (!k->blocks.empty() && k->blocks.back().second >= fb) {
      k->blocks.back().second = std::max(k->blocks.back().second, lb);
    } else {
      k->blocks.emplace_back(fb, lb);
    }
  }
  for (const auto& [fb, lb] : k->blocks) {
    const size_t bytes = optim::state_bytes(f, std::min(lb * B, n)) - fb * bb;  // a partial last block
    for (const void* s : {ea, eas}) {
      if (!s) continue;  // one state (Lion, Adagrad, Adam-mini)
      const char* src = static_cast<const char*>(s) + fb * bb;
      k->saved.insert(k->saved.end(), src, src + bytes);
    }
  }
}

Status restore_packed_blocks(optim::StateFormat f, const optim::StateKind kinds[2], size_t n, void* ea,
                             void* eas, const char* at, const UntouchedKeep& k) {
  const size_t B = optim::state_block_elems(f), bb = optim::state_block_bytes(f);
  std::vector<float> old_v(B), new_v(B);
  std::vector<uint8_t> mask(B);
  size_t r = 0;  // the first range that may meet the block
  for (const auto& [fb, lb] : k.blocks) {
    for (int s = 0; s < (eas ? 2 : 1); ++s) {
      void* state = s == 0 ? ea : eas;
      const optim::StateKind kind = kinds[s];
      for (size_t blk = fb; blk < lb; ++blk) {
        const size_t lo = blk * B, len = std::min(B, n - lo);
        std::fill(mask.begin(), mask.end(), uint8_t{0});
        for (size_t q = r; q < k.ranges.size() && k.ranges[q].first < lo + len; ++q) {
          const size_t b = std::max(lo, k.ranges[q].first), e = std::min(lo + len, k.ranges[q].second);
          for (size_t i = b; i < e; ++i) mask[i - lo] = 1;
        }
        char* dst = static_cast<char*>(state) + blk * bb;
        const size_t bytes = optim::state_bytes(f, len);
        at += bytes;
        if (static_cast<size_t>(std::count(mask.begin(), mask.begin() + len, uint8_t{1})) == len) {
          memcpy(dst, at - bytes, bytes);
          continue;
        }
        ZOE_RETURN_IF_ERROR(optim::dequantize_state(kind, f, at - bytes, old_v.data(), len));
        ZOE_RETURN_IF_ERROR(optim::dequantize_state(kind, f, dst, new_v.data(), len));
        for (size_t i = 0; i < len; ++i) new_v[i] = mask[i] ? old_v[i] : new_v[i];
        ZOE_RETURN_IF_ERROR(optim::quantize_state(kind, f, new_v.data(), dst, len));
      }
    }
    while (r < k.ranges.size() && k.ranges[r].second <= lb * B) ++r;
  }
  return Status::ok();
}

}  // namespace zoe::zero
