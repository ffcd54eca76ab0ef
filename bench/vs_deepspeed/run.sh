#!/usr/bin/env bash
# zoe against DeepSpeed on the same Hugging Face models, the same ds_config.json and the same
# batches, on this machine's CPU (DeepSpeed's CPU accelerator, gloo). Sets everything up and runs
# the matrix: models gpt2 (GPT-2 small, 124M) and llama300m (a Llama-architecture model of 303M),
# ZeRO stage 3 with offload none | cpu | nvme (parameters and optimizer states), fp32 and bf16.
#
# usage: bash bench/vs_deepspeed/run.sh --out DIR [--quick] [--nvme-path DIR] [--models "gpt2 llama300m"]
#          [--offloads "none cpu nvme"] [--precisions "fp32 bf16"] [--busy N] [--report-only]
#   --quick        GPT-2 small only, fp32, 5 steps (each engine), every offload
#   --busy N       each cell also runs as many rounds with N processes spinning on the CPU beside
#                  both engines (alternating with the quiet rounds): results.md adds zoe / DS busy
#   --report-only  no runs: DIR/results.* from the cells already in DIR/cells
# Writes DIR/results.json, DIR/results.md, DIR/step_time.png (and DIR/cells, DIR/configs, DIR/logs).
# ZOE_BENCH_LOCK=FILE: each cell runs under `flock -x FILE` (a quiet machine per cell, not for
# the whole matrix), and the build of zoe under `flock -s FILE`. ZOE_CACHE: where the venv and
# DeepSpeed's compiled ops live (default ~/.cache/zoe).
#
# Setup (each step skipped when already done): the Debian packages zoe builds with
# (scripts/install-deps.sh) and libaio-dev (DeepSpeed's async_io op, for NVMe offload); a venv
# with torch, transformers and DeepSpeed from PyPI, cached by the hash of requirements.txt; zoe
# itself installed into it with `pip install .` from this checkout (incremental, build-pip/).
# DeepSpeed's ops (cpu_adam, async_io) compile just in time the first time (minutes), into
# $ZOE_CACHE/torch-extensions-<tag>, and are reused afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
here=$root/bench/vs_deepspeed

out="" quick=0 nvme=${ZOE_SCRATCH:-/var/tmp} report_only=0 busy=0
models="gpt2 llama300m" offloads="none cpu nvme" precisions="fp32 bf16"
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --nvme-path) nvme=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --offloads) offloads=$2; shift 2 ;;
    --precisions) precisions=$2; shift 2 ;;
    --busy) busy=$2; shift 2 ;;
    --report-only) report_only=1; shift ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$out" ]; then echo "run.sh: --out DIR is required" >&2; exit 2; fi
if [ $quick = 1 ]; then models=gpt2; precisions=fp32; fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

# Debian packages.
bash scripts/install-deps.sh
if ! dpkg-query -W -f='${Status}' libaio-dev 2>/dev/null | grep -q "install ok installed"; then
  echo "run.sh: installing libaio-dev (DeepSpeed's async_io op)" >&2
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libaio-dev > /dev/null
fi

# The venv (cached), with zoe from this checkout.
cache=${ZOE_CACHE:-$HOME/.cache/zoe}
py=""
for cand in "$(command -v python3 || true)" /usr/bin/python3; do
  if [ -n "$cand" ] && "$cand" -c "import venv, ensurepip" 2>/dev/null; then py=$cand; break; fi
done
if [ -z "$py" ]; then echo "run.sh: no python3 with the venv and ensurepip modules" >&2; exit 2; fi
tag=$("$py" -c 'import sys; print("py%d%d" % sys.version_info[:2])')-$(sha256sum "$here/requirements.txt" | cut -c1-12)
venv=$cache/venv-vs-deepspeed-$tag
if [ ! -f "$venv/.zoe-ready" ]; then
  echo "run.sh: creating $venv from $here/requirements.txt (PyPI; a few GB the first time)" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$here/requirements.txt"
  touch "$venv/.zoe-ready"
fi
launcher=()
if command -v ccache > /dev/null; then
  launcher=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache -C cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache)
fi
if [ $report_only = 0 ]; then
  echo "run.sh: pip install . into $venv (build-pip/)" >&2
  lock=(); if [ -n "${ZOE_BENCH_LOCK:-}" ]; then lock=(flock -s "$ZOE_BENCH_LOCK"); fi
  "${lock[@]}" "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation --force-reinstall . \
    -C build-dir="$root/build-pip" "${launcher[@]}"
fi
export PATH=$venv/bin:$PATH
export DS_ACCELERATOR=cpu
export TORCH_EXTENSIONS_DIR=$cache/torch-extensions-$tag
unset PYTHONPATH

if [ $report_only = 0 ]; then
  ds_report > "$out/ds_report.txt" 2>&1 || true
  for m in $models; do
    for p in $precisions; do
      for o in $offloads; do
        args=(cell --out "$out" --model "$m" --offload "$o" --precision "$p" --nvme-path "$nvme" --busy "$busy")
        if [ $quick = 1 ]; then
          args+=(--rounds 5 --steps-per-round 1 --warmup 2)
        elif [ "$p" = bf16 ]; then
          args+=(--rounds 2 --steps-per-round 5)   # 10 steps; fp32 (the loss comparison): 20
        fi
        if [ -n "${ZOE_BENCH_LOCK:-}" ]; then
          flock -x "$ZOE_BENCH_LOCK" python "$here/vs_deepspeed.py" "${args[@]}"
        else
          python "$here/vs_deepspeed.py" "${args[@]}"
        fi
      done
    done
    # The fp32 reference the losses are compared with: plain torch AdamW, the same batches.
    if [[ " $precisions " == *" fp32 "* ]]; then
      args=(reference --out "$out" --model "$m")
      if [ $quick = 1 ]; then args+=(--rounds 5 --steps-per-round 1); fi
      if [ -n "${ZOE_BENCH_LOCK:-}" ]; then
        flock -x "$ZOE_BENCH_LOCK" python "$here/vs_deepspeed.py" "${args[@]}"
      else
        python "$here/vs_deepspeed.py" "${args[@]}"
      fi
    fi
  done
fi
python "$here/vs_deepspeed.py" report --out "$out"
echo "run.sh: $out/results.json, $out/results.md, $out/step_time.png" >&2
