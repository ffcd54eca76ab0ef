"""engine.train_batch(batches): one optimizer step over a step's micro-batches, returning their
losses. Against the same calls made by hand (engine(...), engine.backward, engine.step: the same
bits), against plain torch with gradient accumulation (a Hugging Face GPT-2 and Llama at stage 3
with NVMe offload), and its refusals: a wrong number of micro-batches, a loss of more than one
element, a step already under way."""
import os

import pytest

torch = pytest.importorskip("torch")
zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")
os.environ["HF_HUB_OFFLINE"] = "1"

from zoe_torch_models import clone, config, gpt_batches, make_model  # noqa: E402

GAS = 3
STEPS = 4
LR = 3e-3


def groups(data, g=GAS):
    return [data[i:i + g] for i in range(0, len(data), g)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_same_bits_as_the_calls_by_hand(dtype, tmp_path):
    model = make_model("gpt")
    data = gpt_batches(GAS * STEPS)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    a = zoe.initialize(clone(model), config(tmp_path / "a", gas=GAS, dtype=dtype), force_local=True)
    b = zoe.initialize(clone(model), config(tmp_path / "b", gas=GAS, dtype=dtype), force_local=True)
    la, lb = [], []
    for step in groups(data):
        la += a.train_batch(step)
        assert a.last_step_stats.stepped and a.last_step_stats.schedule == "micro-batch"
        for args in step:
            loss = b(*args)
            b.backward(loss)
            lb.append(loss.item())
        assert b.step().stepped
    assert la == lb
    pa, pb = a.master_params(), b.master_params()
    for n in pa:
        assert torch.equal(pa[n], pb[n]), n
    a.close()
    b.close()


def torch_accumulated(model, steps, lr=LR, wd=0.1, clip=0.5):
    """torch.optim.AdamW over steps of GAS micro-batches: each micro-batch's loss / GAS backward."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    losses = []
    for step in steps:
        opt.zero_grad(set_to_none=True)
        for ids in step:
            loss = model(input_ids=ids, labels=ids).loss
            (loss / len(step)).backward()
            losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return losses


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hugging_face_model_against_torch_with_accumulation(arch, tmp_path):
    transformers = pytest.importorskip("transformers")
    from test_hf_models import batches, build, hf_config

    model = build(arch)
    ref = build(arch)
    ref.load_state_dict(model.state_dict())
    steps = groups(batches(GAS * STEPS))
    want = torch_accumulated(ref, steps)
    eng = zoe.initialize(model, hf_config(tmp_path, gas=GAS), force_local=True)
    got = []
    for step in steps:
        got += eng.train_batch([{"input_ids": ids, "labels": ids} for ids in step])
        assert eng.last_step_stats.schedule == "micro-batch"
    for i, (a, b) in enumerate(zip(got, want)):
        assert abs(a - b) <= 1e-5 * abs(b), f"micro-batch {i}: zoe {a}, torch {b}"
    assert abs(want[0] - want[-1]) > 1e-3
    # torch sums loss / 3's gradients in .grad, zoe sums the gradients and divides once: rounding
    # apart, which Adam's normalised update turns into up to a few percent of one update (lr) on
    # an element whose gradient is near zero. Bound: 5% of lr.
    sd = eng.state_dict()
    for n, p in ref.named_parameters():
        assert (sd[n] - p.detach()).abs().max().item() <= 0.05 * LR, n
    assert isinstance(transformers.__version__, str)
    eng.close()


def test_refusals_name_what_to_change(tmp_path):
    eng = zoe.initialize(make_model("gpt"), config(tmp_path, gas=GAS), force_local=True)
    data = gpt_batches(GAS + 1)
    with pytest.raises(zoe.ZoeError, match="2 micro-batches given, but gradient_accumulation_steps is 3"):
        eng.train_batch(data[:2])
    with pytest.raises(zoe.ZoeError, match="micro-batch 0: the loss must be a one-element tensor"):
        eng.train_batch(data[:GAS], loss_fn=lambda out, batch: torch.stack([out, out]))
    # Refused before its backward: the next call trains.
    losses = eng.train_batch(data[:GAS], loss_fn=lambda out, batch: out * 1.0)
    assert len(losses) == GAS
    loss = eng(*data[GAS])
    eng.backward(loss)
    with pytest.raises(zoe.ZoeError, match="already under way"):
        eng.train_batch(data[:GAS])
    eng.close()


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2", "mistral", "gpt_neox", "qwen2_moe", "mixtral"])
def test_layer_major_gives_the_micro_batch_bits(arch, tmp_path):
    """zoe.schedule "layer-major": each decoder layer fetched once per pass for the step's micro-batches,
    the same losses and weights, bit for bit, as the micro-batch schedule."""
    pytest.importorskip("transformers")
    from test_hf_models import batches, build, hf_config

    steps = groups(batches(GAS * STEPS))
    runs = {}
    for schedule in ("micro-batch", "layer-major"):
        eng = zoe.initialize(build(arch), hf_config(tmp_path / schedule, gas=GAS, schedule=schedule),
                             force_local=True)
        losses = []
        for step in steps:
            losses += eng.train_batch([{"input_ids": ids, "labels": ids} for ids in step])
            assert eng.last_step_stats.schedule == schedule
        runs[schedule] = (losses, eng.master_params(), eng.last_step_stats.step_bytes_host_to_device)
        eng.close()
    assert runs["layer-major"][0] == runs["micro-batch"][0]
    # Each decoder layer reaches the device once per pass instead of once per micro-batch (the
    # embedding, final norm and head still once per micro-batch).
    assert runs["layer-major"][2] * 2 < runs["micro-batch"][2], (runs["layer-major"][2], runs["micro-batch"][2])
    for n, w in runs["micro-batch"][1].items():
        assert torch.equal(runs["layer-major"][1][n], w), n


# The placements, G and dtypes of the layer-major bits test for an HF Llama and GPT-2, as a covering
# set rather than the whole product (288 cases): every stage 0-3, every offload of the optimizer
# (none, cpu, nvme) and of the parameters (none, cpu, nvme at stage 3), G 1, 3 and 8 and fp32 and
# bf16 each appear with both architectures. The two-rank cases are in test_torch_mpi.py.
# (arch, stage, offload_optimizer, offload_param, G, dtype)
MATRIX = [
    ("llama", 0, "none", "none", 3, "fp32"),
    ("gpt2", 0, "none", "none", 8, "bf16"),
    ("gpt2", 1, "cpu", "none", 8, "bf16"),
    ("llama", 1, "none", "none", 8, "fp32"),
    ("llama", 2, "nvme", "none", 1, "bf16"),
    ("gpt2", 2, "cpu", "none", 3, "fp32"),
    ("gpt2", 3, "cpu", "cpu", 3, "fp32"),
    ("llama", 3, "cpu", "cpu", 1, "fp32"),
    ("llama", 3, "nvme", "nvme", 8, "bf16"),
    ("gpt2", 3, "nvme", "nvme", 1, "fp32"),
    ("gpt2", 3, "none", "none", 3, "bf16"),
    ("llama", 3, "nvme", "cpu", 3, "bf16"),
]


@pytest.mark.parametrize("arch,stage,opt,param,gas,dtype", MATRIX, ids=["-".join(map(str, c)) for c in MATRIX])
def test_layer_major_bits_across_placements(arch, stage, opt, param, gas, dtype, tmp_path):
    """Two steps of G micro-batches through train_batch in both schedules: the same losses and
    masters, bit for bit, in every placement of MATRIX."""
    pytest.importorskip("transformers")
    from test_hf_models import BUDGET, batches, build

    data = [{"input_ids": ids, "labels": ids} for ids in batches(2 * gas)]
    zero = {"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0} if stage == 3 else {}
    runs = {}
    for schedule in ("micro-batch", "layer-major"):
        d = tmp_path / schedule
        os.makedirs(d)
        kw = {"device_budget": BUDGET} if param != "none" else {}
        cfg = config(d, stage=stage, opt=opt, param=param, gas=gas, micro=2, dtype=dtype, zero=zero,
                     schedule=schedule, **kw)
        eng = zoe.initialize(build(arch), cfg, force_local=True)
        losses = eng.train_batch(data[:gas]) + eng.train_batch(data[gas:])
        # With G = 1 both schedules are the same calls, which StepStats names "micro-batch".
        assert eng.last_step_stats.stepped and eng.last_step_stats.schedule == (schedule if gas > 1 else "micro-batch")
        runs[schedule] = (losses, eng.master_params())
        eng.close()
    assert runs["layer-major"][0] == runs["micro-batch"][0]
    for n, w in runs["micro-batch"][1].items():
        assert torch.equal(runs["layer-major"][1][n], w), n


def dropout_config(arch):
    """A tiny config of test_hf_models with dropout on everywhere the architecture has it."""
    from test_hf_models import tiny_config

    cfg = tiny_config(arch)
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout"):
        if hasattr(cfg, key):
            setattr(cfg, key, 0.2)
    return cfg


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox"])
def test_dropout_gives_the_same_bits_in_both_schedules(arch, tmp_path):
    """Dropout on (0.2 in the embedding, attention and residuals where the architecture has it):
    train_batch draws micro-batch g's masks from its own stream (zoe.micro_batch_seed), so the
    layer-major schedule gives the micro-batch schedule's losses and weights, bit for bit; those
    are the calls made by hand with torch.manual_seed(micro_batch_seed(step, g)) before each
    micro-batch; the masks are real (the losses differ from dropout off); torch's default
    generator is left as train_batch found it."""
    transformers = pytest.importorskip("transformers")
    from test_hf_models import batches, build, hf_config

    def built(cfg):
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")

    steps = groups([{"input_ids": ids, "labels": ids} for ids in batches(2 * GAS)])
    torch.manual_seed(123)
    base = torch.initial_seed()
    runs = {}
    for schedule in ("micro-batch", "layer-major"):
        eng = zoe.initialize(built(dropout_config(arch)), hf_config(tmp_path / schedule, gas=GAS, schedule=schedule),
                             force_local=True)
        torch.manual_seed(base)
        before = torch.random.get_rng_state()
        losses = []
        for step in steps:
            losses += eng.train_batch(step)
            assert eng.last_step_stats.schedule == schedule
        assert torch.equal(torch.random.get_rng_state(), before), "train_batch drew from torch's default generator"
        runs[schedule] = (losses, eng.master_params())
        eng.close()
    assert runs["layer-major"][0] == runs["micro-batch"][0]
    for n, w in runs["micro-batch"][1].items():
        assert torch.equal(runs["layer-major"][1][n], w), n
    # The calls by hand, each micro-batch on its documented seed.
    by_hand = zoe.initialize(built(dropout_config(arch)), hf_config(tmp_path / "hand", gas=GAS), force_local=True)
    hand = []
    for s, step in enumerate(steps):
        seeds = [zoe.micro_batch_seed(s, g, base) for g in range(GAS)]
        for g, b in enumerate(step):
            torch.manual_seed(seeds[g])
            loss = by_hand(**b).loss
            by_hand.backward(loss)
            hand.append(float(loss.detach().float()))
        by_hand.step()
    assert hand == runs["micro-batch"][0]
    for n, w in by_hand.master_params().items():
        assert torch.equal(runs["micro-batch"][1][n], w), n
    by_hand.close()
    # Without dropout the losses are others: the masks above were drawn and used.
    off = zoe.initialize(build(arch), hf_config(tmp_path / "off", gas=GAS), force_local=True)
    assert off.train_batch(steps[0]) != runs["micro-batch"][0][:GAS]
    off.close()


def test_dropout_masks_of_a_resumed_run_are_the_uninterrupted_runs(tmp_path):
    """The micro-batch seeds follow engine.global_steps, which a checkpoint restores: a run resumed
    after step 1 (in a fresh process's state: torch seeded anew) trains step 2 on the masks the
    uninterrupted run drew, bit for bit."""
    transformers = pytest.importorskip("transformers")
    from test_hf_models import batches, hf_config

    def built():
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(dropout_config("gpt2"), attn_implementation="eager")

    steps = groups([{"input_ids": ids, "labels": ids} for ids in batches(2 * GAS)])
    torch.manual_seed(7)
    whole = zoe.initialize(built(), hf_config(tmp_path / "whole", gas=GAS, schedule="layer-major"), force_local=True)
    torch.manual_seed(7)
    want = whole.train_batch(steps[0]) + whole.train_batch(steps[1])
    want_w = whole.master_params()
    whole.close()
    torch.manual_seed(7)
    first = zoe.initialize(built(), hf_config(tmp_path / "first", gas=GAS, schedule="layer-major"), force_local=True)
    torch.manual_seed(7)
    got = first.train_batch(steps[0])
    first.save_checkpoint(tmp_path / "ckpt", tag="step-1")
    first.close()
    torch.manual_seed(7)
    resumed = zoe.initialize(built(), hf_config(tmp_path / "resumed", gas=GAS, schedule="layer-major"),
                             force_local=True)
    resumed.load_checkpoint(tmp_path / "ckpt", tag="step-1")
    assert resumed.global_steps == 1
    # Each micro-batch of each step its own seed.
    seeds = {zoe.micro_batch_seed(s, g, 7) for s in range(2) for g in range(GAS)}
    assert len(seeds) == 2 * GAS and all(0 <= x < 2**63 for x in seeds)
    torch.manual_seed(7)
    got += resumed.train_batch(steps[1])
    assert got == want
    for n, w in want_w.items():
        assert torch.equal(resumed.master_params()[n], w), n
    resumed.close()


def test_layer_major_error_takes_no_step(tmp_path):
    """A failure in the middle of a layer-major step (here the loss of micro-batch 1) raises from
    train_batch, and no update is taken from the step's partial gradients."""
    pytest.importorskip("transformers")
    from test_hf_models import batches, build, hf_config

    eng = zoe.initialize(build("llama"), hf_config(tmp_path, gas=GAS, schedule="layer-major"), force_local=True)
    before = eng.master_params()

    def loss_fn(out, batch):
        if batch["input_ids"] is data[1]:
            raise RuntimeError("a failing loss")
        return out.loss

    data = batches(GAS)
    with pytest.raises(RuntimeError, match="a failing loss"):
        eng.train_batch([{"input_ids": ids, "labels": ids} for ids in data], loss_fn=loss_fn)
    with pytest.raises(zoe.ZoeError, match="no step is taken"):
        eng.step()
    after = eng.master_params()
    for n in before:
        assert torch.equal(before[n], after[n]), n
    eng.close()


def test_layer_major_inputs_go_through_the_activation_store(tmp_path):
    """With zoe.activation_offload nvme and budgets that leave no host tier, the layer inputs of
    every micro-batch go to NVMe and back: the same bits as the micro-batch schedule without it."""
    pytest.importorskip("transformers")
    from test_hf_models import batches, build, hf_config

    data = [{"input_ids": ids, "labels": ids} for ids in batches(GAS)]
    ref = zoe.initialize(build("llama"), hf_config(tmp_path / "ref", gas=GAS), force_local=True)
    want = ref.train_batch(data)
    want_w = ref.master_params()
    ref.close()
    one = 2 * 16 * 32 * 4  # a layer's input: batch x T x hidden, fp32
    os.makedirs(tmp_path / "lm", exist_ok=True)
    cfg = hf_config(tmp_path / "lm", gas=GAS, schedule="layer-major", activation_offload="nvme",
                    activation_min_bytes=1024, activation_device_budget=2 * one, activation_host_budget=128 << 10,
                    activation_nvme_path=str(tmp_path / "lm"))
    eng = zoe.initialize(build("llama"), cfg, force_local=True)
    got = eng.train_batch(data)
    st = eng.activation_stats()
    assert got == want
    for n, w in want_w.items():
        assert torch.equal(eng.master_params()[n], w), n
    assert st["tier_bytes"]["nvme"] > 0, st  # placed on the NVMe tier (4 KiB tensors come back from its write runs)
    assert st["high_water_device"] <= 2 * one, st
    eng.close()


def test_layer_major_on_a_model_it_cannot_drive_says_so_once(tmp_path, caplog):
    """zoe.schedule "layer-major" on a model that is not an HF decoder-only LM: train_batch runs the
    micro-batch schedule, says so once naming the key, and gives the micro-batch bits."""
    data = gpt_batches(2 * GAS)
    runs = {}
    for schedule in ("micro-batch", "layer-major"):
        (tmp_path / schedule).mkdir()
        eng = zoe.initialize(make_model("gpt"), config(tmp_path / schedule, gas=GAS, schedule=schedule),
                             force_local=True)
        with caplog.at_level("WARNING", logger="zoe.engine"):
            losses = eng.train_batch(data[:GAS]) + eng.train_batch(data[GAS:])
        assert eng.last_step_stats.schedule == "micro-batch"
        runs[schedule] = (losses, eng.master_params())
        eng.close()
    said = [r.getMessage() for r in caplog.records if "layer-major" in r.getMessage()]
    assert len(said) == 1 and "zoe.schedule" in said[0] and "not a Hugging Face decoder-only" in said[0], said
    assert runs["layer-major"][0] == runs["micro-batch"][0]
    for n, w in runs["micro-batch"][1].items():
        assert torch.equal(runs["layer-major"][1][n], w), n


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_layer_major_fetches_each_module_a_fixed_number_of_times_a_step(arch, tmp_path):
    """Layer-major at stage 3 with the parameters on NVMe: a step fetches each decoder layer once
    a pass and the embedding, final norm and head once a phase, so its fetches are the same with 2
    and with 4 micro-batches, where the micro-batch schedule's double."""
    pytest.importorskip("transformers")
    from test_hf_models import LAYERS, batches, build, hf_config

    got = {}
    for schedule in ("micro-batch", "layer-major"):
        for gas in (2, 4):
            eng = zoe.initialize(build(arch), hf_config(tmp_path / f"{schedule}{gas}", gas=gas, schedule=schedule),
                                 force_local=True)
            data = [{"input_ids": ids, "labels": ids} for ids in batches(2 * gas)]
            eng.train_batch(data[:gas])
            before = eng._fetcher.fetches
            eng.train_batch(data[gas:])
            got[schedule, gas] = eng._fetcher.fetches - before
            eng.close()
    assert got["layer-major", 2] == got["layer-major", 4], got
    assert got["micro-batch", 4] == 2 * got["micro-batch", 2], got
    # The layers twice, and at most 3 x (embedding, norm, head) and a rotary unit's or the like.
    assert 2 * LAYERS <= got["layer-major", 4] <= 2 * LAYERS + 12, got


def test_layer_major_io_fault_is_that_steps_error(tmp_path):
    """An I/O fault in the middle of a layer-major step (the parameters' swap file truncated after
    the forward pass, while the head runs): train_batch raises zoe's error naming the file, and the
    step is refused (no update runs on the partial gradients)."""
    pytest.importorskip("transformers")
    import glob

    from test_hf_models import batches, build, hf_config

    cfg = hf_config(tmp_path, gas=GAS, schedule="layer-major")
    params_dir = tmp_path / "params"
    params_dir.mkdir()
    cfg["zero_optimization"]["offload_param"].update(nvme_path=str(params_dir), max_in_cpu=0)
    eng = zoe.initialize(build("llama"), cfg, force_local=True)
    data = [{"input_ids": ids, "labels": ids} for ids in batches(2 * GAS)]
    eng.train_batch(data[:GAS])
    assert eng.last_step_stats.step == 1

    def loss_fn(out, batch):
        if batch is data[GAS + 1]:  # the head pass, after every layer's forward
            for f in glob.glob(str(params_dir / "*.swap")):
                os.truncate(f, 0)
        return out.loss

    with pytest.raises(zoe.ZoeError, match=r"swap file .*params/zoe-swap.* was truncated"):
        eng.train_batch(data[GAS:], loss_fn=loss_fn)
    with pytest.raises(zoe.ZoeError, match="no step is taken"):
        eng.step()
    assert eng._phase.global_steps == 1
    eng.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_layer_major_head_pass_fetches_an_untied_embedding_never(arch, tmp_path):
    """The head pass (step 3) does not use the embedding's output: an untied embedding (llama) is
    fetched in the first and the last phase only, 2 times a step; a tied one (qwen2: the head is
    the embedding's weight) in the head pass too, 3 times. The bits are the micro-batch schedule's
    (the matrix above)."""
    pytest.importorskip("transformers")
    from test_hf_models import batches, build, hf_config

    eng = zoe.initialize(build(arch), hf_config(tmp_path, gas=2, schedule="layer-major"), force_local=True)
    emb = eng.module.get_input_embeddings()
    emb_zm = next(zm for zm in eng._layout.zmods if any(p is emb.weight for p in zm.params))
    seen = []
    acquire = eng._fetcher.acquire

    def counting(zm):
        before = eng._fetcher.fetches
        r = acquire(zm)
        if zm is emb_zm and eng._fetcher.fetches > before:
            seen.append(zm)
        return r
    eng._fetcher.acquire = counting
    data = [{"input_ids": ids, "labels": ids} for ids in batches(4)]
    eng.train_batch(data[:2])
    seen.clear()
    eng.train_batch(data[2:])
    eng.close()
    assert len(seen) == (3 if arch == "qwen2" else 2), len(seen)
