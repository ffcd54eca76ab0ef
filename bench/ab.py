#!/usr/bin/env python3
"""Two zoe binaries side by side, measured alternately in one run: a baseline (A) and a candidate (B).

Each round runs every benchmark with A then B (B then A on odd rounds, so drift on this machine's
disk and CPU falls on both): `zoe bench adam` (parameters per second), `zoe bench swap` (seconds
per swapped step), `zoe bench engine` (seconds per step at stage 3 with NVMe offload, the
steps after the first), and `zoe train` on the demo preset with parameters and optimizer states
on NVMe (tokens per second). Prints each figure's median per binary and the ratio B/A, where
above 1 means B is faster. The two binaries' training losses must be equal (checked).
Usage: bench/ab.py A/bin/zoe B/bin/zoe [--rounds 3] [--json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    return json.loads(out.stdout)


def bench_adam(zoe, scratch):
    return run_json([zoe, "bench", "adam", "--json"])["params_per_s"], None


def bench_swap(zoe, scratch):
    j = run_json([zoe, "bench", "swap", "--json", "--path", scratch])
    return 1.0 / j["t_step"], None


def bench_engine(zoe, scratch):
    j = run_json([zoe, "bench", "engine", "--json", "--offload", "nvme", "--path", scratch])
    total = 0.0
    for row in j["rows"]:
        for s in row["steps"][1:]:
            total += s["t_compute"] + s["t_comm"] + s["t_io_stall"] + s["t_optimizer"]
    return 1.0 / total, None


def train_nvme(zoe, scratch):
    j = run_json([zoe, "train", "--json", "--quiet", "--preset", "demo", "--steps", "12", "--seed", "3",
                  "--micro-batch", "8", "--offload", "nvme", "--nvme-path", scratch, "--device-budget", "16MiB",
                  "--eval-batches", "1"])
    return j["tokens_per_s"], j["losses"]


BENCHES = [("bench adam: params/s", bench_adam), ("bench swap: steps/s", bench_swap),
           ("bench engine (nvme): steps/s", bench_engine), ("train demo nvme: tokens/s", train_nvme)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = {name: {"a": [], "b": []} for name, _ in BENCHES}
    losses = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("ZOE_SCRATCH", "/var/tmp"), prefix="zoe-ab.") as scratch:
        for r in range(args.rounds):
            order = [("a", args.a), ("b", args.b)] if r % 2 == 0 else [("b", args.b), ("a", args.a)]
            for name, fn in BENCHES:
                for tag, zoe in order:
                    value, extra = fn(zoe, scratch)
                    results[name][tag].append(value)
                    if extra is not None:
                        losses.setdefault(tag, extra)
                    print(f"round {r + 1}/{args.rounds} {name} {tag}: {value:.6g}", file=sys.stderr)
    out = {}
    for name, _ in BENCHES:
        a = statistics.median(results[name]["a"])
        b = statistics.median(results[name]["b"])
        out[name] = {"a": a, "b": b, "b_over_a": b / a, "a_all": results[name]["a"], "b_all": results[name]["b"]}
    same = losses.get("a") == losses.get("b")
    if args.json:
        print(json.dumps({"rounds": args.rounds, "figures": out, "losses_equal": same}, indent=2))
    else:
        print(f"{'figure':32} {'A (median)':>14} {'B (median)':>14} {'B/A':>7}")
        for name, f in out.items():
            print(f"{name:32} {f['a']:14.6g} {f['b']:14.6g} {f['b_over_a']:7.3f}")
        print(f"training losses equal: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
