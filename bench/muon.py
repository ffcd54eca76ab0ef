#!/usr/bin/env python3
"""Muon's step against AdamW's on the same model, stage 3 with NVMe offload, measured alternately.

`zoe train --preset P --offload nvme` with `--optimizer muon` and `--optimizer adamw`, run A/B/A/B
(the disk's rate swings 2x from minute to minute): the steady step is the median wall time of the
steps after the first --skip, and Muon's is reported as a ratio of AdamW's from the same rounds.
Beside it, Muon's Newton-Schulz seconds per step (the `newton_schulz` of each step's times, part of
the optimizer's) and the NVMe bytes per parameter per step of each (Muon reads and writes the
gradient sums and the momentum once more: src/zero/updater.h). Target: Muon <= 1.3x AdamW.

Progress goes to stderr; a table (or with --json one JSON object) to stdout. Run it alone
(flock -x /tmp/zoe-heavy.lock bench/muon.py): other processes on the CPUs and the disk move the
figures.
Usage: bench/muon.py [--zoe build/bin/zoe] [--nvme-path DIR] [--preset demo] [--steps N]
       [--reps R] [--skip K] [--host-budget B] [--device-budget B] [--micro-batch M] [--json]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lowbit import alternate, log, ratio, steady_step, train  # noqa: E402

TARGET = 1.3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zoe", default="build/bin/zoe", help="the zoe binary (default build/bin/zoe)")
    ap.add_argument("--nvme-path", default="/var/tmp", help="scratch directory on the drive (default /var/tmp)")
    ap.add_argument("--preset", default="demo", help="zoe train --preset (default demo)")
    ap.add_argument("--steps", type=int, default=8, help="steps per run (default 8)")
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the median (default 2)")
    ap.add_argument("--reps", type=int, default=3, help="A/B rounds (default 3)")
    ap.add_argument("--host-budget", default="80MiB", help="--host-budget (default 80MiB: NVMe-bound)")
    ap.add_argument("--device-budget", default="16MiB", help="--device-budget (default 16MiB)")
    ap.add_argument("--micro-batch", type=int, default=1, help="--micro-batch (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if not os.access(args.zoe, os.X_OK):
        sys.exit(f"muon.py: {args.zoe} is not an executable (build first, or give --zoe)")
    if args.skip >= args.steps:
        sys.exit(f"muon.py: --skip {args.skip} leaves none of --steps {args.steps}")
    base = ["--preset", args.preset, "--offload", "nvme", "--device-budget", args.device_budget, "--host-budget",
            args.host_budget, "--micro-batch", str(args.micro_batch), "--eval-batches", "1", "--seed", "1",
            "--steps", str(args.steps), "--lr", "0.001"]
    kinds = ["adamw", "muon"]
    steps = {k: [] for k in kinds}
    ns = []
    info = {}
    for rnd in range(args.reps):
        for k in alternate(kinds, rnd):
            j, rss, _ = train(args.zoe, base + ["--optimizer", k], args.nvme_path)
            s = steady_step(j, args.skip)
            steps[k].append(s)
            tail = j["step_time_s"][args.skip:]
            if k == "muon":
                ns.append(statistics.median(x.get("newton_schulz", 0.0) for x in tail))
            info[k] = {"params": j["params"], "bytes_per_param_per_step": j["bytes_per_param_per_step"],
                       "optimizer_state_bytes_per_param": j["optimizer_state_bytes_per_param"], "peak_rss": rss}
            log(f"round {rnd + 1}/{args.reps} {k}: steady step {s:.3f} s")
    a, m = statistics.median(steps["adamw"]), statistics.median(steps["muon"])
    out = {"date": datetime.date.today().isoformat(), "host": platform.node(), "flags": base,
           "reps": args.reps, "skip": args.skip,
           "adamw_step_s": a, "muon_step_s": m, "adamw_all": steps["adamw"], "muon_all": steps["muon"],
           "muon_vs_adamw": ratio(m, a), "newton_schulz_s": statistics.median(ns),
           "newton_schulz_share_of_muon_step": ratio(statistics.median(ns), m),
           "target": f"<= {TARGET:g}", "met": ratio(m, a) <= TARGET, "runs": info}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{'optimizer':10} {'steady step s':>14} {'bytes/param/step':>40}")
        for k in kinds:
            print(f"{k:10} {statistics.median(steps[k]):14.3f} {json.dumps(info[k]['bytes_per_param_per_step']):>40}")
        print(f"Muon / AdamW: {out['muon_vs_adamw']:.3f} (target <= {TARGET:g}: {'met' if out['met'] else 'missed'}); "
              f"Newton-Schulz {out['newton_schulz_s']:.3f} s a step "
              f"({100 * out['newton_schulz_share_of_muon_step']:.1f}% of Muon's step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
