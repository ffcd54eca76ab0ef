#!/usr/bin/env bash
# Multi-node case: `zoe tune --calibrate` under a launch of 2 test nodes x 2 ranks (netns.sh)
# measures the collectives across the nodes: the calibration file has net_gbps and
# net_latency_us other than the defaults that one rank writes, and the line names 2 nodes.
# Usage: case_tune_calibrate.sh (ZOE_BIN: the zoe program, default <repo>/build/bin/zoe). Exit 77
# when network namespaces cannot be made here.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
ZOE_BIN=${ZOE_BIN:-$root/build/bin/zoe}
export MN_PREFIX=${MN_PREFIX:-zoetc} MN_SUBNET=${MN_SUBNET:-10.82.0}
export MN_STATE=${MN_STATE:-/tmp/zoe-netns-$MN_PREFIX}
# shellcheck source=tests/multinode/netns.sh
source "$here/netns.sh"

mn_check || exit $?
[ -x "$ZOE_BIN" ] || { echo "case_tune_calibrate: $ZOE_BIN is not an executable (set ZOE_BIN)" >&2; exit 1; }
tmp=$(mktemp -d "${ZOE_SCRATCH:-/var/tmp}/zoe-tune-mn.XXXXXX")
chmod 755 "$tmp"
trap 'mn_down > /dev/null 2>&1; rm -rf "$tmp"' EXIT
mn_up 2,2 || exit 1
args=(tune --calibrate --preset demo --seq 64 --device cpu --fixed-micro-batch --calibrate-bytes 16MiB
  --calibrate-max-spread 10 --nvme-path "$tmp" --json)
# One rank alone: the file without any network figure (the reference).
"$ZOE_BIN" "${args[@]}" --nodes 1 --gpus-per-node 1 --calibration-out "$tmp/one.json" > /dev/null \
  2> "$tmp/one.err" || { tail -5 "$tmp/one.err" >&2; echo "case_tune_calibrate: one rank failed" >&2; exit 1; }
timeout -k 5 400 bash "$here/netns.sh" mpirun -np 4 "$ZOE_BIN" "${args[@]}" --nodes 2 --gpus-per-node 2 \
  --calibration-out "$tmp/four.json" > /dev/null 2> "$tmp/four.err" ||
  { tail -5 "$tmp/four.err" >&2; echo "case_tune_calibrate: 2 nodes x 2 ranks failed" >&2; exit 1; }
grep -q "collectives across 4 rank(s) on 2 node(s)" "$tmp/four.err" ||
  { echo "case_tune_calibrate: no line naming 4 ranks on 2 nodes" >&2; exit 1; }
/usr/bin/python3 - "$tmp/one.json" "$tmp/four.json" << 'PY' || exit 1
import json, sys
one, four = (json.load(open(p)) for p in sys.argv[1:3])
bad = [k for k in ("net_gbps", "net_latency_us") if not four[k] > 0 or four[k] == one[k]]
for k in bad: print(f"case_tune_calibrate: {k} {four[k]} (one rank: {one[k]}): not measured", file=sys.stderr)
print(f"case_tune_calibrate: net_gbps {four['net_gbps']:.4g}, net_latency_us {four['net_latency_us']:.4g}")
sys.exit(1 if bad else 0)
PY
echo "case_tune_calibrate: OK (net_gbps and net_latency_us measured across 2 nodes x 2 ranks)"
