#!/usr/bin/env bash
# zoe over several nodes, on one machine: test nodes are network namespaces on a bridge
# (tests/multinode/netns.sh), each with its own address, hostname and NVMe directory (a mount
# namespace: the same path is a different directory on each node); mpirun reaches them through
# an rsh agent and the ranks talk over TCP.
#
# Cases:
#   layouts    stages 1, 2 and 3 with NVMe offload on 2 nodes x 2 ranks, on 1 node x 4 ranks and on
#              3 uneven nodes (1, 2, 1 ranks): bit-identical losses and gradient norms, and the same
#              as stage 0 without offload (the dense reference); each node's swap files lie in its
#              own directory behind the one nvme_path, and none is left; comm_s_by_rank has every
#              rank's row
#   space      one node's NVMe directory too small: every rank's error names that node
#   stall      one rank's I/O held longer than zoe.comm_timeout_s: not a lost rank, same losses
#   kill       one node's processes killed mid-run: every other rank exits within 60 s naming a
#              lost rank and its host, and mpirun itself returns within 90 s; the last checkpoint
#              verifies; no swap file left
#   link       one node's link taken down mid-run: the same, where mpirun (its keepalive on its
#              daemons' connections, netns.sh) may find the node unreachable and name it first
#   resume     the kill case's last checkpoint resumed on 2 nodes x 1 rank (4 ranks -> 2): the
#              same losses as 1 node x 2 ranks resumed from it
#   torch      the PyTorch front-end on 2 nodes x 1 rank and on 1 node x 2 ranks: the same losses
#              and weights (needs ZOE_PYTHON: a python that imports zoe and torch; else skipped)
#   torchrun   zoe train under torchrun on 2 nodes x 1 rank (gloo over TCP, torch's TCPStore on node 0):
#              the same losses and gradient norms as mpirun; node 1's link down mid-run, then node 1
#              killed mid-run: node 0's rank names the lost rank and every rank left exits within
#              60 s (needs ZOE_PYTHON; else skipped)
#   bench_comm zoe bench comm on 2 nodes x 2 ranks (case_bench_comm.sh): exact, 2 nodes counted,
#              nccl-tests' busbw formulas
#   tune_calibrate zoe tune --calibrate on 2 nodes x 2 ranks (case_tune_calibrate.sh): net_gbps and
#              net_latency_us measured, other than one rank's file
#
# Usage: bash tests/multinode/run.sh [CASE...]    (ZOE_BIN: the zoe binary, default build/bin/zoe;
#        MN_KEEP=1 keeps the outputs, the namespaces go anyway)
# Exit 0 when every case passes; 77 with one line when this machine does not allow network
# namespaces (not root, no CAP_NET_ADMIN); 1 on a failure. Every namespace, bridge, veth and node
# directory is removed on every way out.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export MN_PREFIX=${MN_PREFIX:-zoemn} MN_SUBNET=${MN_SUBNET:-10.77.0}
# shellcheck source=tests/multinode/netns.sh
source "$here/netns.sh"

why=$(mn_check)
rc=$?
if [ $rc -ne 0 ]; then
  echo "$why"
  exit 77
fi
ZOE=$(readlink -f "${ZOE_BIN:-$root/build/bin/zoe}")
if [ ! -x "$ZOE" ]; then
  echo "multinode: $ZOE is not built (build it, or set ZOE_BIN)" >&2
  exit 1
fi
# One run of this prefix at a time on this machine.
exec 9> "/tmp/zoe-multinode-$MN_PREFIX.lock"
flock 9
work=$(mktemp -d "${ZOE_SCRATCH:-/var/tmp}/zoe-multinode.XXXXXX")
export MN_STATE=$work/state
cleanup() {
  mn_down > /dev/null 2>&1 || mn_down
  if [ -n "${MN_KEEP:-}" ]; then
    echo "multinode: outputs kept in $work (MN_KEEP)" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

failed=0
fail() {
  echo "multinode: FAILED: $*" >&2
  failed=1
}
note() { echo "multinode: $*" >&2; }

py() { /usr/bin/python3 "$@"; }

# The directory that is each node's own (a bind mount per node), and the config's path into it:
# $ZOE_MN_NVME (an environment variable) and {host}, {local_rank} (placeholders).
nvme=$work/nvme
mkdir -p "$nvme"
export ZOE_MN_NVME=$nvme

# Nodes for LAYOUT ("2,2"), each with directories HOST/0..3 in its own NVMe directory.
nodes_up() {
  mn_down > /dev/null 2>&1
  mkdir -p "$MN_STATE"
  rm -f "$MN_STATE/node-setup"
  mn_up "$1" "$nvme" || return 1
  local i n
  n=$(wc -l < "$MN_STATE/hosts")
  for ((i = 0; i < n; i++)); do
    mkdir -p "$MN_STATE/node-dir/node$i/node$i/"{0,1,2,3}
  done
}


# mpirun over the nodes (already up) with a time limit: mn_launch SECONDS NP ARGS... The ranks get
# mpirun's environment (the rsh agent passes it on, as ssh with SendEnv would).
mn_launch() {
  local limit=$1 np=$2
  shift 2
  timeout -k 5 "$limit" bash "$here/netns.sh" mpirun -np "$np" "$@"
}

# A config file: stage, offload (none|nvme), extra JSON for "zoe".
write_config() {
  local file=$1 stage=$2 offload=$3 extra=${4:-}
  local off="" budget=""
  if [ "$offload" = nvme ]; then
    budget='"device_budget": "1MiB", '  # the states must move: the device holds 1 MiB
    local path='"$ZOE_MN_NVME/{host}/{local_rank}"'
    off=", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": $path}"
    [ "$stage" = 3 ] && off="$off, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": $path}"
  fi
  cat > "$file" << EOF
{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
  "zero_optimization": {"stage": $stage, "stage3_param_persistence_threshold": 0 $off},
  "zoe": {$budget"optimizer_threads": 1 $extra}
}
EOF
}

train_args=(train --preset tiny --seq 32 --precision fp32 --quiet --json)

# The swap files under the node directories (none may be left).
swap_files_left() { find "$MN_STATE/node-dir" "$nvme" -name '*.swap' 2> /dev/null; }

# Runs one training (nodes already up) in the background and records, while it runs, which swap
# files each node's directory holds. OUT.json, OUT.err, OUT.swaps.
train_watching() {
  local out=$1 np=$2
  shift 2
  mn_launch 240 "$np" "$ZOE" "${train_args[@]}" "$@" > "$out.json" 2> "$out.err" &
  local pid=$!
  : > "$out.swaps"
  while kill -0 $pid 2> /dev/null; do
    (cd "$MN_STATE/node-dir" && find . -name '*.swap') >> "$out.swaps" 2> /dev/null
    sleep 0.1
  done
  wait $pid
}

# --- layouts ------------------------------------------------------------------------------------
case_layouts() {
  local steps=4 stage layout
  for stage in 1 2 3; do
    write_config "$work/s$stage.json" "$stage" nvme
    for layout in 2,2 1x4 1,2,1; do
      nodes_up "$layout" || return 1
      local out="$work/s$stage-${layout//,/_}"
      if ! train_watching "$out" 4 --config "$work/s$stage.json" --steps $steps; then
        fail "stage $stage on nodes $layout: exit $? ($(tail -3 "$out.err"))"
        continue
      fi
      # Each node's directory holds exactly its own ranks' swap files (rank r: zoe-swap-rR-*).
      py - "$out.swaps" "$layout" << 'EOF' || fail "stage $stage on nodes $layout: swap files in the wrong node's directory"
import re, sys
seen = {l.strip() for l in open(sys.argv[1]) if l.strip()}
spec = sys.argv[2]
layout = [int(spec.split("x")[1])] * int(spec.split("x")[0]) if "x" in spec else [int(x) for x in spec.split(",")]
owner, r = {}, 0
for node, n in enumerate(layout):
    for _ in range(n):
        owner[r] = node
        r += 1
bad, nodes_seen = [], set()
for s in seen:  # ./nodeI/nodeI/LOCAL/zoe-swap-rR-PID....swap
    m = re.match(r"\./node(\d+)/node(\d+)/(\d+)/zoe-swap-r(\d+)-", s)
    if not m or int(m.group(1)) != int(m.group(2)) or owner.get(int(m.group(4))) != int(m.group(1)):
        bad.append(s)
    else:
        nodes_seen.add(int(m.group(1)))
if bad or nodes_seen != set(range(len(layout))):
    print("swap files:", sorted(seen), "misplaced:", bad, "nodes with files:", sorted(nodes_seen), file=sys.stderr)
    sys.exit(1)
EOF
      [ -z "$(swap_files_left)" ] || fail "stage $stage on nodes $layout left swap files: $(swap_files_left)"
    done
  done
  # The dense reference: stage 0, nothing offloaded, one node of 4 ranks.
  write_config "$work/s0.json" 0 none
  nodes_up 1x4 || return 1
  mn_launch 240 4 "$ZOE" "${train_args[@]}" --config "$work/s0.json" --steps $steps > "$work/dense.json" \
    2> "$work/dense.err" || fail "the dense reference: exit $? ($(tail -3 "$work/dense.err"))"
  # Stages 1-3 on every layout: the same bits, losses and gradient norms. The dense run: the same
  # losses (the same weights at every step); its gradient norm sums the whole gradient on each rank
  # rather than the partitions' sums, so it may differ in the last bits (1e-12 relative allowed).
  py - "$work" << 'EOF' || fail "losses differ across node layouts or from the dense reference"
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
def curve(p):
    j = json.loads(p.read_text())
    return j["losses"], j["grad_norms"], j["world_size"]
dense = curve(w / "dense.json")
assert dense[2] == 4, dense
first, bad = None, 0
for stage in (1, 2, 3):
    for layout in ("2_2", "1x4", "1_2_1"):
        p = w / f"s{stage}-{layout}.json"
        if not p.exists() or not p.read_text().strip():
            print(f"stage {stage} nodes {layout}: no result", file=sys.stderr); bad += 1; continue
        got = curve(p)
        first = first or got
        if got != first:
            print(f"stage {stage} nodes {layout}: {got} != stage 1 on 2_2 {first}", file=sys.stderr); bad += 1
        if got[0] != dense[0] or any(abs(a - b) > 1e-12 * abs(b) for a, b in zip(got[1], dense[1])):
            print(f"stage {stage} nodes {layout}: {got} vs dense {dense}", file=sys.stderr); bad += 1
        # Every rank's comm per step: 4 rows of the run's steps, rank 0's as its step_time_s.
        j = json.loads(p.read_text())
        by_rank, steps = j["comm_s_by_rank"], len(j["step_time_s"])
        if len(by_rank) != 4 or any(len(r) != steps or min(r) < 0 for r in by_rank) or \
                by_rank[0] != [t["comm"] for t in j["step_time_s"]]:
            print(f"stage {stage} nodes {layout}: comm_s_by_rank {by_rank}", file=sys.stderr); bad += 1
if not bad:
    print(f"multinode: layouts: stages 1-3 x 3 layouts bit-identical, losses = the dense run's {dense[0]}",
          file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
}

# --- space --------------------------------------------------------------------------------------
case_space() {
  nodes_up 2,1 || return 1
  # Node 1's NVMe directory is a 64 KiB tmpfs (the same path as node 0's, which has room).
  cat > "$MN_STATE/node-setup" << EOF
#!/bin/sh
[ "\$1" = 1 ] || exit 0
mount -t tmpfs -o size=64k tmpfs '$nvme' && mkdir -p '$nvme/node1/0'
EOF
  chmod +x "$MN_STATE/node-setup"
  write_config "$work/space.json" 3 nvme
  mn_launch 120 3 "$ZOE" "${train_args[@]}" --config "$work/space.json" --steps 2 > /dev/null 2> "$work/space.err"
  local rc=$?
  [ $rc -ne 0 ] || fail "space: a run with a node short of NVMe space exited 0"
  [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "space: the run hung"
  local n
  n=$(grep -c "NVMe swap space: node node1 lacks it: rank 2 " "$work/space.err")
  [ "$n" -ge 1 ] || fail "space: no error names node1: $(tail -5 "$work/space.err")"
  grep -q "node node0 lacks" "$work/space.err" && fail "space: node0 named although it has room"
  note "space: $n rank(s) named node1 ($(grep -m1 -o 'NVMe swap space: node node1[^;]*' "$work/space.err"))"
}

# --- stall --------------------------------------------------------------------------------------
case_stall() {
  nodes_up 2,2 || return 1
  write_config "$work/stall.json" 3 nvme ', "comm_timeout_s": 3'
  local t0=$SECONDS
  ZOE_IO_STALL=3:40:8 mn_launch 240 4 "$ZOE" "${train_args[@]}" --config "$work/stall.json" --steps 4 \
    > "$work/stall.json.out" 2> "$work/stall.err" || fail "stall: exit $? ($(tail -3 "$work/stall.err"))"
  local took=$((SECONDS - t0))
  if [ ! -s "$work/s3-2_2.json" ]; then  # the layouts case's run without a stall, when it did not run
    mn_launch 240 4 "$ZOE" "${train_args[@]}" --config "$work/stall.json" --steps 4 > "$work/s3-2_2.json" \
      2> "$work/stall-ref.err" || fail "stall: the run without a stall: exit $?"
  fi
  grep -q "rank 3: ZOE_IO_STALL: holding I/O completion 40 for 8.0 s" "$work/stall.err" ||
    fail "stall: rank 3's I/O was not held ($(tail -3 "$work/stall.err"))"
  [ $took -ge 8 ] || fail "stall: the run took $took s, less than the 8 s stall"
  grep -q "was lost" "$work/stall.err" && fail "stall: a stall longer than zoe.comm_timeout_s was taken for a loss"
  py - "$work/stall.json.out" "$work/s3-2_2.json" << 'EOF' || fail "stall: the losses differ from the run without a stall"
import json, sys
a, b = (json.loads(open(p).read()) for p in sys.argv[1:3])
sys.exit(0 if a["losses"] == b["losses"] else 1)
EOF
  note "stall: an 8 s I/O stall with zoe.comm_timeout_s 3: no loss, same losses (run took ${took} s)"
}

# --- kill and link ------------------------------------------------------------------------------
# A zoe process still running on node I (the orted is Open MPI's, not ours).
zoe_pids_on() {
  local p
  for p in $(ip netns pids "$(mn_ns "$1")" 2> /dev/null); do
    [ "$(readlink "/proc/$p/exe" 2> /dev/null)" = "$ZOE" ] && echo "$p"
  done
}

# Starts a long 2 x 2 run saving a checkpoint every 2 steps into SAVE; waits until one exists.
start_long_run() {
  local name=$1 save=$2
  nodes_up 2,2 || return 1
  write_config "$work/$name.cfg" 3 nvme
  mn_launch 300 4 "$ZOE" train --preset tiny --seq 32 --precision fp32 --config "$work/$name.cfg" \
    --steps 100000 --save-every 2 --save-dir "$save" > /dev/null 2> "$work/$name.err" &
  long_pid=$!
  local t=0
  until [ -e "$save/latest" ] && [ -n "$(ls -d "$save"/step-000004 2> /dev/null)" ]; do
    sleep 0.2
    t=$((t + 1))
    if [ $t -ge 600 ] || ! kill -0 $long_pid 2> /dev/null; then
      fail "$name: no checkpoint after 120 s ($(tail -3 "$work/$name.err"))"
      return 1
    fi
  done
}

# After node LOST was cut off: every zoe rank on the other nodes (and on LOST when it still runs)
# exits within 60 s, both ranks of node 0 naming a lost rank and its host (or, with BY_MPIRUN,
# mpirun naming that node), and mpirun itself returns within 90 s (a launcher left waiting holds
# the user's allocation).
expect_clean_exit() {
  local name=$1 lost=$2 by_mpirun=${3:-} t0=$SECONDS left i
  while :; do
    left=""
    for i in 0 1; do left="$left$(zoe_pids_on $i)"; done
    [ -z "$left" ] && break
    if [ $((SECONDS - t0)) -gt 60 ]; then
      fail "$name: zoe ranks still running 60 s after node $lost was lost"
      break
    fi
    sleep 0.2
  done
  local took=$((SECONDS - t0))
  while kill -0 $long_pid 2> /dev/null && [ $((SECONDS - t0)) -lt 90 ]; do sleep 0.2; done
  local ended rc
  if kill -0 $long_pid 2> /dev/null; then
    fail "$name: mpirun still running 90 s after node $lost was lost"
    ended="never: the harness stopped it after 90 s"
    kill -TERM $long_pid 2> /dev/null
    wait $long_pid 2> /dev/null
  else
    wait $long_pid 2> /dev/null
    rc=$?
    ended="by itself $((SECONDS - t0)) s after the loss, exit $rc"
    [ "$rc" -ne 0 ] || fail "$name: mpirun exited 0 after a node was lost"
  fi
  local line
  line=$(grep -m1 "was lost" "$work/$name.err" || grep -m1 "Remote daemon" "$work/$name.err")
  # The loss is named: by both ranks of node 0 (a rank of node 1 and its host; node 1's own lines,
  # if any, cannot reach mpirun over a link that is down), or, for a link down, by mpirun, whose
  # keepalive finds the unreachable node before zoe.comm_timeout_s (30 s) does.
  local r named=0
  for r in 0 1; do
    grep -Eq "^zoe: rank $r \(host node0\): rank [23] \(host node1\) was lost" "$work/$name.err" &&
      named=$((named + 1))
  done
  if [ $named -lt 2 ] && { [ -z "$by_mpirun" ] ||
    ! grep -Eq "Remote daemon: .* on node $(mn_addr 1)\$" "$work/$name.err"; }; then
    fail "$name: neither both ranks of node 0 nor mpirun named the lost node: $(grep -v setpgid "$work/$name.err" | tail -5)"
  fi
  note "$name: every rank gone ${took} s after the loss (mpirun ended $ended); \"$line\""
}

# No swap file left on node I (the ranks that were alive remove their own).
expect_no_swap_on() {
  local left
  left=$(find "$MN_STATE/node-dir/node$2" -name '*.swap' 2> /dev/null)
  [ -z "$left" ] || fail "$1: swap files left on node$2: $left"
}

case_kill() {
  local save=$work/ckpt-kill
  start_long_run kill "$save" || return 1
  mn_kill 1
  expect_clean_exit kill 1
  expect_no_swap_on kill 0
  # The killed ranks could not remove theirs: the next run on that node's path reclaims them (their
  # locks died with their processes).
  local killed
  killed=$(find "$MN_STATE/node-dir/node1" -name '*.swap' | wc -l)
  mn_exec 1 "$ZOE" train --preset tiny --steps 1 --quiet --offload nvme --nvme-path "$nvme/node1/0" \
    --nvme-path "$nvme/node1/1" --device-budget 1MiB > /dev/null 2> "$work/kill-reclaim.err" || fail "kill: the run on node1 after the loss: exit $?"
  expect_no_swap_on kill 1
  note "kill: node1's $killed swap file(s) of the killed ranks reclaimed by the next run there"
  "$ZOE" ckpt verify "$save" > "$work/kill.verify" 2>&1 || fail "kill: the last checkpoint does not verify: $(tail -3 "$work/kill.verify")"
}

case_link() {
  local save=$work/ckpt-link
  start_long_run link "$save" || return 1
  mn_link 1 down
  expect_clean_exit link 1 by_mpirun
  expect_no_swap_on link 0
  expect_no_swap_on link 1
  "$ZOE" ckpt verify "$save" > "$work/link.verify" 2>&1 || fail "link: the last checkpoint does not verify: $(tail -3 "$work/link.verify")"
}

# --- resume -------------------------------------------------------------------------------------
case_resume() {
  local save=$work/ckpt-kill
  [ -e "$save/latest" ] || { fail "resume: no checkpoint from the kill case"; return 1; }
  local ck
  ck=$(readlink -f "$save/latest" 2> /dev/null || cat "$save/latest")
  [ -d "$ck" ] || ck="$save/$(cat "$save/latest")"
  write_config "$work/resume.cfg" 3 nvme
  local start
  start=$(basename "$ck" | sed 's/step-0*//')
  local steps=$((start + 3)) layout
  for layout in 1,1 1x2; do
    nodes_up $layout || return 1
    mn_launch 240 2 "$ZOE" "${train_args[@]}" --config "$work/resume.cfg" --steps $steps --resume "$ck" \
      > "$work/resume-${layout//,/_}.json" 2> "$work/resume-${layout//,/_}.err" ||
      fail "resume on nodes $layout: exit $? ($(tail -3 "$work/resume-${layout//,/_}.err"))"
  done
  py - "$work/resume-1_1.json" "$work/resume-1x2.json" "$start" << 'EOF' || fail "resume: 2 nodes x 1 rank and 1 node x 2 ranks differ"
import json, sys
a, b = (json.loads(open(p).read()) for p in sys.argv[1:3])
assert a["world_size"] == 2 and a["start_step"] == int(sys.argv[3]), (a["world_size"], a["start_step"])
assert len(a["losses"]) == 3, a["losses"]
sys.exit(0 if (a["losses"], a["grad_norms"]) == (b["losses"], b["grad_norms"]) else 1)
EOF
  note "resume: 4 ranks' checkpoint step $start resumed on 2 ranks, 2 nodes = 1 node"
}

# --- torch --------------------------------------------------------------------------------------
case_torch() {
  if [ -z "${ZOE_PYTHON:-}" ]; then
    note "torch: skipped (set ZOE_PYTHON to a python that imports zoe and torch; scripts/test.sh does)"
    return 0
  fi
  local layout out
  for layout in 1,1 1x2; do
    nodes_up $layout || return 1
    out=$work/torch-${layout//,/_}
    mkdir -p "$out"
    mn_launch 300 2 "$ZOE_PYTHON" "$root/tests/python/test_torch_mpi.py" "$out" gpt \
      > "$out.log" 2>&1 || fail "torch on nodes $layout: exit $? ($(tail -5 "$out.log"))"
  done
  py - "$work/torch-1_1" "$work/torch-1x2" << 'EOF' || fail "torch: 2 nodes x 1 rank and 1 node x 2 ranks differ"
import json, sys
from pathlib import Path
a, b = ([json.loads((Path(d) / f"gpt-w2-r{r}.json").read_text()) for r in (0, 1)] for d in sys.argv[1:3])
sys.exit(0 if a == b else 1)
EOF
  note "torch: the PyTorch front-end on 2 nodes = 1 node (losses and weights)"
}

# --- torchrun -------------------------------------------------------------------------------------
# zoe train under torchrun on 2 nodes x 1 rank: a torchrun on each node (static rendezvous, the
# store on node 0's address), zoe's ranks meeting through it and talking over gloo on the subnet;
# the same losses and gradient norms as mpirun on the same nodes.
case_torchrun() {
  if [ -z "${ZOE_PYTHON:-}" ]; then
    note "torchrun: skipped (set ZOE_PYTHON to a python with torch, whose torch.distributed.run is torchrun)"
    return 0
  fi
  if ! "$ZOE" info --json | py -c 'import json, sys; sys.exit(0 if json.load(sys.stdin)["gloo"]["built"] else 1)'; then
    note "torchrun: skipped (zoe built without gloo)"
    return 0
  fi
  nodes_up 1,1 || return 1
  write_config "$work/torchrun.json" 3 nvme
  local i pids=() codes=0
  for i in 0 1; do
    timeout -k 5 240 bash "$here/netns.sh" exec $i "$ZOE_PYTHON" -m torch.distributed.run --nnodes 2 \
      --node_rank $i --nproc_per_node 1 --master_addr "$(mn_addr 0)" --master_port 29577 --no-python \
      "$ZOE" "${train_args[@]}" --config "$work/torchrun.json" --steps 4 > "$work/torchrun-$i.json" \
      2> "$work/torchrun-$i.err" &
    pids+=($!)
  done
  for i in 0 1; do wait "${pids[$i]}" || codes=$?; done
  if [ $codes -ne 0 ]; then
    fail "torchrun on 2 nodes: exit $codes ($(tail -5 "$work/torchrun-0.err" "$work/torchrun-1.err"))"
    return 0
  fi
  if ! mn_launch 240 2 "$ZOE" "${train_args[@]}" --config "$work/torchrun.json" --steps 4 \
    > "$work/torchrun-mpi.json" 2> "$work/torchrun-mpi.err"; then
    fail "mpirun beside torchrun: exit $? ($(tail -3 "$work/torchrun-mpi.err"))"
    return 0
  fi
  py - "$work/torchrun-0.json" "$work/torchrun-mpi.json" << 'EOF' || fail "torchrun: 2 nodes under torchrun differ from mpirun"
import json, sys
a, b = (json.loads(open(p).read()) for p in sys.argv[1:3])
assert a["world_size"] == 2 and len(a["losses"]) == 4, a
sys.exit(0 if (a["losses"], a["grad_norms"]) == (b["losses"], b["grad_norms"]) else 1)
EOF
  note "torchrun: zoe train under torchrun on 2 nodes (gloo over TCP) = mpirun, bit for bit"
  torchrun_loss link 29578
  torchrun_loss kill 29579
}

# A node lost under torchrun mid-run, killed or its link down: node 0's rank names the lost rank and
# its host and exits within 60 s (the heartbeat, as under MPI), and node 0's torchrun returns. With
# the link down, node 1's rank, cut off from node 0, ends within 60 s too.
torchrun_loss() {
  local how=$1 port=$2 long_pid t=0 i pids=()
  for i in 0 1; do
    timeout -k 5 300 bash "$here/netns.sh" exec $i "$ZOE_PYTHON" -m torch.distributed.run --nnodes 2 \
      --node_rank $i --nproc_per_node 1 --master_addr "$(mn_addr 0)" --master_port "$port" --no-python \
      "$ZOE" train --preset tiny --seq 32 --precision fp32 --config "$work/torchrun.json" --steps 100000 \
      > /dev/null 2> "$work/torchrun-$how-$i.err" &
    pids+=($!)
  done
  long_pid=${pids[0]}
  until [ -n "$(zoe_pids_on 0)" ] && [ -n "$(zoe_pids_on 1)" ]; do
    sleep 0.2
    t=$((t + 1))
    [ $t -lt 300 ] || { fail "torchrun $how: the ranks did not start ($(tail -3 "$work/torchrun-$how-0.err"))"; return 0; }
  done
  sleep 3
  if [ "$how" = kill ]; then mn_kill 1; else mn_link 1 down; fi
  local t0=$SECONDS
  while { [ -n "$(zoe_pids_on 0)" ] || { [ "$how" = link ] && [ -n "$(zoe_pids_on 1)" ]; }; } &&
    [ $((SECONDS - t0)) -le 60 ]; do sleep 0.2; done
  [ -z "$(zoe_pids_on 0)" ] || fail "torchrun $how: node 0's rank still running 60 s after node 1 was lost"
  [ "$how" = kill ] || [ -z "$(zoe_pids_on 1)" ] ||
    fail "torchrun $how: node 1's rank still running 60 s after its link went down"
  local took=$((SECONDS - t0))
  [ "$how" = kill ] || mn_link 1 up
  wait $long_pid 2> /dev/null
  grep -Eq "^zoe: rank 0 \(host node0\): rank 1 \(host node1\) was lost" "$work/torchrun-$how-0.err" ||
    fail "torchrun $how: node 0's rank did not name the lost rank: $(tail -5 "$work/torchrun-$how-0.err")"
  note "torchrun $how: the ranks gone ${took} s after node 1 was lost: \"$(grep -m1 "was lost" "$work/torchrun-$how-0.err")\""
  # Whatever of node 1's torchrun is left (its agent waits for the store behind the link) goes.
  [ "$how" = kill ] || mn_kill 1
  wait "${pids[1]}" 2> /dev/null
  return 0
}

# --- bench_comm -----------------------------------------------------------------------------------
# zoe bench comm on 2 nodes x 2 ranks (its own script, with namespaces of its own prefix and subnet).
case_bench_comm() {
  ZOE_BIN=$ZOE bash "$here/case_bench_comm.sh" > "$work/bench_comm.log" 2>&1 ||
    fail "bench_comm: exit $? ($(tail -5 "$work/bench_comm.log"))"
  note "bench_comm: zoe bench comm exact on 2 nodes x 2 ranks, nccl-tests' busbw formulas"
}

# --- tune_calibrate -------------------------------------------------------------------------------
# zoe tune --calibrate on 2 nodes x 2 ranks measures the network (its own script and namespaces).
case_tune_calibrate() {
  ZOE_BIN=$ZOE bash "$here/case_tune_calibrate.sh" > "$work/tune_calibrate.log" 2>&1 ||
    fail "tune_calibrate: exit $? ($(tail -5 "$work/tune_calibrate.log"))"
  note "tune_calibrate: net_gbps and net_latency_us measured across 2 nodes x 2 ranks"
}

cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(layouts space stall kill link resume torch torchrun bench_comm tune_calibrate)
t_all=$SECONDS
for c in "${cases[@]}"; do
  t0=$SECONDS
  if ! declare -F "case_$c" > /dev/null; then
    fail "no case $c"
    continue
  fi
  "case_$c" || fail "$c: could not run"
  note "$c: $((SECONDS - t0)) s"
done
mn_down || fail "namespaces left behind"
if [ $failed -ne 0 ]; then
  echo "multinode: some cases failed ($((SECONDS - t_all)) s)" >&2
  exit 1
fi
echo "multinode: all cases passed ($((SECONDS - t_all)) s)" >&2
exit 0
