#!/usr/bin/env bash
# The activation tier: `zoe train --activation-checkpointing` keeps each block's input of the
# reference GPT in the engine's activation store (device -> pinned host -> NVMe) and recomputes the
# block in the backward. Three measurements, each run under its own exclusive lock on
# $ZOE_BENCH_LOCK (default /tmp/zoe-heavy.lock; builds take it shared), each well under 8 minutes:
#
#  long      A long sequence: the demo preset's width (d_model 256, 8 heads) at --seq/--context
#            SEQ, LAYERS blocks, where the checkpointed block inputs are >= 10x the engine's device
#            budget. With --activation-offload cpu they reach host memory, and with the host's
#            activation budget lowered (--activation-host-budget) NVMe; the device high-water mark
#            (StepStats, the store's device tier included) must stay under the device budget, and
#            both runs must give the same losses. `zoe plan` of the same run shows where it would
#            place the block inputs.
#            The last block input never leaves the device (keep_last), so the device budget holds
#            at least one of them beside the placement: the ratio checkpoints / budget is below the
#            number of blocks, hence more blocks than the demo preset's 6 for 10x.
#  overhead  The step with the block inputs on NVMe against the same run with recompute and no
#            offload (every block input kept on the device), alternated ROUNDS times in one run,
#            the median of the ratios; the losses must be equal. Beside it the I/O lower bound: the
#            NVMe run's activation bytes per step over the drive's read and write rates (`zoe bench
#            io` at the store's 8 MiB runs), and the bound's ratio max(base, io) / base.
#  rss       Peak host RSS (/usr/bin/time) of the NVMe run at two host activation budgets, and the
#            run with everything in host memory: the RSS grows with the budget, by no more than it.
#
# Usage: bench/activation_offload.sh [build dir] [long|overhead|rss|all] [ROUNDS]
set -euo pipefail
build=${1:-build}
what=${2:-all}
rounds=${3:-5}
zoe="$build/bin/zoe"
lock=${ZOE_BENCH_LOCK:-/tmp/zoe-heavy.lock}
[ -x "$zoe" ] || { echo "activation_offload.sh: $zoe not found (build first)" >&2; exit 1; }
scratch=$(mktemp -d "${ZOE_SCRATCH:-/var/tmp}/zoe-act.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
py=/usr/bin/python3

# train NAME ARGS...: runs zoe train --json under /usr/bin/time, keeps NAME.json and NAME.rss (KiB).
train() {
  local name=$1
  shift
  /usr/bin/time -f %M -o "$scratch/$name.rss" "$zoe" train --json --quiet --seed 3 --eval-batches 1 "$@" \
    > "$scratch/$name.json" 2> "$scratch/$name.err" || { cat "$scratch/$name.err" >&2; exit 1; }
}
# field NAME EXPR: a Python expression over the run's JSON `d` (n: its steps).
field() {
  $py -c "import json,sys; d=json.load(open('$scratch/$1.json')); n=len(d['losses']); print($2)"
}
same_losses() {
  [ "$(field "$1" 'd["losses"]')" = "$(field "$2" 'd["losses"]')" ] ||
    { echo "activation_offload.sh: $1 and $2 trained to different losses" >&2; exit 1; }
}
mib() { $py -c "print(f'{$1 / 1048576:.1f}')"; }

long() {
  local layers=${LONG_LAYERS:-24} seq=${LONG_SEQ:-512} micro=${LONG_MICRO:-8} budget=${LONG_BUDGET:-9MiB}
  local args=(--preset demo --layers "$layers" --context "$seq" --seq "$seq" --micro-batch "$micro" --steps 3
              --offload nvme --nvme-path "$scratch" --device-budget "$budget" --activation-checkpointing)
  echo "## long sequence: demo width, $layers blocks, seq $seq, micro-batch $micro, --device-budget $budget"
  "$zoe" plan --preset demo --layers "$layers" --context "$seq" --seq "$seq" --micro-batch "$micro" \
    --device cpu --device-mem 1GiB --activation-device-budget 4MiB --activation-checkpointing --activation-offload nvme \
    --activation-host-budget 48MiB --top 3 2> /dev/null || true
  train long-cpu "${args[@]}" --activation-offload cpu
  train long-nvme "${args[@]}" --activation-offload nvme --activation-host-budget 48MiB
  same_losses long-cpu long-nvme
  printf "%-10s %12s %12s %9s %12s %12s %12s %12s %8s\n" run ckpt_MiB budget_MiB ratio device_hw act_dev_hw \
    act_host_hw act_nvme_hw s/step
  for r in long-cpu long-nvme; do
    printf "%-10s %12s %12s %9s %12s %12s %12s %12s %8s\n" "$r" \
      "$(mib "$(field $r 'd["activation_checkpoint_bytes"]')")" "$(mib "$(field $r 'd["device_budget_bytes"]')")" \
      "$(field $r '"%.1fx" % (d["activation_checkpoint_bytes"] / d["device_budget_bytes"])')" \
      "$(mib "$(field $r 'd["high_water_bytes"]["device"]')")" \
      "$(mib "$(field $r 'd["high_water_bytes"]["activation_device"]')")" \
      "$(mib "$(field $r 'd["high_water_bytes"]["activation_host"]')")" \
      "$(mib "$(field $r 'd["high_water_bytes"]["activation_nvme"]')")" \
      "$(field $r '"%.2f" % (d["time_s"]["total"] / n)')"
    [ "$(field $r 'int(d["high_water_bytes"]["device"] <= d["device_budget_bytes"])')" = 1 ] ||
      { echo "activation_offload.sh: $r's device high-water is over the device budget" >&2; exit 1; }
  done
}

io_rates() {  # -> read GB/s, write GB/s of the drive at the store's 8 MiB runs
  "$zoe" bench io --path "$scratch" --size 512MiB --bs 8MiB --qd 2 --rw read,write --loops 2 --json 2> /dev/null |
    $py -c 'import json, sys; r = {x["rw"]: x["gbps"] for x in json.load(sys.stdin)["rows"]}; print(r["read"], r["write"])'
}

overhead() {
  local seq=${OVER_SEQ:-512} micro=${OVER_MICRO:-8}
  local tensor=$((micro * seq * 256 * 4))
  cat > "$scratch/none.json" <<JSON
{"train_micro_batch_size_per_gpu": $micro, "zero_optimization": {"stage": 3}, "bf16": {"enabled": true}}
JSON
  # The device's share holds the last block input; the host's budget only the NVMe tier's buffers
  # (two write runs of an eighth of it, three read-ahead blocks).
  cat > "$scratch/nvme.json" <<JSON
{"train_micro_batch_size_per_gpu": $micro, "zero_optimization": {"stage": 3}, "bf16": {"enabled": true},
 "activation_checkpointing": {},
 "zoe": {"activation_offload": "nvme", "activation_nvme_path": "$scratch", "activation_device_budget": $tensor,
         "activation_host_budget": $((4 * tensor))}}
JSON
  local args=(--preset demo --context "$seq" --seq "$seq" --steps 4 --activation-checkpointing)
  echo "## overhead: demo, seq $seq, micro-batch $micro: block inputs on NVMe vs recompute without offload"
  printf "%-6s %10s %10s %8s %10s %10s %8s %14s\n" round none_s nvme_s ratio io_s bound stall_s nvme_MiB/step
  local ratios=() bounds=()
  for ((k = 1; k <= rounds; ++k)); do
    train over-none --config "$scratch/none.json" "${args[@]}"
    train over-nvme --config "$scratch/nvme.json" "${args[@]}"
    same_losses over-none over-nvme
    read -r gr gw < <(io_rates)
    # Steady state: the steps after the first (its time includes the first plan and file growth).
    local base nv io rw
    base=$(field over-none 'sum(s["wall"] for s in d["step_time_s"][1:]) / (n - 1)')
    nv=$(field over-nvme 'sum(s["wall"] for s in d["step_time_s"][1:]) / (n - 1)')
    rw=$(field over-nvme '"%f %f" % (d["activation_bytes_moved"]["nvme->host"] / n, d["activation_bytes_moved"]["host->nvme"] / n)')
    io=$($py -c "r, w = map(float, '$rw'.split()); print(r / ($gr * 1e9) + w / ($gw * 1e9))")
    read -r ratio bound < <($py -c "print(f'{$nv / $base:.3f} {max($base, $io) / $base:.3f}')")
    ratios+=("$ratio")
    bounds+=("$bound")
    printf "%-6s %10.3f %10.3f %8s %10.3f %10s %8s %14s\n" "$k" "$base" "$nv" "$ratio" "$io" "$bound" \
      "$(field over-nvme '"%.2f" % d["time_s"]["activation_stall"]')" \
      "$($py -c "r, w = map(float, '$rw'.split()); print(f'{(r + w) / 1048576:.1f}')")"
  done
  $py -c "import statistics as s; r = [$(IFS=,; echo "${ratios[*]}")]; b = [$(IFS=,; echo "${bounds[*]}")];
print(f'median nvme / none = {s.median(r):.3f} (target <= 1.15); median I/O bound ratio = {s.median(b):.3f}')"
}

rss() {
  local layers=${RSS_LAYERS:-12} seq=${RSS_SEQ:-512} micro=${RSS_MICRO:-8}
  local args=(--preset demo --layers "$layers" --context "$seq" --seq "$seq" --micro-batch "$micro" --steps 2
              --offload nvme --nvme-path "$scratch" --device-budget 16MiB --activation-checkpointing)
  echo "## peak host RSS: demo width, $layers blocks, seq $seq, micro-batch $micro"
  train rss-32 "${args[@]}" --activation-offload nvme --activation-host-budget 32MiB
  train rss-64 "${args[@]}" --activation-offload nvme --activation-host-budget 64MiB
  train rss-cpu "${args[@]}" --activation-offload cpu
  same_losses rss-32 rss-64
  same_losses rss-32 rss-cpu
  printf "%-8s %12s %12s %12s %12s\n" run ckpt_MiB act_host_hw act_nvme_hw peak_rss_MiB
  for r in rss-32 rss-64 rss-cpu; do
    printf "%-8s %12s %12s %12s %12s\n" "$r" "$(mib "$(field $r 'd["activation_checkpoint_bytes"]')")" \
      "$(mib "$(field $r 'd["high_water_bytes"]["activation_host"]')")" \
      "$(mib "$(field $r 'd["high_water_bytes"]["activation_nvme"]')")" "$(mib "$(($(cat "$scratch/$r.rss") * 1024))")"
  done
  $py -c "a = $(cat "$scratch/rss-32.rss"); b = $(cat "$scratch/rss-64.rss"); c = $(cat "$scratch/rss-cpu.rss")
print(f'peak RSS 64 MiB budget - 32 MiB budget = {(b - a) / 1024:.1f} MiB (the budgets differ by 32 MiB: {(b - a) / 32768:.2f}x); '
      f'everything in host memory - 32 MiB budget = {(c - a) / 1024:.1f} MiB')"
}

for piece in long overhead rss; do
  if [ "$what" = all ] || [ "$what" = "$piece" ]; then
    flock -x "$lock" "$0" "$build" "$piece-locked" "$rounds"
  fi
done
case "$what" in
  long-locked) long ;;
  overhead-locked) overhead ;;
  rss-locked) rss ;;
esac
