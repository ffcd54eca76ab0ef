#!/usr/bin/env bash
# The offloaded step against the no-offload step, measured alternately in one run: zoe train on
# the demo preset (bf16, stage 3) with no offload, with parameters and optimizer states on NVMe
# and a serial step (zoe.overlap_step false), and the same with the update overlapped behind the
# next forward (the default), and that with 36 swapper buffers (offload_optimizer.buffer_count).
# The default run sets none of the swapper's or the tier manager's sizing knobs: zoe sizes them from
# the host share (zoe.host_budget, or the host's memory / 16), and the run's JSON (`buffers`) says
# what it chose, printed beside the ratio.
# Prints each run's seconds per step and the ratios to the no-offload run of the same round; the
# losses of the NVMe runs must be equal (they are checked). Each round also measures the drive with
# `zoe bench io` (1 MiB requests, queue depth 8, the engine's default aio point): the I/O lower
# bound of a step is the overlapped run's NVMe bytes per step over those read and write GB/s, and
# the bound ratio is its time over max(no-offload step, I/O bound) (the large preset's target:
# <= 1.15).
# Usage: bench/overlap.sh [build dir] [rounds] [steps] [preset] [device budget] [micro-batch]
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
steps=${3:-30}
preset=${4:-demo}
budget=${5:-16MiB}
micro=${6:-8}
zoe="$build/bin/zoe"
[ -x "$zoe" ] || { echo "overlap.sh: $zoe not found (build first)" >&2; exit 1; }
scratch=$(mktemp -d "${ZOE_SCRATCH:-/var/tmp}/zoe-overlap.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cat > "$scratch/none.json" <<JSON
{"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}}
JSON
for ov in false true; do
  cat > "$scratch/nvme-$ov.json" <<JSON
{"zero_optimization": {"stage": 3,
  "offload_optimizer": {"device": "nvme", "nvme_path": "$scratch"},
  "offload_param": {"device": "nvme", "nvme_path": "$scratch"}},
 "bf16": {"enabled": true}, "zoe": {"device_budget": "$budget", "overlap_step": $ov}}
JSON
done
# The overlapped step with 36 swapper buffers (9 slots: 8 chunks of the next update read during
# the backward), a knob zoe tune searches; DeepSpeed's default is 4 (zoe's minimum, 3 slots, 12).
cat > "$scratch/nvme-buffers.json" <<JSON
{"zero_optimization": {"stage": 3,
  "offload_optimizer": {"device": "nvme", "nvme_path": "$scratch", "buffer_count": 36},
  "offload_param": {"device": "nvme", "nvme_path": "$scratch"}},
 "bf16": {"enabled": true}, "zoe": {"device_budget": "$budget", "overlap_step": true}}
JSON
run() {  # config -> seconds per step (wall time of the steps, from the JSON), and the losses
  "$zoe" train --config "$1" --preset "$preset" --steps "$steps" --micro-batch "$micro" --quiet --json \
    > "$scratch/out.json" 2> "$scratch/err.txt" || { cat "$scratch/err.txt" >&2; exit 1; }
  /usr/bin/python3 - "$scratch/out.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t = d["time_s"]
losses = json.dumps(d["losses"], separators=(",", ":"))
b = d["bytes_moved"]
n = len(d["losses"])
u = d["buffers"]
print(f'{t["total"] / n:.6f} {losses} {t["compute"]:.3f} {t["io_stall"]:.3f} {t["optimizer"]:.3f} {t["comm"]:.3f} '
      f'{b["nvme->host"] / n:.0f} {b["host->nvme"] / n:.0f} {u["swap_buffer_count"]}')
PY
}
io_rates() {  # -> read GB/s, write GB/s of the drive now
  "$zoe" bench io --path "$scratch" --size 512MiB --bs 1MiB --qd 8 --rw read,write --loops 2 --json 2> /dev/null |
    /usr/bin/python3 -c 'import json, sys; r = {x["rw"]: x["gbps"] for x in json.load(sys.stdin)["rows"]}; print(r["read"], r["write"])'
}
printf "%-6s %-22s %10s %8s   %s\n" round run s/step ratio "compute / io_stall / optimizer / comm (s)"
declare -a r_serial r_overlap r_buffers r_bound t_base t_overlap t_buffers
for ((k = 1; k <= rounds; ++k)); do
  read -r base _ bc bi bo bm _ _ _ < <(run "$scratch/none.json")
  read -r ser ls sc si so sm _ _ _ < <(run "$scratch/nvme-false.json")
  read -r ovl lo oc oi oo om rd wr ob < <(run "$scratch/nvme-true.json")
  read -r gr gw < <(io_rates)
  read -r buf lb uc ui uo um _ _ _ < <(run "$scratch/nvme-buffers.json")
  if [ "$ls" != "$lo" ] || [ "$ls" != "$lb" ]; then
    echo "overlap.sh: the overlapped runs' losses differ from the serial run's" >&2; exit 1
  fi
  rs=$(/usr/bin/python3 -c "print(f'{$ser/$base:.3f}')")
  ro=$(/usr/bin/python3 -c "print(f'{$ovl/$base:.3f}')")
  rb=$(/usr/bin/python3 -c "print(f'{$buf/$base:.3f}')")
  read -r iob rbound < <(/usr/bin/python3 -c "
iob = $rd / ($gr * 1e9) + $wr / ($gw * 1e9)
print(f'{iob:.6f}', f'{min($ovl, $buf) / max($base, iob):.3f}')")
  r_serial+=("$rs"); r_overlap+=("$ro"); r_buffers+=("$rb"); r_bound+=("$rbound")
  t_base+=("$base"); t_overlap+=("$ovl"); t_buffers+=("$buf")
  printf "%-6s %-22s %10s %8s   %s\n" "$k" "no offload" "$base" "1.000" "$bc / $bi / $bo / $bm"
  printf "%-6s %-22s %10s %8s   %s\n" "$k" "nvme serial" "$ser" "$rs" "$sc / $si / $so / $sm"
  printf "%-6s %-22s %10s %8s   %s\n" "$k" "nvme overlap, defaults" "$ovl" "$ro" "$oc / $oi / $oo / $om ($ob swapper buffers chosen)"
  printf "%-6s %-22s %10s %8s   %s\n" "$k" "nvme overlap, 36 bufs" "$buf" "$rb" "$uc / $ui / $uo / $um"
  printf "%-6s %-22s %10s %8s   %s\n" "$k" "I/O lower bound" "$iob" "" \
    "$(/usr/bin/python3 -c "print(f'{$rd / 1e6:.0f} MB read + {$wr / 1e6:.0f} MB written a step at {$gr:.2f} / {$gw:.2f} GB/s; best overlapped / max(no offload, bound) = $rbound')")"
done
med() { printf "%s\n" "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
least() { printf "%s\n" "$@" | sort -g | head -1; }
echo "median ratio to no offload: nvme serial $(med "${r_serial[@]}"), nvme overlapped with default knobs $(med "${r_overlap[@]}") (target <= 1.10), with 36 swapper buffers $(med "${r_buffers[@]}"); best overlapped over max(no offload, I/O bound) $(med "${r_bound[@]}") (large preset's target <= 1.15); losses equal"
# Each run's best round against the no-offload run's best (a run slowed by another process on the
# machine counts less than in a round's ratio).
/usr/bin/python3 -c "
b, o, u = $(least "${t_base[@]}"), $(least "${t_overlap[@]}"), $(least "${t_buffers[@]}")
print(f'best of {len(\"${t_base[*]}\".split())} rounds: no offload {b:.4f} s/step; nvme overlapped with default knobs {o:.4f} ({o / b:.3f}x); with 36 swapper buffers {u:.4f} ({u / b:.3f}x)')"
