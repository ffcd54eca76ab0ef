#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU and the CUDA toolkit (no network needed): builds
# the CUDA test suites (ctest label `cuda`: test_adam_cuda, test_gpt_cuda), test_device and the engine on
# the GPU (test_engine EngineCuda.*) in build-gpu, runs them, then the PyTorch front-end on the GPU
# (tests/python/test_torch_cuda.py, against the CPU device and torch.optim.AdamW) with the machine's own
# python3, torch and pybind11 (the _zoe extension is built in build-gpu/python; nothing is installed),
# and ends with a summary. About 3-4 minutes on 16 cores; meant to fit 8.
#
# Usage: bash scripts/gpu-check.sh
# Environment (all optional):
#   ZOE_DEB_ROOT     Debian packages unpacked with dpkg -x (scripts/gpu-debs.sh makes one), for a
#                    machine that lacks GoogleTest, OpenBLAS, nlohmann-json, CLI11 or pkg-config:
#                    its usr/include, usr/lib/x86_64-linux-gnu and pkg-config files are used
#                    (and only those for pkg-config).
#   ZOE_DEBS         a folder of .deb files to unpack first into build-gpu/deb-root (needs dpkg);
#                    used as ZOE_DEB_ROOT.
#   ZOE_CUDA_ARCHS   CUDA architectures to build for (default 90: H100/H200).
#   ZOE_JOBS         build jobs (default: nproc).
#   ZOE_GPU_CHECK_LOG  the full log (default build-gpu/gpu-check.log).
#   ZOE_PYTHON3      the interpreter with a CUDA build of torch, numpy, pytest and pybind11 for the
#                    front-end step (default python3). ZOE_GPU_CHECK_TORCH=0 leaves that step out
#                    (said in the summary); otherwise a missing module fails the check.
# Exit status: 0 every test ran on a GPU and passed; 1 a build step or a test failed, or the
# front-end tests skipped where the engine's tests saw a GPU; 2 the tests ran but saw no GPU (they
# skip: nothing was checked).
set -euo pipefail
cd "$(dirname "$0")/.."

build="build-gpu"
mkdir -p "$build"
log=${ZOE_GPU_CHECK_LOG:-$build/gpu-check.log}
start=$(date +%s)

section() { printf '\n== %s  [%ds]\n' "$1" $(($(date +%s) - start)); }

main() {
  local jobs=${ZOE_JOBS:-$(nproc)}
  local targets=(test_adam_cuda test_gpt_cuda test_device test_engine)
  local cmake_args=(-DCMAKE_BUILD_TYPE=Release -DZOE_CUDA=ON -DZOE_BUILD_BENCH=OFF -DZOE_BUILD_TESTS=ON
                    "-DZOE_CUDA_ARCHS=${ZOE_CUDA_ARCHS:-90}")

  section "machine"
  echo "host: $(uname -srm), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | grep -q . && echo '(with local changes)')"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi || echo "nvidia-smi failed (exit $?)"
  else
    echo "nvidia-smi: not found"
  fi
  local nvcc=""
  if command -v nvcc >/dev/null; then
    nvcc=$(command -v nvcc)
  elif [ -x /usr/local/cuda/bin/nvcc ]; then
    nvcc=/usr/local/cuda/bin/nvcc
  fi
  if [ -z "$nvcc" ]; then
    echo "gpu-check: nvcc not found (PATH, /usr/local/cuda/bin): the CUDA toolkit is needed" >&2
    return 1
  fi
  echo "nvcc: $nvcc: $("$nvcc" --version | tail -n 2 | head -n 1)"
  # ZoeDeps.cmake looks in /usr/local/cuda first; elsewhere, point it at the nvcc found.
  if [ ! -d /usr/local/cuda ] && [ -z "${CUDAToolkit_ROOT:-}" ]; then
    cmake_args+=("-DCUDAToolkit_ROOT=$(dirname "$(dirname "$(readlink -f "$nvcc")")")")
  fi
  echo "cmake: $(cmake --version | head -n 1); c++: $(c++ --version 2>/dev/null | head -n 1 || echo 'not found')"

  # Debian packages carried in (gpu-debs.sh), for a machine without a package registry.
  local root=${ZOE_DEB_ROOT:-}
  if [ -n "${ZOE_DEBS:-}" ] && [ -z "$root" ]; then
    section "unpacking ${ZOE_DEBS}/*.deb"
    command -v dpkg >/dev/null || { echo "gpu-check: ZOE_DEBS needs dpkg; unpack them elsewhere and set ZOE_DEB_ROOT" >&2; return 1; }
    root=$build/deb-root
    rm -rf "$root"
    mkdir -p "$root"
    local f n=0
    for f in "$ZOE_DEBS"/*.deb; do
      [ -e "$f" ] || { echo "gpu-check: no .deb files in $ZOE_DEBS" >&2; return 1; }
      dpkg -x "$f" "$root"
      n=$((n + 1))
    done
    echo "unpacked $n packages into $root"
  fi
  if [ -n "$root" ]; then
    [ -d "$root/usr" ] || { echo "gpu-check: ZOE_DEB_ROOT=$root has no usr/ (expected dpkg -x output)" >&2; return 1; }
    root=$(cd "$root" && pwd)
    local ml=$root/usr/lib/x86_64-linux-gnu
    echo "using Debian packages unpacked in $root"
    export CMAKE_PREFIX_PATH="$root/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    export CPATH="$root/usr/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$ml${LIBRARY_PATH:+:$LIBRARY_PATH}"
    # libopenblas.so.0 and what it loads (libgfortran.so.5), for the test binaries.
    export LD_LIBRARY_PATH="$ml/openblas-pthread:$ml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # pkg-config reads only the unpacked .pc files, and prefixes their paths with the root.
    unset PKG_CONFIG_PATH
    export PKG_CONFIG_LIBDIR="$ml/openblas-pthread/pkgconfig:$ml/pkgconfig:$root/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$root"
    if ! command -v pkg-config >/dev/null && [ -x "$root/usr/bin/pkgconf" ]; then
      cmake_args+=("-DPKG_CONFIG_EXECUTABLE=$root/usr/bin/pkgconf")
    fi
  fi

  # The front-end: the _zoe extension for this machine's python3 (its pybind11's CMake files).
  local py="" torch_step=${ZOE_GPU_CHECK_TORCH:-1}
  if [ "$torch_step" != 0 ]; then
    py=$(command -v "${ZOE_PYTHON3:-python3}" || true)
    if [ -z "$py" ] || ! "$py" -c "import torch, numpy, pytest, pybind11" 2>/dev/null; then
      echo "gpu-check: ${ZOE_PYTHON3:-python3} with torch, numpy, pytest and pybind11 is needed for the front-end" \
           "tests (set ZOE_PYTHON3, or ZOE_GPU_CHECK_TORCH=0 to leave them out)" >&2
      return 1
    fi
    echo "python: $py: $("$py" -c 'import sys, torch, pybind11; print("python", sys.version.split()[0], "torch",
      torch.__version__, "CUDA", torch.version.cuda, "pybind11", pybind11.__version__)')"
    cmake_args+=(-DZOE_PYTHON=ON "-DPython3_EXECUTABLE=$py" "-Dpybind11_DIR=$("$py" -m pybind11 --cmakedir)")
    targets+=(_zoe)
  fi

  section "configure ($build)"
  local gen=()
  if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then gen=(-G Ninja); fi
  cmake -S . -B "$build" "${gen[@]}" "${cmake_args[@]}" || { echo "RESULT: FAILED: configure"; return 1; }
  if ! grep -q '^ZOE_CUDA:STRING=ON' "$build/CMakeCache.txt"; then
    echo "gpu-check: configure did not enable CUDA" >&2
    return 1
  fi

  section "build: ${targets[*]} (-j$jobs)"
  cmake --build "$build" -j "$jobs" --target "${targets[@]}" || { echo "RESULT: FAILED: build"; return 1; }

  section "tests"
  # Each gtest binary also writes an XML report, read for the summary below.
  rm -rf "$build/gtest-xml"
  mkdir -p "$build/gtest-xml"
  local xml_dir
  xml_dir=$(cd "$build/gtest-xml" && pwd)
  export GTEST_OUTPUT="xml:$xml_dir/"
  local rc_cuda=0 rc_device=0 rc_engine=0
  # -V shows every test's output (skip reasons, the printed losses and notes); the per-test
  # RUN/OK lines are left out of the console (they stay in $build/ctest-*.log).
  ctest --test-dir "$build" -L cuda --output-on-failure -V --timeout 300 >"$build/ctest-cuda.log" 2>&1 || rc_cuda=$?
  grep -v -E '^[0-9]+: \[( RUN      |       OK )\]' "$build/ctest-cuda.log" || true
  ctest --test-dir "$build" -R '^test_device$' --output-on-failure -V --timeout 120 >"$build/ctest-device.log" 2>&1 ||
    rc_device=$?
  grep -v -E '^[0-9]+: \[( RUN      |       OK )\]' "$build/ctest-device.log" || true
  # The engine on the GPU (zoe.device "cuda"), against the dense reference and the CPU device.
  "$build/bin/test_engine" --gtest_filter='EngineCuda.*' >"$build/ctest-engine.log" 2>&1 || rc_engine=$?
  grep -v -E '^\[( RUN      |       OK )\]' "$build/ctest-engine.log" || true
  # The PyTorch front-end on the GPU, from the build tree (zoe.device "cuda" against the CPU
  # device and torch.optim.AdamW). Its skips are counted from the JUnit report below.
  local rc_torch=0 torch_tests=0 torch_skips=0 torch_xml=$build/pytest-torch-cuda.xml
  if [ -n "$py" ]; then
    rm -f "$torch_xml"
    mkdir -p "$build/test-tmp"
    PYTHONPATH="$build/python:tests/python" PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -q -rs -p no:cacheprovider \
      --basetemp="$build/test-tmp/torch-cuda" --junitxml="$torch_xml" tests/python/test_torch_cuda.py \
      >"$build/pytest-torch-cuda.log" 2>&1 || rc_torch=$?
    cat "$build/pytest-torch-cuda.log"
    if [ -f "$torch_xml" ]; then
      torch_tests=$(grep -o '<testcase ' "$torch_xml" | wc -l)
      torch_skips=$(grep -o '<skipped' "$torch_xml" | wc -l)
    else
      echo "no JUnit report from pytest: the front-end tests did not run"
      [ "$rc_torch" -ne 0 ] || rc_torch=1
    fi
  fi

  section "summary"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' || true
  fi
  local x name tests fails skips no_gpu=0 total_fail=0
  printf '%-16s %6s %6s %8s\n' binary tests failed skipped
  for x in "$build"/gtest-xml/*.xml; do
    [ -e "$x" ] || { echo "no gtest XML reports: the test binaries did not run"; total_fail=1; break; }
    name=$(basename "$x" .xml)
    tests=$(grep -c '<testcase ' "$x" || true)
    fails=$(awk '/<testcase /{tc=1} /<failure /{if (tc) {n++; tc=0}} END{print n+0}' "$x")
    skips=$(grep -c 'result="skipped"' "$x" || true)
    printf '%-16s %6s %6s %8s\n' "$name" "$tests" "$fails" "$skips"
    total_fail=$((total_fail + fails))
    if grep -q -E 'no usable GPU|no GPU: cudaGetDeviceCount|no CUDA device to compare' "$x"; then no_gpu=1; fi
  done
  echo "ctest: label cuda exit $rc_cuda, test_device exit $rc_device, EngineCuda exit $rc_engine; logs: $build/ctest-*.log, $log"
  if [ -n "$py" ]; then
    echo "front-end (test_torch_cuda.py): pytest exit $rc_torch, $torch_tests tests, $torch_skips skipped;" \
         "log: $build/pytest-torch-cuda.log"
  else
    echo "front-end (test_torch_cuda.py): LEFT OUT (ZOE_GPU_CHECK_TORCH=0)"
  fi
  echo "time: $(($(date +%s) - start)) s"
  if [ "$rc_cuda" -ne 0 ] || [ "$rc_device" -ne 0 ] || [ "$rc_engine" -ne 0 ] || [ "$total_fail" -ne 0 ] ||
     [ "$rc_torch" -ne 0 ]; then
    echo "RESULT: FAILED (see the failures above and in $build/ctest-*.log, $build/pytest-torch-cuda.log)"
    return 1
  fi
  if [ "$torch_skips" -ne 0 ] && [ "$no_gpu" -eq 0 ]; then
    echo "RESULT: FAILED: the engine's tests ran on the GPU but $torch_skips front-end test(s) skipped" \
         "(torch sees no GPU, or zoe did not import: see the SKIPPED lines above)"
    return 1
  fi
  if [ "$no_gpu" -ne 0 ]; then
    echo "RESULT: NO GPU SEEN: the CUDA tests skipped, nothing was checked on a GPU"
    grep -h -o -E '(no usable GPU|no GPU: cudaGetDeviceCount|no CUDA device to compare)[^"]*' "$build"/gtest-xml/*.xml |
      sed 's/\]\]>.*//' | sort -u | head -n 5
    return 2
  fi
  echo "RESULT: PASSED on the GPU"
}

# The exit status is main's (pipefail; tee succeeds).
main 2>&1 | tee "$log"
