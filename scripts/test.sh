#!/usr/bin/env bash
# Builds zoe and runs the whole test suite: a Release build, an ASan+UBSan build, and a TSan
# build of the multi-threaded layers.
# Usage: scripts/test.sh            (ZOE_SKIP_SANITIZE=1 skips the sanitizer pass)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
jobs=$(nproc)

echo "== layer map and format checks" >&2
/usr/bin/python3 scripts/check-layers.py

echo "== Release build and tests (build/)" >&2
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
echo "== crash test: kills, faults, fuzzed configs (tests/crash; 1-2 minutes)" >&2
/usr/bin/python3 tests/crash/crashtest.py --zoe build/bin/zoe --seed 1

if [ "${ZOE_SKIP_SANITIZE:-0}" != "1" ]; then
  echo "== ASan+UBSan build and tests (build-san/)" >&2
  # CUDA off: the CUDA runtime and ASan's shadow memory do not mix; GPU code is checked on GPUs.
  cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZOE_SANITIZE=address,undefined \
        -DZOE_CUDA=OFF -DZOE_BUILD_BENCH=OFF
  cmake --build build-san -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-san --output-on-failure -j"$jobs"
fi
if [ "${ZOE_SKIP_SANITIZE:-0}" != "1" ]; then
  # The multi-threaded layers (I/O engine, devices, tier manager, swapper, the engine with its
  # prefetch and asynchronous checkpoints) under ThreadSanitizer.
  echo "== TSan build and tests of the concurrent layers (build-tsan/)" >&2
  tsan_tests="test_io_engine test_device test_tier_manager test_tier_stress test_optimizer_swapper test_engine"
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZOE_SANITIZE=thread -DZOE_CUDA=OFF -DZOE_BUILD_BENCH=OFF
  cmake --build build-tsan -j"$jobs" --target $tsan_tests
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" -R "^($(echo $tsan_tests | tr ' ' '|'))\$"
fi
echo "== all tests passed" >&2
