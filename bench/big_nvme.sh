#!/usr/bin/env bash
# A model bigger than the host's memory trained with every state on NVMe (by default the 2b preset:
# 2.05B parameters, 36.8 GB of model state; `zoe train --preset 2b --steps 2 --micro-batch 1
# --seq 64 --offload nvme --device-budget 2GiB`), against the drive's rates measured beside it with
# `zoe bench io` (1 MiB requests, queue depth 8, the engine's default aio point) before and after
# the run (their mean). Prints the run's breakdown and three ratios:
#  - steady step: the last step's wall time over max(its compute, its NVMe bytes read and written
#    at those rates) (target <= 1.15);
#  - initialisation: Engine::initialize()'s wall time over the model state's bytes written at the
#    write rate (target <= 1.2);
#  - peak RSS of the run (/usr/bin/time), against 2 GB, with the peak's mappings by kind
#    (bench/rss_trace.py: heap, malloc arenas, buffers, stacks, files).
# It writes the model state (37 GB for 2b) under $ZOE_SCRATCH (default /var/tmp); run it alone
# (flock -x /tmp/zoe-heavy.lock bench/big_nvme.sh).
# Usage: bench/big_nvme.sh [build dir] [preset] [steps] [device budget] [extra zoe train flags...]
set -euo pipefail
build=${1:-build}
preset=${2:-2b}
steps=${3:-2}
budget=${4:-2GiB}
shift $(($# < 4 ? $# : 4))
zoe="$build/bin/zoe"
[ -x "$zoe" ] || { echo "big_nvme.sh: $zoe not found (build first)" >&2; exit 1; }
scratch=$(mktemp -d "${ZOE_SCRATCH:-/var/tmp}/zoe-big.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
io_rates() {  # -> read GB/s, write GB/s of the drive now
  "$zoe" bench io --path "$scratch" --size 1GiB --bs 1MiB --qd 8 --rw read,write --loops 2 --json 2> /dev/null |
    /usr/bin/python3 -c 'import json, sys; r = {x["rw"]: x["gbps"] for x in json.load(sys.stdin)["rows"]}; print(r["read"], r["write"])'
}
read -r r1 w1 < <(io_rates)
t0=$(date +%s.%N)
/usr/bin/time -f "%M" -o "$scratch/rss.txt" "$zoe" train --preset "$preset" --steps "$steps" --micro-batch 1 --seq 64 \
  --offload nvme --nvme-path "$scratch" --device-budget "$budget" --json "$@" > "$scratch/out.json" 2> "$scratch/err.txt" &
timer=$!
# The run's resident memory every half second (seconds since the start, anonymous and file kB), to
# tell which phase holds the peak, and the peak's mappings grouped by kind (bench/rss_trace.py).
sleep 0.2
zpid=$(pgrep -P "$timer" | head -1 || true)
if [ -n "$zpid" ]; then
  /usr/bin/python3 "$(dirname "$0")/rss_trace.py" "$zpid" "$t0" "$scratch/rss-trace.txt" > "$scratch/rss-peak.json" || true
fi
wait "$timer" || { cat "$scratch/err.txt" >&2; exit 1; }
t1=$(date +%s.%N)
grep -v '^[[:space:]]*[0-9.]*$' "$scratch/err.txt" | grep -E "host buffers|warn" >&2 || true
read -r r2 w2 < <(io_rates)
touch "$scratch/rss-trace.txt" "$scratch/rss-peak.json"
/usr/bin/python3 - "$scratch/out.json" "$scratch/rss.txt" "$t0" "$t1" "$r1" "$w1" "$r2" "$w2" "$scratch/rss-trace.txt" \
  "$scratch/rss-peak.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
trace = [tuple(map(float, l.split())) for l in open(sys.argv[9]) if len(l.split()) == 3]
rss = int(open(sys.argv[2]).read().split()[-1]) * 1024
t0, t1, r1, w1, r2, w2 = map(float, sys.argv[3:9])
rd, wr = (r1 + r2) / 2 * 1e9, (w1 + w2) / 2 * 1e9
t = d["time_s"]
last = d["step_time_s"][-1]
per = d["step_bytes_per_param"][-1]
n = d["params"]
read_b, write_b = per["nvme->host"] * n, per["host->nvme"] * n
io_s = read_b / rd + write_b / wr
bound = max(last["compute"], io_s)
state = d["model_state_bytes"]
init_bound = state / wr
walls = [s["wall"] for s in d["step_time_s"]]
print(f"drive: read {r1:.2f} / {r2:.2f} GB/s, write {w1:.2f} / {w2:.2f} GB/s (before / after)")
print(f"wall {t1 - t0:.1f} s: initialise {t['initialize']:.1f} s, steps {' + '.join(f'{w:.1f}' for w in walls)} s, "
      f"loop and evaluation {t['total']:.1f} s, the rest (start, teardown) {t1 - t0 - t['initialize'] - t['total']:.1f} s")
print(f"summed over steps: compute {t['compute']:.1f} s, I/O stall {t['io_stall']:.1f} s, comm {t['comm']:.1f} s, "
      f"optimizer {t['optimizer']:.1f} s")
print(f"buffers: {json.dumps(d['buffers'])}")
print(f"high water: {json.dumps(d['high_water_bytes'])}")
print(f"steady step: {last['wall']:.1f} s for compute {last['compute']:.1f} s and {read_b / 1e9:.1f} GB read + "
      f"{write_b / 1e9:.1f} GB written ({io_s:.1f} s at the drive's rates): {last['wall'] / bound:.3f}x the bound "
      f"(target <= 1.15)")
print(f"initialisation: {t['initialize']:.1f} s for {state / 1e9:.1f} GB of model state ({init_bound:.1f} s at "
      f"{wr / 1e9:.2f} GB/s): {t['initialize'] / init_bound:.3f}x (target <= 1.2)")
print(f"  written at initialisation: {d['params'] * (d['model_state_bytes'] / d['params'] - 12) / 1e9:.1f} GB "
      f"(compute parameters and fp32 master; m and v read as zeros until the first update)")
print(f"peak RSS: {rss / 1e9:.2f} GB (target < 2 GB)")
peak = json.loads(open(sys.argv[10]).read() or "{}")
if peak:
    print(f"  at its peak ({peak['rss_mb'] / 1e3:.2f} GB resident at {peak['t']:.0f} s), by kind: "
          + ", ".join(f"{k} {v / 1e3:.2f} GB" for k, v in peak["kinds_mb"].items() if v >= 1))
    print("  its largest mappings (MB resident / size): "
          + ", ".join(f"{m['rss_mb']:.0f}/{m['size_mb']:.0f} {m['name']}" for m in peak["largest"]))
if trace:
    # Initialisation ends about when the first step starts: the trace's time of the loop's start is
    # the run's wall time less the loop, evaluation and teardown.
    init_end = (t1 - t0) - t["total"] - 0.5
    for name, part in (("initialisation", [x for x in trace if x[0] <= init_end]),
                       ("steps and evaluation", [x for x in trace if x[0] > init_end])):
        if part:
            top = max(part, key=lambda x: x[1] + x[2])
            print(f"  {name}: peak resident {(top[1] + top[2]) / 1e6:.2f} GB ({top[1] / 1e6:.2f} anonymous, "
                  f"{top[2] / 1e6:.2f} file) at {top[0]:.0f} s")
print(f"losses: {d['losses']}")
PY
