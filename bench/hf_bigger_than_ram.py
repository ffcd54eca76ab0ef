#!/usr/bin/env python3
"""A Llama-architecture model whose fp32 model states (parameters, gradients, AdamW's master copy
and two moments: 16 bytes a parameter) are larger than this machine's RAM, built on the meta
device, initialised unit by unit by transformers' own init, trained two steps at stage 3 with
parameters and optimizer states on NVMe, and its peak RSS against the model states.

usage: python bench/hf_bigger_than_ram.py --nvme-path DIR [--ratio 1.5] [--steps 2] [--device-budget 2GiB]
       [--host-budget SIZE] [--json out.json]
(with zoe and transformers importable: scripts/python-venv.sh's venv)"""
import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import zoe


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def llama_config(layers, hidden=2560, inter=6912, heads=20, kv=4, vocab=32000):
    return LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                       max_position_embeddings=512, tie_word_embeddings=False)


def n_params(cfg):
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    kvd = h // cfg.num_attention_heads * cfg.num_key_value_heads
    layer = 2 * h * h + 2 * h * kvd + 3 * h * i + 2 * h
    return cfg.num_hidden_layers * layer + 2 * v * h + h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvme-path", required=True)
    ap.add_argument("--ratio", type=float, default=1.5, help="model states / RAM (default 1.5)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--device-budget", default="2GiB", help="zoe.device_budget (host memory on the CPU device)")
    ap.add_argument("--host-budget", default=None, help="zoe.host_budget (default zoe's: the host's memory / 16)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ram = mem_total()
    layers = 1
    while n_params(llama_config(layers)) * 16 < a.ratio * ram:
        layers += 1
    cfg = llama_config(layers)
    n = n_params(cfg)
    states = 16 * n
    print(f"RAM {ram / 2**30:.1f} GiB; Llama {layers} layers, {n / 1e9:.2f}B parameters, fp32 model states "
          f"{states / 2**30:.1f} GiB ({states / ram:.2f}x RAM)", file=sys.stderr)
    nvme = tempfile.mkdtemp(prefix="zoe-bigger-than-ram-", dir=a.nvme_path)
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
          "zero_optimization": {"stage": 3,
                                "offload_param": {"device": "nvme", "nvme_path": nvme},
                                "offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
          "zoe": {"device_budget": a.device_budget}}
    if a.host_budget:
        ds["zoe"]["host_budget"] = a.host_budget
    try:
        t0 = time.perf_counter()
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
        engine = zoe.initialize(model, config=ds)
        t_init = time.perf_counter() - t0
        rss_init = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(f"initialize: {t_init:.1f} s, peak RSS {rss_init / 2**30:.2f} GiB", file=sys.stderr)
        g = torch.Generator().manual_seed(0)
        losses, step_s = [], []
        for s in range(a.steps):
            ids = torch.randint(0, cfg.vocab_size, (1, a.seq), generator=g)
            t1 = time.perf_counter()
            out = engine(input_ids=ids, labels=ids)
            engine.backward(out.loss)
            engine.step()
            step_s.append(time.perf_counter() - t1)
            losses.append(out.loss.item())
            print(f"step {s + 1}: loss {losses[-1]:.4f}, {step_s[-1]:.1f} s", file=sys.stderr)
        engine.close()
    finally:
        shutil.rmtree(nvme, ignore_errors=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"ram_bytes": ram, "layers": layers, "params": n, "model_state_bytes": states,
           "states_over_ram": states / ram, "init_s": t_init, "step_s": step_s, "losses": losses,
           "peak_rss_bytes": rss, "rss_over_states": rss / states, "device_budget": a.device_budget,
           "host_budget": a.host_budget,
           "torch": torch.__version__}
    print(json.dumps(out, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    ok = all(l == l and l < 1e4 for l in losses) and rss <= states / 4
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
