#!/usr/bin/env python3
"""A user's GPT, written in plain PyTorch, trained by zoe with parameters and optimizer states
on NVMe (stage 3): a progress line per step and a final table of states against budgets.

usage: PYTHONPATH=build/python /usr/bin/python3 examples/train_torch_gpt.py [--steps 20]
       [--nvme-path /var/tmp] [--device-budget 6MiB] [--device cuda]     (mpirun -np N works too)"""
import argparse
import math
import os
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import zoe


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(self.ln_1(x)).split(C, 2))
        att = (q @ k.transpose(-2, -1) / math.sqrt(C // self.heads))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=256, d=128, layers=4, heads=4, ctx=64):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def mib(n):
    return f"{n / 2**20:9.2f} MiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--nvme-path", default=os.environ.get("ZOE_SCRATCH", tempfile.gettempdir()))
    ap.add_argument("--device-budget", default="6MiB")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="zoe.device")
    a = ap.parse_args()
    os.makedirs(a.nvme_path, exist_ok=True)
    torch.manual_seed(0)
    model = GPT()
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                              "offload_param": {"device": "nvme", "nvme_path": a.nvme_path},
                              "offload_optimizer": {"device": "nvme", "nvme_path": a.nvme_path}},
        "zoe": {"device_budget": a.device_budget, "device": a.device},
    }
    engine = zoe.initialize(model, config=config)
    g = torch.Generator().manual_seed(1 + engine.rank)
    text = torch.randint(0, 256, (4096,), generator=g)
    t0 = time.time()
    for step in range(1, a.steps + 1):
        starts = torch.randint(0, text.numel() - 65, (8,), generator=g)
        batch = torch.stack([text[s:s + 65] for s in starts]).to(engine.device)
        loss = engine(batch[:, :-1], batch[:, 1:])
        engine.backward(loss)
        s = engine.step()
        if engine.rank == 0:
            print(f"step {step:4d}/{a.steps}  loss {loss.item():.4f}  grad norm {s.grad_norm:.3f}  "
                  f"lr {s.lr:.2e}  {(time.time() - t0) / step:.3f} s/step", file=sys.stderr)
    if engine.rank == 0:
        hw = s.high_water
        print(f"{'what':<28}{'bytes':>13}")
        print(f"{'model states (per rank)':<28}{mib(engine.model_state_bytes()):>13}")
        print(f"{'device budget':<28}{mib(engine.device_budget_bytes()):>13}")
        print(f"{'device high water':<28}{mib(hw['device']):>13}")
        print(f"{'host high water':<28}{mib(hw['host']):>13}")
        print(f"{'nvme high water':<28}{mib(hw['nvme']):>13}")
        ratio = engine.model_state_bytes() / max(1, engine.device_budget_bytes())
        print(f"states / device budget: {ratio:.1f}x; device high water "
              f"{'within' if hw['device'] <= engine.device_budget_bytes() else 'OVER'} budget")


if __name__ == "__main__":
    main()
