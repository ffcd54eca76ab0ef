#!/usr/bin/env bash
# Builds zoe (Release) and runs its main job: training a GPT whose model states are several
# times the device budget, with parameters and optimizer states offloaded to NVMe in a scratch
# folder under $ZOE_SCRATCH (default /var/tmp) that is removed afterwards. Extra arguments go to
# `zoe train` (e.g. --steps 50). ZOE_DEMO=io runs `zoe bench io` instead; ZOE_DEMO=text trains on
# the licence texts every Debian system has (/usr/share/common-licenses, read at run time) and
# prints a generated sample before and after.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh --cli
# No test suites, benchmarks or Python package: scripts/test.sh turns them on in the same tree.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DZOE_BUILD_TESTS=OFF -DZOE_BUILD_BENCH=OFF -DZOE_PYTHON=OFF >/dev/null
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
if [ "${ZOE_DEMO:-train}" = text ]; then
  ./build/bin/zoe train --preset tiny --data /usr/share/common-licenses --offload nvme \
    --nvme-path "$scratch" --device-budget 576KiB --steps 3000 --micro-batch 32 --lr 0.003 \
    --warmup 0 --eval-every 1000 --sample 200 --prompt "This License " --temperature 0.6 "$@"
  exit
fi
# The main job: a 2-layer GPT learns one-digit additions ("7+5=12") from scratch. Its 2.1 MB of
# model state per rank live on NVMe against a 576 KiB device budget (3.7x), as the DeepSpeed-style
# config below asks. Exact-match accuracy on held-out problems climbs from 0% to 100% in about
# 75 s on 2 cores; the model then answers a prompt it completes greedily.
# The recipe: AdamW with betas (0.9, 0.95), gradient clipping at 1.0, and the rate warmed up over
# 100 steps to 0.003, then decayed linearly to 0 at step 3000. With a constant 0.003 and betas
# (0.9, 0.999), when the model left its plateau (accuracy 0%, loss near 2.4) depended on the seed
# and on the CPU's BLAS kernels, and some runs never did (21.9% and 7.9% after 3000 steps); this
# one reaches 100% for seeds 1-3 on every kernel set measured (docs/benchmarks.md).
cat > "$scratch/ds_config.json" << EOF
{
  "train_micro_batch_size_per_gpu": 32,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "betas": [0.9, 0.95], "weight_decay": 0}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.003, "warmup_num_steps": 100,
                           "warmup_type": "linear", "total_num_steps": 3000}},
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 3,
    "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": "$scratch"},
    "offload_optimizer": {"device": "nvme", "nvme_path": "$scratch"}
  },
  "zoe": {"device_budget": "576KiB"}
}
EOF
./build/bin/zoe train --config "$scratch/ds_config.json" --preset tiny --task add1 --seed 2 --steps 3000 \
  --eval-every 500 --sample 13 --prompt "7+5=" --temperature 0 "$@"
