#!/usr/bin/env python3
"""zoe's fused CPU optimizer steps against DeepSpeed's, in one process, on tensors of one kind.

    vs_deepspeed_optim.py --lib build/lib/libzoe_optim_capi.so [--params 64M] [--threads 0]
                          [--optimizers lion,adagrad,adamw] [--work step,step+copy]
                          [--rounds 7] [--steps-per-round 3] [--json FILE]

DeepSpeed: DeepSpeedCPULion, DeepSpeedCPUAdagrad and DeepSpeedCPUAdam (adamw_mode), their
`step()` on one fp32 parameter of --params elements with an fp32 gradient and fp32 states:
what ZeRO-Offload runs on its flat fp32 partition. Their ops are built from DeepSpeed's source
just in time (torch.utils.cpp_extension with DeepSpeed's own flags: -O3 -march=native -fopenmp
and its SIMD width) into $TORCH_EXTENSIONS_DIR. zoe: lion_step / adagrad_step / adam_step
through zoe_optim_capi, on tensors from the same torch allocator, same sizes, same start.

--work:
  step       the step alone: fp32 gradients in, new fp32 parameters and states out (the same work);
  step+copy  the step and the bf16 copy of the new parameters the device computes with: DeepSpeed's
             step() then the copy ZeRO makes after it (bf16_param.copy_(fp32_param), torch's
             threads), against zoe's one pass that writes the copy (param_out). Same inputs, same
             outputs.
zoe's roofline (one_state_roofline_pass: the one-state step's exact streams with trivial
arithmetic, on the same tensors) is timed in the same rounds for Lion and Adagrad: the memory
bound both implementations are measured against.

Threads: --threads T (0: every CPU) sets OMP_NUM_THREADS and torch.set_num_threads for
DeepSpeed's OpenMP loops and torch's copy, and the size of zoe's pool. Each round times
--steps-per-round steps of each contender in turn, the order rotating from round to round,
after one warm-up round; the figures are median step times, and ratio = DeepSpeed / zoe (> 1: zoe
faster). A check on 1M elements runs 5 steps of each from the same start and reports how far the
parameters are apart (FMA, and for Lion DeepSpeed's sign(0) = 1, make them differ in the last bits).

Run it with a Python that has torch and deepspeed, DS_ACCELERATOR=cpu on a machine without a GPU
(bench/optim/vs_deepspeed_optim.sh sets that up).
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
        self.lib = L = ctypes.CDLL(lib_path)
        vp, f, i64, sz, i = ctypes.c_void_p, ctypes.c_float, ctypes.c_int64, ctypes.c_size_t, ctypes.c_int
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
        L.zoe_optim_one_state_roofline.argtypes = [vp, vp, vp, i, vp, sz, vp, i]
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
BF16 = 2  # zoe's DType code


class Pair:
    """One optimizer: DeepSpeed's on its own parameter, zoe's on its own tensors, the same start.
    copy: each also produces the bf16 copy of the new parameters."""

    def __init__(self, name, n, zoe, copy, seed=0):
        import torch
        self.name, self.n, self.zoe, self.copy, self.t = name, n, zoe, copy, 0
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
        self.ds_bf16 = torch.empty(n, dtype=torch.bfloat16) if copy else None
        self.zp, self.zg = p0.clone(), g0.clone()
        self.zs = [torch.zeros(n) for _ in range(2 if name == "adamw" else 1)]
        self.zout = torch.empty(n, dtype=torch.bfloat16) if copy else None

    def ds_step(self):
        self.ds.step()
        if self.copy:
            self.ds_bf16.copy_(self.ds_param.data)

    def zoe_step(self):
        self.t += 1
        h, z, L = HYPER[self.name], self.zoe, self.zoe.lib
        p, g, s = self.zp.data_ptr(), self.zg.data_ptr(), [x.data_ptr() for x in self.zs]
        out = self.zout.data_ptr() if self.copy else None
        if self.name == "lion":
            rc = L.zoe_optim_lion_step(z.pool, p, g, 0, s[0], self.n, h["lr"], h["betas"][0], h["betas"][1],
                                       h["weight_decay"], self.t, 1.0, out, BF16)
        elif self.name == "adagrad":
            rc = L.zoe_optim_adagrad_step(z.pool, p, g, 0, s[0], self.n, h["lr"], h["eps"], h["weight_decay"],
                                          self.t, 1.0, out, BF16)
        else:
            rc = L.zoe_optim_adam_step(z.pool, p, g, 0, s[0], s[1], self.n, h["lr"], h["betas"][0],
                                       h["betas"][1], h["eps"], h["weight_decay"], 1, self.t, 1.0, out, BF16)
        z.check(rc)

    def roofline(self):
        z = self.zoe
        out = self.zout.data_ptr() if self.copy else None
        z.check(z.lib.zoe_optim_one_state_roofline(z.pool, self.zp.data_ptr(), self.zg.data_ptr(), 0,
                                                   self.zs[0].data_ptr(), self.n, out, BF16))


def agreement(name, zoe, steps=5):
    """Max |p_zoe - p_ds| / max(|p_ds|, 1e-3) after `steps` steps, and the fraction of elements
    more than 1e-5 apart."""
    pr = Pair(name, 1 << 20, zoe, False, seed=1)
    for _ in range(steps):
        pr.ds_step()
        pr.zoe_step()
    a, b = pr.zp, pr.ds_param.data
    rel = (a - b).abs() / b.abs().clamp_min(1e-3)
    return {"max_rel_diff": float(rel.max()), "frac_over_1e-5": float((rel > 1e-5).float().mean()),
            "steps": steps, "elements": pr.n}


def bench(name, n, zoe, rounds, k, work):
    pr = Pair(name, n, zoe, work == "step+copy")
    fns = {"deepspeed": pr.ds_step, "zoe": pr.zoe_step}
    if name != "adamw":
        fns["roofline"] = pr.roofline
    t = {w: [] for w in fns}
    order = list(fns)
    for r in range(rounds + 1):  # round 0 warms up (page faults, thread pools) and is dropped
        for who in order[r % len(order):] + order[:r % len(order)]:
            for _ in range(k):
                t0 = time.perf_counter()
                fns[who]()
                if r > 0:
                    t[who].append(time.perf_counter() - t0)
    med = {w: statistics.median(v) * 1e3 for w, v in t.items()}
    mn = {w: min(v) * 1e3 for w, v in t.items()}
    row = {"optimizer": name, "work": work, "params": n, "steps_each": len(t["zoe"]), "median_ms": med,
           "min_ms": mn, "ratio": med["deepspeed"] / med["zoe"], "ratio_of_mins": mn["deepspeed"] / mn["zoe"]}
    if "roofline" in med:
        row["zoe_vs_roofline"] = med["roofline"] / med["zoe"]
        row["deepspeed_vs_roofline"] = med["roofline"] / med["deepspeed"]
    return row


def print_row(row, agree):
    med = row["median_ms"]
    roof = f"{med['roofline']:8.2f} {row['zoe_vs_roofline']:6.3f} {row['deepspeed_vs_roofline']:6.3f}" \
        if "roofline" in med else f"{'-':>8} {'-':>6} {'-':>6}"
    print(f"  {row['optimizer']:8} {row['work']:9} {med['deepspeed']:9.2f} {med['zoe']:8.2f} {row['ratio']:6.3f} "
          f"{row['ratio_of_mins']:6.3f} {roof} {agree['max_rel_diff']:9.2g}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="path to libzoe_optim_capi.so")
    ap.add_argument("--params", default="64M")
    ap.add_argument("--threads", type=int, default=0, help="0: every CPU")
    ap.add_argument("--optimizers", default="lion,adagrad,adamw")
    ap.add_argument("--work", default="step,step+copy")
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
    works = [x for x in a.work.split(",") if x]
    for x in names:
        if x not in HYPER:
            sys.exit(f"--optimizers: unknown '{x}' (lion, adagrad, adamw)")
    for x in works:
        if x not in ("step", "step+copy"):
            sys.exit(f"--work: unknown '{x}' (step, step+copy)")
    print(f"# zoe vs DeepSpeed CPU optimizer step: {n} params, {threads} thread(s); zoe path {zoe.path}, "
          f"pool {zoe.backend}; DeepSpeed {deepspeed.__version__}, torch {torch.__version__}")
    print(f"# medians of {a.rounds} rounds x {a.steps_per_round} steps each, contenders in rotating order; "
          f"ratio = DeepSpeed / zoe; vs_roof = roofline time / that step's time")
    print(f"# {'optim':8} {'work':9} {'DS ms':>9} {'zoe ms':>8} {'ratio':>6} {'(mins)':>6} {'roof ms':>8} "
          f"{'zoe/rf':>6} {'DS/rf':>6} {'max rel diff':>9}")
    rows = []
    for name in names:
        agree = agreement(name, zoe)
        for work in works:
            row = bench(name, n, zoe, a.rounds, a.steps_per_round, work)
            row["agreement"] = agree
            rows.append(row)
            print_row(row, agree)
    out = {"machine": platform.processor() or platform.machine(), "threads": threads, "zoe_path": zoe.path,
           "zoe_pool": zoe.backend, "deepspeed": deepspeed.__version__, "torch": torch.__version__,
           "rounds": a.rounds, "steps_per_round": a.steps_per_round, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
