"""Checkpointed activations of torch models through zoe's activation store (issue 31):
torch.utils.checkpoint (reentrant and not) and transformers' gradient_checkpointing_enable() with
zoe.activation_offload none, cpu and nvme against plain torch.optim.AdamW, the same bits with and
without offload, dropout replayed on recompute, parameters never offloaded, an evaluation forward
saving nothing, and an I/O fault raised at its step."""
import functools
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tuc

zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

import zoe.activations as zoe_activations  # noqa: E402
from zoe_torch_models import GPT, clone, config, gpt_batches, train_torch  # noqa: E402

STEPS = 4
# torch before 2.1 keeps a non-reentrant region's inputs in a closure, which no hook reaches.
MODES = ["reentrant", pytest.param("non_reentrant", marks=pytest.mark.skipif(
    not zoe_activations.NON_REENTRANT_COVERED, reason="this torch's non-reentrant checkpoint saves no tensors"))]
# The GPT of these tests: 6 blocks 64 wide over 32 tokens, batch 4. A block's input (a region's)
# is 32 KiB of fp32: three fill the store's smallest NVMe run (64 KiB), so runs are written and
# read back.
WIDE = dict(d=64, layers=6, ctx=32)
T_TOKENS = 32
REGION_BYTES = 4 * T_TOKENS * 64 * 4
HOST_BUDGET_NVME = 256 << 10  # two 64 KiB write buffers and the read-ahead blocks: no host tier


class CkptGPT(GPT):
    """The test GPT with each block (and a dropout after it) under torch.utils.checkpoint, or not
    checkpointed when mode is None."""

    def __init__(self, mode, p=0.0):
        super().__init__(**WIDE)
        self.mode, self.p = mode, p

    def _block(self, b, x):
        return F.dropout(b(x), self.p, self.training)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            fn = functools.partial(self._block, b)
            x = fn(x) if self.mode is None else tuc.checkpoint(fn, x, use_reentrant=self.mode == "reentrant")
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make(mode, p=0.0):
    torch.manual_seed(0)
    return CkptGPT(mode, p)


def batches(n, seed=1):
    return gpt_batches(n, T=T_TOKENS, seed=seed)


def act_config(tmp_path, offload, stage=2, **kw):
    """Offload the region inputs beyond two (the device share holds two, the last one saved among them), a
    minimum size under a region input's, and for nvme a host budget with no room for them."""
    os.makedirs(tmp_path, exist_ok=True)
    acts = dict(activation_offload=offload, activation_min_bytes=1024, activation_device_budget=2 * REGION_BYTES,
                activation_nvme_path=str(tmp_path))
    if offload == "nvme":
        acts["activation_host_budget"] = HOST_BUDGET_NVME
    return config(tmp_path, stage=stage, opt="cpu", param="none" if stage < 3 else "cpu", **{**acts, **kw})


def run_zoe(model, cfg, data, seed=None, loss_of=lambda eng, args: eng(*args)):
    eng = zoe.initialize(model, config=cfg)
    if seed is not None:
        torch.manual_seed(seed)
    losses, stats, acts = [], [], []
    for args in data:
        loss = loss_of(eng, args)
        eng.backward(loss)
        stats.append(eng.step())
        acts.append(eng.activation_stats())
        losses.append(loss.item())
    return eng, losses, stats, acts


def assert_close_to_torch(eng, ref, z, t, what):
    for i, (a, b) in enumerate(zip(z, t)):
        assert abs(a - b) <= 1e-5 * abs(b), f"{what}: step {i + 1}: zoe loss {a}, torch {b}"
    got, want = eng.state_dict(), ref.state_dict()
    for n in want:
        d = (got[n] - want[n]).abs().max().item()
        assert d <= 2e-5, f"{what}: {n}: max |zoe - torch| = {d}"


def assert_same_bits(eng, z, base_eng, base_z, what):
    assert z == base_z, f"{what}: losses differ from activation_offload none"
    got, want = eng.state_dict(), base_eng.state_dict()
    for n in want:
        assert torch.equal(got[n], want[n]), f"{what}: {n} differs from activation_offload none"


def assert_offloaded(acts, offload, regions, what):
    """Every step saved each region's input (at least `regions` tensors; a transformers layer
    may take its attention mask positionally too) and loaded each back once; with offload, those
    beyond the device share left the device (to the host; with nvme also to NVMe); the device kept at most its share (two region inputs)."""
    for i, a in enumerate(acts):
        if offload == "none":
            assert a["last_saved"] == 0 and a["checkpoint_bytes"] == 0, (what, i, a)
            continue
        assert a["last_saved"] >= regions and a["last_loaded"] == a["last_saved"], (what, i, a)
        assert a["saved"] == 0 and a["loaded"] == 0, (what, i, a)
        assert a["checkpoint_bytes"] == a["last_bytes_saved"] > 0, (what, i, a)
        tiers = a["tier_bytes"]
        assert sum(tiers.values()) == a["checkpoint_bytes"], (what, i, a)
        assert tiers["device"] <= 2 * REGION_BYTES and tiers["host"] + tiers["nvme"] > 0, (what, i, a)
        if offload == "nvme":
            assert tiers["nvme"] > 0, (what, i, a)


@pytest.mark.parametrize("mode", MODES)
def test_torch_checkpoint_offload_matches_torch(mode, tmp_path):
    """Blocks under torch.utils.checkpoint: for activation_offload none, cpu and nvme, losses and
    weights as torch.optim.AdamW's (1e-5 relative, 2e-5 absolute), and cpu and nvme give the
    bits of none."""
    data = batches(STEPS)
    ref = make(mode)
    t = train_torch(ref, data)
    base = None
    for offload in ("none", "cpu", "nvme"):
        what = f"{mode}, activation_offload {offload}"
        eng, z, stats, acts = run_zoe(make(mode), act_config(tmp_path / offload, offload), data)
        assert_close_to_torch(eng, ref, z, t, what)
        assert_offloaded(acts, offload, len(ref.h), what)
        if offload != "none":  # the StepStats fields (include/zoe/step_stats.h) say the same
            assert stats[-1].activation_checkpoint_bytes == acts[-1]["checkpoint_bytes"], what
            assert stats[-1].activation_tier_bytes == acts[-1]["tier_bytes"], what
        if base is None:
            base = (eng, z)
        else:
            assert_same_bits(eng, z, *base, what)


# ---------------------------------------------------------------------------------------------
# transformers' gradient_checkpointing_enable()


def hf_model(arch):
    transformers = pytest.importorskip("transformers")
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=4, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    else:
        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       tie_word_embeddings=False)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def hf_batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 128, (4, T_TOKENS), generator=g),) for _ in range(n)]


def hf_loss(model, args):
    return model(input_ids=args[0], labels=args[0]).loss


@pytest.mark.parametrize("arch,reentrant", [("gpt2", True), ("gpt2", False), ("llama", True)])
def test_hf_gradient_checkpointing_offload(arch, reentrant, tmp_path):
    """model.gradient_checkpointing_enable() (use_reentrant through gradient_checkpointing_kwargs):
    each decoder layer's hidden states go through the store; losses and weights as plain torch's
    without checkpointing, and cpu and nvme give the bits of none."""
    if not reentrant and not zoe_activations.NON_REENTRANT_COVERED:
        pytest.skip("this torch's non-reentrant checkpoint saves no tensors")
    data = hf_batches(4)
    ref = hf_model(arch)
    opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    t = []
    for args in data:
        opt.zero_grad(set_to_none=True)
        loss = hf_loss(ref, args)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step()
        t.append(loss.item())
    base = None
    for offload in ("none", "cpu", "nvme"):
        what = f"{arch}, use_reentrant={reentrant}, activation_offload {offload}"
        model = hf_model(arch)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model.train()
        cfg = act_config(tmp_path / offload, offload, stage=3)
        eng, z, _, acts = run_zoe(model, cfg, data, loss_of=hf_loss)
        assert_close_to_torch(eng, ref, z, t, what)
        assert_offloaded(acts, offload, 4, what)
        if base is None:
            base = (eng, z)
        else:
            assert_same_bits(eng, z, *base, what)


# ---------------------------------------------------------------------------------------------
# Dropout, parameters, evaluation


@pytest.mark.parametrize("mode", MODES)
def test_dropout_replayed_on_recompute(mode, tmp_path):
    """Dropout (p 0.2) inside the checkpointed regions, region inputs on NVMe: the bits of zoe
    without checkpointing (the recompute draws the forward's masks again)."""
    data = batches(4)
    plain_eng, plain, _, _ = run_zoe(make(None, p=0.2), act_config(tmp_path / "plain", "none"), data, seed=7)
    eng, z, _, acts = run_zoe(make(mode, p=0.2), act_config(tmp_path / "nvme", "nvme"), data, seed=7)
    assert_offloaded(acts, "nvme", WIDE["layers"], mode)
    assert_same_bits(eng, z, plain_eng, plain, f"{mode} with dropout against no checkpointing")
    torch.manual_seed(8)  # the masks matter: another draw gives another loss
    assert make(None, p=0.2)(*data[0]).item() != plain[0]


class ParamBlock(nn.Module):
    """A block whose checkpointed region takes, besides its input x, a parameter, a view of a
    parameter and a tensor under the store's minimum size as positional inputs."""

    def __init__(self, d, mode):
        super().__init__()
        self.mode = mode
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.proj = nn.Linear(4 * d, d, bias=False)

    def _region(self, x, w_fc, w_proj_t, gain):
        return x + (F.gelu(F.linear(self.ln(x), w_fc)) @ w_proj_t) * gain

    def forward(self, x):
        gain = torch.full((x.shape[-1],), 0.5)  # 256 bytes
        return tuc.checkpoint(self._region, x, self.fc.weight, self.proj.weight.t(), gain,
                              use_reentrant=self.mode == "reentrant")


class ParamNet(nn.Module):
    def __init__(self, mode, d=64, layers=3):
        super().__init__()
        self.emb = nn.Embedding(64, d)
        self.blocks = nn.ModuleList([ParamBlock(d, mode) for _ in range(layers)])
        self.head = nn.Linear(d, 64)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return F.cross_entropy(self.head(x).reshape(-1, 64), targets.reshape(-1))


@pytest.mark.parametrize("mode", MODES)
def test_parameters_never_offloaded(mode, tmp_path):
    """A parameter (64 KiB) and a transposed view of one passed into a region stay where zoe
    holds them, and so does a tensor under activation_min_bytes: the store gets exactly the
    blocks' inputs; training matches torch."""
    torch.manual_seed(0)
    model = ParamNet(mode)
    ref = clone(model)
    data = batches(3)
    eng, z, _, acts = run_zoe(model, act_config(tmp_path, "cpu"), data)
    t = train_torch(ref, data)
    assert_close_to_torch(eng, ref, z, t, mode)
    for a in acts:
        assert a["last_saved"] == 3 and a["checkpoint_bytes"] == 3 * REGION_BYTES, a


def test_evaluation_forward_saves_nothing(tmp_path):
    """A forward under torch.no_grad() saves nothing; a forward with gradients and no backward
    saves, and the next forward drops it: the step after both has the bits of a fresh engine's."""
    data = batches(2)
    fresh_eng, fresh, _, _ = run_zoe(make("reentrant"), act_config(tmp_path / "a", "cpu"), data[:1])
    eng = zoe.initialize(make("reentrant"), config=act_config(tmp_path / "b", "cpu"))
    for mode in ("non_reentrant", "reentrant"):
        eng.module.mode = mode
        with torch.no_grad():
            eng(*data[1])
        assert eng.activation_stats()["saved"] == 0, mode
    eng(*data[1])
    assert eng.activation_stats()["saved"] == WIDE["layers"]
    loss = eng(*data[0])
    a = eng.activation_stats()
    assert a["saved"] == a["last_saved"] == WIDE["layers"] and a["last_loaded"] == 0, a
    eng.backward(loss)
    eng.step()
    assert [loss.item()] == fresh
    got, want = eng.state_dict(), fresh_eng.state_dict()
    assert all(torch.equal(got[n], want[n]) for n in want)


# ---------------------------------------------------------------------------------------------
# A fault: NVMe writes refused (RLIMIT_FSIZE), in a child process so that no hang goes unseen

_FAULT_CHILD = r"""
import json, resource, signal, sys
import torch
import zoe
import test_torch_activations as T

work = sys.argv[1]
data = T.batches(3)
eng = zoe.initialize(T.make("reentrant"), config=T.act_config(work + "/nvme", "nvme"))
eng.backward(eng(*data[0]))
eng.step()
eng.save_checkpoint(work + "/ckpt", tag="one")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
out = {"where": "forward"}
try:
    loss = eng(*data[1])
    out["where"] = "backward"
    eng.backward(loss)
    out["where"] = None
except RuntimeError as e:  # ZoeError; torch 1.13 wraps one raised in a pack hook in a RuntimeError
    out["error"] = str(e)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
try:
    eng.step()
    out["step"] = "taken"
except zoe.ZoeError as e:
    out["step"] = str(e)
eng.load_checkpoint(work + "/ckpt", tag="one")
loss = eng(*data[2])
eng.backward(loss)
eng.step()
out["after"] = [loss.item(), {n: t.tolist() for n, t in eng.state_dict().items()}]
print(json.dumps(out))
"""


def test_nvme_write_fault_raises_at_its_step(tmp_path):
    """NVMe writes refused from the second step on (RLIMIT_FSIZE 0, EFBIG): that step raises a
    ZoeError (a RuntimeError) naming the activation store and its file, in the forward (the save that finds the
    failed write) or the backward (the load); after a failed backward engine.step() refuses the
    incomplete gradients. Resumed from the checkpoint of step one, the next step has the bits of
    a run that never met the fault."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-c", _FAULT_CHILD, str(tmp_path)], capture_output=True, text=True,
                       timeout=150, env=env, cwd=os.path.dirname(__file__))
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert "error" in out and out["where"] in ("forward", "backward"), f"no error with NVMe writes refused: {out}"
    assert "activation store" in out["error"] and "zoe-activations" in out["error"], out["error"]
    if out["where"] == "backward":
        assert "incomplete" in out["step"], out["step"]
    data = batches(3)
    ref = zoe.initialize(make("reentrant"), config=act_config(tmp_path / "ref", "nvme"))
    for args in (data[0], data[2]):
        loss = ref(*args)
        ref.backward(loss)
        ref.step()
    assert out["after"][0] == loss.item()
    for n, t in ref.state_dict().items():
        assert torch.equal(torch.tensor(out["after"][1][n]), t), n
