#!/usr/bin/env bash
# Builds zoe and runs the whole test suite: a Release build, an ASan+UBSan build, and a TSan
# build of the multi-threaded layers.
# Usage: scripts/test.sh            (ZOE_SKIP_SANITIZE=1 skips the sanitizer pass)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
# Each section says when it starts (minutes:seconds since the start), so a slow CI run shows where.
t0=$SECONDS
section() { printf '== [%dm%02ds] %s\n' $(((SECONDS - t0) / 60)) $(((SECONDS - t0) % 60)) "$*" >&2; }
jobs=$(nproc)
# ccache (installed by install-deps.sh) with paths relative to the checkout: the builds below and
# `pip install .`'s share compiled objects, and a rerun recompiles only what changed.
launcher=()
if command -v ccache > /dev/null; then
  export CCACHE_BASEDIR=$(pwd)
  # The sanitizer builds carry debug info, whose compile directory ccache would otherwise hash:
  # a checkout elsewhere (a fresh CI clone) then reuses their objects too.
  export CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi

section "layer map, function and file length, and format checks"
/usr/bin/python3 scripts/check-layers.py
/usr/bin/python3 scripts/check-function-length.py
/usr/bin/python3 scripts/check-file-length.py
bash scripts/check-format.sh

section "Release build and tests (build/)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DZOE_BUILD_TESTS=ON -DZOE_BUILD_BENCH=ON -DZOE_PYTHON=AUTO \
      "${launcher[@]}"
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
section "crash test: kills, faults, fuzzed configs (tests/crash; 1-2 minutes)"
/usr/bin/python3 tests/crash/crashtest.py --zoe build/bin/zoe --seed 1

# The Python suite on PyPI's torch, against zoe installed with `pip install .` into a cached venv.
section "pip install . into a venv with PyPI's torch; tests/python against it (scripts/python-venv.sh)"
bash scripts/python-venv.sh

# Test nodes on this machine (network namespaces and an rsh agent for mpirun): stages 1-3 across
# node layouts, node-local NVMe, a node lost mid-run, the PyTorch front-end over the venv above.
# Exit 77 (not root, no CAP_NET_ADMIN): skipped, with its one line printed.
section "multi-node tests in network namespaces (tests/multinode/run.sh; a few minutes)"
mn_status=0
ZOE_BIN=$(pwd)/build/bin/zoe ZOE_PYTHON=$(cat build-pip/venv-python 2> /dev/null || true) \
  bash tests/multinode/run.sh || mn_status=$?
if [ $mn_status -ne 0 ] && [ $mn_status -ne 77 ]; then
  section "multi-node tests failed (exit $mn_status)"
  exit 1
fi

# The install path: zoe installed into a temporary prefix; the public API tests and the example
# built as separate CMake projects that see only that prefix (find_package(zoe)), then run.
section "install, public API tests and examples against the installed zoe"
prefix=$(mktemp -d /tmp/zoe-install.XXXXXX)
scratch=$(mktemp -d "${ZOE_SCRATCH:-/var/tmp}/zoe-example.XXXXXX")
trap 'rm -rf "$prefix" "$scratch"' EXIT
cmake --install build --prefix "$prefix" > /dev/null
cmake -S tests/api -B "$prefix/build-api" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
cmake --build "$prefix/build-api" -j"$jobs"
ZOE_TEST_TMPDIR="$scratch" ctest --test-dir "$prefix/build-api" --output-on-failure
cmake -S examples -B "$prefix/build-examples" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
cmake --build "$prefix/build-examples" -j"$jobs"
# train_mlp exits 1 unless its loss fell over the steps.
timeout 300 "$prefix/build-examples/train_mlp" 12 "$scratch"
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --exists --print-errors zoe

if [ "${ZOE_SKIP_SANITIZE:-0}" != "1" ]; then
  section "ASan+UBSan build and tests (build-san/)"
  # CUDA off: the CUDA runtime and ASan's shadow memory do not mix; GPU code is checked on GPUs.
  cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZOE_SANITIZE=address,undefined \
        -DZOE_CUDA=OFF -DZOE_BUILD_BENCH=OFF "${launcher[@]}"
  cmake --build build-san -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-san --output-on-failure -j"$jobs"
fi
if [ "${ZOE_SKIP_SANITIZE:-0}" != "1" ]; then
  # The multi-threaded layers (I/O engine, the gloo communicator, devices, tier manager, swapper, the
  # engine with its prefetch and asynchronous checkpoints) under ThreadSanitizer.
  section "TSan build and tests of the concurrent layers (build-tsan/)"
  tsan_tests="test_io_engine test_comm_gloo test_device test_tier_manager test_tier_stress test_tier_parts test_tier_device_faults test_optimizer_swapper test_swap_file test_engine test_engine_faults test_heartbeat test_activation_store test_engine_activations test_parts test_engine_lowbit test_engine_sleep test_engine_muon test_engine_optimizers test_engine_adam_mini"
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZOE_SANITIZE=thread -DZOE_CUDA=OFF -DZOE_BUILD_BENCH=OFF \
        "${launcher[@]}"
  cmake --build build-tsan -j"$jobs" --target $tsan_tests
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" -R "^($(echo $tsan_tests | tr ' ' '|'))\$"
fi
section "all tests passed"
