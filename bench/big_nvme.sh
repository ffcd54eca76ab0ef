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
#  - peak RSS of the run (/usr/bin/time), against 2 GB.
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
# tell which phase holds the peak.
sleep 0.2
zpid=$(pgrep -P "$timer" | head -1 || true)
while [ -n "$zpid" ] && kill -0 "$zpid" 2> /dev/null; do
  awk -v t="$(date +%s.%N)" -v t0="$t0" '/^RssAnon|^RssFile/ {v[$1] = $2} END {if (length(v)) print t - t0, v["RssAnon:"], v["RssFile:"]}' \
    "/proc/$zpid/status" 2> /dev/null >> "$scratch/rss-trace.txt" || true
  sleep 0.5
done
wait "$timer" || { cat "$scratch/err.txt" >&2; exit 1; }
t1=$(date +%s.%N)
grep -v '^[[:space:]]*[0-9.]*$' "$scratch/err.txt" | grep -E "host buffers|warn" >&2 || true
read -r r2 w2 < <(io_rates)
touch "$scratch/rss-trace.txt"
/usr/bin/python3 - "$scratch/out.json" "$scratch/rss.txt" "$t0" "$t1" "$r1" "$w1" "$r2" "$w2" "$scratch/rss-trace.txt" <<'PY'
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
print(f"peak RSS: {rss / 1e9:.2f} GB (target < 2 GB)")
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
