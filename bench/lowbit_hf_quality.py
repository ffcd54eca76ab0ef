#!/usr/bin/env python3
"""Low-bit optimizer states on a Hugging Face Llama trained on text: final eval loss against fp32.

A small Llama (transformers' LlamaConfig, byte-level: vocabulary 256) is trained through zoe's
PyTorch front-end on the license texts every Debian system has (/usr/share/common-licenses, each
file once, in name order; every k-th KiB held out, k = 1 / --eval-frac), with bf16 compute (or
fp32: --compute) and the optimizer offloaded to the CPU. Formats, each seed run in turn (the order
reversed on odd seeds): fp32 states and master (the baseline), int8 states + bf16 master, int4
states + bf16 master. The same seed gives every format the same initial weights and the same
batches.

Reported: each format's held-out loss per seed, the mean over seeds, and the mean's relative
difference from fp32's. Targets: int8 within 1%, int4 within 2%.

usage: python bench/lowbit_hf_quality.py [--seeds 3] [--steps 400] [--json OUT]
(with zoe and transformers importable: scripts/python-venv.sh's venv)"""
import argparse
import json
import os
import statistics
import sys
import time

CORPUS = "/usr/share/common-licenses"
FORMATS = (("fp32", "fp32", "fp32"), ("int8+bf16", "int8", "bf16"), ("int4+bf16", "int4", "bf16"))
TARGETS = {"int8+bf16": 0.01, "int4+bf16": 0.02}


def corpus_bytes(folder):
    seen, data = set(), bytearray()
    for name in sorted(os.listdir(folder)):
        path = os.path.realpath(os.path.join(folder, name))
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        with open(path, "rb") as f:
            data += f.read()
    return bytes(data)


def run(a, fmt, seed, train, held):
    import torch
    import transformers

    import zoe
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=a.width, intermediate_size=a.width * 8 // 3,
                                   num_hidden_layers=a.layers, num_attention_heads=a.width // 64,
                                   max_position_embeddings=a.seq, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    ds = {"train_micro_batch_size_per_gpu": a.batch, "bf16": {"enabled": a.compute == "bf16"},
          "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "weight_decay": 0.01}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": a.steps, "warmup_max_lr": a.lr,
                                                          "warmup_num_steps": a.steps // 10}},
          "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
          "zoe": {"optimizer_states": fmt[1], "master_weights": fmt[2]}}
    eng = zoe.initialize(model, config=ds)
    g = torch.Generator().manual_seed(seed)
    for k in range(a.steps):
        starts = torch.randint(0, len(train) - a.seq - 1, (a.batch,), generator=g)
        ids = torch.stack([train[s:s + a.seq] for s in starts.tolist()])
        out = eng(input_ids=ids, labels=ids)
        eng.backward(out.loss)
        eng.step()
        if (k + 1) % max(1, a.steps // 4) == 0:
            print(f"  {fmt[0]} seed {seed} step {k + 1}: loss {out.loss.item():.4f}", file=sys.stderr, flush=True)
    eng.eval()
    windows = held[:len(held) // a.seq * a.seq].view(-1, a.seq)
    losses = []
    with torch.no_grad():
        for i in range(0, len(windows), a.batch):
            losses.append(eng(input_ids=windows[i:i + a.batch], labels=windows[i:i + a.batch]).loss.item())
    eng.close()
    return statistics.mean(losses)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--seeds", type=int, default=3, help="seeds 1..S (default 3)")
    ap.add_argument("--steps", type=int, default=400, help="steps per run (default 400)")
    ap.add_argument("--batch", type=int, default=8, help="sequences a step (default 8)")
    ap.add_argument("--seq", type=int, default=128, help="bytes a sequence (default 128)")
    ap.add_argument("--width", type=int, default=256, help="hidden size, a multiple of 64 (default 256)")
    ap.add_argument("--layers", type=int, default=4, help="layers (default 4)")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    ap.add_argument("--eval-frac", type=float, default=0.1, help="share of the corpus held out (default 0.1)")
    ap.add_argument("--corpus", default=CORPUS, help=f"folder of text files (default {CORPUS})")
    ap.add_argument("--formats", default="fp32,int8+bf16,int4+bf16",
                    help="formats to run, comma-separated, fp32 among them (default all three)")
    ap.add_argument("--compute", choices=("bf16", "fp32"), default="bf16",
                    help="compute dtype (default bf16; fp32 where torch's bf16 matmuls are slow, as on CPUs "
                         "without AVX-512)")
    ap.add_argument("--json", default=None, help="also write the JSON object to this file")
    a = ap.parse_args()
    names = a.formats.split(",")
    bad = [x for x in names if x not in [f[0] for f in FORMATS]]
    if bad or "fp32" not in names:
        ap.error(f"--formats {a.formats}: choose among {', '.join(f[0] for f in FORMATS)}, with fp32 (the baseline)")
    formats = tuple(f for f in FORMATS if f[0] in names)
    for flag, v in (("--seeds", a.seeds), ("--steps", a.steps), ("--batch", a.batch), ("--layers", a.layers)):
        if v < 1:
            ap.error(f"{flag} {v}: at least 1")
    if a.width < 64 or a.width % 64:
        ap.error(f"--width {a.width}: a multiple of 64 (heads of 64)")
    if not 0 < a.eval_frac < 1:
        ap.error(f"--eval-frac {a.eval_frac}: between 0 and 1")
    if not os.path.isdir(a.corpus):
        ap.error(f"--corpus {a.corpus}: not a folder")
    import torch
    data = torch.frombuffer(bytearray(corpus_bytes(a.corpus)), dtype=torch.uint8).long()
    # Every k-th piece of 1 KiB held out (k = 1 / --eval-frac): the held-out text is drawn from every
    # file, as the training text is, rather than being the last files' (another distribution).
    pieces = list(torch.split(data, 1024))
    k = max(2, round(1 / a.eval_frac))
    held = torch.cat([p for i, p in enumerate(pieces) if i % k == k - 1])
    train = torch.cat([p for i, p in enumerate(pieces) if i % k != k - 1])
    if len(train) <= a.seq + 1 or len(held) < a.seq:
        sys.exit(f"lowbit_hf_quality: the corpus in {a.corpus} ({len(data)} bytes) is too small for --seq {a.seq}")
    print(f"corpus: {len(data)} bytes ({len(train)} train, {len(held)} held out)", file=sys.stderr)
    loss = {f[0]: {} for f in formats}
    t0 = time.monotonic()
    for seed in range(1, a.seeds + 1):
        for fmt in (formats if seed % 2 else formats[::-1]):
            loss[fmt[0]][seed] = run(a, fmt, seed, train, held)
            print(f"seed {seed} {fmt[0]}: held-out loss {loss[fmt[0]][seed]:.5f}", file=sys.stderr, flush=True)
    seeds = list(range(1, a.seeds + 1))
    fp = statistics.mean(loss["fp32"].values())
    out = {"corpus": a.corpus, "corpus_bytes": len(data), "seeds": seeds, "steps": a.steps,
           "model": {"width": a.width, "layers": a.layers, "vocab": 256, "seq": a.seq, "batch": a.batch},
           "compute": a.compute,
           "seconds": time.monotonic() - t0, "formats": {}}
    for f in formats:
        mean = statistics.mean(loss[f[0]].values())
        row = {"eval_loss_by_seed": [loss[f[0]][s] for s in seeds], "mean_eval_loss": mean,
               "rel_diff_of_mean": mean / fp - 1,
               "rel_diff_by_seed": [loss[f[0]][s] / loss["fp32"][s] - 1 for s in seeds]}
        if f[0] in TARGETS:
            # A quality bound: the loss at most this far above fp32's (a lower loss loses no quality).
            row["target"] = f"within {TARGETS[f[0]] * 100:g}% (at most {TARGETS[f[0]] * 100:g}% above fp32's)"
            row["met"] = row["rel_diff_of_mean"] <= TARGETS[f[0]]
        out["formats"][f[0]] = row
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
