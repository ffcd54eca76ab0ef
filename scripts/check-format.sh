#!/usr/bin/env bash
# Fails when a C++/CUDA source is not formatted as .clang-format says (clang-format --dry-run
# -Werror over every tracked source). Fix with: clang-format -i <files> (or scripts/check-format.sh --fix).
set -euo pipefail
cd "$(dirname "$0")/.."
cf=$(command -v clang-format || command -v clang-format-14 || true)
if [ -z "$cf" ]; then
  echo "check-format: clang-format is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' 2>/dev/null || find include src io offload tools tests bench examples python -name '*.cpp' -o -name '*.h' -o -name '*.cu')
if [ "${1:-}" = "--fix" ]; then
  "$cf" -i "${files[@]}"
  exit 0
fi
if ! "$cf" --dry-run -Werror "${files[@]}" 2> /tmp/zoe-format.$$; then
  grep -E "error:" /tmp/zoe-format.$$ | head -20 >&2
  echo "check-format: $(grep -c 'error:' /tmp/zoe-format.$$) place(s) differ from .clang-format; run scripts/check-format.sh --fix" >&2
  rm -f /tmp/zoe-format.$$
  exit 1
fi
rm -f /tmp/zoe-format.$$
echo "check-format: ${#files[@]} files formatted" >&2
