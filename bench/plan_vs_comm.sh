#!/usr/bin/env bash
# zoe plan's network term against the communication time of a measured stage-3 step, on two test
# nodes of this machine (tests/multinode/netns.sh: 2 nodes x 2 ranks over TCP). Each round, in
# this order: `zoe bench comm` (all-gather and reduce-scatter at 4 KiB and at the step's module
# sizes, ITERS each) gives the latency (the mean time at 4 KiB) and the rate beyond it at those
# sizes, as `zoe tune --calibrate` takes them (bench/plan_vs_comm.py rates); `zoe train --preset
# demo` with the plan's own config (stage 3, bf16, every module partitioned, micro-batch 1) runs
# STEPS steps; per step, the least of the ranks' comm (comm_s_by_rank: the rank that waited least
# for slower ones), the median of steps 3..STEPS, is the measured time (rank 0's also printed);
# `zoe plan --preset demo --nodes 2 --gpus-per-node 2 --device cpu --seq 64 --micro-batch 1` with
# those two values predicts busy_s.network of the same placement. Also printed, as the baseline of
# the same round: the prediction with the rate at the largest size alone (the earlier derivation).
#
# Usage: flock -x /tmp/zoe-heavy.lock bench/plan_vs_comm.sh [ROUNDS] [STEPS] [ITERS]
#        (defaults 1 16 20; one round takes about a minute here)
# Env:   ZOE_BIN (default build/bin/zoe), MN_PREFIX / MN_SUBNET (default zoenp / 10.79.0),
#        MODULES (the step's collective sizes in bytes and their modules, "BYTES:COUNT,...";
#        default the demo preset's in bf16: final norm, embedding, 6 blocks), JSON=out.json to also
#        write every round's figures. Exit 77 when network namespaces cannot be made here.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
rounds=${1:-1}
steps=${2:-16}
iters=${3:-20}
modules=${MODULES:-16384:1,163840:1,1589248:6}
ZOE_BIN=${ZOE_BIN:-$root/build/bin/zoe}
export MN_PREFIX=${MN_PREFIX:-zoenp} MN_SUBNET=${MN_SUBNET:-10.79.0}
export MN_STATE=${MN_STATE:-/tmp/zoe-netns-$MN_PREFIX}
# shellcheck source=tests/multinode/netns.sh
source "$root/tests/multinode/netns.sh"
mn_check || exit $?
[ -x "$ZOE_BIN" ] || { echo "plan_vs_comm: no zoe at $ZOE_BIN (build first, or set ZOE_BIN)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'mn_down > /dev/null 2>&1; rm -rf "$tmp"' EXIT
mn_up 2,2 || exit 1
# zoe train's flags config: stage 3, every module partitioned (persistence threshold 0), bf16.
cat > "$tmp/ds.json" << 'EOF'
{"bf16": {"enabled": true}, "train_micro_batch_size_per_gpu": 1,
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
EOF
launch() { timeout -k 5 400 bash "$root/tests/multinode/netns.sh" mpirun -np 4 "$ZOE_BIN" "$@"; }
# The last JSON object on stdin (one line or pretty-printed), on one line; nothing when there is none.
last_json() { /usr/bin/python3 -c 'import json, sys
text = sys.stdin.read()
for at in reversed([i for i, c in enumerate(text) if c == "{" and (i == 0 or text[i - 1] == "\n")]):
    try:
        print(json.dumps(json.JSONDecoder().raw_decode(text[at:])[0]))
        break
    except ValueError:
        pass'; }
sizes=4096,${modules//:[0-9]/}
plan() {
  "$ZOE_BIN" plan --preset demo --nodes 2 --gpus-per-node 2 --device cpu --seq 64 --micro-batch 1 \
    --config "$tmp/ds.json" --json "$@"
}

for ((r = 1; r <= rounds; ++r)); do
  launch bench comm --ops allgather,reducescatter --sizes "$sizes" --iters "$iters" --warmup 2 --json \
    2> "$tmp/comm.err" | last_json > "$tmp/comm.json"
  [ -s "$tmp/comm.json" ] || { cat "$tmp/comm.err" >&2; echo "plan_vs_comm: zoe bench comm failed" >&2; exit 1; }
  launch train --preset demo --config "$tmp/ds.json" --seq 64 --steps "$steps" --json --quiet \
    2> "$tmp/train.err" | last_json > "$tmp/train.json"
  [ -s "$tmp/train.json" ] || { tail -20 "$tmp/train.err" >&2; echo "plan_vs_comm: zoe train failed" >&2; exit 1; }
  read -r lat gbps one < <(/usr/bin/python3 "$here/plan_vs_comm.py" rates "$tmp/comm.json" "$modules") || exit 1
  plan --net-gbps "$gbps" --net-latency-us "$lat" > "$tmp/plan.json" || exit 1
  plan --net-gbps "$one" --net-latency-us "$lat" > "$tmp/plan1.json" || exit 1
  /usr/bin/python3 "$here/plan_vs_comm.py" report "$r" "$steps" "$lat" "$gbps" "$one" "$tmp" "${JSON:-}" || exit 1
done
