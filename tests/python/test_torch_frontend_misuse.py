"""zoe's PyTorch front-end where a PyTorch user's own habits used to give silently wrong results:
activation checkpointing inside the model (reentrant and not), calling the original model after
initialize, the model's own state_dict, a dtype change after initialize, and errors raised in a
forward. Each is checked against plain PyTorch or for a clear error."""
import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc

zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

from zoe_torch_models import GPT, clone, config, gpt_batches, train_torch, train_zoe  # noqa: E402

STEPS = 4


class CheckpointedGPT(GPT):
    """GPT whose blocks run through torch.utils.checkpoint (recomputed in the backward)."""

    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = tuc.checkpoint(b, x, use_reentrant=self.reentrant)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
@pytest.mark.parametrize("stage,where", [(3, "nvme"), (2, "cpu"), (0, "none")])
def test_activation_checkpointing_matches_torch(reentrant, stage, where, tmp_path):
    """Blocks under torch.utils.checkpoint: losses and gradient norms within 1e-5 of plain torch
    (which checkpoints the same way: recompute gives the same numbers) over a few steps."""
    torch.manual_seed(0)
    model = CheckpointedGPT(reentrant)
    ref = clone(model)
    data = gpt_batches(STEPS)
    extra = {}
    if stage == 3:  # a budget that makes the engine reuse a released unit's device memory
        extra = dict(device_budget=384 << 10,
                     zero={"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0})
    eng = zoe.initialize(model, config=config(tmp_path, stage=stage, opt=where, param=where if stage == 3 else "none",
                                              clip=0, **extra))
    z, stats = train_zoe(eng, data)
    t, norms = [], []
    opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    for args in data:
        opt.zero_grad(set_to_none=True)
        loss = ref(*args)
        loss.backward()
        norms.append(torch.norm(torch.stack([p.grad.norm() for p in ref.parameters()])).item())
        opt.step()
        t.append(loss.item())
    for i in range(STEPS):
        assert abs(z[i] - t[i]) <= 1e-5 * abs(t[i]), f"step {i + 1}: zoe loss {z[i]}, torch {t[i]}"
        assert abs(stats[i].grad_norm - norms[i]) <= 1e-4 * norms[i], \
            f"step {i + 1}: zoe grad norm {stats[i].grad_norm}, torch {norms[i]}"
    eng.close()


def test_original_model_after_initialize_is_refused(tmp_path):
    """The model handed to initialize is driven by the engine: calling it directly raises a
    ZoeError that says to call the engine, and the engine still trains like torch afterwards."""
    torch.manual_seed(0)
    model = GPT()
    ref = clone(model)
    data = gpt_batches(3)
    eng = zoe.initialize(model, config=config(tmp_path))
    with pytest.raises(zoe.ZoeError, match=r"engine\(\.\.\.\)"):
        model(*data[0])
    z, _ = train_zoe(eng, data)
    t = train_torch(ref, data)
    for a, b in zip(z, t):
        assert abs(a - b) <= 1e-5 * abs(b)
    # Also a submodule of it.
    with pytest.raises(zoe.ZoeError, match="engine"):
        model.h[0](torch.zeros(1, 4, 32))
    eng.close()


def test_model_state_dict_points_to_the_engine(tmp_path):
    """model.state_dict() after initialize would hold 0-element placeholders: it raises, naming
    engine.state_dict() and zoe.consolidate; engine.state_dict() holds the real tensors."""
    torch.manual_seed(0)
    model = GPT()
    want = clone(model).state_dict()
    eng = zoe.initialize(model, config=config(tmp_path))
    with pytest.raises(zoe.ZoeError, match=r"engine\.state_dict\(\)"):
        model.state_dict()
    got = eng.state_dict()
    assert set(got) == set(want)
    for n in want:
        assert torch.equal(got[n], want[n]), n
    eng.close()


def test_dtype_change_after_initialize_is_refused(tmp_path):
    """model.to(torch.float16) after initialize would train on in fp32 without a word: refused,
    naming the config keys that choose the compute dtype."""
    torch.manual_seed(0)
    model = GPT()
    data = gpt_batches(1)
    eng = zoe.initialize(model, config=config(tmp_path))
    model.to(torch.float16)
    with pytest.raises(zoe.ZoeError, match=r"float16.*(fp16|bf16)\.enabled"):
        eng(*data[0])
    eng.close()


def test_model_in_half_precision_is_refused_at_initialize(tmp_path):
    torch.manual_seed(0)
    model = GPT().to(torch.float16)
    with pytest.raises(zoe.ZoeError, match=r"float16.*fp16\.enabled"):
        zoe.initialize(model, config=config(tmp_path))


def test_forward_error_keeps_its_type_and_traceback(tmp_path):
    """An error raised by the user's forward (here a dtype mismatch) reaches the caller as itself,
    with its traceback, not re-wrapped; the engine still works afterwards."""
    torch.manual_seed(0)
    model = GPT()
    data = gpt_batches(2)
    eng = zoe.initialize(model, config=config(tmp_path))
    bad = (data[0][0].to(torch.float32), data[0][1])  # nn.Embedding wants integer indices
    with pytest.raises(RuntimeError) as info:
        eng(*bad)
    assert not isinstance(info.value, zoe.ZoeError)
    frames = [f.name for f in info.traceback]
    assert "forward" in frames, frames
    loss = eng(*data[1])
    eng.backward(loss)
    assert eng.step().stepped
    eng.close()


def test_default_persistence_threshold_fits_a_small_budget(tmp_path):
    """DeepSpeed's default stage3_param_persistence_threshold (1e5 elements) would keep every
    module of this model whole on the device, which a 384 KiB budget cannot hold: the planner
    partitions them instead (one warning naming the key) and the run matches plain torch."""
    torch.manual_seed(0)
    model = GPT()
    ref = clone(model)
    data = gpt_batches(3)
    eng = zoe.initialize(model, config=config(tmp_path, device_budget=384 << 10))
    assert eng.config_value("zero_optimization.stage3_param_persistence_threshold") == 100000
    z, stats = train_zoe(eng, data)
    t = train_torch(ref, data)
    for a, b in zip(z, t):
        assert abs(a - b) <= 1e-5 * abs(b)
    assert max(s.high_water["device"] for s in stats) <= 384 << 10
    eng.close()
