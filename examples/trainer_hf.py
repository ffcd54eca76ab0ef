#!/usr/bin/env python3
"""A Hugging Face Trainer script on zoe: zoe.hf.Trainer in place of transformers.Trainer, the rest
as it was (TrainingArguments, a dataset, evaluate, save_model, checkpoints in output_dir). A
Llama-architecture model with parameters and optimizer states on NVMe (stage 3) learns a small
set of sequences built here; nothing is downloaded. Exits 1 unless the loss fell.

usage: PYTHONPATH=build/python python3 examples/trainer_hf.py [--steps 20] [--out DIR]
       [--nvme-path DIR] [--resume]   (--resume: from the last checkpoint in DIR)

Any Trainer subclass runs the same way through the mixin, TRL's SFTTrainer for one:
    class ZoeSFTTrainer(zoe.hf.ZoeTrainerMixin, trl.SFTTrainer): pass"""
import argparse
import os
import sys
import tempfile

import torch
import transformers

import zoe.hf


class Sequences(torch.utils.data.Dataset):
    """n token sequences drawn from `distinct` patterns: a causal LM learns to continue them."""

    def __init__(self, n, vocab, length=32, distinct=8, seed=1):
        g = torch.Generator().manual_seed(seed)
        patterns = torch.randint(0, vocab, (distinct, length), generator=g)
        self.x = patterns[torch.randint(0, distinct, (n,), generator=g)]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="trainer_hf_out")
    ap.add_argument("--nvme-path", default=None)
    ap.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --out")
    a = ap.parse_args()
    if a.nvme_path:
        os.makedirs(a.nvme_path, exist_ok=True)
        return train(a, a.nvme_path)
    with tempfile.TemporaryDirectory(prefix="zoe-trainer-hf-") as nvme:
        return train(a, nvme)


def train(a, nvme):
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    args = transformers.TrainingArguments(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=4, learning_rate=3e-3,
        lr_scheduler_type="constant", logging_steps=1, save_steps=10, eval_strategy="steps", eval_steps=10,
        report_to="none", use_cpu=not torch.cuda.is_available(), disable_tqdm=True)
    # A DeepSpeed config, as DeepSpeed users write it ("auto": from the TrainingArguments); the same
    # dict as zoe.hf.TrainingArguments(deepspeed=...) works too.
    zoe_config = {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",
                  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
                  "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                                        "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}}
    trainer = zoe.hf.Trainer(model=model, args=args, train_dataset=Sequences(256, cfg.vocab_size),
                             eval_dataset=Sequences(32, cfg.vocab_size, seed=1), zoe_config=zoe_config)
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    losses = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    for step, loss in losses:
        print(f"step {step:3d}  loss {loss:.4f}", flush=True)
    print(f"eval loss {trainer.evaluate()['eval_loss']:.6f}")
    trainer.save_model(a.out)  # config.json + model.safetensors: AutoModelForCausalLM.from_pretrained(out)
    print("saved", a.out)
    trainer.zoe_engine.close()
    if not (len(losses) >= 2 and losses[-1][1] < losses[0][1]):
        print(f"error: the loss did not fall ({losses[0][1]:.4f} -> {losses[-1][1]:.4f})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
