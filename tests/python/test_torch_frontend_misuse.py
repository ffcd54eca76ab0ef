"""zoe's PyTorch front-end where a PyTorch user's own habits used to give silently wrong results:
activation checkpointing inside the model (reentrant and not), calling the original model after
initialize, the model's own state_dict, a dtype change after initialize, and errors raised in a
forward. Each is checked against plain PyTorch or for a clear error."""
import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc

zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

from zoe_torch_models import GPT, Experts, clone, config, gpt_batches, train_torch, train_zoe  # noqa: E402

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


@pytest.mark.parametrize("key,value", [("stage3_max_live_parameters", 1001),
                                       ("stage3_prefetch_bucket_size", 40000001)],
                         ids=["max_live_below_a_module", "prefetch_bucket_beyond_the_budget"])
def test_hints_that_do_not_fit_are_lowered_not_refused(key, value, tmp_path, capfd):
    """A performance hint that cannot be honoured within the device budget (max_live_parameters
    below one module, a prefetch bucket far beyond 384 KiB) does not fail the run: the planner uses
    what fits and says once what it used, naming the key, and the run matches plain torch."""
    torch.manual_seed(0)
    model = GPT()
    ref = clone(model)
    data = gpt_batches(3)
    eng = zoe.initialize(model, config=config(tmp_path, device_budget=384 << 10,
                                              zero={"stage3_param_persistence_threshold": 0, key: value}))
    z, _ = train_zoe(eng, data)
    eng.close()
    err = capfd.readouterr().err
    assert err.count(f"zero_optimization.{key} is {value}; zoe uses ") == 1, err
    t = train_torch(ref, data)
    for a, b in zip(z, t):
        assert abs(a - b) <= 1e-5 * abs(b)


def _torch_steps(model, data, lr=3e-3, wd=0.1):
    """torch.optim.AdamW over the parameters that require grad."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.999),
                            eps=1e-8, weight_decay=wd)
    losses = []
    for args in data:
        opt.zero_grad(set_to_none=True)
        loss = model(*args)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


PLACEMENTS = [dict(stage=3, opt="nvme", param="nvme"), dict(stage=2, opt="cpu", param="none"),
              dict(stage=2, opt="cpu", param="none", speculative_step=True), dict(stage=1, opt="none", param="none")]


@pytest.mark.parametrize("where", PLACEMENTS + [dict(stage=3, opt="nvme", param="nvme", dtype="bf16"),
                                   dict(stage=2, opt="cpu", param="none", dtype="bf16"),
                                   dict(stage=1, opt="none", param="none", dtype="bf16")],
                         ids=["s3-nvme", "s2-cpu", "s2-cpu-speculative", "s1-device", "s3-nvme-bf16", "s2-cpu-bf16",
                              "s1-device-bf16"])
def test_frozen_parameters_are_not_touched(where, tmp_path):
    """requires_grad=False parameters (a frozen base, as with LoRA) keep their exact values with
    weight decay on (with bf16 compute: their initial values rounded once to bf16, the only copy a
    frozen parameter has); the others match torch.optim.AdamW over the trainable ones."""
    torch.manual_seed(0)
    model = GPT()
    for n, p in model.named_parameters():
        if n.startswith(("wte", "h.0.", "h.2.attn")):
            p.requires_grad_(False)
    ref = clone(model)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    data = gpt_batches(4)
    eng = zoe.initialize(model, config=config(tmp_path, clip=0, **where))
    z, _ = train_zoe(eng, data)
    t = _torch_steps(ref, data)
    bf16 = where.get("dtype") == "bf16"
    # bf16 against fp32 torch: losses as test_bf16_tracks_torch_fp32; each run moves a weight at most
    # about lr per step, so the two differ by at most 2 x lr x steps.
    tol, wtol = (2e-2, 2 * 3e-3 * len(data)) if bf16 else (1e-5, 2e-5)
    for i, (a, b) in enumerate(zip(z, t)):
        assert abs(a - b) <= tol * abs(b), f"step {i + 1}: zoe loss {a}, torch {b}"
    got = eng.state_dict()
    for n, v in frozen.items():
        want_frozen = v.to(torch.bfloat16).to(torch.float32) if bf16 else v
        assert torch.equal(got[n], want_frozen), f"frozen parameter {n} changed"
    want = ref.state_dict()
    for n in want:
        assert (got[n] - want[n]).abs().max().item() <= wtol, n
    eng.close()


def _torch_adamw_steps(model, data, lr=3e-3, wd=0.1):
    """Plain torch.optim.AdamW: a parameter whose .grad is None is skipped, its moments kept, and
    its step not counted (its bias correction afterwards uses its own number of updates; zoe's
    does the same, Updater::skipped_steps)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    losses, snapshots = [], []
    for args in data:
        opt.zero_grad(set_to_none=True)
        loss = model(*args)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        snapshots.append({n: v.detach().clone() for n, v in model.state_dict().items()})
    return losses, snapshots


@pytest.mark.parametrize("where", PLACEMENTS, ids=["s3-nvme", "s2-cpu", "s2-cpu-speculative", "s1-device"])
def test_parameter_without_gradient_is_left_as_it_is(where, tmp_path):
    """An expert that got no gradient in a step keeps its weights and moments, bit for bit (torch's
    AdamW skips a parameter whose .grad is None; DeepSpeed zero-fills its gradient, which decays
    it and moves it by its momentum): weights match plain torch.optim.AdamW, which counts each
    parameter's own steps, after steps that alternate experts."""
    torch.manual_seed(0)
    model = Experts()
    ref = clone(model)
    base = gpt_batches(6)
    which = [0, 0, 1, 0, 1, 1]
    data = [(x, y, w) for (x, y), w in zip(base, which)]
    eng = zoe.initialize(model, config=config(tmp_path, clip=0, **where), unit_params=2000)
    t, snaps = _torch_adamw_steps(ref, data)
    before = eng.state_dict()
    for k, args in enumerate(data):
        loss = eng(*args)
        eng.backward(loss)
        eng.step()
        assert abs(loss.item() - t[k]) <= 1e-5 * abs(t[k]), f"step {k + 1}: zoe loss {loss.item()}, torch {t[k]}"
        got = eng.state_dict()
        idle = f"moe.experts.{1 - which[k]}."
        for n in got:
            if n.startswith(idle):
                assert torch.equal(got[n], before[n]), f"step {k + 1}: {n} moved without a gradient"
            assert (got[n] - snaps[k][n]).abs().max().item() <= 2e-5, f"step {k + 1}: {n}"
        before = got
    eng.close()


def test_frozen_units_are_released_after_their_backward(tmp_path):
    """Units whose parameters are all frozen are fetched for their backward (the input gradient
    needs them) and released once it has run, not held to the end of the backward: a budget that
    holds a few units, not the model, trains a model whose blocks are mostly frozen."""
    budget = 512 << 10
    torch.manual_seed(0)
    model = GPT(d=64, vocab=256, layers=6)
    for n, p in model.named_parameters():
        if n.startswith(("h.0.", "h.1.", "h.2.", "h.3.", "h.4.")):
            p.requires_grad_(False)
    ref = clone(model)
    data = gpt_batches(3, vocab=256)
    cfg = config(tmp_path, clip=0, device_budget=budget,
                 zero={"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0})
    eng = zoe.initialize(model, config=cfg, unit_params=20000)
    assert eng.model_state_bytes() >= 4 * budget, eng.model_state_bytes()
    z, stats = train_zoe(eng, data)
    t = _torch_steps(ref, data)
    for i, (a, b) in enumerate(zip(z, t)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {i + 1}: zoe loss {a}, torch {b}"
    assert max(s.high_water["device"] for s in stats) <= budget
    eng.close()


class _NoInit(torch.nn.Module):
    """A module with a parameter of its own and no reset_parameters(), built on the meta device."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.empty(32, device="meta"))
        self.lin = torch.nn.Linear(32, 32, device="meta")

    def forward(self, x):
        return (self.lin(x) * self.scale).sum()


def test_meta_parameter_nothing_initialises_is_refused(tmp_path):
    """A meta-device parameter that no reset_parameters() and no init_fn gives values would train
    from uninitialised memory: refused, naming it; with an init_fn that covers it, it trains."""
    with pytest.raises(zoe.ZoeError, match=r"parameter 'scale' was built on the meta device"):
        zoe.initialize(_NoInit(), config=config(tmp_path, stage=3, opt="none", param="none"))

    def init_fn(m):
        if isinstance(m, _NoInit):
            torch.nn.init.ones_(m.scale)
        if isinstance(m, torch.nn.Linear):
            m.reset_parameters()

    eng = zoe.initialize(_NoInit(), config=config(tmp_path, stage=3, opt="none", param="none"), init_fn=init_fn)
    assert torch.equal(eng.state_dict()["scale"], torch.ones(32))
    loss = eng(torch.randn(4, 32))
    eng.backward(loss)
    assert eng.step().stepped
    eng.close()


def test_torchrun_environment_without_mpi_is_refused(tmp_path, monkeypatch):
    """WORLD_SIZE from torchrun with an MPI world of one: each process would train alone."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(zoe.ZoeError, match=r"WORLD_SIZE=2 .* mpirun -np 2 .*srun -n 2"):
        zoe.initialize(GPT(), config=config(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "1")
    zoe.initialize(GPT(), config=config(tmp_path)).close()


def test_torchrun_variables_are_refused_before_mpi_starts(tmp_path, monkeypatch):
    """torchrun's full set of variables (RANK, LOCAL_RANK, TORCHELASTIC_*) with no MPI launcher: refused
    by the runtime's launcher check, naming mpirun and srun, before any engine is made."""
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "MPI_LOCALNRANKS",
                "MV2_COMM_WORLD_SIZE", "I_MPI_RANK", "SLURM_STEP_ID", "SLURM_STEPID"):
        monkeypatch.delenv(var, raising=False)
    for var, value in (("WORLD_SIZE", "4"), ("RANK", "1"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "4"),
                       ("TORCHELASTIC_RUN_ID", "none"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(var, value)
    with pytest.raises(zoe.ZoeError, match=r"WORLD_SIZE=4 .*torchrun.*mpirun -np 4.*srun -n 4"):
        zoe.initialize(GPT(), config=config(tmp_path))
    # force_local ignores the launcher, as it does MPI's.
    zoe.initialize(GPT(), config=config(tmp_path), force_local=True).close()


def test_backward_twice_is_torchs_error_and_loses_nothing(tmp_path):
    """engine.backward twice on one loss: torch's own error, and the step that follows uses the
    gradients of the one backward that ran (its norm is torch's); step() without backward is refused."""
    torch.manual_seed(0)
    model = GPT()
    ref = clone(model)
    x, y = gpt_batches(1)[0]
    eng = zoe.initialize(model, config=config(tmp_path, clip=0))
    with pytest.raises(zoe.ZoeError, match=r"before engine\.backward"):
        eng.step()
    loss = eng(x, y)
    eng.backward(loss)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        eng.backward(loss)
    stats = eng.step()
    ref(x, y).backward()
    norm = torch.norm(torch.stack([p.grad.norm() for p in ref.parameters()])).item()
    assert stats.stepped and abs(stats.grad_norm - norm) <= 1e-5 * norm, (stats.grad_norm, norm)
    eng.close()


class _RootParamNet(torch.nn.Module):
    """A parameter of the root module itself (held through the whole forward and backward, beside
    every unit in use) and a stack of blocks of the same size."""

    def __init__(self, d=96, layers=4):
        super().__init__()
        self.proj = torch.nn.Parameter(torch.randn(d, d) / d ** 0.5)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(d, d) for _ in range(layers)])

    def forward(self, x, y):
        h = x @ self.proj
        for b in self.blocks:
            h = torch.tanh(b(h))
        return torch.nn.functional.mse_loss(h, y)


def test_a_budget_initialize_accepts_holds_the_root_parameters_beside_each_unit(tmp_path):
    """Every device budget either is refused at initialize, naming zoe.device_budget, or trains:
    never an initialize that passes and a backward that runs out of budget (the root's own
    parameters stay fetched beside every unit in use, and the budget check counts them)."""
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(4, 96, generator=g), torch.randn(4, 96, generator=g)) for _ in range(2)]
    torch.manual_seed(0)
    ref = train_torch(_RootParamNet(), batches)
    trained = 0
    for kib in range(96, 640, 32):
        torch.manual_seed(0)
        model = _RootParamNet()
        (tmp_path / str(kib)).mkdir()
        try:
            eng = zoe.initialize(model, config=config(tmp_path / str(kib), device_budget=kib << 10))
        except zoe.ZoeError as e:
            assert "zoe.device_budget" in str(e), (kib, str(e))
            continue
        losses = train_zoe(eng, batches)[0]
        eng.close()
        assert losses == pytest.approx(ref, rel=1e-5), f"device_budget {kib} KiB"
        trained += 1
    assert trained > 0
