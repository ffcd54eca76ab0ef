#!/usr/bin/env python3
"""torchrun against mpirun on one host, alternated in one run: the launch overhead and the host
collectives' bus bandwidth.

- launch: two jobs under each launcher with 2 ranks, the wall time from starting the launcher to
  its exit (so to the first step, plus one step and the exit, alike for both): `zoe train --preset
  tiny --steps 1` (a C++ job of half a second) and `examples/train_hf.py --steps 2` (a Python job
  that imports torch and transformers, as users' jobs do). Target: torchrun <= 1.1x mpirun.
- comm: `zoe bench comm --backend host` under each launcher (gloo under torchrun, MPI under
  mpirun), the bus bandwidth of each collective at each size, and their mean over the sizes.
  Target: gloo >= 0.8x MPI's.

Rounds alternate the launchers' order. One JSON object on stdout (and in OUT with --json).

usage: python bench/torchrun_vs_mpirun.py [--zoe build/bin/zoe] [--rounds 3] [--sizes 1MiB..64MiB]
(run it with a python whose torch has torch.distributed.run, alone on the machine)"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "train_hf.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher(name, np):
    if name == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(np), "--master_addr",
                "127.0.0.1", "--master_port", str(free_port()), "--no-python"]
    return [shutil.which("mpirun"), "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "--mca", "btl",
            "self,vader", "-np", str(np)]


def run(cmd):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"torchrun_vs_mpirun: {' '.join(cmd)} exited with {p.returncode}: {p.stderr[-2000:]}")
    return p.stdout, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--zoe", default=shutil.which("zoe") or "build/bin/zoe", help="the zoe binary")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the launchers' order alternated (default 3)")
    ap.add_argument("--sizes", default="1MiB..64MiB", help="zoe bench comm --sizes (default 1MiB..64MiB)")
    ap.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--json", default=None, help="also write the JSON object to this file")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: at least 1")
    if a.np < 2:
        ap.error(f"--np {a.np}: at least 2")
    if not os.access(a.zoe, os.X_OK):
        ap.error(f"--zoe {a.zoe}: not an executable")
    if shutil.which("mpirun") is None:
        sys.exit("torchrun_vs_mpirun: mpirun is not installed (openmpi-bin)")
    launch = {"torchrun": [], "mpirun": []}
    launch_py = {"torchrun": [], "mpirun": []}
    busbw = {"torchrun": {}, "mpirun": {}}
    for r in range(a.rounds):
        for name in (("torchrun", "mpirun") if r % 2 == 0 else ("mpirun", "torchrun")):
            _, wall = run(launcher(name, a.np) + [a.zoe, "train", "--preset", "tiny", "--steps", "1", "--quiet"])
            launch[name].append(wall)
            with tempfile.TemporaryDirectory(prefix="zoe-tvm-", dir=os.environ.get("ZOE_SCRATCH", "/var/tmp")) as tmp:
                py = [] if name == "torchrun" else [sys.executable]
                cmd = launcher(name, a.np) + py + [EXAMPLE, "--steps", "2", "--out", tmp + "/out", "--nvme-path", tmp]
                if name == "torchrun":
                    cmd.remove("--no-python")
                _, pwall = run(cmd)
            launch_py[name].append(pwall)
            out, _ = run(launcher(name, a.np) + [a.zoe, "bench", "comm", "--backend", "host", "--sizes", a.sizes,
                                                  "--json"])
            for row in json.loads(out)["rows"]:
                busbw[name].setdefault(f"{row['op']} {row['bytes']}", []).append(row["busbw_gbps"])
            print(f"round {r + 1} {name}: launch to exit {wall:.2f} s (zoe train), {pwall:.2f} s (python job)",
                  file=sys.stderr)
    rows = {}
    for key in busbw["mpirun"]:
        g, m = statistics.median(busbw["torchrun"][key]), statistics.median(busbw["mpirun"][key])
        rows[key] = {"gloo_busbw_gbps": g, "mpi_busbw_gbps": m, "ratio": g / m if m > 0 else None}
    ops = sorted({k.split()[0] for k in rows})
    by_op = {}
    for op in ops:
        g = statistics.mean(v["gloo_busbw_gbps"] for k, v in rows.items() if k.startswith(op + " "))
        m = statistics.mean(v["mpi_busbw_gbps"] for k, v in rows.items() if k.startswith(op + " "))
        by_op[op] = {"gloo_mean_busbw_gbps": g, "mpi_mean_busbw_gbps": m, "ratio": g / m, "met": g / m >= 0.8}
    def launch_row(runs):
        t, m = statistics.median(runs["torchrun"]), statistics.median(runs["mpirun"])
        return {"torchrun_s": t, "mpirun_s": m, "ratio": t / m, "target": "<= 1.1", "met": t / m <= 1.1,
                "torchrun_all_s": runs["torchrun"], "mpirun_all_s": runs["mpirun"]}
    out = {"np": a.np, "rounds": a.rounds, "sizes": a.sizes,
           "launch": {"zoe_train": launch_row(launch), "python_job": launch_row(launch_py)},
           "comm_by_op": by_op, "comm_rows": rows}
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
