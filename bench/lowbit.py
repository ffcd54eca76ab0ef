#!/usr/bin/env python3
"""Low-bit optimizer states against fp32 states, measured alternately in one run.

Four parts, each a ratio against fp32 states (fp32 master) run in the same invocation:

- bytes: NVMe bytes written per parameter per step, from the disk's own counters
  (/sys/block/<dev>/stat, sectors written x 512, of the whole disk holding --nvme-path). Each
  format trains the demo preset with `--offload nvme` for N and for 2N steps; the difference of the
  two runs' written bytes over N x params is the steady step's, the initial write of every state
  and the warm-up steps cancelling. The engine's own count (`nvme_bytes_written`, the same
  difference) is reported beside it: the disk's figure minus the engine's is what the file system
  and other writers to the disk added. Every (N, 2N) pair is repeated --reps times with the formats'
  order reversed on odd rounds; the median is reported, with the disk's idle write rate measured
  before the part as the bound on other writers. Formats: fp32, bf16 (fp32 master), int8 + bf16
  master, int4 + bf16 master. Targets: fp32 about 12, bf16 about 8 ("about": within 15%), int8 <= 4.1,
  int4 <= 3.1.
- time: the demo preset with `--offload nvme` under a small `--host-budget` (NVMe-bound), int8 +
  bf16 master against fp32, run A/B/A/B (the disk's rate swings 2x); the steady step is the median
  wall time of the steps after the first --skip. Target: int8 + bf16 <= 0.45x fp32.
- quality: --seeds seeds of the demo preset on the demo's task (one-digit additions, `--task
  add1`) for --quality-steps steps; final eval loss of int8 + bf16 and int4 + bf16 against fp32
  states of the same seed. Targets: int8 within 1%, int4 within 2% (of the mean over seeds).
- rss: peak resident memory (ru_maxrss of the zoe process) with `--offload cpu` at --rss-preset
  (its width; --rss-layers overrides its depth where fp32 states of the whole preset do not fit the
  host), int8 states (fp32 master, and bf16 master) against fp32. Target: int8 <= 0.5x fp32.

Progress goes to stderr; a table (or with --json one JSON object) to stdout. Run it alone
(flock -x /tmp/zoe-heavy.lock bench/lowbit.py): other writers to the disk and other processes
on the CPUs move the figures.
Usage: bench/lowbit.py [--zoe build/bin/zoe] [--nvme-path DIR] [--only bytes|time|quality|rss]...
       [--steps N] [--seeds S] [--reps R] [--json]
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# (name, zoe.optimizer_states, zoe.master_weights)
FP32 = ("fp32", "fp32", "fp32")
BF16 = ("bf16", "bf16", "fp32")
INT8 = ("int8+bf16", "int8", "bf16")
INT4 = ("int4+bf16", "int4", "bf16")
INT8_FP32 = ("int8", "int8", "fp32")

BYTES_TARGETS = {"fp32": ("about", 12.0), "bf16": ("about", 8.0), "int8+bf16": ("<=", 4.1),
                 "int4+bf16": ("<=", 3.1)}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def block_stat(path):
    """The whole disk holding path: (name, its /sys/block/<name>/stat)."""
    st = os.stat(path)
    node = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    if not os.path.exists(node):
        sys.exit(f"lowbit.py: --nvme-path {path} is on device {os.major(st.st_dev)}:{os.minor(st.st_dev)}, "
                 "which is no block device (tmpfs, overlay or btrfs?): give a directory on a disk")
    real = os.path.realpath(node)
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    name = os.path.basename(real)
    stat = f"/sys/block/{name}/stat"
    if not os.path.exists(stat):
        sys.exit(f"lowbit.py: {stat} (the disk holding --nvme-path {path}) does not exist")
    return name, stat


def sectors_written_bytes(stat):
    return int(open(stat).read().split()[6]) * 512


def train(zoe, flags, scratch_parent=None):
    """One `zoe train --json` run: (its JSON, peak RSS bytes, wall seconds)."""
    scratch = tempfile.mkdtemp(dir=scratch_parent, prefix="zoe-lowbit.") if scratch_parent else None
    cmd = [zoe, "train", "--json", "--quiet"] + flags + (["--nvme-path", scratch] if scratch else [])
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, stdout=out, stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            wall = time.monotonic() - t0
            if proc.returncode != 0:
                err.seek(0)
                sys.exit(f"lowbit.py: {' '.join(cmd)} failed ({proc.returncode}):\n"
                         + err.read().decode(errors="replace")[-3000:])
            out.seek(0)
            return json.loads(out.read()), usage.ru_maxrss * 1024, wall
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def fmt_flags(f):
    return ["--optimizer-states", f[1], "--master-weights", f[2]]


def alternate(formats, rnd):
    return formats if rnd % 2 == 0 else list(reversed(formats))


def ratio(x, base):
    return x / base if base else float("nan")


# ---- bytes: NVMe bytes written per parameter per step ----

def part_bytes(args):
    dev, stat = block_stat(args.nvme_path)
    idle = args.idle_s
    b0 = sectors_written_bytes(stat)
    time.sleep(idle)
    background = (sectors_written_bytes(stat) - b0) / idle
    log(f"bytes: disk {dev}, idle writes {background / 1e6:.3f} MB/s over {idle:g} s")
    base = ["--preset", args.preset, "--offload", "nvme", "--device-budget", "16MiB", "--micro-batch", "8",
            "--eval-batches", "1", "--seed", "1"]
    n = args.steps
    formats = [FP32, BF16, INT8, INT4]
    rows = {f[0]: {"disk": [], "engine": [], "excess": [], "bg_bound": []} for f in formats}
    info = {}
    for rnd in range(args.reps):
        for f in alternate(formats, rnd):
            got = {}
            for steps in (n, 2 * n):
                d0 = sectors_written_bytes(stat)
                j, _, wall = train(args.zoe, base + fmt_flags(f) + ["--steps", str(steps)], args.nvme_path)
                d1 = sectors_written_bytes(stat)
                got[steps] = (d1 - d0, j["nvme_bytes_written"], wall, j)
            p = got[n][3]["params"]
            disk = (got[2 * n][0] - got[n][0]) / (n * p)
            eng = (got[2 * n][1] - got[n][1]) / (n * p)
            bg = background * (got[2 * n][2] + got[n][2]) / (n * p)
            r = rows[f[0]]
            r["disk"].append(disk)
            r["engine"].append(eng)
            r["excess"].append(disk - eng)
            r["bg_bound"].append(bg)
            last = got[2 * n][3]
            info[f[0]] = {"params": p, "optimizer_state_bytes_per_param": last["optimizer_state_bytes_per_param"],
                          "engine_last_step": last["bytes_per_param_per_step"]}
            log(f"bytes round {rnd + 1}/{args.reps} {f[0]}: disk {disk:.3f}, engine {eng:.3f} B/param/step "
                f"(other writers at the idle rate: {bg:.3f})")
            if abs(disk - eng) > 0.05:
                log(f"bytes round {rnd + 1}/{args.reps} {f[0]}: the disk's figure differs from the engine's by "
                    f"{disk - eng:+.3f} B/param/step: other writers were busy (use more --reps, or a quiet disk)")
    out = {"disk": dev, "steps": [n, 2 * n], "reps": args.reps, "idle_write_bytes_per_s": background,
           "flags": base, "formats": {}}
    fp = statistics.median(rows["fp32"]["disk"])
    for f in formats:
        r = rows[f[0]]
        disk = statistics.median(r["disk"])
        kind, target = BYTES_TARGETS[f[0]]
        met = disk <= target if kind == "<=" else abs(disk - target) / target <= 0.15
        out["formats"][f[0]] = {
            "optimizer_states": f[1], "master_weights": f[2],
            "disk_bytes_per_param_per_step": disk, "disk_all": r["disk"], "disk_min": min(r["disk"]),
            "engine_bytes_per_param_per_step": statistics.median(r["engine"]),
            "engine_last_step_host_to_nvme": info[f[0]]["engine_last_step"].get("host->nvme"),
            "engine_last_step_nvme_to_host": info[f[0]]["engine_last_step"].get("nvme->host"),
            "disk_minus_engine": statistics.median(r["excess"]),
            "other_writers_bound": statistics.median(r["bg_bound"]),
            "optimizer_state_bytes_per_param": info[f[0]]["optimizer_state_bytes_per_param"],
            "params": info[f[0]]["params"], "ratio_vs_fp32": ratio(disk, fp),
            "target": f"{kind} {target:g}", "met": met}
    return out


# ---- time: the NVMe-bound step ----

def steady_step(j, skip):
    walls = [s["wall"] for s in j["step_time_s"][skip:]]
    return statistics.median(walls)


def part_time(args):
    base = ["--preset", args.preset, "--offload", "nvme", "--device-budget", args.time_device_budget, "--host-budget",
            args.host_budget, "--micro-batch", str(args.time_micro_batch), "--eval-batches", "1", "--seed", "1",
            "--steps", str(args.time_steps)]
    formats = [FP32, INT8]
    runs = {f[0]: [] for f in formats}
    detail = {}
    for rnd in range(args.reps):
        for f in alternate(formats, rnd):
            j, _, _ = train(args.zoe, base + fmt_flags(f), args.nvme_path)
            s = steady_step(j, args.skip)
            runs[f[0]].append(s)
            steps = j["step_time_s"][args.skip:]
            detail[f[0]] = {"io_stall_share": sum(x["io_stall"] for x in steps) / sum(x["wall"] for x in steps),
                            "optimizer_share": sum(x["optimizer"] for x in steps) / sum(x["wall"] for x in steps),
                            "compute_share": sum(x["compute"] for x in steps) / sum(x["wall"] for x in steps),
                            "bytes_per_param_per_step": j["bytes_per_param_per_step"],
                            "buffers": j["buffers"]}
            log(f"time round {rnd + 1}/{args.reps} {f[0]}: steady step {s * 1e3:.1f} ms")
    fp = statistics.median(runs["fp32"])
    q = statistics.median(runs["int8+bf16"])
    pairs = [b / a for a, b in zip(runs["fp32"], runs["int8+bf16"])]
    return {"flags": base, "skip": args.skip, "reps": args.reps,
            "fp32_step_s": fp, "int8_bf16_step_s": q, "fp32_all": runs["fp32"], "int8_bf16_all": runs["int8+bf16"],
            "ratio": ratio(q, fp), "ratio_per_round": pairs, "target": "<= 0.45", "met": ratio(q, fp) <= 0.45,
            "last_run": detail}


# ---- quality: final eval loss over seeds ----

def part_quality(args):
    base = ["--preset", args.preset, "--task", "add1", "--steps", str(args.quality_steps), "--eval-batches", "8"]
    formats = [FP32, INT8, INT4]
    loss = {f[0]: {} for f in formats}
    acc = {f[0]: {} for f in formats}
    for i, seed in enumerate(range(1, args.seeds + 1)):
        for f in alternate(formats, i):
            j, _, wall = train(args.zoe, base + fmt_flags(f) + ["--seed", str(seed)])
            loss[f[0]][seed] = j["eval_loss"]
            acc[f[0]][seed] = j.get("accuracy")
            log(f"quality seed {seed} {f[0]}: eval loss {j['eval_loss']:.5f} accuracy {j.get('accuracy')} "
                f"({wall:.0f} s)")
    out = {"flags": base, "seeds": list(range(1, args.seeds + 1)), "formats": {}}
    fp_mean = statistics.mean(loss["fp32"].values())
    for f, tol in ((FP32, None), (INT8, 0.01), (INT4, 0.02)):
        per_seed = [loss[f[0]][s] / loss["fp32"][s] - 1 for s in out["seeds"]]
        mean = statistics.mean(loss[f[0]].values())
        rel = mean / fp_mean - 1
        row = {"eval_loss_by_seed": [loss[f[0]][s] for s in out["seeds"]],
               "accuracy_by_seed": [acc[f[0]][s] for s in out["seeds"]],
               "mean_eval_loss": mean, "ratio_vs_fp32": mean / fp_mean, "rel_diff_of_mean": rel,
               "rel_diff_by_seed": per_seed}
        if tol is not None:
            # A quality bound: the loss at most tol above fp32's (a lower loss is no loss of quality).
            row["target"] = f"within {tol * 100:g}% (at most {tol * 100:g}% above fp32's)"
            row["met"] = rel <= tol
        out["formats"][f[0]] = row
    return out


# ---- rss: peak host memory with --offload cpu ----

def part_rss(args):
    base = ["--preset", args.rss_preset, "--offload", "cpu", "--steps", str(args.rss_steps), "--micro-batch", "1",
            "--eval-batches", "1", "--seed", "1"]
    if args.rss_layers:
        base += ["--layers", str(args.rss_layers)]
    formats = [FP32, INT8_FP32, INT8]
    rss = {f[0]: [] for f in formats}
    info = {}
    for rnd in range(args.rss_reps):
        for f in alternate(formats, rnd):
            j, peak, wall = train(args.zoe, base + fmt_flags(f))
            rss[f[0]].append(peak)
            info[f[0]] = {"params": j["params"], "model_state_bytes": j["model_state_bytes"],
                          "optimizer_state_bytes_per_param": j["optimizer_state_bytes_per_param"],
                          "high_water_host": j["high_water_bytes"]["host"], "wall_s": wall}
            log(f"rss round {rnd + 1}/{args.rss_reps} {f[0]}: peak RSS {peak / 2**30:.2f} GiB ({wall:.0f} s)")
    fp = statistics.median(rss["fp32"])
    out = {"flags": base, "reps": args.rss_reps, "formats": {}}
    for f in formats:
        peak = statistics.median(rss[f[0]])
        row = dict(info[f[0]], peak_rss_bytes=peak, peak_rss_all=rss[f[0]], ratio_vs_fp32=ratio(peak, fp))
        if f is not FP32:
            row["target"] = "<= 0.5"
            row["met"] = ratio(peak, fp) <= 0.5
        out["formats"][f[0]] = row
    return out


PARTS = {"bytes": part_bytes, "time": part_time, "quality": part_quality, "rss": part_rss}


def table(res):
    rows = []
    for name, f in res.get("bytes", {}).get("formats", {}).items():
        rows.append((f"NVMe B/param/step, disk ({name})", f"{f['disk_bytes_per_param_per_step']:.3f}",
                     f"engine {f['engine_bytes_per_param_per_step']:.3f}, fp32 disk "
                     f"{res['bytes']['formats']['fp32']['disk_bytes_per_param_per_step']:.3f}", f"{f['ratio_vs_fp32']:.3f}", f["target"],
                     f["met"]))
    t = res.get("time")
    if t:
        rows.append(("NVMe-bound step s (int8+bf16)", f"{t['int8_bf16_step_s']:.4f}", f"fp32 {t['fp32_step_s']:.4f}",
                     f"{t['ratio']:.3f}", t["target"], t["met"]))
    for name, f in res.get("quality", {}).get("formats", {}).items():
        if name != "fp32":
            fp = res["quality"]["formats"]["fp32"]["mean_eval_loss"]
            rows.append((f"eval loss, mean of seeds ({name})", f"{f['mean_eval_loss']:.5f}", f"fp32 {fp:.5f}",
                         f"{f['ratio_vs_fp32']:.4f}", f["target"], f["met"]))
    for name, f in res.get("rss", {}).get("formats", {}).items():
        if name != "fp32":
            fp = res["rss"]["formats"]["fp32"]["peak_rss_bytes"]
            rows.append((f"peak RSS GiB, --offload cpu ({name})", f"{f['peak_rss_bytes'] / 2**30:.2f}",
                         f"fp32 {fp / 2**30:.2f}", f"{f['ratio_vs_fp32']:.3f}", f["target"], f["met"]))
    head = ("figure", "value", "baseline", "ratio", "target", "met")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoe", default="build/bin/zoe")
    ap.add_argument("--nvme-path", default=os.environ.get("ZOE_SCRATCH", "/var/tmp"),
                    help="directory on the disk to measure (default $ZOE_SCRATCH or /var/tmp)")
    ap.add_argument("--only", action="append", choices=list(PARTS), help="run only this part (repeatable)")
    ap.add_argument("--preset", default="demo",
                    help="bytes, time and quality: the model (default demo; smaller presets pad each swapper "
                    "chunk to 4096 bytes, which inflates the low-bit formats' bytes)")
    ap.add_argument("--steps", type=int, default=10, help="bytes: runs of N and 2N steps (default 10)")
    ap.add_argument("--reps", type=int, default=3, help="bytes and time: rounds, alternated (default 3)")
    ap.add_argument("--idle-s", type=float, default=5.0, help="bytes: seconds the disk's idle writes are measured")
    ap.add_argument("--time-steps", type=int, default=40, help="time: steps per run (default 40)")
    ap.add_argument("--skip", type=int, default=5, help="time: first steps left out of the steady step")
    ap.add_argument("--host-budget", default="80MiB",
                    help="time: zoe's --host-budget (default 80MiB; the demo's placement needs 64.02 MiB)")
    ap.add_argument("--time-micro-batch", type=int, default=1, help="time: --micro-batch (default 1)")
    ap.add_argument("--time-device-budget", default="16MiB",
                    help="time: --device-budget (default 16MiB; a larger preset's module needs more, e.g. 2GiB at 2b)")
    ap.add_argument("--seeds", type=int, default=3, help="quality: seeds 1..S (default 3)")
    ap.add_argument("--quality-steps", type=int, default=1000, help="quality: steps per run (default 1000)")
    ap.add_argument("--rss-preset", default="2b", help="rss: preset (default 2b)")
    ap.add_argument("--rss-layers", type=int, default=0, help="rss: layers instead of the preset's (0: its own)")
    ap.add_argument("--rss-steps", type=int, default=3, help="rss: steps per run (default 3)")
    ap.add_argument("--rss-reps", type=int, default=1, help="rss: rounds (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if not os.access(args.zoe, os.X_OK):
        sys.exit(f"lowbit.py: --zoe {args.zoe} is not an executable (build it: cmake --build build --target zoe)")
    if not os.path.isdir(args.nvme_path):
        sys.exit(f"lowbit.py: --nvme-path {args.nvme_path} is not a directory")
    for flag, v in (("--steps", args.steps), ("--reps", args.reps), ("--seeds", args.seeds),
                    ("--time-steps", args.time_steps - args.skip), ("--rss-reps", args.rss_reps)):
        if v < 1:
            sys.exit(f"lowbit.py: {flag} must be at least 1 (--time-steps more than --skip)")
    info = subprocess.run([args.zoe, "info"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    res = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": " ".join(sys.argv), "machine": info.strip().splitlines()}
    for name in args.only or list(PARTS):
        t0 = time.monotonic()
        res[name] = PARTS[name](args)
        res[name]["seconds"] = time.monotonic() - t0
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
