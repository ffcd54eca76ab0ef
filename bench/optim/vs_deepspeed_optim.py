#!/usr/bin/env python3
"""zoe's fused CPU optimizer steps against DeepSpeed's, in one process, on the same tensors.

    vs_deepspeed_optim.py --lib build/lib/libzoe_optim_capi.so [--params 64M] [--threads 0]
                          [--optimizers lion,adagrad,adamw] [--rounds 7] [--steps-per-round 3]
                          [--json FILE]

DeepSpeed's DeepSpeedCPULion, DeepSpeedCPUAdagrad and DeepSpeedCPUAdam (their `step()`, on one
fp32 parameter of --params elements with an fp32 gradient and fp32 states, what ZeRO-Offload
runs on its flat fp32 partition) and zoe's lion_step / adagrad_step / adam_step (through
zoe_optim_capi, on tensors of the same size from the same torch allocator, fp32 gradients,
no compute copy: the same work). DeepSpeed's ops are built from its source just in time
(torch.utils.cpp_extension, its own compiler flags: -O3 -march=native -fopenmp and its SIMD
width), into $TORCH_EXTENSIONS_DIR.

Threads: --threads T (0: every CPU) sets OMP_NUM_THREADS and torch.set_num_threads for
DeepSpeed's OpenMP loops and the size of zoe's pool. Each round times --steps-per-round steps of
one implementation, then of the other, the first one alternating from round to round, after one
warm-up round; the figure is the median step time, and the ratio DeepSpeed / zoe (> 1: zoe
faster). A separate check on 1M elements runs 5 steps of each from the same start and reports
how far the parameters are apart (FMA and DeepSpeed's sign(0) = 1 make Lion differ where c is
within rounding of 0; Adagrad and AdamW agree to a few ulps).

Run it with a Python that has torch and deepspeed (bench/vs_deepspeed/run.sh's venv, or any),
with DS_ACCELERATOR=cpu on a machine without a GPU.
"""
import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time


def parse_count(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s[-1].upper() in mult:
        return int(float(s[:-1]) * mult[s[-1].upper()])
    return int(float(s))


class Zoe:
    """zoe_optim_capi through ctypes."""

    def __init__(self, lib_path, threads):
        self.lib = ctypes.CDLL(lib_path)
        L, vp, f, i64, sz, i = self.lib, ctypes.c_void_p, ctypes.c_float, ctypes.c_int64, ctypes.c_size_t, ctypes.c_int
        L.zoe_optim_pool_create.restype = vp
        L.zoe_optim_pool_create.argtypes = [i]
        L.zoe_optim_pool_threads.argtypes = [vp]
        L.zoe_optim_pool_backend.argtypes = [vp]
        L.zoe_optim_pool_backend.restype = ctypes.c_char_p
        L.zoe_optim_kernel_path.restype = ctypes.c_char_p
        L.zoe_optim_last_error.restype = ctypes.c_char_p
        L.zoe_optim_lion_step.argtypes = [vp, vp, vp, i, vp, sz, f, f, f, f, i64, f, vp, i]
        L.zoe_optim_adagrad_step.argtypes = [vp, vp, vp, i, vp, sz, f, f, f, i64, f, vp, i]
        L.zoe_optim_adam_step.argtypes = [vp, vp, vp, i, vp, vp, sz, f, f, f, f, f, i, i64, f, vp, i]
        self.pool = L.zoe_optim_pool_create(threads)
        if not self.pool:
            sys.exit("zoe_optim_pool_create: " + L.zoe_optim_last_error().decode())
        self.threads = L.zoe_optim_pool_threads(self.pool)
        self.backend = L.zoe_optim_pool_backend(self.pool).decode()
        self.path = L.zoe_optim_kernel_path().decode()

    def check(self, rc):
        if rc != 0:
            sys.exit("zoe: " + self.lib.zoe_optim_last_error().decode())


# DeepSpeed's defaults for each optimizer type, with weight decay on (its branch taken).
HYPER = {
    "lion": dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.01),
    "adagrad": dict(lr=1e-2, eps=1e-10, weight_decay=0.01),
    "adamw": dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
}


class Pair:
    """One optimizer: DeepSpeed's on its own parameter, zoe's on its own tensors; same start."""

    def __init__(self, name, n, zoe, seed=0):
        import torch
        self.name, self.n, self.zoe, self.t = name, n, zoe, 0
        gen = torch.Generator().manual_seed(seed)
        p0 = torch.randn(n, generator=gen)
        g0 = torch.randn(n, generator=gen)
        self.ds_param = torch.nn.Parameter(p0.clone())
        self.ds_param.grad = g0.clone()
        h = HYPER[name]
        if name == "lion":
            from deepspeed.ops.lion import DeepSpeedCPULion
            self.ds = DeepSpeedCPULion([self.ds_param], **h)
        elif name == "adagrad":
            from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
            self.ds = DeepSpeedCPUAdagrad([self.ds_param], **h)
        else:
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            self.ds = DeepSpeedCPUAdam([self.ds_param], adamw_mode=True, **h)
        self.zp, self.zg = p0.clone(), g0.clone()
        self.zs = [torch.zeros(n) for _ in range(2 if name == "adamw" else 1)]

    def ds_step(self):
        self.ds.step()

    def zoe_step(self):
        self.t += 1
        h, z, L = HYPER[self.name], self.zoe, self.zoe.lib
        p, g, s = self.zp.data_ptr(), self.zg.data_ptr(), [x.data_ptr() for x in self.zs]
        if self.name == "lion":
            rc = L.zoe_optim_lion_step(z.pool, p, g, 0, s[0], self.n, h["lr"], h["betas"][0], h["betas"][1],
                                       h["weight_decay"], self.t, 1.0, None, 2)
        elif self.name == "adagrad":
            rc = L.zoe_optim_adagrad_step(z.pool, p, g, 0, s[0], self.n, h["lr"], h["eps"], h["weight_decay"],
                                          self.t, 1.0, None, 2)
        else:
            rc = L.zoe_optim_adam_step(z.pool, p, g, 0, s[0], s[1], self.n, h["lr"], h["betas"][0],
                                       h["betas"][1], h["eps"], h["weight_decay"], 1, self.t, 1.0, None, 2)
        z.check(rc)


def time_steps(fn, k):
    out = []
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def agreement(name, zoe, steps=5):
    """Max |p_zoe - p_ds| / max(|p_ds|, 1e-3) and the fraction of elements more than 1e-5 apart."""
    import torch
    pr = Pair(name, 1 << 20, zoe, seed=1)
    for _ in range(steps):
        pr.ds_step()
        pr.zoe_step()
    a, b = pr.zp, pr.ds_param.data
    rel = (a - b).abs() / b.abs().clamp_min(1e-3)
    return {"max_rel_diff": float(rel.max()), "frac_over_1e-5": float((rel > 1e-5).float().mean()),
            "steps": steps, "elements": pr.n}


def bench(name, n, zoe, rounds, k):
    pr = Pair(name, n, zoe)
    t = {"deepspeed": [], "zoe": []}
    fns = {"deepspeed": pr.ds_step, "zoe": pr.zoe_step}
    for r in range(rounds + 1):  # round 0 warms up (page faults, JIT) and is dropped
        order = ("deepspeed", "zoe") if r % 2 == 0 else ("zoe", "deepspeed")
        for who in order:
            ts = time_steps(fns[who], k)
            if r > 0:
                t[who] += ts
    med = {w: statistics.median(v) for w, v in t.items()}
    mn = {w: min(v) for w, v in t.items()}
    return {"optimizer": name, "params": n, "steps_each": len(t["zoe"]),
            "deepspeed_ms": med["deepspeed"] * 1e3, "zoe_ms": med["zoe"] * 1e3,
            "deepspeed_min_ms": mn["deepspeed"] * 1e3, "zoe_min_ms": mn["zoe"] * 1e3,
            "ratio": med["deepspeed"] / med["zoe"], "ratio_of_mins": mn["deepspeed"] / mn["zoe"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="path to libzoe_optim_capi.so")
    ap.add_argument("--params", default="64M")
    ap.add_argument("--threads", type=int, default=0, help="0: every CPU")
    ap.add_argument("--optimizers", default="lion,adagrad,adamw")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps-per-round", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    threads = a.threads or os.cpu_count()
    os.environ["OMP_NUM_THREADS"] = str(threads)  # before torch and DeepSpeed's ops load OpenMP
    import torch
    torch.set_num_threads(threads)
    import deepspeed
    zoe = Zoe(os.path.abspath(a.lib), threads)
    n = parse_count(a.params)
    names = [x for x in a.optimizers.split(",") if x]
    for x in names:
        if x not in HYPER:
            sys.exit(f"--optimizers: unknown '{x}' (lion, adagrad, adamw)")
    rows = []
    print(f"# zoe vs DeepSpeed CPU optimizer step: {n} params, {threads} thread(s); zoe path {zoe.path}, "
          f"pool {zoe.backend}; DeepSpeed {deepspeed.__version__}, torch {torch.__version__}")
    print(f"# medians of {a.rounds} alternated rounds x {a.steps_per_round} steps each")
    print(f"# {'optimizer':10} {'DeepSpeed ms':>12} {'zoe ms':>8} {'ratio':>6} {'ratio(min)':>10} "
          f"{'max rel diff':>12} {'frac>1e-5':>9}")
    for name in names:
        row = bench(name, n, zoe, a.rounds, a.steps_per_round)
        row["agreement"] = agreement(name, zoe)
        rows.append(row)
        print(f"  {name:10} {row['deepspeed_ms']:12.2f} {row['zoe_ms']:8.2f} {row['ratio']:6.3f} "
              f"{row['ratio_of_mins']:10.3f} {row['agreement']['max_rel_diff']:12.3g} "
              f"{row['agreement']['frac_over_1e-5']:9.2g}", flush=True)
    out = {"machine": platform.processor() or platform.machine(), "threads": threads, "zoe_path": zoe.path,
           "zoe_pool": zoe.backend, "deepspeed": deepspeed.__version__, "torch": torch.__version__,
           "rounds": a.rounds, "steps_per_round": a.steps_per_round, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
