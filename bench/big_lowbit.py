#!/usr/bin/env python3
"""A Llama-7B shape on one small machine: int8 optimizer states and a bf16 master on NVMe.

The model is Hugging Face's LlamaConfig() (its defaults are the 7B shape: 32 layers, width 4096,
MLP 11008, 32 heads, vocabulary 32000), built on the meta device and trained through zoe's
PyTorch front-end (`zoe.initialize`) with ZeRO stage 3, bf16 compute, parameters and optimizer
states on NVMe, `zoe.optimizer_states: "int8"` and `zoe.master_weights: "bf16"`. fp32 states
(16 bytes a parameter with the fp32 master, about 108 GB at 7B) fit neither this machine's RAM
nor, usually, its free disk; the script states what fp32 would need beside what int8 used.

Reported (one JSON object on stdout, and in OUT with --json): params, steps, step_s (the median
steady step: every step after the first), steps_s, init_s, io_bound_s (the steady step's NVMe
bytes at the drive's read and write rates, measured with `zoe bench io` before and after the
run), peak_rss_bytes (the training process's ru_maxrss), nvme_bytes_per_step (read and written,
the steady step's), optimizer_state_bytes_per_param, fp32_state_bytes (what fp32 states and
master would need on NVMe) and free_disk_bytes.

usage: python bench/big_lowbit.py --nvme-path DIR --json OUT [--steps 3] [--layers N] [--seq 128]
  --layers N: the 7B shape with N layers instead of 32 (a check of the script in minutes).
(with zoe and transformers importable: scripts/python-venv.sh's venv; run it alone on the machine:
 flock -x /tmp/zoe-heavy.lock python bench/big_lowbit.py ...)"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from hf_at_scale import io_rates  # the drive's rates as `zoe bench io` measures them (bench/)

# Bytes a parameter on NVMe with int8 states and a bf16 master stored as the compute copy: bf16
# parameters 2, packed m and v 2 x (256 + 4) / 256, fp32 gradient sums 4; and with fp32 states and
# master: bf16 parameters 2, master, m, v 12, gradient sums 4.
INT8_NVME_BYTES = 2 + 2 * 260 / 256 + 4
FP32_NVME_BYTES = 2 + 12 + 4
SLACK = 1.10  # chunk rounding and the swap files' headroom


def zoe_bin(a):
    found = a.zoe or shutil.which("zoe")
    if not found:
        sys.exit("big_lowbit: no zoe binary on PATH (pass --zoe build/bin/zoe)")
    return found


def llama_config(a):
    import transformers
    cfg = transformers.LlamaConfig()  # the 7B shape
    if a.layers:
        cfg.num_hidden_layers = a.layers
    cfg.max_position_embeddings = max(a.seq, 128)
    return cfg


def estimate_params(cfg):
    d, f, v, n = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    return n * (4 * d * d + 3 * d * f + 2 * d) + 2 * v * d + d


def child(a):
    """The training run, in its own process (its peak RSS is its own)."""
    import torch
    import transformers

    import zoe
    cfg = llama_config(a)
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
          "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": a.child_nvme},
                                "offload_optimizer": {"device": "nvme", "nvme_path": a.child_nvme}},
          "zoe": {"device_budget": a.device_budget, "optimizer_states": "int8", "master_weights": "bf16"}}
    if a.host_budget:
        ds["zoe"]["host_budget"] = a.host_budget
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    eng = zoe.initialize(model, config=ds)
    init_s = time.perf_counter() - t0
    print(f"initialized {eng.num_params() / 1e9:.2f}B parameters in {init_s:.0f} s", file=sys.stderr)
    g = torch.Generator().manual_seed(0)
    steps, stats = [], []
    for k in range(a.steps):
        ids = torch.randint(0, cfg.vocab_size, (1, a.seq), generator=g)
        t1 = time.perf_counter()
        out = eng(input_ids=ids, labels=ids)
        eng.backward(out.loss)
        st = eng.step()
        steps.append(time.perf_counter() - t1)
        stats.append({"loss": out.loss.item(), "read_bytes": st.step_bytes_nvme_read,
                      "write_bytes": st.step_bytes_nvme_write, "t_io_stall": st.t_io_stall,
                      "t_optimizer": st.t_optimizer})
        print(f"step {k + 1}/{a.steps}: {steps[-1]:.1f} s, loss {stats[-1]['loss']:.3f}, NVMe read "
              f"{st.step_bytes_nvme_read / 1e9:.1f} GB, written {st.step_bytes_nvme_write / 1e9:.1f} GB",
              file=sys.stderr)
    n, state = eng.num_params(), eng.model_state_bytes()
    eng.close()
    json.dump({"params": n, "model_state_bytes": state, "init_s": init_s, "steps_s": steps, "stats": stats},
              open(a.child_json, "w"))


def run_child(a, scratch):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--child-nvme", scratch, "--child-json",
               out.name, "--steps", str(a.steps), "--seq", str(a.seq), "--device-budget", a.device_budget]
        cmd += (["--layers", str(a.layers)] if a.layers else []) + (
            ["--host-budget", a.host_budget] if a.host_budget else [])
        p = subprocess.Popen(cmd)
        _, status, usage = os.wait4(p.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            sys.exit(f"big_lowbit: the training run exited with {code}")
        d = json.load(open(out.name))
    d["peak_rss_bytes"] = usage.ru_maxrss * 1024
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--nvme-path", default=os.environ.get("ZOE_SCRATCH", "/var/tmp"),
                    help="a folder on the drive to swap to (a scratch folder is made in it and removed)")
    ap.add_argument("--json", default=None, help="also write the JSON object to this file")
    ap.add_argument("--steps", type=int, default=3, help="training steps (default 3; at least 2)")
    ap.add_argument("--layers", type=int, default=None, help="the 7B shape with this many layers (default 32)")
    ap.add_argument("--seq", type=int, default=128, help="tokens a step (micro-batch 1; default 128)")
    ap.add_argument("--device-budget", default="4GiB", help="zoe.device_budget (default 4GiB)")
    ap.add_argument("--host-budget", default=None, help="zoe.host_budget (default zoe's)")
    ap.add_argument("--zoe", default=None, help="the zoe binary, for `zoe bench io` (default: zoe on PATH)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-nvme", help=argparse.SUPPRESS)
    ap.add_argument("--child-json", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.steps < 2:
        ap.error(f"--steps {a.steps}: at least 2 (the first step is not a steady one)")
    if a.layers is not None and a.layers < 1:
        ap.error(f"--layers {a.layers}: at least 1")
    if a.seq < 2:
        ap.error(f"--seq {a.seq}: at least 2 tokens")
    if a.child:
        return child(a)
    if not os.path.isdir(a.nvme_path):
        ap.error(f"--nvme-path {a.nvme_path}: not a folder")
    zoe = zoe_bin(a)
    cfg = llama_config(a)
    n_est = estimate_params(cfg)
    free = shutil.disk_usage(a.nvme_path).free
    need = n_est * INT8_NVME_BYTES * SLACK + 2 * 2**30  # and the `zoe bench io` file
    if need > free:
        sys.exit(f"big_lowbit: {n_est / 1e9:.2f}B parameters need about {need / 1e9:.0f} GB on --nvme-path "
                 f"{a.nvme_path} with int8 states, and it has {free / 1e9:.0f} GB free; free space or pass "
                 "--layers N for a smaller model")
    scratch = tempfile.mkdtemp(prefix="zoe-big-lowbit-", dir=a.nvme_path)
    try:
        before = io_rates(zoe, scratch)
        print(f"{n_est / 1e9:.2f}B parameters; drive {before[0] / 1e9:.2f} / {before[1] / 1e9:.2f} GB/s "
              "read / write", file=sys.stderr)
        d = run_child(a, scratch)
        after = io_rates(zoe, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rd, wr = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
    steady = d["stats"][1:]
    read = statistics.median(s["read_bytes"] for s in steady)
    write = statistics.median(s["write_bytes"] for s in steady)
    n = d["params"]
    out = {"params": n, "steps": a.steps, "seq": a.seq, "layers": cfg.num_hidden_layers,
           "step_s": statistics.median(d["steps_s"][1:]), "steps_s": d["steps_s"], "init_s": d["init_s"],
           "io_bound_s": read / rd + write / wr, "peak_rss_bytes": d["peak_rss_bytes"],
           "nvme_bytes_per_step": {"read": read, "written": write, "written_per_param": write / n,
                                   "read_per_param": read / n},
           "optimizer_state_bytes_per_param": 2 + 2 * 260 / 256, "model_state_bytes": d["model_state_bytes"],
           "fp32_state_bytes": n * FP32_NVME_BYTES, "free_disk_bytes": free,
           "drive_gbps": {"read": rd / 1e9, "write": wr / 1e9}, "losses": [s["loss"] for s in d["stats"]]}
    out["step_over_io_bound"] = out["step_s"] / out["io_bound_s"]
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
