#!/usr/bin/env python3
"""What the always-on swap integrity checks cost, measured alternately in one run.

Each round runs, in an order that alternates between rounds (so drift of this machine's disk and
CPU falls on every variant):
- `zoe bench swap` (the optimizer swapper over NVMe: master, m, v and the gradient of each element
  read and written every step) with the hole checks (the default), without them
  (--no-hole-check), and with checksums (--checksum, off by default) for scale;
- `zoe train --preset demo` with bf16, stage 3, parameters and optimizer states on NVMe behind a
  16 MiB device budget, with `zoe.swap_hole_check` true (the default) and false: seconds per step
  after the first. The two runs' losses must be equal (checked).
Prints each variant's median and its ratio to the run without checks; the target is <= 1.03.
Usage: bench/swap_integrity.py [--zoe build/bin/zoe] [--rounds 5] [--steps 20] [--params 64M] [--json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_json(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("swap_integrity: %s failed (rc %d): %s" % (" ".join(cmd), p.returncode, p.stderr[-2000:]))
    return json.loads(p.stdout)


def bench_swap(a, scratch, flags):
    j = run_json([a.zoe, "bench", "swap", "--params", a.params, "--repeats", "3", "--path", scratch, "--json"] +
                 flags)
    return j["t_step"]


def train(a, scratch, hole_check):
    cfg = os.path.join(scratch, "hole-%s.json" % hole_check)
    with open(cfg, "w") as f:
        json.dump({"zero_optimization": {"stage": 3,
                                         "offload_optimizer": {"device": "nvme", "nvme_path": scratch},
                                         "offload_param": {"device": "nvme", "nvme_path": scratch}},
                   "bf16": {"enabled": True},
                   "zoe": {"device_budget": "16MiB", "swap_hole_check": hole_check}}, f)
    j = run_json([a.zoe, "train", "--config", cfg, "--preset", "demo", "--steps", str(a.steps), "--quiet", "--json"])
    walls = [s["wall"] for s in j["step_time_s"][1:]]
    return sum(walls) / len(walls), j["losses"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zoe", default="build/bin/zoe")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--params", default="64M", help="zoe bench swap --params (default 64M)")
    ap.add_argument("--scratch", default=os.environ.get("ZOE_SCRATCH", "/var/tmp"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    variants = {
        "swap: hole checks (default)": lambda d: bench_swap(a, d, []),
        "swap: no checks": lambda d: bench_swap(a, d, ["--no-hole-check"]),
        "swap: checksums": lambda d: bench_swap(a, d, ["--checksum"]),
        "demo nvme step: hole checks (default)": lambda d: train(a, d, True),
        "demo nvme step: no checks": lambda d: train(a, d, False),
    }
    times = {k: [] for k in variants}
    losses = {}
    with tempfile.TemporaryDirectory(dir=a.scratch, prefix="zoe-swap-integrity.") as d:
        for r in range(a.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for k in order:
                v = variants[k](d)
                if isinstance(v, tuple):
                    v, losses[k] = v
                times[k].append(v)
            print("swap_integrity: round %d/%d done" % (r + 1, a.rounds), file=sys.stderr)
    demo = [v for k, v in losses.items()]
    if any(x != demo[0] for x in demo):
        sys.exit("swap_integrity: the demo runs' losses differ between hole checks on and off")
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = {
        "swap_hole_check": med["swap: hole checks (default)"] / med["swap: no checks"],
        "swap_checksum": med["swap: checksums"] / med["swap: no checks"],
        "demo_hole_check": med["demo nvme step: hole checks (default)"] / med["demo nvme step: no checks"],
    }
    # Per round, the ratio of the pair measured next to each other.
    per_round = {
        "swap_hole_check": [x / y for x, y in zip(times["swap: hole checks (default)"], times["swap: no checks"])],
        "demo_hole_check": [x / y for x, y in zip(times["demo nvme step: hole checks (default)"],
                                                  times["demo nvme step: no checks"])],
    }
    if a.json:
        print(json.dumps({"rounds": a.rounds, "median_s": med, "ratios": ratios, "per_round": per_round,
                          "times_s": times}))
        return
    print("# swap integrity checks: medians of %d rounds, alternated" % a.rounds)
    for k, v in med.items():
        print("%-40s %8.4f s" % (k, v))
    for k, v in ratios.items():
        rr = per_round.get(k)
        print("%-40s %8.3fx%s" % (k, v, "  (rounds: %s)" % ", ".join("%.3f" % x for x in rr) if rr else ""))


if __name__ == "__main__":
    main()
