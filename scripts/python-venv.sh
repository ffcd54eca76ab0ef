#!/usr/bin/env bash
# The Python half of the test command: a virtual environment with PyPI's torch (cached: created
# once per python/requirements-test.txt), zoe installed into it with `pip install .` (an
# incremental build in build-pip/), and the Python suite (tests/python) run against the installed
# package, not the build tree.
#
# Usage: scripts/python-venv.sh [pytest args...]     (ZOE_BIN: the zoe binary for the CLI tests,
#        default build/bin/zoe; ZOE_CACHE: where the venv lives, default ~/.cache/zoe)
# Prints the venv's path on its last line of stderr. Exit status: pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
cache=${ZOE_CACHE:-$HOME/.cache/zoe}
req=python/requirements-test.txt

# An interpreter that can make a venv with pip: the first python3 on PATH, else Debian's.
py=""
for cand in "$(command -v python3 || true)" /usr/bin/python3; do
  if [ -n "$cand" ] && "$cand" -c "import venv, ensurepip" 2>/dev/null; then py=$cand; break; fi
done
if [ -z "$py" ]; then
  echo "python-venv: no python3 with the venv and ensurepip modules (apt-get install python3-venv)" >&2
  exit 2
fi
tag=$("$py" -c 'import sys; print("py%d%d" % sys.version_info[:2])')-$(sha256sum "$req" | cut -c1-12)
venv=$cache/venv-$tag
if [ ! -f "$venv/.zoe-ready" ]; then
  echo "python-venv: creating $venv from $req (PyPI; a few GB the first time)" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -r "$req"
  touch "$venv/.zoe-ready"
fi
echo "python-venv: $("$venv/bin/python" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)')" >&2
# The packages tests compare with (python/requirements-compare.txt), where they install: once per
# venv and version of that file; a failure is said and their tests skip.
cmp_req=python/requirements-compare.txt
cmp_tag=$venv/.zoe-compare-$(sha256sum "$cmp_req" | cut -c1-12)
if [ ! -f "$cmp_tag" ]; then
  if "$venv/bin/pip" install -q -r "$cmp_req"; then
    touch "$cmp_tag"
  else
    echo "python-venv: the packages of $cmp_req did not install; the tests comparing with them skip" >&2
  fi
fi

# pip install . into the venv: the build directory persists, so a rerun rebuilds only what changed.
launcher=()
if command -v ccache > /dev/null; then
  launcher=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache -C cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache)
fi
echo "python-venv: pip install . (build-pip/)" >&2
"$venv/bin/pip" install -q --no-deps --no-build-isolation --force-reinstall . -C build-dir="$root/build-pip" \
  "${launcher[@]}"
"$venv/bin/zoe" --version > /dev/null
# The venv's python, for the multi-node tests' PyTorch case (scripts/test.sh passes it as ZOE_PYTHON).
mkdir -p build-pip
echo "$venv/bin/python" > build-pip/venv-python

# The suite against the installed package: no PYTHONPATH into the build tree.
export ZOE_BIN=${ZOE_BIN:-$root/build/bin/zoe}
export PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH
mkdir -p build-pip/test-tmp
status=0
(cd "$root/build-pip" && "$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp="$root/build-pip/test-tmp" \
  --durations=12 "$root/tests/python" "$@") || status=$?
echo "python-venv: $venv" >&2
exit $status
