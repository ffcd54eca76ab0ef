#!/usr/bin/env python3
"""Adam-mini's NVMe bytes and step against AdamW's on the same model, stage 3 with NVMe offload, alternated.

`zoe train --preset P --offload nvme` with `--optimizer adam_mini` and `--optimizer adamw`, run A/B/A/B
(the disk's rate swings 2x from minute to minute). Per run: the NVMe bytes per parameter of a steady
step (read + written, the engine's own counters: `step_bytes_per_param` of the last step), and the
steady step (the median wall time of the steps after the first --skip). Adam-mini's figures are
ratios of AdamW's from the same rounds. Target: Adam-mini's NVMe bytes per parameter per step <= 0.7x
AdamW's. Beside it, the final loss of each (Adam-mini's partition follows its package's rules on
zoe's GPT: src/optim/adam_mini.h).

Progress goes to stderr; a table (or with --json one JSON object) to stdout. Run it alone
(flock -x /tmp/zoe-heavy.lock bench/adam_mini.py): other processes on the CPUs and the disk move the
figures.
Usage: bench/adam_mini.py [--zoe build/bin/zoe] [--nvme-path DIR] [--preset demo] [--steps N]
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

TARGET = 0.7


def nvme_bytes(j):
    """NVMe bytes per parameter of the run's last step, read + written."""
    last = j["step_bytes_per_param"][-1]
    return last["nvme->host"] + last["host->nvme"]


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
        sys.exit(f"adam_mini.py: {args.zoe} is not an executable (build first, or give --zoe)")
    if args.skip >= args.steps:
        sys.exit(f"adam_mini.py: --skip {args.skip} leaves none of --steps {args.steps}")
    base = ["--preset", args.preset, "--offload", "nvme", "--device-budget", args.device_budget, "--host-budget",
            args.host_budget, "--micro-batch", str(args.micro_batch), "--eval-batches", "1", "--seed", "1",
            "--steps", str(args.steps), "--lr", "0.001"]
    kinds = ["adamw", "adam_mini"]
    steps = {k: [] for k in kinds}
    nbytes = {k: [] for k in kinds}
    info = {}
    for rnd in range(args.reps):
        for k in alternate(kinds, rnd):
            j, rss, _ = train(args.zoe, base + ["--optimizer", k], args.nvme_path)
            s = steady_step(j, args.skip)
            steps[k].append(s)
            nbytes[k].append(nvme_bytes(j))
            info[k] = {"params": j["params"], "bytes_per_param_per_step": j["step_bytes_per_param"][-1],
                       "optimizer_state_bytes_per_param": j["optimizer_state_bytes_per_param"], "peak_rss": rss,
                       "final_loss": j["losses"][-1]}
            log(f"round {rnd + 1}/{args.reps} {k}: steady step {s:.3f} s, NVMe {nbytes[k][-1]:.2f} bytes/param")
    a, m = statistics.median(steps["adamw"]), statistics.median(steps["adam_mini"])
    ba, bm = statistics.median(nbytes["adamw"]), statistics.median(nbytes["adam_mini"])
    out = {"date": datetime.date.today().isoformat(), "host": platform.node(), "flags": base,
           "reps": args.reps, "skip": args.skip,
           "adamw_nvme_bytes_per_param": ba, "adam_mini_nvme_bytes_per_param": bm,
           "nvme_bytes_vs_adamw": ratio(bm, ba),
           "adamw_step_s": a, "adam_mini_step_s": m, "adamw_all": steps["adamw"], "adam_mini_all": steps["adam_mini"],
           "step_vs_adamw": ratio(m, a),
           "target": f"nvme bytes <= {TARGET:g}x", "met": ratio(bm, ba) <= TARGET, "runs": info}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{'optimizer':10} {'NVMe bytes/param/step':>22} {'steady step s':>14} {'final loss':>11}")
        for k in kinds:
            print(f"{k:10} {statistics.median(nbytes[k]):22.2f} {statistics.median(steps[k]):14.3f} "
                  f"{info[k]['final_loss']:11.4f}")
        print(f"Adam-mini / AdamW: NVMe bytes {out['nvme_bytes_vs_adamw']:.3f} (target <= {TARGET:g}: "
              f"{'met' if out['met'] else 'missed'}), step {out['step_vs_adamw']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
