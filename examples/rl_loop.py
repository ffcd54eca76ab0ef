#!/usr/bin/env python3
"""Reinforcement learning with the trainer and the generator on one device: a GRPO-style loop.

Each iteration:
  1. the inference copy (a plain Hugging Face model) samples a group of completions per prompt
     with HF generate, while zoe's engine sleeps (engine.sleep(): its device memory is free for
     the generator; engine.wake() brings every byte back);
  2. a reward computed here (the share of completion tokens equal to --target) gives each
     completion its group-relative advantage (reward minus the group's mean, over its std);
  3. zoe takes one policy-gradient step (stage 3, parameters and optimizer states offloaded);
  4. engine.gathered_parameters() streams the new weights, one tensor at a time, into the
     inference copy.
A tiny Llama-architecture model built here; nothing is downloaded. Exits 1 unless the reward rose
(the mean of the last 5 iterations above the first 5's by --min-rise).

usage: PYTHONPATH=build/python python3 examples/rl_loop.py [--iters 30] [--nvme-path DIR] [--json]"""
import argparse
import copy
import json
import sys
import tempfile
import time

import torch
import transformers

import zoe


def build(vocab, seed):
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   bos_token_id=0, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def rollout(infer, prompts, group, new_tokens):
    """group completions per prompt, sampled (HF generate draws from torch's global generator,
    seeded in run()): the prompt + completion token ids, and the completions'."""
    batch = prompts.repeat_interleave(group, dim=0)
    with torch.no_grad():
        seqs = infer.generate(batch, attention_mask=torch.ones_like(batch), do_sample=True, top_k=0, top_p=1.0,
                              temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              pad_token_id=0, eos_token_id=None)
    return seqs, seqs[:, prompts.shape[1]:]


def advantages(rewards, group):
    r = rewards.view(-1, group)
    return ((r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + 1e-4)).view(-1)


def policy_loss(engine, seqs, prompt_len, adv):
    """-mean(advantage * log p(completion token)): the on-policy GRPO objective (one step per
    rollout, so the ratio is 1 and needs no clipping)."""
    logits = engine(input_ids=seqs[:, :-1]).logits[:, prompt_len - 1:]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, seqs[:, prompt_len:, None]).squeeze(-1)
    return -(adv[:, None] * logp).mean()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per iteration")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt (GRPO's group)")
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--target", type=int, default=7, help="the token the reward counts")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-rise", type=float, default=0.1, help="the rise of the mean reward the run must show")
    ap.add_argument("--nvme-path", default=None, help="zoe's NVMe directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    a = ap.parse_args()
    if a.nvme_path:
        return run(a, a.nvme_path)
    with tempfile.TemporaryDirectory(prefix="zoe-rl-") as nvme:
        return run(a, nvme)


def run(a, nvme):
    vocab = 32
    policy = build(vocab, a.seed)
    infer = copy.deepcopy(policy).eval()
    config = {"train_micro_batch_size_per_gpu": a.prompts * a.group, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "weight_decay": 0.0}},
              "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                    "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}}
    engine = zoe.initialize(policy, config=config)
    infer_params = dict(infer.named_parameters())
    gen = torch.Generator().manual_seed(a.seed)
    torch.manual_seed(a.seed + 1)
    rewards_by_iter, slept = [], []
    t0 = time.perf_counter()
    for it in range(1, a.iters + 1):
        prompts = torch.randint(1, vocab, (a.prompts, 4), generator=gen)
        # The generator's turn: zoe gives the device memory back.
        engine.sleep()
        slept.append(engine.memory_in_use()["device"])
        seqs, completions = rollout(infer, prompts, a.group, a.new_tokens)
        engine.wake()
        rewards = (completions == a.target).float().mean(dim=1)
        adv = advantages(rewards, a.group)
        # The trainer's turn: one step, then the new weights into the inference copy.
        loss = policy_loss(engine, seqs, prompts.shape[1], adv)
        engine.backward(loss)
        engine.step()
        with torch.no_grad():
            for name, t in engine.gathered_parameters():
                infer_params[name].copy_(t)
        rewards_by_iter.append(rewards.mean().item())
        print(f"iter {it:3d}  reward {rewards_by_iter[-1]:.3f}  loss {loss.item():+.4f}", flush=True)
    engine.close()
    first, last = sum(rewards_by_iter[:5]) / 5, sum(rewards_by_iter[-5:]) / 5
    rose = last - first >= a.min_rise
    print(f"reward {first:.3f} (first 5 iterations) -> {last:.3f} (last 5) in {time.perf_counter() - t0:.1f}s; "
          f"device memory while asleep: {max(slept)} bytes")
    if a.json:
        print(json.dumps({"rewards": rewards_by_iter, "first5": first, "last5": last, "rose": rose,
                          "device_bytes_asleep": max(slept)}))
    if not rose:
        print(f"the reward did not rise by {a.min_rise}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
