#!/usr/bin/env bash
# zoe's fused CPU Lion / Adagrad / AdamW steps against DeepSpeed's DeepSpeedCPULion,
# DeepSpeedCPUAdagrad and DeepSpeedCPUAdam on this machine, in one process (vs_deepspeed_optim.py).
#
# usage: bash bench/optim/vs_deepspeed_optim.sh [vs_deepspeed_optim.py's arguments, e.g. --params 64M
#          --threads 2 --rounds 7 --json out.json]
# Environment:
#   ZOE_DS_PYTHON  a python with torch and deepspeed to use as it is; unset: the venv of
#                  bench/vs_deepspeed/run.sh (torch and DeepSpeed pinned by its requirements.txt,
#                  created from PyPI the first time, a few GB, cached under $ZOE_CACHE)
#   ZOE_BUILD      the CMake build directory to build zoe_optim_capi in (default build/; configured
#                  with the project's defaults when missing)
#   ZOE_CACHE      the cache directory (default ~/.cache/zoe); DeepSpeed's ops compile just in time
#                  into $TORCH_EXTENSIONS_DIR (default $ZOE_CACHE/torch-extensions-<tag>) the
#                  first time, a minute or two each
# Run it on a quiet machine (under `flock -x /tmp/zoe-heavy.lock` where builds share it).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
cache=${ZOE_CACHE:-$HOME/.cache/zoe}
build=${ZOE_BUILD:-$root/build}

req=$root/bench/vs_deepspeed/requirements.txt
if [ -n "${ZOE_DS_PYTHON:-}" ]; then
  py=$ZOE_DS_PYTHON
  tag=$("$py" -c 'import sys; print("py%d%d" % sys.version_info[:2])')-custom
else
  base=""
  for cand in "$(command -v python3 || true)" /usr/bin/python3; do
    if [ -n "$cand" ] && "$cand" -c "import venv, ensurepip" 2>/dev/null; then base=$cand; break; fi
  done
  if [ -z "$base" ]; then echo "vs_deepspeed_optim.sh: no python3 with the venv module" >&2; exit 2; fi
  tag=$("$base" -c 'import sys; print("py%d%d" % sys.version_info[:2])')-$(sha256sum "$req" | cut -c1-12)
  venv=$cache/venv-vs-deepspeed-$tag
  if [ ! -f "$venv/.zoe-ready" ]; then
    echo "vs_deepspeed_optim.sh: creating $venv from $req (PyPI; a few GB the first time)" >&2
    rm -rf "$venv"
    mkdir -p "$cache"
    "$base" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -r "$req"
    touch "$venv/.zoe-ready"
  fi
  py=$venv/bin/python
fi

export CCACHE_BASEDIR=$root
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DZOE_BUILD_BENCH=ON > /dev/null
fi
cmake --build "$build" -j2 --target zoe_optim_capi > /dev/null
lib=$(find "$build" -name 'libzoe_optim_capi.so' -print -quit)

export DS_ACCELERATOR=cpu
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$cache/torch-extensions-$tag}
unset PYTHONPATH
exec "$py" "$root/bench/optim/vs_deepspeed_optim.py" --lib "$lib" "$@"
