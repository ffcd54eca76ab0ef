#!/usr/bin/env python3
"""The layer-major schedule against the micro-batch schedule, measured alternately in one run.

`zoe train` at --preset (default large) with parameters (stage 3, none kept in host memory:
offload_param.max_in_cpu 0) and optimizer states on NVMe under --nvme-path, bf16, activation
checkpointing, gradient_accumulation_steps G (--accum, default 8) micro-batches of --micro-batch
sequences of --seq tokens (few tokens: an NVMe-bound step on a CPU). Runs, in rounds (--rounds;
the order reversed on odd rounds, as the disk's rate swings 2x from minute to minute):

- micro-batch, G micro-batches;
- layer-major, G micro-batches;
- micro-batch, 1 micro-batch (the bytes a step reads when nothing is read twice).

For each run, over the steps after the first --skip: the median step wall time and the NVMe bytes
read and written per step (the engine's counts, per parameter). Figures: layer-major's NVMe reads
at G over the G = 1 run's (target <= 1.1x), layer-major's step time over micro-batch's (target
<= 0.6x), each from the medians over rounds, and the I/O lower bound of both schedules: the step's
NVMe bytes over the disk's read and write bandwidth (fio, io_uring, O_DIRECT, 1 MiB blocks, queue
depth 16, measured between the rounds), beside the measured step.

Progress goes to stderr; a table (or with --json one JSON object) to stdout. Run it alone
(flock -x /tmp/zoe-heavy.lock bench/layer_major.py): other writers to the disk and other processes
on the CPUs move the figures.
Usage: bench/layer_major.py [--zoe build/bin/zoe] [--nvme-path DIR] [--preset large] [--accum 8]
       [--steps 4] [--skip 1] [--rounds 2] [--json]
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


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def config(nvme, accum, micro_batch, host_budget):
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": accum,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
        "activation_checkpointing": {"partition_activations": False},
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "offload_param": {"device": "nvme", "nvme_path": nvme, "max_in_cpu": 0},
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
        },
        "zoe": {"host_budget": host_budget, "activation_offload": "cpu"},
    }


def run(a, work, schedule, accum):
    nvme = os.path.join(work, "swap")
    os.makedirs(nvme, exist_ok=True)
    path = os.path.join(work, f"cfg-{schedule}-{accum}.json")
    with open(path, "w") as f:
        json.dump(config(nvme, accum, a.micro_batch, a.host_budget), f)
    cmd = [a.zoe, "train", "--config", path, "--preset", a.preset, "--seq", str(a.seq), "--steps",
           str(a.steps), "--schedule", schedule, "--json", "--quiet"]
    log(f"  {schedule:11s} G={accum}: {' '.join(cmd)}")
    p = subprocess.run(cmd, capture_output=True, text=True)
    shutil.rmtree(nvme, ignore_errors=True)
    settle_free_space(work)
    if p.returncode != 0:
        sys.exit(f"zoe train failed ({p.returncode}):\n{p.stderr[-3000:]}")
    j = json.loads(p.stdout)
    steps = range(a.skip, len(j["step_time_s"]))
    params = j["params"]
    out = {
        "step_s": statistics.median(j["step_time_s"][i]["wall"] for i in steps),
        "read_per_param": statistics.median(j["step_bytes_per_param"][i]["nvme->host"] for i in steps),
        "write_per_param": statistics.median(j["step_bytes_per_param"][i]["host->nvme"] for i in steps),
        "params": params,
        "losses": j["losses"],
    }
    log(f"    step {out['step_s']:.2f} s, NVMe read {out['read_per_param']:.2f} B/param, "
        f"written {out['write_per_param']:.2f} B/param")
    return out


def settle_free_space(path, limit_s=180):
    """Waits until the file system's free space stops growing: a deleted swap file of tens of GB
    is given back over seconds, and the next run's free-space check would otherwise refuse."""
    os.sync()
    last, steady, t0 = -1, 0, time.monotonic()
    while steady < 3 and time.monotonic() - t0 < limit_s:
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize
        steady = steady + 1 if free == last else 0
        last = free
        time.sleep(1)


def fio_bandwidth(work, rw):
    if shutil.which("fio") is None:
        return None
    f = os.path.join(work, "fio.dat")
    p = subprocess.run(["fio", "--name=lm", f"--filename={f}", f"--rw={rw}", "--bs=1M", "--iodepth=16",
                        "--ioengine=io_uring", "--direct=1", "--size=2G", "--runtime=8", "--time_based",
                        "--output-format=json"], capture_output=True, text=True)
    if p.returncode != 0:
        return None
    job = json.loads(p.stdout)["jobs"][0]
    return job["read" if rw == "read" else "write"]["bw_bytes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoe", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "zoe"))
    ap.add_argument("--nvme-path", default="/var/tmp")
    ap.add_argument("--preset", default="large")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--skip", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--host-budget", default="2GiB")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.skip >= a.steps:
        sys.exit("--skip must be below --steps")
    work = tempfile.mkdtemp(prefix="zoe-layer-major-", dir=a.nvme_path)
    runs = {"micro-batch": [], "layer-major": [], "one": []}
    bw = {"read": [], "write": []}
    try:
        for r in range(a.rounds):
            log(f"round {r + 1} of {a.rounds}")
            order = [("micro-batch", a.accum), ("layer-major", a.accum), ("one", 1)]
            if r % 2:
                order.reverse()
            for name, accum in order:
                runs[name].append(run(a, work, "micro-batch" if name == "one" else name, accum))
            for rw in ("read", "write"):
                b = fio_bandwidth(work, rw)
                if b:
                    bw[rw].append(b)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("step_s", "read_per_param", "write_per_param")}
           for k, v in runs.items()}
    params = runs["one"][0]["params"]
    same = all(x["losses"] == runs["micro-batch"][0]["losses"] for x in runs["layer-major"] + runs["micro-batch"])
    rbw = statistics.median(bw["read"]) if bw["read"] else None
    wbw = statistics.median(bw["write"]) if bw["write"] else None

    def bound(k):
        if not rbw or not wbw:
            return None
        return med[k]["read_per_param"] * params / rbw + med[k]["write_per_param"] * params / wbw

    result = {
        "date": datetime.date.today().isoformat(),
        "preset": a.preset, "params": params, "accum": a.accum, "seq": a.seq, "micro_batch": a.micro_batch,
        "steps": a.steps, "skip": a.skip, "rounds": a.rounds,
        "median": med,
        "fio_read_bytes_per_s": rbw, "fio_write_bytes_per_s": wbw,
        "io_bound_s": {k: bound(k) for k in ("micro-batch", "layer-major")},
        "reads_layer_major_over_g1": med["layer-major"]["read_per_param"] / med["one"]["read_per_param"],
        "reads_micro_batch_over_g1": med["micro-batch"]["read_per_param"] / med["one"]["read_per_param"],
        "step_layer_major_over_micro_batch": med["layer-major"]["step_s"] / med["micro-batch"]["step_s"],
        "same_losses": same,
        "runs": runs,
    }
    if a.json:
        print(json.dumps(result, indent=1))
        return
    print(f"# layer-major vs micro-batch, preset {a.preset} ({params} params), G={a.accum}, "
          f"{a.micro_batch}x{a.seq} tokens per micro-batch, {a.rounds} rounds, {result['date']}")
    print(f"{'run':14s} {'step s':>8s} {'I/O bound s':>12s} {'read B/param':>13s} {'written B/param':>16s}")
    for k, label in (("micro-batch", f"micro-batch G={a.accum}"), ("layer-major", f"layer-major G={a.accum}"),
                     ("one", "micro-batch G=1")):
        b = bound(k) if k != "one" else None
        print(f"{label:14s} {med[k]['step_s']:8.2f} {b if b is not None else float('nan'):12.2f} "
              f"{med[k]['read_per_param']:13.2f} {med[k]['write_per_param']:16.2f}")
    print(f"NVMe reads per step, layer-major G={a.accum} / G=1: {result['reads_layer_major_over_g1']:.2f}x "
          f"(target <= 1.1x; micro-batch: {result['reads_micro_batch_over_g1']:.2f}x)")
    print(f"step time, layer-major / micro-batch: {result['step_layer_major_over_micro_batch']:.2f}x "
          f"(target <= 0.6x)")
    print(f"losses identical across schedules and rounds: {same}")


if __name__ == "__main__":
    main()
