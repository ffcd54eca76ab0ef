#!/usr/bin/env bash
# Multi-node case: `zoe bench comm` on two test nodes of two ranks each (netns.sh), over TCP
# between the nodes: the launch counts 2 nodes and 4 ranks, every row is exact (wrong 0), and
# algbw and busbw follow nccl-tests' formulas. Prints the table it measured.
# Usage: case_bench_comm.sh (ZOE_BIN: the zoe program, default <repo>/build/bin/zoe). Exit 77 when
# network namespaces cannot be made here.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
ZOE_BIN=${ZOE_BIN:-$root/build/bin/zoe}
export MN_PREFIX=${MN_PREFIX:-zoebc} MN_SUBNET=${MN_SUBNET:-10.78.0}
export MN_STATE=${MN_STATE:-/tmp/zoe-netns-$MN_PREFIX}
# shellcheck source=tests/multinode/netns.sh
source "$here/netns.sh"

mn_check || exit $?
if [ ! -x "$ZOE_BIN" ]; then
  echo "case_bench_comm: $ZOE_BIN is not an executable (set ZOE_BIN)" >&2
  exit 1
fi
trap 'mn_down > /dev/null 2>&1' EXIT
mn_up 2,2 || exit 1

run() { timeout -k 5 300 bash "$here/netns.sh" mpirun -np 4 "$ZOE_BIN" bench comm "$@"; }

json=$(run --sizes 1KiB..4MiB --iters 5 --warmup 2 --json) || {
  echo "case_bench_comm: zoe bench comm --json failed on the test nodes" >&2
  exit 1
}
/usr/bin/python3 - "$json" << 'PY' || exit 1
import json, sys
j = json.loads(sys.argv[1])
bad = []
if j["ranks"] != 4: bad.append(f"ranks {j['ranks']}, expected 4")
if j["nodes"] != 2: bad.append(f"nodes {j['nodes']}, expected 2")
if j["hosts"] != ["node0", "node0", "node1", "node1"]: bad.append(f"hosts {j['hosts']}")
ops = ["allreduce", "reducescatter", "allgather", "broadcast"]
if [r["op"] for r in j["rows"]] != [op for op in ops for _ in range(13)]: bad.append("rows: not 4 ops x 13 sizes")
factor = {"allreduce": 1.5, "reducescatter": 0.75, "allgather": 0.75, "broadcast": 1.0}
for r in j["rows"]:
    if r["wrong"] != 0: bad.append(f"{r['op']} {r['bytes']}: {r['wrong']} wrong")
    alg = r["bytes"] / r["time_us"] / 1e3
    if abs(r["algbw_gbps"] - alg) > 1e-9 * alg: bad.append(f"{r['op']} {r['bytes']}: algbw {r['algbw_gbps']} != {alg}")
    if abs(r["busbw_gbps"] - alg * factor[r["op"]]) > 1e-9 * alg: bad.append(f"{r['op']} {r['bytes']}: busbw")
for b in bad: print("case_bench_comm:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY
# The table, for the log (and docs/multinode.md, "Measuring the network").
run --sizes 64KiB..4MiB --iters 5 --warmup 2 || exit 1
echo "case_bench_comm: OK (2 nodes x 2 ranks, every row exact)"
