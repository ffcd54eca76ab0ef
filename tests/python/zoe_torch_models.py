"""Plain-PyTorch models and helpers shared by the test_torch_*.py tests of zoe's front-end."""
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.attn = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(C, dim=2)
        h = self.heads
        q = q.view(B, T, h, C // h).transpose(1, 2)
        k = k.view(B, T, h, C // h).transpose(1, 2)
        v = v.view(B, T, h, C // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // h)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    """GPT-2 style decoder: token + position embeddings, pre-LN blocks, tied head."""

    def __init__(self, vocab=64, d=32, layers=4, heads=4, ctx=16):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.h = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for n, p in self.named_parameters():
            if n.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class MoE(nn.Module):
    """Two experts; a batch goes through one of them (the other gets no gradient, like an expert
    no token reached)."""

    def __init__(self, d):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(d, d) for _ in range(2)])

    def forward(self, x, which):
        return x + torch.tanh(self.experts[which](x))


class Experts(nn.Module):
    """An embedding, a two-expert layer and a head; `which` picks the expert of the step."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.moe = MoE(32)
        self.head = nn.Linear(32, 64)

    def forward(self, idx, targets, which):
        logits = self.head(self.moe(self.emb(idx), which))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class ConvNet(nn.Module):
    """A conv + MLP classifier (8x8 single-channel images, 10 classes)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1),
                                      nn.ReLU(), nn.MaxPool2d(2))
        self.mlp = nn.Sequential(nn.Flatten(), nn.Linear(16 * 16, 64), nn.GELU(), nn.Linear(64, 10))

    def forward(self, x, y):
        return F.cross_entropy(self.mlp(self.features(x)), y)


def gpt_batches(n, batch=4, T=16, vocab=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        idx = torch.randint(0, vocab, (batch, T + 1), generator=g)
        out.append((idx[:, :-1].contiguous(), idx[:, 1:].contiguous()))
    return out


def tiny_llama(seed=0, vocab=128):
    """A tiny Hugging Face Llama from a LlamaConfig (nothing downloaded): 3 layers, hidden 32, 4 heads
    and 2 key/value heads (grouped-query attention), an untied head, eager attention."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def permutation_batches(n, vocab=128, batch=2, T=16, seed=1):
    """Sequences that follow a fixed permutation of the vocabulary: a model learns them within a few
    steps, so every update shows in the losses."""
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(99))
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.empty(batch, T, dtype=torch.long)
        x[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        for t in range(T - 1):
            x[:, t + 1] = perm[x[:, t]]
        out.append(x)
    return out


def run_distance(a, b):
    """Largest per-step relative loss difference and largest weight difference of two runs, each
    (losses, {name: weights}, ...)."""
    loss = max(abs(x - y) / abs(y) for x, y in zip(a[0], b[0]))
    weight = max((a[1][n] - b[1][n]).abs().max().item() for n in b[1])
    return loss, weight


def conv_batches(n, batch=8, seed=2):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 1, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(n)]


class LoRALinear(nn.Module):
    """A frozen base nn.Linear plus a trainable low-rank update: base(x) + (x A^T) B^T."""

    def __init__(self, d_in, d_out, rank=4):
        super().__init__()
        self.base = nn.Linear(d_in, d_out)
        self.base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, d_in) * 0.1)
        self.lora_b = nn.Parameter(torch.randn(d_out, rank) * 0.1)  # not zero: A gets gradients at once

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a.t()) @ self.lora_b.t()


class LoRANet(nn.Module):
    """A frozen LayerNorm (a unit with no trainable parameter), two LoRA layers (units whose
    parameters are part frozen, part trainable) and a trainable head; the frozen base is the
    larger part. forward(x, y) gives the cross-entropy loss."""

    def __init__(self, d=64, hidden=128, classes=10):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.norm.requires_grad_(False)
        self.layers = nn.ModuleList([LoRALinear(d, hidden), LoRALinear(hidden, hidden)])
        self.head = nn.Linear(hidden, classes)

    def forward(self, x, y):
        h = self.norm(x)
        for layer in self.layers:
            h = F.gelu(layer(h))
        return F.cross_entropy(self.head(h), y)


def lora_batches(n, batch=8, d=64, classes=10, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, d, generator=g), torch.randint(0, classes, (batch,), generator=g)) for _ in range(n)]


def make_model(kind, seed=0):
    torch.manual_seed(seed)
    return GPT() if kind == "gpt" else ConvNet()


def config(tmp, stage=3, opt="nvme", param="nvme", lr=3e-3, wd=0.1, clip=0.5, gas=1, micro=4, dtype="fp32",
           zero=None, **zoe):
    c = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": clip,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": wd}},
        "zero_optimization": {"stage": stage, **(zero or {})},
        "zoe": dict(zoe),
    }
    if opt != "none":
        c["zero_optimization"]["offload_optimizer"] = {"device": opt, "nvme_path": str(tmp)}
    if param != "none":
        c["zero_optimization"]["offload_param"] = {"device": param, "nvme_path": str(tmp)}
    if dtype == "bf16":
        c["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        c["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return c


def train_torch(model, batches, lr=3e-3, wd=0.1, clip=0.5):
    """The reference: torch.optim.AdamW with clip_grad_norm_, no zoe."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    losses = []
    for args in batches:
        opt.zero_grad(set_to_none=True)
        loss = model(*args)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


def train_zoe(engine, batches):
    losses, stats = [], []
    for args in batches:
        loss = engine(*args)
        engine.backward(loss)
        stats.append(engine.step())
        losses.append(loss.item())
    return losses, stats


def clone(model):
    return copy.deepcopy(model)
