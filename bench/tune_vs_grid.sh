#!/usr/bin/env bash
# zoe tune's pick against a grid of real runs: every placement `zoe plan` says fits (the top N by
# predicted time) is trained for a few steps with `zoe train`, and the measured step times are
# ranked. Prints, per placement, predicted and measured seconds per step, then the rank of
# tune's pick among the measured times and the ratio of its time to the grid's best (target:
# rank 1, ratio <= 1.10). Rows alternate order between rounds, since a shared machine drifts.
#
# Usage: bench/tune_vs_grid.sh [PRESET] [STEPS] [DIR] [TOP]     (defaults: small 8 /var/tmp 12)
# Env:   ZOE=path/to/zoe (default build/bin/zoe), MICRO=8 (sequences per micro-batch),
#        VERIFY=3 (tune's --verify K: the measured best of its K best is its pick),
#        JSON=out.json to also write the results as JSON, PLAN_FLAGS="--device-mem 16MiB ..." for
#        the budgets tune and plan search under (the grid's configs inherit the tuned config's),
#        SETTLE_MAX=90 (seconds the settle gate below may wait), PROBE_BEST=FILE (the fastest
#        probe, kept across runs: bench/tune_scenarios.sh passes one file to all its scenarios).
# Settle gate: on a virtual machine, gigabytes written to the drive leave the host flushing them
# for tens of seconds, and the cores run up to a third slower meanwhile. Before the calibration
# and before each grid run, a probe (10 steps of the small preset, no offload, under a second) is
# repeated until its median step is within 4 % of the fastest probe seen, so that tune, its
# verification and the grid are measured at the same machine speed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
preset=${1:-small}
steps=${2:-8}
dir=${3:-/var/tmp}
top=${4:-12}
zoe=${ZOE:-$here/build/bin/zoe}
micro=${MICRO:-8}
py=/usr/bin/python3
[ -x "$zoe" ] || { echo "no zoe binary at $zoe (build first, or set ZOE=)" >&2; exit 1; }
work=$(mktemp -d "$dir/zoe-tune-grid.XXXXXX")
trap 'rm -rf "$work"' EXIT

probe_best=${PROBE_BEST:-$work/probe_best}
settle() {
  local start now p tries=0
  start=$(date +%s)
  while :; do
    tries=$((tries + 1))
    p=$("$zoe" train --preset small --steps 10 --micro-batch 8 --quiet --json |
      $py -c 'import json,sys; w=sorted(t["wall"] for t in json.load(sys.stdin)["step_time_s"][2:]); print(w[len(w)//2])')
    now=$(date +%s)
    if $py - "$probe_best" "$p" "$((now - start))" "${SETTLE_MAX:-90}" "$1" "$tries" <<'PY'; then return 0; fi
import os, sys
path, p, waited, most, what = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
tries = int(sys.argv[6])
best = min(float(open(path).read()), p) if os.path.exists(path) else p
open(path, "w").write(f"{best}\n")
if p <= 1.04 * best:
    if tries > 1:
        print(f"# settle: {what}: waited {waited} s for the machine's speed", file=sys.stderr)
    sys.exit(0)
if waited >= most:
    print(f"# settle: {what}: still {100 * (p / best - 1):.0f}% slower than the fastest probe after "
          f"{waited} s; measured anyway", file=sys.stderr)
    sys.exit(0)
sys.exit(1)
PY
    sleep 3
  done
}

# shellcheck disable=SC2206
common=(--preset "$preset" --device cpu --nvme-path "$work" --micro-batch "$micro" ${PLAN_FLAGS:-})
echo "# calibrating and tuning ($preset, micro-batch $micro)" >&2
settle "before the calibration"
t0=$(date +%s)
# shellcheck disable=SC2086
"$zoe" tune "${common[@]}" --calibrate --calibration-out "$work/cal.json" --out "$work/tuned.json" \
  --verify "${VERIFY:-3}" --json > "$work/tune.json"
tune_s=$(($(date +%s) - t0))
"$zoe" plan "${common[@]}" --calibration "$work/cal.json" --json > "$work/plan.json"

# One config per fitting row: the tuned config with the row's placement.
$py - "$work" "$top" "$micro" <<'PY'
import json, sys
work, top, micro = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = json.load(open(f"{work}/tuned.json"))
rows = [r for r in json.load(open(f"{work}/plan.json"))["rows"] if r["fits"]][:top]
for i, r in enumerate(rows):
    p, c = r["placement"], json.loads(json.dumps(base))
    z = c["zero_optimization"]
    z["stage"] = p["stage"]
    for key, dev in (("offload_param", p["offload_param"]), ("offload_optimizer", p["offload_optimizer"])):
        z[key]["device"] = dev
        if dev == "nvme":
            z[key]["nvme_path"] = [work]
    c["zoe"]["offload_ratio"] = p["offload_ratio"] if p["offload_ratio"] is not None else 1.0
    c["zoe"]["bf16_optimizer_states"] = p["bf16_optimizer_states"]
    # The sizes zoe chooses itself (swap buffers and chunk, staging, host cache) that tune wrote
    # for its own pick: left to zoe for this row's placement, as zoe plan's prediction assumes.
    z.pop("sub_group_size", None)
    z["offload_optimizer"].pop("buffer_count", None)
    for key in ("buffer_size", "max_in_cpu"):
        z["offload_param"].pop(key, None)
    # The grid's rows run at MICRO sequences per step, without accumulation (tune may have chosen a
    # smaller micro-batch with accumulation for the same batch; its own config runs as written).
    c["train_micro_batch_size_per_gpu"], c["gradient_accumulation_steps"] = micro, 1
    c["train_batch_size"] = micro
    json.dump(c, open(f"{work}/row{i}.json", "w"))
    json.dump({"placement": p, "predicted_step_s": r["predicted_step_s"]}, open(f"{work}/row{i}.meta", "w"))
PY

n=$(ls "$work"/row*.json 2>/dev/null | wc -l)
[ "$n" -gt 0 ] || { echo "no placement fits" >&2; exit 1; }
run_tuned() {
  echo "# round $1: tune's config" >&2
  settle "round $1, tune's config"
  # As written: its micro-batch and accumulation are tune's choice (the same sequences per step).
  "$zoe" train --config "$work/tuned.json" --preset "$preset" --steps "$steps" --quiet --json \
    > "$work/tuned.run$1"
}
# Round 1: the rows, then tune's config; round 2: tune's config, then the rows in reverse.
for round in 1 2; do
  order=$(seq 0 $((n - 1)))
  if [ "$round" = 2 ]; then
    order=$(seq $((n - 1)) -1 0)
    run_tuned 2
  fi
  for i in $order; do
    echo "# round $round: row $i of $n" >&2
    settle "round $round, row $i"
    "$zoe" train --config "$work/row$i.json" --preset "$preset" --steps "$steps" --micro-batch "$micro" \
      --quiet --json > "$work/row$i.run$round"
  done
  if [ "$round" = 1 ]; then run_tuned 1; fi
done

$py - "$work" "$n" "$steps" "${JSON:-}" "$tune_s" <<'PY'
import json, sys
work, n, steps, out, tune_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
def step_s(path):
    # The median wall time of the steps after the first two (the first records the fetch order,
    # the second is the first prefetched one), as tune's --verify times them.
    j = json.load(open(path))
    walls = sorted(t["wall"] for t in j["step_time_s"][2:]) or [j["time_s"]["total"]]
    return walls[len(walls) // 2]
rows = []
for i in range(n):
    m = json.load(open(f"{work}/row{i}.meta"))
    t = min(step_s(f"{work}/row{i}.run1"), step_s(f"{work}/row{i}.run2"))
    rows.append({"placement": m["placement"], "predicted_step_s": m["predicted_step_s"],
                 "measured_step_s": t})
tuned = min(step_s(f"{work}/tuned.run1"), step_s(f"{work}/tuned.run2"))
best = min(r["measured_step_s"] for r in rows)
rank = 1 + sum(r["measured_step_s"] < tuned for r in rows)
print(f"{'stage':>5} {'params':>6} {'optim':>5} {'ratio':>5} {'bf16st':>6} {'predicted':>10} "
      f"{'measured':>10}")
print(f"{'':>5} {'':>6} {'':>5} {'':>5} {'':>6} {'(s)':>10} {'(s)':>10}")
for r in sorted(rows, key=lambda r: r["measured_step_s"]):
    p = r["placement"]
    ratio = "-" if p["offload_ratio"] is None else f"{p['offload_ratio']:g}"
    print(f"{p['stage']:>5} {p['offload_param']:>6} {p['offload_optimizer']:>5} {ratio:>5} "
          f"{'on' if p['bf16_optimizer_states'] else 'off':>6} {r['predicted_step_s']:>10.4g} "
          f"{r['measured_step_s']:>10.4g}")
ok = rank == 1 or tuned <= 1.10 * best
errs = sorted(abs(r["predicted_step_s"] - r["measured_step_s"]) / r["measured_step_s"] for r in rows)
tj = json.load(open(f"{work}/tune.json"))
verr = sorted(abs(v["error"]) for v in tj.get("verified", []))
med = lambda a: a[len(a) // 2] if len(a) % 2 else (a[len(a) // 2 - 1] + a[len(a) // 2]) / 2
print(f"# prediction error over the grid's rows: max {100 * errs[-1]:.1f}%, median {100 * med(errs):.1f}%; "
      f"over tune's verified candidates: max {100 * verr[-1]:.1f}%" if verr else "")
print(f"# tune (calibration, search, verification): {tune_s:.0f} s (target <= 180 s)")
print(f"# tune's pick: {tuned:.4g} s/step, rank {rank} of {n + 1}, {tuned / best:.3f}x the grid's best: "
      f"{'OK' if ok else 'FAILED'}")
if out:
    json.dump({"rows": rows, "tuned_step_s": tuned, "rank": rank, "ratio_to_best": tuned / best, "ok": ok,
               "max_error": errs[-1], "median_error": med(errs), "verified_max_error": verr[-1] if verr else None,
               "tune_s": tune_s, "verified": [{k: v[k] for k in ("placement", "predicted_step_s", "measured_step_s",
                                                                   "error")} for v in tj.get("verified", [])]},
              open(out, "w"), indent=2)
sys.exit(0 if ok else 1)
PY
