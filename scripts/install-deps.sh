#!/usr/bin/env bash
# Installs the Debian packages zoe needs to build, test and benchmark; idempotent.
# --cli: only those the `zoe` CLI's build needs (scripts/demo.sh: no test, Python or plot packages).
set -euo pipefail

CLI_PKGS=(
  build-essential cmake pkg-config
  liburing-dev libhwloc-dev libtbb-dev
  nlohmann-json3-dev libcli11-dev libxxhash-dev
  libopenmpi-dev openmpi-bin libgloo-dev
  libopenblas-dev
)
PKGS=(
  build-essential cmake pkg-config git
  liburing-dev libhwloc-dev libtbb-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libxxhash-dev
  libopenmpi-dev openmpi-bin libgloo-dev
  libopenblas-dev
  fio clang-format
  # Python tests (tests/python, pytest) and plots (scripts/zoe_plot.py): Debian's CPU PyTorch.
  python3 python3-pytest python3-numpy python3-torch python3-matplotlib
  # The zoe Python package (python/, the PyTorch front-end): headers for the pybind11 extension.
  python3-dev pybind11-dev
  # scripts/python-venv.sh: a venv for PyPI's torch (when no other python3 with venv is on PATH),
  # and ccache, which keeps `pip install .`'s rebuilds of the C++ core short.
  python3-venv ccache
)

if [ "${1:-}" = --cli ]; then PKGS=("${CLI_PKGS[@]}"); fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages already installed" >&2
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done" >&2
