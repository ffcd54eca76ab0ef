#!/usr/bin/env bash
# Builds zoe (Release) and runs its main job: training a GPT whose model states are several
# times the device budget, with parameters and optimizer states offloaded to NVMe in a scratch
# folder under $ZOE_SCRATCH (default /var/tmp) that is removed afterwards. Extra arguments go to
# `zoe train` (e.g. --steps 50). ZOE_DEMO=io runs `zoe bench io` instead.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
# The main job needs only the CLI; the tests are built by scripts/test.sh.
cmake --build build -j"$(nproc)" --target zoe

base="${ZOE_SCRATCH:-/var/tmp}"
if [ "${ZOE_DEMO:-train}" = io ]; then
  exec ./build/bin/zoe bench io --path "$base" "$@"
fi
scratch=$(mktemp -d "$base/zoe-demo.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
./build/bin/zoe info --path "$scratch"
echo
# 4.8M parameters: 87 MB of model state per rank against a 16 MiB device budget (5x).
./build/bin/zoe train --preset demo --offload nvme --nvme-path "$scratch" --device-budget 16MiB \
  --steps 200 --micro-batch 8 --lr 0.002 --eval-every 50 "$@"
