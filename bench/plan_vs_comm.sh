#!/usr/bin/env bash
# zoe plan's network term against the communication time of a measured stage-3 step, on two test
# nodes of this machine (tests/multinode/netns.sh: 2 nodes x 2 ranks over TCP). Each round, in
# this order: `zoe bench comm` (all-gather and reduce-scatter at 4 KiB and at SIZE) gives the
# latency (the mean time at 4 KiB) and the rate beyond it ((w-1)/w SIZE over the time at SIZE less
# the latency); `zoe train --preset demo` (stage 3, bf16, every module partitioned) runs STEPS
# steps and its time_s.comm per step (the median of steps 2..STEPS) is the measured time;
# `zoe plan --preset demo --nodes 2 --gpus-per-node 2 --device cpu --seq 64` with those two values
# predicts busy_s.network of the same placement. Also printed, as the baseline of the same round:
# the prediction without a latency term at bench comm's busbw at SIZE (the rate its table shows).
#
# Usage: flock -x /tmp/zoe-heavy.lock bench/plan_vs_comm.sh [ROUNDS] [STEPS] [SIZE]
#        (defaults 1 6 2MiB; one round takes about a minute here)
# Env:   ZOE_BIN (default build/bin/zoe), MN_PREFIX / MN_SUBNET (default zoenp / 10.79.0),
#        JSON=out.json to also write every round's figures. Exit 77 when network namespaces cannot
#        be made here.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
rounds=${1:-1}
steps=${2:-6}
size=${3:-2MiB}
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
{"bf16": {"enabled": true},
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

for ((r = 1; r <= rounds; ++r)); do
  launch bench comm --ops allgather,reducescatter --sizes "4KiB,$size" --iters 5 --warmup 2 --json \
    2> "$tmp/comm.err" | last_json > "$tmp/comm.json"
  [ -s "$tmp/comm.json" ] || { cat "$tmp/comm.err" >&2; echo "plan_vs_comm: zoe bench comm failed" >&2; exit 1; }
  launch train --preset demo --precision bf16 --steps "$steps" --json --quiet \
    2> "$tmp/train.err" | last_json > "$tmp/train.json"
  [ -s "$tmp/train.json" ] || { tail -20 "$tmp/train.err" >&2; echo "plan_vs_comm: zoe train failed" >&2; exit 1; }
  read -r lat gbps busbw < <(/usr/bin/python3 - "$tmp/comm.json" << 'PY'
import json, sys
j = json.load(open(sys.argv[1]))
small = min(r["bytes"] for r in j["rows"])
big = max(r["bytes"] for r in j["rows"])
w = j["ranks"]
lat = [r["time_us"] for r in j["rows"] if r["bytes"] == small]
lat = sum(lat) / len(lat)
at = [r for r in j["rows"] if r["bytes"] == big]
# Bus bytes (w-1)/w of the size, over the time beyond the latency.
rate = sum((w - 1) / w * r["bytes"] / ((r["time_us"] - lat) * 1e3) for r in at) / len(at)
busbw = sum(r["busbw_gbps"] for r in at) / len(at)
print(f"{lat:.1f} {rate:.6g} {busbw:.6g}")
PY
)
  plan() {
    "$ZOE_BIN" plan --preset demo --nodes 2 --gpus-per-node 2 --device cpu --seq 64 --config "$tmp/ds.json" \
      --json "$@"
  }
  plan --net-gbps "$gbps" --net-latency-us "$lat" > "$tmp/plan.json" || exit 1
  plan --net-gbps "$busbw" --net-latency-us 0.001 > "$tmp/plan0.json" || exit 1
  /usr/bin/python3 - "$r" "$steps" "$lat" "$gbps" "$busbw" "$tmp" "${JSON:-}" << 'PY' || exit 1
import json, os, statistics, sys
r, steps, lat, gbps, busbw, tmp, out = sys.argv[1:8]
train = json.load(open(f"{tmp}/train.json"))
comm = [s["comm"] for s in train["step_time_s"]][1:]
measured = statistics.median(comm)
def row(path):
    for x in json.load(open(path))["rows"]:
        p = x["placement"]
        if p["stage"] == 3 and p["offload_param"] == "none" and p["offload_optimizer"] == "none":
            return x
    sys.exit("plan_vs_comm: no stage-3 row without offload in zoe plan's output")
new, old = row(f"{tmp}/plan.json"), row(f"{tmp}/plan0.json")
pred, pred0 = new["busy_s"]["network"], old["busy_s"]["network"]
err, err0 = (pred - measured) / measured, (pred0 - measured) / measured
print(f"round {r}: bench comm latency {float(lat):.0f} us, {float(gbps):.4f} GB/s beyond it "
      f"(busbw at the size {float(busbw):.4f} GB/s); {new['link_bytes']['collectives']} collectives, "
      f"{new['link_bytes']['network'] / 1e6:.2f} MB per rank per step")
print(f"round {r}: measured comm {measured:.3f} s/step (median of steps 2-{steps}: "
      + " ".join(f"{c:.3f}" for c in comm) + ")")
print(f"round {r}: predicted {pred:.3f} s ({100 * err:+.1f} %); without latency at busbw {pred0:.3f} s "
      f"({100 * err0:+.1f} %)")
if out:
    rows = json.load(open(out)) if os.path.exists(out) and os.path.getsize(out) else []
    rows.append({"round": int(r), "latency_us": float(lat), "net_gbps": float(gbps), "busbw_gbps": float(busbw),
                 "measured_comm_s": measured, "comm_per_step_s": comm, "predicted_s": pred, "error": err,
                 "predicted_without_latency_s": pred0, "error_without_latency": err0,
                 "collectives": new["link_bytes"]["collectives"], "network_bytes": new["link_bytes"]["network"]})
    json.dump(rows, open(out, "w"), indent=1)
PY
done
