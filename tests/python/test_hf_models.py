"""Hugging Face transformers models, unchanged, trained by zoe's PyTorch front-end: every common
architecture at stage 3 with parameters and optimizer states on NVMe and a device budget several
times smaller than the model states, against plain torch.optim.AdamW; gradient checkpointing;
generate() after training; engine.save_pretrained() loaded back by from_pretrained(); weights=
and transformers' own initialisation for a model built on the meta device. Tiny configs built
with from_config: nothing is downloaded."""
import copy
import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")
os.environ["HF_HUB_OFFLINE"] = "1"

from zoe_torch_models import config  # noqa: E402

STEPS = 10
LR = 3e-3
VOCAB = 128
LAYERS = 6
BUDGET = 352 << 10  # bytes of device memory zoe may use (a decoder layer in use needs about 230 KiB,
#                     the placement about 100 KiB more); the model states are several times more


def tiny_config(arch):
    T = transformers
    dec = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)
    if arch == "gpt2":  # Conv1D, learned positions, tied head
        return T.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=LAYERS, n_head=4, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
    if arch == "llama":  # GQA, RoPE, untied head
        return T.LlamaConfig(**dec, tie_word_embeddings=False)
    if arch == "qwen2":  # q/k/v biases, tied head
        return T.Qwen2Config(**dec, tie_word_embeddings=True)
    if arch == "mistral":
        return T.MistralConfig(**dec, tie_word_embeddings=False)
    if arch == "gpt_neox":  # fused qkv, partial rotary, parallel residual
        return T.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                               num_attention_heads=4, max_position_embeddings=64, hidden_dropout=0.0,
                               attention_dropout=0.0, tie_word_embeddings=False)
    if arch == "qwen2_moe":  # 8 experts, 2 per token: 32 tokens a step leave some with none
        return T.Qwen2MoeConfig(**dec, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=8,
                                shared_expert_intermediate_size=32, tie_word_embeddings=False)
    if arch == "mixtral":
        return T.MixtralConfig(**{**dec, "intermediate_size": 8}, num_local_experts=8, num_experts_per_tok=2,
                               tie_word_embeddings=False)
    raise ValueError(arch)


def build(arch, seed=0, **kw):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(tiny_config(arch), attn_implementation="eager", **kw)


def batches(n, batch=2, T=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, T), generator=g) for _ in range(n)]


def hf_config(tmp_path, **kw):
    os.makedirs(tmp_path, exist_ok=True)
    return config(tmp_path, device_budget=BUDGET, micro=2,
                  zero={"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0}, **kw)


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def train_torch(model, data, opt=None):
    opt = opt or adamw(model)
    losses = []
    for ids in data:
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        losses.append(loss.item())
    return losses


def train_zoe(eng, data):
    losses = []
    for ids in data:
        out = eng(input_ids=ids, labels=ids)
        assert isinstance(out, transformers.modeling_outputs.ModelOutput)  # the model's own output object
        eng.backward(out.loss)
        assert eng.step().stepped
        losses.append(out.loss.item())
    return losses


def assert_losses(z, t, what=""):
    for i, (a, b) in enumerate(zip(z, t)):
        assert abs(a - b) <= 1e-5 * abs(b), f"{what} step {i + 1}: zoe loss {a}, torch {b}"
    assert abs(t[0] - t[-1]) > 1e-3, "training did not move the loss"


def assert_weights(eng, ref, tol=2e-5):
    got = eng.state_dict()
    want = {n: p.detach() for n, p in ref.named_parameters(remove_duplicate=False)}
    for n, w in want.items():
        assert n in got, n
        d = (got[n] - w).abs().max().item()
        assert d <= tol, f"{n}: max |zoe - torch| = {d}"


ARCHS = ["gpt2", "llama", "qwen2", "mistral", "gpt_neox", "qwen2_moe", "mixtral"]


@pytest.mark.parametrize("arch", ARCHS)
def test_architecture_trains_like_torch(arch, tmp_path):
    """Stage 3, parameters and optimizer states on NVMe, a device budget at most a third of the
    model states: 10 steps' losses within 1e-5 relative of torch.optim.AdamW's, final weights
    within 2e-5; each decoder layer is one unit."""
    model = build(arch)
    ref = copy.deepcopy(model)
    data = batches(STEPS)
    eng = zoe.initialize(model, config=hf_config(tmp_path))
    assert eng.model_state_bytes() >= 3 * eng.device_budget_bytes(), (eng.model_state_bytes(), BUDGET)
    names = [u for u, _ in eng.units()]
    layers = "transformer.h" if arch == "gpt2" else "gpt_neox.layers" if arch == "gpt_neox" else "model.layers"
    assert f"{layers}.0" in names and f"{layers}.1" in names, names
    z = train_zoe(eng, data)
    t = train_torch(ref, data)
    assert_losses(z, t, arch)
    assert_weights(eng, ref)
    eng.close()


BF16_LOSS_RTOL = 3e-3  # measured: at most 7e-4 (llama), 2e-4 (gpt2) over the 10 steps
BF16_WEIGHT_RATIO = 0.25  # measured: 0.05 (gpt2), 0.06 (llama)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_architecture_trains_in_bf16(arch, tmp_path):
    """bf16 ("bf16": {"enabled": true}: bf16 compute, fp32 master weights and Adam states), stage 3
    on NVMe, against the fp32 torch.optim.AdamW reference: each of the 10 steps' losses within
    3e-3 relative, and the final weights' distance from the reference's at most a quarter of how
    far the reference's weights moved (a bf16 update that went astray would be as far as the move)."""
    model = build(arch)
    ref = copy.deepcopy(model)
    init = {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
    data = batches(STEPS)
    eng = zoe.initialize(model, config=hf_config(tmp_path, dtype="bf16"))
    assert eng.compute_dtype() == torch.bfloat16
    z = train_zoe(eng, data)
    t = train_torch(ref, data)
    for i, (a, b) in enumerate(zip(z, t)):
        assert abs(a - b) <= BF16_LOSS_RTOL * abs(b), f"{arch} bf16 step {i + 1}: zoe loss {a}, torch fp32 {b}"
    got = eng.state_dict()
    want = {n: p.detach() for n, p in ref.named_parameters(remove_duplicate=False)}
    off = torch.cat([(got[n].float() - w).flatten() for n, w in want.items()]).norm().item()
    moved = torch.cat([(w - init[n]).flatten() for n, w in want.items()]).norm().item()
    assert moved > 0 and off <= BF16_WEIGHT_RATIO * moved, f"{arch} bf16: |zoe - torch| {off}, torch moved {moved}"
    eng.close()


def test_moe_steps_leave_experts_without_tokens():
    """The MoE case is the one asked for: in the batches used, some expert of some layer gets no
    token (its slice of the fused expert weights gets a zero gradient)."""
    model = build("qwen2_moe")
    seen = []

    def hook(mod, args, out):
        seen.append(torch.bincount(out[2].reshape(-1), minlength=8))

    hs = [layer.mlp.gate.register_forward_hook(hook) for layer in model.model.layers]
    with torch.no_grad():
        for ids in batches(STEPS):
            model(input_ids=ids)
    for h in hs:
        h.remove()
    assert any(bool((c == 0).any()) for c in seen)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing(arch, reentrant, tmp_path):
    """model.gradient_checkpointing_enable(): the same losses as torch without checkpointing."""
    model = build(arch)
    ref = copy.deepcopy(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    data = batches(4)
    eng = zoe.initialize(model, config=hf_config(tmp_path))
    z = train_zoe(eng, data)
    t = train_torch(ref, data)
    for i, (a, b) in enumerate(zip(z, t)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {i + 1}: zoe loss {a}, torch {b}"
    assert_weights(eng, ref)
    eng.close()


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2_moe"])
def test_generate_after_training(arch, tmp_path):
    """engine.module.generate() (greedy) after training gives the reference model's tokens; a
    training forward on the model outside engine(...) is still refused."""
    model = build(arch)
    ref = copy.deepcopy(model)
    data = batches(3)
    eng = zoe.initialize(model, config=hf_config(tmp_path))
    opt = adamw(ref)
    train_zoe(eng, data)
    train_torch(ref, data, opt)
    prompt = data[0][:, :5]
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    got = eng.module.generate(prompt, **kw)
    want = ref.generate(prompt, **kw)
    assert got.shape == (2, 13)
    assert torch.equal(got, want), (got, want)
    with torch.inference_mode():
        logits = eng.module(input_ids=prompt).logits
    assert torch.allclose(logits, ref(input_ids=prompt).logits.detach(), rtol=1e-4, atol=1e-5)
    with pytest.raises(zoe.ZoeError, match=r"engine\(\.\.\.\)"):
        eng.module(input_ids=prompt, labels=prompt)
    # Training goes on after inference, still like torch.
    more = batches(2, seed=5)
    z, t = train_zoe(eng, more), train_torch(ref, more, opt)
    for a, b in zip(z, t):
        assert abs(a - b) <= 1e-5 * abs(b)
    eng.close()


def _trained_pair(arch, tmp_path, steps=4):
    model = build(arch)
    ref = copy.deepcopy(model)
    data = batches(steps)
    eng = zoe.initialize(model, config=hf_config(tmp_path / "nvme"))
    train_zoe(eng, data)
    train_torch(ref, data)
    return eng, ref


def assert_loads_like(folder, ref):
    """AutoModelForCausalLM.from_pretrained(folder) is ref's class in fp32 and gives ref's logits;
    returns them."""
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    assert type(loaded) is type(ref) and loaded.dtype == torch.float32
    ids = batches(1, seed=9)[0]
    with torch.no_grad():
        got, want = loaded(input_ids=ids).logits, ref(input_ids=ids).logits
    assert torch.allclose(got, want, rtol=1e-4, atol=2e-5), (got - want).abs().max()
    return want


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_save_pretrained_loads_in_transformers(arch, tmp_path):
    """engine.save_pretrained(dir) -> AutoModelForCausalLM.from_pretrained(dir) gives the logits of
    the torch reference after the same training; tied weights are written once, under the name
    transformers keeps."""
    from safetensors import safe_open

    eng, ref = _trained_pair(arch, tmp_path)
    out = tmp_path / "hf"
    assert eng.save_pretrained(out) == os.fspath(out)
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
    with safe_open(os.fspath(out / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        assert f.metadata() == {"format": "pt"}
    if arch == "gpt2":
        assert "transformer.wte.weight" in keys and "lm_head.weight" not in keys
    else:
        assert {"model.embed_tokens.weight", "lm_head.weight"} <= keys
    want = assert_loads_like(out, ref)
    ids = batches(1, seed=9)[0]
    # Not trivially equal: the untrained model's logits differ.
    with torch.no_grad():
        assert (build(arch)(input_ids=ids).logits - want).abs().max() > 1e-3
    eng.close()


def test_save_pretrained_shards_and_bf16(tmp_path):
    """Above max_shard_size the tensors go to model-0000i-of-0000n.safetensors with
    model.safetensors.index.json (transformers' names); from_pretrained loads them; a later
    unsharded save removes the stale shards; dtype=torch.bfloat16 writes the masters rounded."""
    eng, ref = _trained_pair("llama", tmp_path, steps=2)
    out = tmp_path / "hf"
    eng.save_pretrained(out, max_shard_size="20KB")
    files = sorted(os.listdir(out))
    shards = [f for f in files if f.startswith("model-")]
    assert len(shards) >= 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert set(index["weight_map"]) == {n for n, _ in ref.named_parameters()}
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in ref.parameters())
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    sd = eng.state_dict()
    for n, p in loaded.named_parameters():
        assert torch.equal(p.detach(), sd[n]), n
    eng.save_pretrained(out, dtype=torch.bfloat16)
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    for n, p in loaded.named_parameters():
        assert torch.equal(p.detach(), sd[n].to(torch.bfloat16).float()), n
    with pytest.raises(zoe.ZoeError, match="max_shard_size"):
        eng.save_pretrained(out, max_shard_size="lots")
    eng.close()


def meta_model(arch):
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(tiny_config(arch), attn_implementation="eager")


@pytest.mark.parametrize("arch,shard", [("llama", "20KB"), ("gpt2", "50GB")])
def test_weights_folder_into_meta_model(arch, shard, tmp_path):
    """zoe.initialize(meta-built model, weights=folder that transformers wrote, sharded or not):
    zoe starts from exactly those weights (buffers included) and trains like torch from them."""
    ref = build(arch, seed=3)
    folder = tmp_path / "w"
    ref.save_pretrained(folder, max_shard_size=shard)
    assert (folder / "model.safetensors.index.json").exists() == (shard == "20KB")
    eng = zoe.initialize(meta_model(arch), config=hf_config(tmp_path / "nvme"), weights=folder)
    sd = eng.state_dict()
    for n, p in ref.named_parameters(remove_duplicate=False):
        assert torch.equal(sd[n], p.detach()), n
    bufs = dict(eng.module.named_buffers())
    for n, b in ref.named_buffers():
        assert torch.equal(bufs[n], b), n
    data = batches(4)
    z, t = train_zoe(eng, data), train_torch(ref, data)
    for a, b in zip(z, t):
        assert abs(a - b) <= 1e-5 * abs(b)
    eng.close()


def test_weights_folder_mismatch_is_named(tmp_path):
    """A missing, an extra and a wrongly shaped tensor are each refused by name."""
    from safetensors.torch import save_file

    ref = build("llama")
    sd = {n: p.detach().clone() for n, p in ref.named_parameters()}
    cases = {
        "missing": ({k: v for k, v in sd.items() if k != "model.norm.weight"}, r"missing 1: model\.norm\.weight"),
        "extra": ({**sd, "model.layers.7.mlp.up_proj.weight": torch.zeros(2)},
                  r"extra \(not in the model\) 1: model\.layers\.7\.mlp\.up_proj\.weight"),
        "shape": ({**sd, "lm_head.weight": torch.zeros(VOCAB, 16)},
                  r"wrong shape 1: lm_head\.weight: \[128, 16\] in the folder, \[128, 32\] in the model"),
    }
    for what, (tensors, msg) in cases.items():
        d = tmp_path / what
        d.mkdir()
        save_file(tensors, os.fspath(d / "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(zoe.ZoeError, match=msg):
            zoe.initialize(meta_model("llama"), config=hf_config(tmp_path / "nvme"), weights=d)
    with pytest.raises(zoe.ZoeError, match="no \\*\\.safetensors file"):
        zoe.initialize(meta_model("llama"), config=hf_config(tmp_path / "nvme"), weights=tmp_path / "nvme")


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2_moe"])
def test_meta_model_gets_transformers_init(arch, tmp_path):
    """A model built on the meta device with no weights: transformers' own _init_weights gives
    every parameter values (norms 1, biases 0, matrices with std initializer_range) and the
    rotary embedding its inv_freq; it trains."""
    eng = zoe.initialize(meta_model(arch), config=hf_config(tmp_path))
    cpu = build(arch)
    sd = eng.state_dict()
    std = cpu.config.initializer_range
    for n, p in cpu.named_parameters(remove_duplicate=False):
        v = sd[n]
        assert v.shape == p.shape and bool(torch.isfinite(v).all()), n
        if "norm" in n or "ln_" in n:
            assert torch.equal(v, p.detach()), n  # ones and zeros, as from_config gives
        elif v.dim() >= 2 and v.numel() >= 512:
            assert abs(v.std().item() - std) < 0.3 * std, (n, v.std().item())
    bufs = dict(eng.module.named_buffers())
    for n, b in cpu.named_buffers():
        assert torch.equal(bufs[n], b), n
    losses = train_zoe(eng, batches(3))
    assert all(abs(x - losses[0]) < 1.0 for x in losses) and losses[0] == pytest.approx(4.85, abs=0.3)
    eng.close()


def test_failed_inference_call_is_released_by_the_next_forward(tmp_path):
    """An exception inside a direct no_grad call leaves the units it fetched held; the next
    engine(...) releases them and trains like torch."""
    model = build("llama")
    ref = copy.deepcopy(model)
    eng = zoe.initialize(model, config=hf_config(tmp_path))

    def boom(mod, args):  # after zoe's pre-hook: the norm's unit is fetched
        raise RuntimeError("boom")

    h = model.model.norm.register_forward_pre_hook(boom)
    with torch.no_grad(), pytest.raises(RuntimeError, match="boom"):
        model(input_ids=batches(1)[0])
    h.remove()
    assert any(zm.refs for zm in eng._zmods)
    data = batches(2)
    z, t = train_zoe(eng, data), train_torch(ref, data)
    assert not any(zm.refs for zm in eng._zmods)
    for a, b in zip(z, t):
        assert abs(a - b) <= 1e-5 * abs(b)
    eng.close()


@pytest.mark.parametrize("arch,key", [("qwen2_moe", "model.layers.0.mlp.experts.3.up_proj.weight"),
                                      ("mixtral", "model.layers.0.block_sparse_moe.experts.3.w3.weight")])
def test_weights_folder_with_per_expert_moe_layout(arch, key, tmp_path):
    """transformers 5 saves an MoE model's fused experts per expert (its original layout, for
    mixtral under the block_sparse_moe name) and converts them while loading; weights= does the
    same."""
    ref = build(arch, seed=4)
    folder = tmp_path / "w"
    ref.save_pretrained(folder)
    from safetensors import safe_open

    with safe_open(os.fspath(folder / "model.safetensors"), framework="pt") as f:
        assert key in set(f.keys())
    eng = zoe.initialize(meta_model(arch), config=hf_config(tmp_path / "nvme"), weights=folder)
    sd = eng.state_dict()
    for n, p in ref.named_parameters():
        assert torch.equal(sd[n], p.detach()), n
    eng.close()


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_ckpt_consolidate_hf_equals_save_pretrained(arch, tmp_path):
    """`zoe ckpt consolidate D --format hf --out dir` from a checkpoint the front-end saved writes
    what engine.save_pretrained writes: the same tensors under the model's names (tied ones once),
    a config from_pretrained loads to the same logits; sharded above --max-shard-size."""
    from safetensors.torch import load_file

    from zoe_testlib import run_zoe

    eng, ref = _trained_pair(arch, tmp_path)
    ckpt = eng.save_checkpoint(tmp_path / "ckpt")
    eng.save_pretrained(tmp_path / "sp")
    out = tmp_path / "cli"
    j = run_zoe("ckpt", "consolidate", ckpt, "--format", "hf", "--out", out, "--json")
    assert j["format"] == "hf" and j["bytes"] > 0
    # The folder save_pretrained writes, and the marker of zoe's export (a later export may replace it).
    assert sorted(os.listdir(out)) == [".zoe-export.json", "config.json", "generation_config.json",
                                       "model.safetensors"]
    got, want = load_file(out / "model.safetensors"), load_file(tmp_path / "sp" / "model.safetensors")
    assert sorted(got) == sorted(want)
    for n in want:
        assert torch.equal(got[n], want[n]), n
    assert_loads_like(out, ref)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    # Sharded: the index names every parameter once, and from_pretrained loads the same weights.
    run_zoe("ckpt", "consolidate", ckpt, "--format", "hf", "--out", tmp_path / "sh", "--max-shard-size", 20000,
            "--json")
    index = json.loads((tmp_path / "sh" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(want) and len(set(index["weight_map"].values())) >= 3
    sharded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "sh", attn_implementation="eager")
    for (n, p), (_, q) in zip(sharded.named_parameters(), loaded.named_parameters()):
        assert torch.equal(p, q), n
    eng.close()


def test_ckpt_consolidate_hf_refuses_a_checkpoint_of_another_model(tmp_path):
    """A front-end checkpoint of a plain torch model holds no transformers config: --format hf says
    so and which format to use instead."""
    from zoe_testlib import run_zoe
    from zoe_torch_models import GPT

    eng = zoe.initialize(GPT(), config=hf_config(tmp_path / "nvme"))
    ckpt = eng.save_checkpoint(tmp_path / "ckpt")
    eng.close()
    p = run_zoe("ckpt", "consolidate", ckpt, "--format", "hf", "--out", tmp_path / "o", json_out=False, check=False)
    assert p.returncode != 0
    assert "no Hugging Face config" in p.stderr and "--format safetensors" in p.stderr, p.stderr
