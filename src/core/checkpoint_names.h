// The names of zoe's entries in a checkpoint save directory and in a checkpoint (the layout is
// src/checkpoint/checkpoint.h's), here so that the output-file checks (zoe/files.h) know a save
// directory by the same names the checkpoint code writes.
#pragma once

namespace zoe::ckpt {

inline constexpr char kLatestName[] = "latest";
inline constexpr char kLockName[] = ".zoe-lock";
inline constexpr char kManifestName[] = "manifest.json";
inline constexpr char kManifestChecksumName[] = "manifest.xxh64";
inline constexpr char kFirstRankFileName[] = "rank-00000.bin";

}  // namespace zoe::ckpt
