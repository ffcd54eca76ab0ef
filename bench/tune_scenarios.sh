#!/usr/bin/env bash
# zoe tune against exhaustive measured grids in seven scenarios on this machine: zoe's GPT from the
# demo to the large preset, with budgets that leave the optimizer states on the device, force them
# to host RAM or stage 3, and force them to NVMe, and the demo at micro-batch 1 (a step of small
# GEMMs, where fixed costs weigh most). Each runs bench/tune_vs_grid.sh; the summary
# gives, per scenario, the grid's size, the prediction error (max and median over the grid's rows,
# max over tune's verified candidates), tune's time, and its pick against the grid's best.
# Targets: every error within 20 %, medians <= 10 %, pick <= 1.10x the best, tune <= 180 s.
#
# Usage: bench/tune_scenarios.sh [DIR] [ONLY]   (DIR: the NVMe scratch, default /var/tmp; ONLY: a
#        comma-separated list of scenario names to run)
# Env:   ZOE=path/to/zoe (default build/bin/zoe), STEPS=8 (per grid run), OUT=results.json,
#        SETTLE=30 (seconds of rest before each scenario after the first: on a virtual machine the
#        host flushes the previous grid's NVMe writes for a while after, and the cores run slower
#        meanwhile, which the next calibration would measure); each grid's settle gate
#        (bench/tune_vs_grid.sh) then waits until the machine runs as fast as the fastest probe
#        of the whole run
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/var/tmp}
only=${2:-}
zoe=${ZOE:-$here/build/bin/zoe}
steps=${STEPS:-8}
out=${OUT:-}
res=$(mktemp -d "${TMPDIR:-/tmp}/zoe-tune-scenarios.XXXXXX")
trap 'rm -rf "$res"' EXIT
# name | preset | micro-batch | plan flags | top rows
scenarios=(
  "small-free|small|8||12"
  "demo-56MiB|demo|8|--device-mem 56MiB|12"
  "demo-44MiB|demo|8|--device-mem 44MiB|8"
  "demo-16MiB-mb1|demo|1|--device-mem 16MiB|8"
  "medium-512MiB|medium|4|--device-mem 512MiB|8"
  "medium-nvme|medium|4|--device-mem 512MiB --host-mem 512MiB|8"
  "large-2GiB|large|1|--device-mem 2GiB|6"
)
settle=${SETTLE:-30}
first=1
for s in "${scenarios[@]}"; do
  IFS='|' read -r name preset micro flags top <<< "$s"
  if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then continue; fi
  if [ $first = 0 ]; then sleep "$settle"; fi
  first=0
  echo "== $name: $preset, micro-batch $micro, ${flags:-no budget flags}" >&2
  PLAN_FLAGS="$flags" MICRO="$micro" ZOE="$zoe" JSON="$res/$name.json" \
    PROBE_BEST="$res/probe_best" bash "$here/bench/tune_vs_grid.sh" "$preset" "$steps" "$dir" "$top" | tee "$res/$name.txt" || true
done
/usr/bin/python3 - "$res" "$out" <<'PY'
import glob, json, os, sys
res, out = sys.argv[1], sys.argv[2]
rows = []
for path in sorted(glob.glob(f"{res}/*.json")):
    d = json.load(open(path))
    d["scenario"] = os.path.basename(path)[:-5]
    rows.append(d)
print(f"{'scenario':<16} {'rows':>4} {'max err':>8} {'median':>7} {'verified':>9} {'tune s':>7} {'pick/best':>10}")
for d in rows:
    v = d.get("verified_max_error")
    print(f"{d['scenario']:<16} {len(d['rows']):>4} {100 * d['max_error']:>7.1f}% {100 * d['median_error']:>6.1f}% "
          f"{'-' if v is None else f'{100 * v:.1f}%':>9} {d['tune_s']:>7.0f} {d['ratio_to_best']:>9.3f}x"
          f"{'' if d['ok'] else ' FAILED'}")
if out:
    json.dump(rows, open(out, "w"), indent=2)
PY
