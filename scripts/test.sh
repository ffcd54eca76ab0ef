#!/usr/bin/env bash
# Builds zoe and runs the whole test suite: a Release build, then an ASan+UBSan build.
# Usage: scripts/test.sh            (ZOE_SKIP_SANITIZE=1 skips the sanitizer pass)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
jobs=$(nproc)

echo "== Release build and tests (build/)" >&2
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

if [ "${ZOE_SKIP_SANITIZE:-0}" != "1" ]; then
  echo "== ASan+UBSan build and tests (build-san/)" >&2
  # CUDA off: the CUDA runtime and ASan's shadow memory do not mix; GPU code is checked on GPUs.
  cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZOE_SANITIZE=address,undefined \
        -DZOE_CUDA=OFF -DZOE_BUILD_BENCH=OFF
  cmake --build build-san -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-san --output-on-failure -j"$jobs"
fi
echo "== all tests passed" >&2
