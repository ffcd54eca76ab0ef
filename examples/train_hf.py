#!/usr/bin/env python3
"""A Hugging Face Llama-architecture model fine-tuned by zoe with parameters and optimizer states
on NVMe (stage 3), saved with engine.save_pretrained as a folder that
transformers.AutoModelForCausalLM.from_pretrained loads. Exits 1 unless the loss fell.

usage: PYTHONPATH=build/python python3 examples/train_hf.py [--steps 20] [--out DIR]
       [--nvme-path DIR] [--weights FOLDER]   (FOLDER: a from_pretrained folder of a Llama model)"""
import argparse
import os
import sys
import tempfile

import torch
import transformers

import zoe


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="train_hf_out")
    ap.add_argument("--nvme-path", default=None)
    ap.add_argument("--weights", default=None, help="a folder written by save_pretrained to start from")
    a = ap.parse_args()
    if a.weights:
        cfg = transformers.AutoConfig.from_pretrained(a.weights)
    else:
        cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    with torch.device("meta"):  # no memory for the weights here: zoe places them on NVMe
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    if a.nvme_path:
        os.makedirs(a.nvme_path, exist_ok=True)
        return train(a, model, cfg, a.nvme_path)
    with tempfile.TemporaryDirectory(prefix="zoe-train-hf-") as nvme:
        return train(a, model, cfg, nvme)


def train(a, model, cfg, nvme):
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
              "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                                    "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}}
    torch.manual_seed(0)
    engine = zoe.initialize(model, config=config, weights=a.weights)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, cfg.vocab_size, (4, 32), generator=g)  # one batch to fit: the loss must fall
    losses = []
    for step in range(a.steps):
        out = engine(input_ids=data, labels=data)
        engine.backward(out.loss)
        engine.step()
        losses.append(out.loss.item())
        print(f"step {step + 1:3d}  loss {losses[-1]:.4f}", flush=True)
    engine.eval()
    with torch.no_grad():  # the trained model's loss on the batch: from_pretrained(out) gives the same
        print(f"final loss {engine(input_ids=data, labels=data).loss.item():.6f}")
    print("saved", engine.save_pretrained(a.out))
    engine.close()
    if not (len(losses) >= 2 and losses[-1] < losses[0]):
        print(f"error: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
