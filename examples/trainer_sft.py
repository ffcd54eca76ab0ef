#!/usr/bin/env python3
"""TRL's SFTTrainer on zoe: the mixin zoe.hf.ZoeTrainerMixin placed before SFTTrainer makes TRL's
supervised fine-tuning run through zoe's engine (its optimizer, schedule, offload and
checkpoints), the rest of the script as TRL users write it (SFTConfig, a text dataset, a
tokenizer, train, save_model). Nothing is downloaded: the dataset is one-digit additions written
here ("7+5=12"), the tokenizer one token per character, the model a small Llama from its config.
Parameters and optimizer states live on NVMe (stage 3). Exits 1 unless the loss fell.

usage: PYTHONPATH=build/python python3 examples/trainer_sft.py [--steps 60] [--out DIR]
       [--nvme-path DIR] [--plain]   (--plain: TRL on plain torch, the same run without zoe)"""
import argparse
import os
import sys
import tempfile

import datasets
import tokenizers
import torch
import transformers
import trl

import zoe.hf


class ZoeSFTTrainer(zoe.hf.ZoeTrainerMixin, trl.SFTTrainer):
    """TRL's SFTTrainer, trained by zoe: the mixin's hooks replace the optimizer, the backward and
    the checkpoints; TRL's data preparation, collator and loss stay TRL's."""


CHARS = "0123456789+="


def char_tokenizer():
    """A tokenizer with one token per character of CHARS, and <pad>, <eos>, <unk>."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    vocab.update({c: i + 3 for i, c in enumerate(CHARS)})
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", behavior="isolated")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                                unk_token="<unk>")


def additions(n, seed):
    """n texts "a+b=c" for one-digit a and b, drawn with `seed`."""
    g = torch.Generator().manual_seed(seed)
    ab = torch.randint(0, 10, (n, 2), generator=g).tolist()
    return datasets.Dataset.from_dict({"text": [f"{a}+{b}={a + b}" for a, b in ab]})


def model_and_tokenizer(seed=0):
    tok = char_tokenizer()
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                   bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg), tok


def sft_config(out, steps, **kw):
    base = dict(output_dir=out, max_steps=steps, per_device_train_batch_size=16, learning_rate=3e-3,
                lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, logging_steps=1,
                save_strategy="no", report_to="none", use_cpu=True, seed=0, data_seed=0, disable_tqdm=True,
                max_length=16, packing=False, dataset_num_proc=None)
    base.update(kw)
    return trl.SFTConfig(**base)


def train(out, steps, zoe_config=None, seed=0, **kw):
    """One SFT run: TRL's SFTTrainer on plain torch (zoe_config None) or on zoe; the trainer."""
    model, tok = model_and_tokenizer(seed)
    cls, extra = (trl.SFTTrainer, {}) if zoe_config is None else (ZoeSFTTrainer, {"zoe_config": zoe_config})
    t = cls(model=model, args=sft_config(out, steps, **kw), train_dataset=additions(512, 1), processing_class=tok,
            **extra)
    t.train()
    return t


def losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default="trainer_sft_out")
    ap.add_argument("--nvme-path", default=None, help="zoe's NVMe swap folder (default: a temporary one)")
    ap.add_argument("--plain", action="store_true", help="TRL on plain torch: the same run without zoe")
    a = ap.parse_args()
    if a.steps < 2:
        ap.error("--steps must be at least 2 (the loss is compared between the first and last steps)")
    with tempfile.TemporaryDirectory(prefix="zoe-trainer-sft-") as tmp:
        nvme = a.nvme_path or tmp
        os.makedirs(nvme, exist_ok=True)
        cfg = None if a.plain else {"zero_optimization": {
            "stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}}
        t = train(a.out, a.steps, cfg)
        t.save_model(a.out)
    seen = losses(t)
    first, last = sum(seen[:5]) / len(seen[:5]), sum(seen[-5:]) / len(seen[-5:])
    print(f"{'TRL on plain torch' if a.plain else 'TRL SFTTrainer on zoe (stage 3, NVMe)'}: loss {first:.3f} "
          f"(first steps) -> {last:.3f} (last steps) in {len(seen)} steps; model saved in {a.out}")
    return 0 if last < first else 1


if __name__ == "__main__":
    sys.exit(main())
