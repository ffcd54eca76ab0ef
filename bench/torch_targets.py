#!/usr/bin/env python3
"""The PyTorch front-end's step against plain PyTorch on a decoder-only transformer of about 50M
parameters at sequence length 256, alternately in one run (the disk and the CPU's speed swing
from minute to minute): plain torch (torch.optim.AdamW, no zoe), zoe with no offload (stage 3,
everything in device memory), and zoe at stage 3 with parameters and optimizer states on NVMe.
Prints the median step of each and the two ratios the front-end's targets are about:
zoe no-offload / torch, and zoe NVMe / torch.

usage: python bench/torch_targets.py [--rounds 3] [--steps 3] [--micro 2] [--nvme-path /var/tmp]
       [--json out.json]     (with zoe importable: pip install ., or PYTHONPATH=build/python)"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
import zoe  # noqa: E402
from zoe_torch_models import GPT  # noqa: E402

SHAPE = dict(vocab=16384, d=512, layers=13, heads=8, ctx=256)  # 49.6M parameters (tied head)


def batches(n, micro, T, vocab):
    g = torch.Generator().manual_seed(1)
    return [(lambda idx: (idx[:, :-1].contiguous(), idx[:, 1:].contiguous()))(
        torch.randint(0, vocab, (micro, T + 1), generator=g)) for _ in range(n)]


def config(micro, nvme):
    c = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
         "zero_optimization": {"stage": 3}}
    if nvme:
        for k in ("offload_param", "offload_optimizer"):
            c["zero_optimization"][k] = {"device": "nvme", "nvme_path": nvme}
    return c


class Plain:
    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)

    def step(self, x, y):
        self.opt.zero_grad(set_to_none=True)
        loss = self.model(x, y)
        loss.backward()
        self.opt.step()
        return loss.item()


class Zoe:
    def __init__(self, model, cfg):
        self.eng = zoe.initialize(model, config=cfg)

    def step(self, x, y):
        loss = self.eng(x, y)
        self.eng.backward(loss)
        self.eng.step()
        return loss.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per engine per round (after one warm-up)")
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--nvme-path", default="/var/tmp")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.rounds < 1 or a.steps < 1 or a.micro < 1:
        ap.error("--rounds, --steps and --micro must be at least 1")
    torch.manual_seed(0)
    nvme = tempfile.mkdtemp(prefix="zoe-torch-targets-", dir=a.nvme_path)
    n_params = sum(p.numel() for p in GPT(**SHAPE).parameters())
    print(f"model: GPT {SHAPE}, {n_params / 1e6:.1f}M parameters; micro-batch {a.micro} x {SHAPE['ctx']} tokens; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
    engines = {}
    for name, make in (("torch", lambda m: Plain(m)), ("zoe_none", lambda m: Zoe(m, config(a.micro, None))),
                       ("zoe_nvme", lambda m: Zoe(m, config(a.micro, nvme)))):
        torch.manual_seed(0)
        engines[name] = make(GPT(**SHAPE))
    data = batches(a.rounds * (a.steps + 1), a.micro, SHAPE["ctx"], SHAPE["vocab"])
    times = {k: [] for k in engines}
    for r in range(a.rounds):
        for name, e in engines.items():
            chunk = data[r * (a.steps + 1):(r + 1) * (a.steps + 1)]
            e.step(*chunk[0])  # warm-up (the first round: allocations, NVMe files)
            for x, y in chunk[1:]:
                t0 = time.perf_counter()
                e.step(x, y)
                times[name].append(time.perf_counter() - t0)
            print(f"round {r + 1}: {name} {statistics.median(times[name][-a.steps:]):.3f} s/step", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"params": n_params, "shape": SHAPE, "micro": a.micro, "torch_version": torch.__version__,
           "median_step_s": med, "ratio_zoe_none_vs_torch": med["zoe_none"] / med["torch"],
           "ratio_zoe_nvme_vs_torch": med["zoe_nvme"] / med["torch"], "rounds": a.rounds, "steps": a.steps}
    for k, v in med.items():
        print(f"{k:9s} {v:.3f} s/step")
    print(f"zoe no offload / torch: {out['ratio_zoe_none_vs_torch']:.2f}x (target <= 1.15x)")
    print(f"zoe stage 3 all NVMe / torch: {out['ratio_zoe_nvme_vs_torch']:.2f}x (target <= 1.3x)")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    for e in engines.values():
        if isinstance(e, Zoe):
            e.eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
