#!/usr/bin/env python3
"""The layer-major schedule against micro-batch for a Hugging Face Llama through engine.train_batch,
measured alternately in one run.

A LlamaForCausalLM built on the meta device from a config of --params size (default about 1.1B:
hidden 2048, 16 layers, 16 heads, intermediate 5504, vocab 32000), initialized by zoe with
transformers' own initializers, trained by zoe's PyTorch front-end: bf16, stage 3 with parameters
(none kept in host memory: offload_param.max_in_cpu 0) and optimizer states on NVMe under
--nvme-path, gradient_accumulation_steps --accum (default 8) micro-batches of --micro-batch x --seq
tokens. Runs, in rounds (--rounds; the order reversed on odd rounds):

- zoe.schedule "micro-batch";
- zoe.schedule "layer-major".

Each run is its own process (a fresh engine and page cache state); for each, over the steps after
the first --skip: the median step wall time, and the engine's NVMe bytes read per step. Figures:
layer-major's step over micro-batch's (target <= 0.6x) and their NVMe reads, from the medians over
rounds; the losses of both must be the same bits.

Progress goes to stderr; a table (or with --json one JSON object) to stdout. Run it alone
(flock -x /tmp/zoe-heavy.lock ...): other processes on the disk and the CPUs move the figures.
Usage: bench/layer_major_hf.py [--python VENV/bin/python] [--nvme-path DIR] [--layers 16] [--accum 8]
       [--steps 3] [--skip 1] [--rounds 1] [--json]
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

WORKER = r'''
import json, os, resource, sys, time
import torch, transformers, zoe
a = json.loads(sys.argv[1])
cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=a["hidden"], intermediate_size=a["inter"],
                               num_hidden_layers=a["layers"], num_attention_heads=a["heads"],
                               num_key_value_heads=a["heads"], max_position_embeddings=512,
                               tie_word_embeddings=False)
with torch.device("meta"):
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
ds = {"train_micro_batch_size_per_gpu": a["micro"], "gradient_accumulation_steps": a["accum"],
      "bf16": {"enabled": True}, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                            "offload_param": {"device": "nvme", "nvme_path": a["nvme"], "max_in_cpu": 0},
                            "offload_optimizer": {"device": "nvme", "nvme_path": a["nvme"]}},
      "zoe": {"schedule": a["schedule"], "host_budget": a["host_budget"]}}
torch.manual_seed(0)  # transformers' initializers draw from it: the same weights in every run
t0 = time.time()
eng = zoe.initialize(model, ds, force_local=True)
init_s = time.time() - t0
g = torch.Generator().manual_seed(1)
steps, losses, reads = [], [], []
for s in range(a["steps"]):
    batches = []
    for _ in range(a["accum"]):
        ids = torch.randint(0, 32000, (a["micro"], a["seq"]), generator=g)
        batches.append({"input_ids": ids, "labels": ids})
    t = time.time()
    losses += eng.train_batch(batches)
    steps.append(time.time() - t)
    reads.append(eng.last_step_stats.step_bytes_nvme_read)
    print(f"  step {s + 1}: {steps[-1]:.1f} s", file=sys.stderr, flush=True)
print(json.dumps({"params": eng.num_params(), "init_s": init_s, "step_s": steps,
                  "nvme_read": reads, "losses": losses, "schedule": eng.last_step_stats.schedule,
                  "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
eng.close()
'''


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(a, work, schedule):
    nvme = os.path.join(work, "swap")
    os.makedirs(nvme, exist_ok=True)
    args = {"hidden": a.hidden, "inter": a.inter, "layers": a.layers, "heads": a.heads, "micro": a.micro_batch,
            "seq": a.seq, "accum": a.accum, "steps": a.steps, "nvme": nvme, "schedule": schedule,
            "host_budget": a.host_budget}
    log(f"  {schedule}")
    p = subprocess.run([a.python, "-c", WORKER, json.dumps(args)], stdout=subprocess.PIPE, text=True)
    shutil.rmtree(nvme, ignore_errors=True)
    if p.returncode != 0:
        sys.exit(f"the {schedule} run failed ({p.returncode})")
    j = json.loads(p.stdout.strip().splitlines()[-1])
    j["step"] = statistics.median(j["step_s"][a.skip:])
    j["read"] = statistics.median(j["nvme_read"][a.skip:])
    log(f"    step {j['step']:.1f} s, NVMe read {j['read'] / j['params']:.2f} B/param, schedule ran: "
        f"{j['schedule']}")
    return j


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="a Python with torch, transformers and zoe")
    ap.add_argument("--nvme-path", default="/var/tmp")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=5504)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--skip", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--host-budget", default="4GiB")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.skip >= a.steps:
        sys.exit("--skip must be below --steps")
    work = tempfile.mkdtemp(prefix="zoe-layer-major-hf-", dir=a.nvme_path)
    runs = {"micro-batch": [], "layer-major": []}
    try:
        for r in range(a.rounds):
            log(f"round {r + 1} of {a.rounds}")
            order = ["micro-batch", "layer-major"]
            if r % 2:
                order.reverse()
            for s in order:
                runs[s].append(run(a, work, s))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {s: {"step_s": statistics.median(x["step"] for x in v), "nvme_read": statistics.median(x["read"] for x in v)}
           for s, v in runs.items()}
    params = runs["micro-batch"][0]["params"]
    same = all(x["losses"] == runs["micro-batch"][0]["losses"] for x in runs["micro-batch"] + runs["layer-major"])
    result = {"date": datetime.date.today().isoformat(), "params": params, "accum": a.accum, "seq": a.seq,
              "micro_batch": a.micro_batch, "steps": a.steps, "skip": a.skip, "rounds": a.rounds, "median": med,
              "step_layer_major_over_micro_batch": med["layer-major"]["step_s"] / med["micro-batch"]["step_s"],
              "reads_layer_major_over_micro_batch": med["layer-major"]["nvme_read"] / med["micro-batch"]["nvme_read"],
              "same_losses": same, "rss_bytes": {s: max(x["rss_bytes"] for x in v) for s, v in runs.items()}}
    if a.json:
        print(json.dumps(result, indent=1))
        return
    print(f"# HF Llama ({params} params) through train_batch, G={a.accum} micro-batches of {a.micro_batch}x{a.seq} "
          f"tokens, {a.rounds} round(s), {result['date']}")
    for s in ("micro-batch", "layer-major"):
        print(f"{s:12s} step {med[s]['step_s']:8.2f} s   NVMe read {med[s]['nvme_read'] / params:8.2f} B/param   "
              f"RSS {result['rss_bytes'][s] / 2**30:.2f} GiB")
    print(f"step time, layer-major / micro-batch: {result['step_layer_major_over_micro_batch']:.2f}x (target <= 0.6x)")
    print(f"losses identical: {same}")


if __name__ == "__main__":
    main()
