#!/usr/bin/env python3
"""The RL colocation calls against the rates of the links they use, measured alternately in one run.

1. engine.sleep() + engine.wake(): a LlamaForCausalLM of about --sleep-params (default 60M) with
   everything on the device (stage 2, no offload: parameters, gradients, AdamW states), after one
   step. Each round times sleep() + wake() and, beside it, the link: the same bytes copied out of
   a buffer of the device's size into host memory and back (numpy, warm buffers; on zoe's CPU
   device the "link" is a host memory copy). Figure: (sleep + wake) over (2 x the device's bytes
   at the link's rate), target <= 1.2x; and over the same copies into fresh memory (what giving
   memory back and taking it again costs on top: the kernel zero-fills every page it hands out).
2. engine.gathered_parameters(): a LlamaForCausalLM of about --stream-params (default 1.1B: hidden
   2048, 22 layers, intermediate 5632, vocab 32000) built on the meta device, stage 3 with its
   parameters and optimizer states (the fp32 masters) on NVMe under --nvme-path. Each round
   streams every tensor (fp32), and beside it measures the disk's read rate (fio: io_uring,
   O_DIRECT, 1 MiB blocks, queue depth 16). Figure: the master bytes over the stream's time,
   over fio's rate; target >= 0.8x.

The order within a round is reversed on odd rounds (the disk's rate swings 2x from minute to
minute). Progress goes to stderr; a table (or with --json one JSON object) to stdout. Run it alone
(flock -x /tmp/zoe-heavy.lock ...).
Usage: PYTHONPATH=build/python bench/rl_colocation.py [--nvme-path DIR] [--rounds 3]
       [--sleep-params 60e6] [--stream-layers 22] [--skip-stream | --skip-sleep] [--json]
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import transformers

import zoe


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def llama(hidden, layers, inter, heads, vocab=32000, meta=False):
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def fio_read(work):
    if shutil.which("fio") is None:
        return None
    f = os.path.join(work, "fio.dat")
    p = subprocess.run(["fio", "--name=rl", f"--filename={f}", "--rw=read", "--bs=1M", "--iodepth=16",
                        "--ioengine=io_uring", "--direct=1", "--size=2G", "--runtime=6", "--time_based",
                        "--output-format=json"], capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)["jobs"][0]["read"]["bw_bytes"]


def link_copy(nbytes):
    """Seconds to copy nbytes out of a buffer and back (warm buffers): the link's time for sleep
    + wake's bytes."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    np.copyto(dst, src)  # both warm
    t = time.perf_counter()
    np.copyto(dst, src)
    np.copyto(src, dst)
    return time.perf_counter() - t


def fresh_copy(nbytes):
    """Seconds to copy nbytes into fresh memory and back into fresh memory: the link's time plus
    the kernel's zero-filling of pages taken anew, which giving memory back and taking it again
    costs (sleep's host copies, wake's device pages)."""
    src = np.ones(nbytes, dtype=np.uint8)
    t = time.perf_counter()
    dst = np.empty(nbytes, dtype=np.uint8)
    np.copyto(dst, src)
    del src
    back = np.empty(nbytes, dtype=np.uint8)
    np.copyto(back, dst)
    return time.perf_counter() - t


def bench_sleep(a, work):
    # hidden 512, intermediate 1376, 8 heads: about 2.2M per layer + 2 x 16.4M embedding/head.
    layers = max(1, int((a.sleep_params - 32.8e6) / 2.24e6))
    model = llama(512, layers, 1376, 8)
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": 2}, "zoe": {"device_budget": "8GiB"}}
    eng = zoe.initialize(model, cfg, force_local=True)
    ids = torch.randint(0, 32000, (2, 16), generator=torch.Generator().manual_seed(1))
    eng.backward(eng(input_ids=ids, labels=ids).loss)
    eng.step()
    dev = eng.memory_in_use()["device"]
    log(f"sleep/wake: {eng.num_params() / 1e6:.1f}M parameters, {dev / 2**20:.0f} MiB on the device")
    rows = []
    for r in range(a.rounds):
        order = ["zoe", "link"] if r % 2 == 0 else ["link", "zoe"]
        row = {}
        for what in order:
            if what == "zoe":
                t = time.perf_counter()
                eng.sleep()
                t_sleep = time.perf_counter() - t
                assert eng.memory_in_use()["device"] == 0
                t = time.perf_counter()
                eng.wake()
                row["sleep_s"], row["wake_s"] = t_sleep, time.perf_counter() - t
            else:
                row["link_s"] = link_copy(dev)
                row["fresh_s"] = fresh_copy(dev)
        row["ratio"] = (row["sleep_s"] + row["wake_s"]) / row["link_s"]
        row["ratio_fresh"] = (row["sleep_s"] + row["wake_s"]) / row["fresh_s"]
        log(f"  round {r + 1}: sleep {row['sleep_s']:.3f} s + wake {row['wake_s']:.3f} s, "
            f"link {row['link_s']:.3f} s (into fresh memory {row['fresh_s']:.3f} s): {row['ratio']:.2f}x "
            f"({row['ratio_fresh']:.2f}x)")
        rows.append(row)
    # The step after the sleeps trains on: the engine is whole.
    eng.backward(eng(input_ids=ids, labels=ids).loss)
    eng.step()
    out = {"params": eng.num_params(), "device_bytes": dev, "rounds": rows,
           "median_ratio": statistics.median(r["ratio"] for r in rows),
           "median_ratio_fresh": statistics.median(r["ratio_fresh"] for r in rows)}
    eng.close()
    return out


def bench_stream(a, work):
    nvme = os.path.join(work, "swap")
    os.makedirs(nvme, exist_ok=True)
    model = llama(2048, a.stream_layers, 5632, 32, meta=True)
    cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                 "offload_param": {"device": "nvme", "nvme_path": nvme, "max_in_cpu": 0},
                                 "offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
           "zoe": {"host_budget": "4GiB"}}
    t = time.perf_counter()
    eng = zoe.initialize(model, cfg, force_local=True)
    log(f"stream: {eng.num_params() / 1e9:.2f}B parameters initialized in {time.perf_counter() - t:.0f} s")
    master = eng.num_params() * 4
    rows = []
    for r in range(a.rounds):
        order = ["zoe", "fio"] if r % 2 == 0 else ["fio", "zoe"]
        row = {}
        for what in order:
            if what == "zoe":
                t = time.perf_counter()
                n = 0
                for _, tensor in eng.gathered_parameters():
                    n += tensor.numel()
                row["stream_s"] = time.perf_counter() - t
                assert n * 4 == master
            else:
                row["fio_read_bytes_per_s"] = fio_read(work)
        row["stream_bytes_per_s"] = master / row["stream_s"]
        fio = row["fio_read_bytes_per_s"]
        row["ratio"] = row["stream_bytes_per_s"] / fio if fio else None
        log(f"  round {r + 1}: {master / 2**30:.2f} GiB in {row['stream_s']:.1f} s "
            f"({row['stream_bytes_per_s'] / 2**20:.0f} MiB/s), fio {fio / 2**20 if fio else 0:.0f} MiB/s: "
            f"{row['ratio'] or 0:.2f}x")
        rows.append(row)
    eng.close()
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    return {"params": int(master / 4), "master_bytes": master, "rounds": rows,
            "median_ratio": statistics.median(ratios) if ratios else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvme-path", default="/var/tmp")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sleep-params", type=float, default=60e6)
    ap.add_argument("--stream-layers", type=int, default=22, help="decoder layers of the streamed Llama (22: 1.1B)")
    ap.add_argument("--skip-stream", action="store_true", help="only the sleep/wake part")
    ap.add_argument("--skip-sleep", action="store_true", help="only the gathered_parameters() part")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zoe-rl-bench-", dir=a.nvme_path) as work:
        res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
               "sleep_wake": None if a.skip_sleep else bench_sleep(a, work)}
        if not a.skip_stream:
            res["gathered_parameters"] = bench_stream(a, work)
    if a.json:
        print(json.dumps(res))
        return 0
    s = res["sleep_wake"]
    if s is not None:
        print(f"sleep()+wake(), {s['device_bytes'] / 2**20:.0f} MiB on the device: {s['median_ratio']:.2f}x "
              f"the link's time for the same bytes (target <= 1.2x), {s['median_ratio_fresh']:.2f}x the same "
              "copies into fresh memory")
    if "gathered_parameters" in res:
        g = res["gathered_parameters"]
        print(f"gathered_parameters(), {g['params'] / 1e9:.2f}B parameters from NVMe: "
              f"{g['median_ratio'] or 0:.2f}x fio's read rate (target >= 0.8x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
