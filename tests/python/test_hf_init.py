"""Models built on the meta device and their buffers: weights= and transformers' own init for BERT,
gemma2 and gemma3_text (integer, bool and floating buffers, persistent or not: each initialised or
refused by name), engine.state_dict() and zoe.consolidate() loaded with load_state_dict(strict=True)
across architectures, and the dtype of a bf16 run's loss. Tiny configs built with from_config:
nothing is downloaded."""
import copy
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")
os.environ["HF_HUB_OFFLINE"] = "1"

import torch.nn as nn  # noqa: E402

from zoe_torch_models import config  # noqa: E402

VOCAB = 128


def tiny_config(arch):
    T = transformers
    dec = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)
    if arch == "bert":  # learned positions (the non-persistent position_ids), token types, tied MLM head
        return T.BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=64, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
    if arch == "t5":  # encoder-decoder, relative attention bias, shared embeddings
        return T.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
                          decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    if arch == "gpt2":
        return T.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0)
    if arch == "llama":
        return T.LlamaConfig(**dec, tie_word_embeddings=False)
    if arch == "gemma2":  # the embedding's non-persistent embed_scale buffer
        return T.Gemma2Config(**dec, head_dim=8)
    if arch == "gemma3_text":
        return T.Gemma3TextConfig(**dec, head_dim=8)
    raise ValueError(arch)


def model_class(arch):
    return {"bert": transformers.BertForMaskedLM, "t5": transformers.T5ForConditionalGeneration}.get(
        arch, transformers.AutoModelForCausalLM)


def build(arch, seed=0, meta=False):
    torch.manual_seed(seed)
    cls, cfg = model_class(arch), tiny_config(arch)
    make = cls.from_config if cls is transformers.AutoModelForCausalLM else cls._from_config
    if meta:
        with torch.device("meta"):
            return make(cfg, attn_implementation="eager")
    return make(cfg, attn_implementation="eager")


def batches(n, batch=2, T=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (batch, T), generator=g) for _ in range(n)]


def zoe_config(tmp_path, **kw):
    os.makedirs(tmp_path, exist_ok=True)
    return config(tmp_path, opt="cpu", param="cpu", micro=2, **kw)


def train_torch(model, data):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
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
        loss = eng(input_ids=ids, labels=ids).loss
        eng.backward(loss)
        eng.step()
        losses.append(loss.item())
    return losses


def assert_trains_like(eng, ref, steps=4):
    """steps steps on one batch (the loss moves by more than on fresh random tokens each step)."""
    data = batches(1) * steps
    z, t = train_zoe(eng, data), train_torch(ref, data)
    for i, (a, b) in enumerate(zip(z, t)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {i + 1}: zoe loss {a}, torch {b}"
    assert abs(t[0] - t[-1]) > 1e-3, "training did not move the loss"


def assert_buffers_like(eng, ref):
    want = dict(ref.named_buffers())
    got = dict(eng.module.named_buffers())
    assert set(got) == set(want)
    for n, b in want.items():
        assert got[n].dtype == b.dtype and torch.equal(got[n], b), f"buffer {n}: {got[n]} in zoe, {b} in torch"


@pytest.mark.parametrize("arch", ["bert", "gemma2", "gemma3_text"])
def test_weights_into_meta_model_sets_non_persistent_buffers(arch, tmp_path):
    """weights= into a meta-built BERT (the integer position_ids, which no folder holds), gemma2
    and gemma3_text (the floating embed_scale on the embedding module, whose weight zoe holds by
    then): every buffer gets the value the CPU-built model has, and zoe trains like torch."""
    ref = build(arch, seed=3)
    folder = tmp_path / "w"
    ref.save_pretrained(folder)
    eng = zoe.initialize(build(arch, meta=True), config=zoe_config(tmp_path / "nvme"), weights=folder)
    assert_buffers_like(eng, ref)
    sd = eng.state_dict()
    for n, p in ref.named_parameters():
        assert torch.equal(sd[n], p.detach()), n
    assert_trains_like(eng, ref)
    eng.close()


def test_meta_bert_masked_lm_initialises_and_trains(tmp_path):
    """A meta-built BertForMaskedLM without weights=: the MLM head's decoder (its weight tied to
    the word embeddings, another unit's) initialises; every parameter and buffer gets values, and
    from those values zoe trains like torch."""
    eng = zoe.initialize(build("bert", meta=True), config=zoe_config(tmp_path))
    ref = build("bert")
    ref.load_state_dict(eng.state_dict(), strict=True)
    for n, p in ref.named_parameters():
        assert bool(torch.isfinite(p).all()), n
    assert_buffers_like(eng, build("bert"))
    assert_trains_like(eng, ref)
    eng.close()


class Buffered(nn.Module):
    """A linear layer with buffers of each dtype, persistent and not."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("steps", torch.arange(8))                      # int64, persistent
        self.register_buffer("mask", torch.arange(8) % 2 == 0)              # bool, persistent
        self.register_buffer("scale", torch.full((8,), 0.5))                # float, persistent
        self.register_buffer("idx", torch.arange(8).flip(0), persistent=False)  # int64
        self.register_buffer("keep", torch.arange(8) < 6, persistent=False)     # bool
        self.register_buffer("bias2", torch.full((8,), 0.25), persistent=False)  # float

    def forward(self, x):
        y = self.lin(x)[:, self.idx] * self.scale + self.bias2
        return (y * self.mask * self.keep).sum() + self.steps.sum() * 0


def set_buffers(module):
    if isinstance(module, Buffered):
        fresh = Buffered()
        for n, b in fresh.named_buffers():
            getattr(module, n).copy_(b)


class _Scale(nn.Module):
    """A module transformers' _init_weights does not know: only its reset_parameters() sets it."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(8))

    def reset_parameters(self):
        nn.init.constant_(self.weight, 3.0)


def test_meta_init_resets_only_what_transformers_init_leaves_unset(tmp_path, monkeypatch):
    """from_config draws every Linear twice (reset_parameters(), then _init_weights over it); zoe
    runs _init_weights first and a module's reset_parameters() only where one of its parameters is
    still unset: a Llama's Linears are never reset, and a module _init_weights does not know gets
    its reset_parameters() values."""
    resets = []
    linear_reset = nn.Linear.reset_parameters
    monkeypatch.setattr(nn.Linear, "reset_parameters", lambda self: (resets.append(self), linear_reset(self))[1])
    model = build("llama", meta=True)
    with torch.device("meta"):
        model.model.scale = _Scale()
    resets.clear()  # the constructor's calls, on meta
    eng = zoe.initialize(model, config=zoe_config(tmp_path))
    assert resets == []
    sd = eng.state_dict()
    assert torch.equal(sd["model.scale.weight"], torch.full((8,), 3.0))
    assert abs(sd["model.layers.0.mlp.up_proj.weight"].std().item() - model.config.initializer_range) < 0.005
    eng.close()


def test_meta_buffers_of_every_dtype_are_set_or_refused_by_name(tmp_path):
    """A meta-built model with int64, bool and float buffers, persistent and not: weights= gives
    the persistent ones (init_fn, run for the others, does not overwrite them), init_fn the others;
    without an init_fn, the first buffer nothing set is refused by name (an integer or bool one
    too, not left at zero)."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = Buffered()
    ref.steps.add_(5)  # the folder's values, not the ones init_fn gives: init_fn sets only what is unset
    ref.scale.mul_(3)
    folder = tmp_path / "w"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, os.fspath(folder / "model.safetensors"))

    def meta():
        with torch.device("meta"):
            return Buffered()

    eng = zoe.initialize(meta(), config=zoe_config(tmp_path / "a"), weights=folder, init_fn=set_buffers)
    got = dict(eng.module.named_buffers())
    for n, b in ref.named_buffers():
        assert got[n].dtype == b.dtype and torch.equal(got[n], b), n
    x = torch.randn(3, 8)
    assert torch.allclose(eng(x), ref(x))
    eng.close()
    with pytest.raises(zoe.ZoeError, match=r"buffer 'idx' \(non-persistent, torch\.int64, shape \[8\]\) was built "
                                           r"on the meta device and nothing gave it values"):
        zoe.initialize(meta(), config=zoe_config(tmp_path / "b"), weights=folder)
    # No folder: the persistent ones are unset too (the Linear's reset_parameters sets no buffer).
    with pytest.raises(zoe.ZoeError, match=r"buffer 'steps' \(persistent, torch\.int64, shape \[8\]\).*"
                                           r"or weights= a folder holding it"):
        zoe.initialize(meta(), config=zoe_config(tmp_path / "c"))
    # A folder without the bool buffer: refused by that name.
    del_mask = tmp_path / "w2"
    del_mask.mkdir()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items() if k != "mask"},
              os.fspath(del_mask / "model.safetensors"))
    with pytest.raises(zoe.ZoeError, match=r"buffer 'mask' \(persistent, torch\.bool"):
        zoe.initialize(meta(), config=zoe_config(tmp_path / "d"), weights=del_mask)


def test_initializer_error_names_the_module(tmp_path):
    """An exception of an initializer on a meta-built model carries a note naming the module it ran
    on and what to do."""

    def bad_init(module):
        if isinstance(module, nn.Linear):
            raise ValueError("no init for this one")

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="no init for this one") as e:
        zoe.initialize(model, config=zoe_config(tmp_path), init_fn=bad_init)
    notes = " ".join(getattr(e.value, "__notes__", []))
    assert "module '0' (Linear)" in notes and "init_fn" in notes, notes


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3_text", "bert", "t5", "gpt2"])
def test_state_dict_loads_strictly(arch, tmp_path):
    """engine.state_dict() and zoe.consolidate(save_checkpoint dir) have exactly the keys of the
    model's own state_dict (no non-persistent inv_freq, embed_scale or position_ids; tied names
    included): load_state_dict(strict=True) takes them, and the loaded model gives the trained
    model's logits."""
    model = build(arch)
    ref = copy.deepcopy(model)
    eng = zoe.initialize(model, config=zoe_config(tmp_path / "nvme"))
    train_zoe(eng, batches(2))
    train_torch(ref, batches(2))
    want = set(ref.state_dict())
    ids = batches(1, seed=9)[0]
    for what, sd in (("engine.state_dict()", eng.state_dict()),
                     ("zoe.consolidate()", zoe.consolidate(eng.save_checkpoint(tmp_path / "ckpt")))):
        assert set(sd) == want, (what, sorted(set(sd) ^ want))
        loaded = build(arch, seed=5)
        loaded.load_state_dict(sd, strict=True)
        with torch.no_grad():
            got, exp = loaded(input_ids=ids, labels=ids).logits, ref(input_ids=ids, labels=ids).logits
        assert torch.allclose(got, exp, rtol=1e-4, atol=2e-5), (what, (got - exp).abs().max())
    eng.close()


@pytest.mark.parametrize("arch", ["t5", "bert", "llama"])
def test_bf16_loss_is_float32_like_autocast(arch, tmp_path):
    """With bf16 compute the loss comes back in float32, computed in float32 from the bf16 logits,
    for a model whose loss is torch.nn.CrossEntropyLoss (T5, BERT) as for one that upcasts its
    logits itself (llama): what torch.autocast gives; within 3e-3 of the fp32 loss over 4 steps."""
    model = build(arch)
    ref = copy.deepcopy(model)
    ids = batches(1)[0]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(input_ids=ids, labels=ids).loss.dtype == torch.float32  # torch's mixed precision
    eng = zoe.initialize(model, config=zoe_config(tmp_path, dtype="bf16"))
    data = batches(4)
    z = []
    for x in data:
        loss = eng(input_ids=x, labels=x).loss
        assert loss.dtype == torch.float32, loss.dtype
        eng.backward(loss)
        eng.step()
        z.append(loss.item())
    t = train_torch(ref, data)
    for i, (a, b) in enumerate(zip(z, t)):
        assert abs(a - b) <= 3e-3 * abs(b), f"step {i + 1}: zoe bf16 loss {a}, torch fp32 {b}"
    eng.close()


@pytest.mark.parametrize("reentrant", [True, False])
def test_bf16_fp32_losses_leave_checkpoint_inputs_to_the_store(reentrant, tmp_path):
    """The float32 losses' torch function mode sits between the model and torch.utils.checkpoint:
    each checkpointed layer's input still goes to zoe's activation store (cpu), and the loss is
    float32."""
    model = build("llama")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    eng = zoe.initialize(model, config=zoe_config(tmp_path, dtype="bf16", activation_offload="cpu",
                                                  activation_min_bytes=1))
    ids = batches(1)[0]
    out = eng(input_ids=ids, labels=ids)
    assert out.loss.dtype == torch.float32
    assert eng.activation_stats()["saved"] == tiny_config("llama").num_hidden_layers
    eng.backward(out.loss)
    assert eng.step().stepped
    eng.close()
