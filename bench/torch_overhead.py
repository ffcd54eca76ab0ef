#!/usr/bin/env python3
"""Step time of zoe's PyTorch front-end against `zoe train` (zoe's own C++ GPT) on the same GPT
shape on the CPU device, alternately in one run, plus plain PyTorch (torch.optim.AdamW, no zoe)
so the front-end's own cost (hooks, fetch/release, gradient copies, the engine's step) shows
apart from the difference between torch's CPU kernels and zoe's.

usage: PYTHONPATH=build/python /usr/bin/python3 bench/torch_overhead.py [--zoe build/bin/zoe]
       [--rounds 3] [--steps 5] [--preset demo] [--json out.json]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
import zoe  # noqa: E402
from zoe_torch_models import GPT  # noqa: E402

PRESETS = {"tiny": (2, 64, 4, 64), "small": (4, 128, 4, 64), "demo": (6, 256, 8, 64)}  # as tools/cmd_train.cpp


def cfg(micro):
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
            "zero_optimization": {"stage": 3}}


def batches(n, micro, T, vocab=256):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n + 1):
        idx = torch.randint(0, vocab, (micro, T + 1), generator=g)
        out.append((idx[:, :-1].contiguous(), idx[:, 1:].contiguous()))
    return out


def time_front_end(shape, steps, micro):
    layers, d, heads, ctx = shape
    torch.manual_seed(0)
    eng = zoe.initialize(GPT(vocab=256, d=d, layers=layers, heads=heads, ctx=ctx), config=cfg(micro))
    data = batches(steps, micro, ctx)
    eng.backward(eng(*data[0]))  # warm-up step (first fetches, allocations)
    eng.step()
    t0 = time.perf_counter()
    for b in data[1:]:
        eng.backward(eng(*b))
        eng.step()
    t = (time.perf_counter() - t0) / steps
    eng.close()
    return t


def time_plain(shape, steps, micro):
    layers, d, heads, ctx = shape
    torch.manual_seed(0)
    m = GPT(vocab=256, d=d, layers=layers, heads=heads, ctx=ctx)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0)
    data = batches(steps, micro, ctx)
    t0 = None
    for i, b in enumerate(data):
        if i == 1:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        m(*b).backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def time_zoe_train(zoe_bin, preset, steps, micro):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ds.json")
        with open(path, "w") as f:
            json.dump(cfg(micro), f)
        p = subprocess.run([zoe_bin, "train", "--preset", preset, "--steps", str(steps + 1), "--precision", "fp32",
                            "--config", path, "--json", "--quiet", "--eval-batches", "1",
                            "--threads", str(torch.get_num_threads())],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            sys.exit(f"torch_overhead: zoe train exited {p.returncode}: {p.stderr[-2000:]}")
        j = json.loads(p.stdout)
        return j["time_s"]["total"] / (steps + 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zoe", default=str(REPO / "build" / "bin" / "zoe"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--preset", default="demo", choices=sorted(PRESETS))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    shape = PRESETS[a.preset]
    print(f"# torch front-end vs zoe train: GPT {a.preset} (layers {shape[0]}, d {shape[1]}, heads {shape[2]}, "
          f"T {shape[3]}, vocab 256), micro-batch {a.micro}, fp32, stage 3, CPU device, "
          f"{a.steps} steps x {a.rounds} rounds, torch threads {torch.get_num_threads()}")
    print(f"{'round':>5} {'zoe train':>10} {'front-end':>10} {'plain torch':>11} {'fe/zoe':>7} {'fe/torch':>8}")
    print(f"{'':>5} {'s/step':>10} {'s/step':>10} {'s/step':>11} {'x':>7} {'x':>8}")
    rows = []
    for r in range(a.rounds):
        z = time_zoe_train(a.zoe, a.preset, a.steps, a.micro)
        f = time_front_end(shape, a.steps, a.micro)
        p = time_plain(shape, a.steps, a.micro)
        rows.append((z, f, p))
        print(f"{r:>5} {z:>10.4f} {f:>10.4f} {p:>11.4f} {f / z:>7.3f} {f / p:>8.3f}")
    z, f, p = (statistics.median(c) for c in zip(*rows))
    ok = f / z <= 1.15
    print(f"{'med':>5} {z:>10.4f} {f:>10.4f} {p:>11.4f} {f / z:>7.3f} {f / p:>8.3f}   "
          f"target fe/zoe <= 1.15: {'OK' if ok else 'OVER'}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"preset": a.preset, "rows": rows, "median": {"zoe_train": z, "front_end": f, "plain_torch": p},
                       "ratio_front_end_to_zoe_train": f / z, "ratio_front_end_to_plain_torch": f / p}, fh)


if __name__ == "__main__":
    main()
