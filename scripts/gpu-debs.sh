#!/usr/bin/env bash
# Fetches, on a machine where apt works, the Debian packages that scripts/gpu-check.sh needs on a
# GPU machine without a package registry, and unpacks them (dpkg -x) into one tree for it.
#
# Usage: bash scripts/gpu-debs.sh [DIR [PACKAGE...]]
#   DIR      where to put them (default build-debs: ignored by git); DIR/debs gets the .deb files
#            (about 13 MB), DIR/root their unpacked contents (about 40 MB; docs, man pages and
#            OpenBLAS's static libraries pruned).
#   PACKAGE  fetch only these (default: the list below: what a CUDA-test build needs beyond the
#            CUDA toolkit, CMake and a C++ compiler).
# Then take DIR/root to the GPU machine and run there
#   ZOE_DEB_ROOT=DIR/root bash scripts/gpu-check.sh
# or take only DIR/debs (smaller) and let gpu-check.sh unpack them (needs dpkg there):
#   ZOE_DEBS=DIR/debs bash scripts/gpu-check.sh
# Built and tested against Debian 12 (bookworm) packages; their libraries need a glibc at least
# as new as bookworm's (2.36).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-build-debs}
if [ $# -gt 0 ]; then shift; fi
pkgs=("$@")
if [ ${#pkgs[@]} -eq 0 ]; then
  pkgs=(
    # GoogleTest (static libraries, headers, CMake config; GTest's config also names gmock)
    libgtest-dev libgmock-dev
    # header-only, found through their CMake configs
    nlohmann-json3-dev libcli11-dev
    # OpenBLAS (zoe_model) and what libopenblas.so.0 loads
    libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
    # pkg-config, in case the GPU machine has none
    pkgconf-bin libpkgconf3
  )
fi

command -v apt-get >/dev/null || { echo "gpu-debs: apt-get not found (run this on Debian/Ubuntu)" >&2; exit 1; }
command -v dpkg >/dev/null || { echo "gpu-debs: dpkg not found" >&2; exit 1; }
mkdir -p "$dir/debs" "$dir/root"
dir=$(cd "$dir" && pwd)

echo "gpu-debs: downloading ${pkgs[*]}" >&2
if ! (cd "$dir/debs" && apt-get download "${pkgs[@]}"); then
  echo "gpu-debs: apt-get download failed; 'apt-get update' may be needed first" >&2
  exit 1
fi

for p in "${pkgs[@]}"; do
  shopt -s nullglob
  files=("$dir"/debs/"${p}"_*.deb)
  shopt -u nullglob
  if [ ${#files[@]} -eq 0 ]; then
    echo "gpu-debs: no .deb for $p in $dir/debs" >&2
    exit 1
  fi
  for f in "${files[@]}"; do dpkg -x "$f" "$dir/root"; done
done
rm -rf "$dir/root/usr/share/doc" "$dir/root/usr/share/man" "$dir/root/usr/share/lintian"
# zoe links libopenblas.so only: drop the static libraries and the BLAS/LAPACK alternatives.
rm -f "$dir"/root/usr/lib/x86_64-linux-gnu/openblas-pthread/*.a \
      "$dir"/root/usr/lib/x86_64-linux-gnu/openblas-pthread/lib{blas,lapack}.so*

echo "gpu-debs: $(find "$dir/debs" -name '*.deb' | wc -l) packages ($(du -sh "$dir/debs" | cut -f1)) unpacked into $dir/root ($(du -sh "$dir/root" | cut -f1))" >&2
echo "gpu-debs: on the GPU machine: ZOE_DEB_ROOT=<copy of $dir/root> bash scripts/gpu-check.sh" >&2
echo "gpu-debs:                 or: ZOE_DEBS=<copy of $dir/debs> bash scripts/gpu-check.sh" >&2
