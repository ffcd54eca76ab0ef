"""zoe's PyTorch front-end against plain PyTorch, every placement, a model larger than the device
budget, gradient accumulation and the meta device (tests 1-3 of issue 13)."""
import pytest
import torch

zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

from zoe_torch_models import (GPT, clone, config, conv_batches, gpt_batches, make_model, train_torch,  # noqa: E402
                              train_zoe)

STEPS = 20
LR = 3e-3


def batches(kind, n):
    return gpt_batches(n) if kind == "gpt" else conv_batches(n)


@pytest.mark.parametrize("kind", ["gpt", "conv"])
def test_fp32_matches_torch_adamw(kind, tmp_path):
    """Stage 3, parameters and optimizer states on NVMe, clipping (0.5) and weight decay (0.1) on:
    losses within 1e-5 relative per step of torch.optim.AdamW's; final weights within 2e-5 (the
    two AdamW implementations round differently: ~1 ulp per step, 20 steps, |w| < 1)."""
    model = make_model(kind)
    ref = clone(model)
    data = batches(kind, STEPS)
    eng = zoe.initialize(model, config=config(tmp_path))
    z, stats = train_zoe(eng, data)
    t = train_torch(ref, data, lr=LR)
    for i, (a, b) in enumerate(zip(z, t)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {i + 1}: zoe loss {a}, torch {b}"
    assert all(s.stepped and not s.skipped for s in stats)
    assert max(s.grad_norm for s in stats) > 0.5, "clipping never engaged: raise the lr or lower the clip"
    assert stats[-1].high_water["nvme"] > 0 and set(stats[-1].high_water) == {"device", "host", "nvme"}
    got, want = eng.state_dict(), ref.state_dict()
    assert set(got) == set(want)
    for n in want:
        d = (got[n] - want[n]).abs().max().item()
        assert d <= 2e-5, f"{n}: max |zoe - torch| = {d}"
    # Weight decay matters at this tolerance: torch without it ends farther away than 10x the bound.
    no_wd = make_model(kind)
    train_torch(no_wd, data, lr=LR, wd=0.0)
    assert max((w - want[n]).abs().max().item() for n, w in no_wd.state_dict().items()) > 2e-4


def test_bf16_tracks_torch_fp32(tmp_path):
    """bf16 compute (parameters rounded to 8 mantissa bits, 2^-9 relative, and every activation of
    4 layers rounded the same way) against fp32 torch: losses within 2e-2 relative per step (0.7%
    seen); fp32 masters within lr x steps (each run moves a weight at most about that far, so the
    two runs disagree by at most half their possible spread; 0.034 seen)."""
    model = make_model("gpt")
    ref = clone(model)
    data = gpt_batches(STEPS)
    eng = zoe.initialize(model, config=config(tmp_path, dtype="bf16"))
    assert eng.compute_dtype() is torch.bfloat16
    z, _ = train_zoe(eng, data)
    t = train_torch(ref, data, lr=LR)
    for i, (a, b) in enumerate(zip(z, t)):
        assert abs(a - b) <= 2e-2 * abs(b), f"step {i + 1}: zoe bf16 loss {a}, torch fp32 {b}"
    got, want = eng.state_dict(), ref.state_dict()
    for n in want:
        assert (got[n] - want[n]).abs().max().item() <= LR * STEPS, n


def placements():
    out = [(s, o, "none") for s in (1, 2) for o in ("none", "cpu", "nvme")]
    return out + [(3, o, p) for o in ("none", "cpu", "nvme") for p in ("none", "cpu", "nvme")]


@pytest.fixture(scope="module")
def no_offload_losses(tmp_path_factory):
    eng = zoe.initialize(make_model("gpt"), config=config(tmp_path_factory.mktemp("base"), stage=0, opt="none",
                                                          param="none"))
    return train_zoe(eng, gpt_batches(8))[0]


@pytest.mark.parametrize("stage,opt,param", placements())
def test_placement_bit_identical(stage, opt, param, tmp_path, no_offload_losses):
    eng = zoe.initialize(make_model("gpt"), config=config(tmp_path, stage=stage, opt=opt, param=param))
    z, _ = train_zoe(eng, gpt_batches(8))
    assert z == no_offload_losses, f"stage {stage} optimizer {opt} params {param}"


def test_larger_than_device(tmp_path):
    """Model states >= 4x the device budget; the device high-water mark stays under the budget."""
    budget = 512 << 10
    torch.manual_seed(0)
    model = GPT(d=64, vocab=256)
    cfg = config(tmp_path, device_budget=budget,
                 zero={"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0})
    eng = zoe.initialize(model, config=cfg, unit_params=20000)
    assert eng.model_state_bytes() >= 4 * budget, eng.model_state_bytes()
    z, stats = train_zoe(eng, gpt_batches(3, vocab=256))
    hw = max(s.high_water["device"] for s in stats)
    assert 0 < hw <= budget, f"device high water {hw} bytes, budget {budget}"
    assert all(torch.isfinite(torch.tensor(z)))


def test_gradient_accumulation_matches_torch(tmp_path):
    """gradient_accumulation_steps 2: step() updates only at the boundary (stats.stepped), as one
    torch step over the mean of the two micro-batches' gradients."""
    model = make_model("gpt")
    ref = clone(model)
    data = gpt_batches(8)
    eng = zoe.initialize(model, config=config(tmp_path, gas=2))
    stepped = []
    for x, y in data:
        eng.backward(eng(x, y))
        stepped.append(eng.step().stepped)
    assert stepped == [False, True] * 4
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=0.1)
    for i in range(0, 8, 2):
        opt.zero_grad()
        for x, y in data[i:i + 2]:
            (ref(x, y) / 2).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step()
    got, want = eng.state_dict(), ref.state_dict()
    for n in want:
        assert (got[n] - want[n]).abs().max().item() <= 2e-5, n


def test_unit_used_twice_and_tied_weights(tmp_path):
    """A block applied twice per forward (and the tied head) trains exactly like torch."""

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = GPT(layers=2)

        def forward(self, idx, targets):
            g = self.inner
            x = g.wte(idx) + g.wpe(torch.arange(idx.shape[1]))
            for b in list(g.h) + [g.h[0]]:
                x = b(x)
            logits = g.lm_head(g.ln_f(x))
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    torch.manual_seed(0)
    model = Twice()
    ref = clone(model)
    data = gpt_batches(5)
    eng = zoe.initialize(model, config=config(tmp_path))
    assert ("inner.lm_head", ["inner.wte"]) in eng.units()
    z, _ = train_zoe(eng, data)
    t = train_torch(ref, data, lr=LR)
    for a, b in zip(z, t):
        assert abs(a - b) <= 1e-5 * abs(b)


def test_meta_device_model(tmp_path):
    """A model built on the meta device is materialised unit by unit by zoe (reset_parameters) and
    trains; the Python process never holds it whole."""
    with torch.device("meta") if hasattr(torch, "device") and hasattr(torch.device, "__enter__") else _meta():
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    assert all(p.device.type == "meta" for p in model.parameters())
    eng = zoe.initialize(model, config=config(tmp_path))
    w = eng.state_dict()["0.weight"]
    assert w.abs().max().item() > 0 and w.abs().max().item() <= 1 / 8 ** 0.5 + 1e-6  # kaiming-uniform bound
    x = torch.randn(16, 8)
    y = torch.randn(16, 1)
    losses = []
    for _ in range(10):
        loss = torch.nn.functional.mse_loss(eng(x), y)
        eng.backward(loss)
        eng.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def _meta_mlp():
    with torch.device("meta") if hasattr(torch, "device") and hasattr(torch.device, "__enter__") else _meta():
        return torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.GELU(), torch.nn.Linear(256, 256))


def test_meta_init_draws_with_zoes_generator_seeded_by_torch(tmp_path):
    """A meta-built model's default initialisation draws its large uniform and normal fills with
    zoe's parallel generator, seeded from torch's: torch.manual_seed fixes every value (the same
    seed, the same weights; another seed, others), within torch's own bounds (kaiming-uniform), and
    not torch's serial stream (which a CPU-built model of the same seed holds)."""
    def weights(seed, sub):
        (tmp_path / sub).mkdir()
        torch.manual_seed(seed)
        eng = zoe.initialize(_meta_mlp(), config=config(tmp_path / sub))
        sd = {k: v.clone() for k, v in eng.state_dict().items()}
        eng.close()
        return sd

    a, b, c = weights(0, "a"), weights(0, "b"), weights(1, "c")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["0.weight"], c["0.weight"])
    assert a["0.weight"].abs().max().item() <= 1 / 512 ** 0.5 + 1e-6
    assert a["0.weight"].std().item() == pytest.approx(1 / (3 * 512) ** 0.5, rel=0.02)  # uniform's std
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.GELU(), torch.nn.Linear(256, 256))
    assert not torch.equal(a["0.weight"], cpu[0].weight.detach().to(a["0.weight"].dtype))


def test_parallel_fills_leave_to_torch_what_they_do_not_take():
    """zoe's fills take contiguous float32 CPU tensors of 64 Ki elements or more with no generator
    of the caller's; a caller's generator, a small, strided or bf16 tensor get torch's own draw
    (the same values as without zoe), and torch's methods are back after the block; taken draws have the asked-for range and moments, and
    Tensor.uniform_ and torch.nn.init.uniform_ of one seed give one stream."""
    from zoe.values import _parallel_random_fills

    def drawn(fn, seed=3):
        torch.manual_seed(seed)
        with _parallel_random_fills():
            return fn()

    def plain(fn, seed=3):
        torch.manual_seed(seed)
        return fn()

    cases = [lambda: torch.empty(1 << 17).normal_(0, 1, generator=torch.Generator().manual_seed(9)),
             lambda: torch.empty(1000).normal_(0, 1),
             lambda: torch.empty(512, 512).t().normal_(0, 1),
             lambda: torch.empty(1 << 17, dtype=torch.bfloat16).uniform_(-1, 1)]
    for fn in cases:
        assert torch.equal(drawn(fn), plain(fn))
    assert "normal_" not in torch.Tensor.__dict__ and "uniform_" not in torch.Tensor.__dict__
    u = drawn(lambda: torch.empty(1 << 18).uniform_(-0.5, 0.25))
    assert u.min().item() >= -0.5 and u.max().item() < 0.25
    assert u.mean().item() == pytest.approx(-0.125, abs=2e-3)
    assert not torch.equal(u, plain(lambda: torch.empty(1 << 18).uniform_(-0.5, 0.25)))
    assert torch.equal(u, drawn(lambda: torch.nn.init.uniform_(torch.empty(1 << 18), -0.5, 0.25)))
    n = drawn(lambda: torch.nn.init.normal_(torch.empty(1 << 18), mean=1.0, std=0.5))
    assert n.mean().item() == pytest.approx(1.0, abs=5e-3) and n.std().item() == pytest.approx(0.5, rel=1e-2)


class _meta:
    """torch 1.13 has no `with torch.device(...)`: build on meta through the device= argument."""

    def __enter__(self):
        self.saved = torch.nn.Linear.__init__
        orig = self.saved

        def init(mod, *a, **k):
            k.setdefault("device", "meta")
            orig(mod, *a, **k)

        torch.nn.Linear.__init__ = init

    def __exit__(self, *exc):
        torch.nn.Linear.__init__ = self.saved


def test_every_step_stat_and_config_key_reach_python(tmp_path):
    """StepStats fields come from their one declaration (include/zoe/step_stats.h) and config keys
    through Config::get: the link fields and the speculative counts, and any key by its path."""
    model = make_model("gpt")
    eng = zoe.initialize(model, config=config(tmp_path, lr=2e-3, wd=0.05))
    _, stats = train_zoe(eng, batches("gpt", 2))
    s = stats[-1]
    for name in ("step", "grad_norm", "t_optimizer", "step_bytes_nvme_read", "per_param_nvme_write",
                 "gathers_prefetched", "speculative_kept", "speculative_undone"):
        assert name in s.fields, f"{name} missing from {sorted(s.fields)}"
    # An overlapped update's bytes count at whichever step() collects after they moved, so one step's part
    # depends on timing; the parts always add up to the totals, and the totals are not zero.
    assert s.bytes_nvme_read > 0 and s.bytes_nvme_write > 0, "NVMe states were read and written"
    for link in ("nvme_read", "nvme_write", "host_to_device", "device_to_host"):
        parts = sum(getattr(x, "step_bytes_" + link) for x in stats)
        assert parts == getattr(s, "bytes_" + link), f"{link}: the steps' parts {parts} != the total"
        for x in stats:
            assert getattr(x, "per_param_" + link) == pytest.approx(getattr(x, "step_bytes_" + link) / eng.num_params())
    assert s.fields["high_water"] == s.high_water
    assert eng.config_value("zero_optimization.stage") == 3
    assert eng.config_value("optimizer.params.lr") == pytest.approx(2e-3)
    assert eng.config_value("optimizer.params.weight_decay") == pytest.approx(0.05)
    with pytest.raises(zoe.ZoeError, match="no_such_key"):
        eng.config_value("zero_optimization.no_such_key")
