#!/usr/bin/env bash
# Builds zoe (Release) and runs its main job: `zoe bench io`, the swap-bandwidth profile of the
# drive holding $ZOE_SCRATCH (default /var/tmp). Extra arguments go to `zoe bench io`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
./build/bin/zoe info --path "${ZOE_SCRATCH:-/var/tmp}"
echo
./build/bin/zoe bench io --path "${ZOE_SCRATCH:-/var/tmp}" "$@"
