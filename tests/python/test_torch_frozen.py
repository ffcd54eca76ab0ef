"""zoe's PyTorch front-end with frozen parameters (requires_grad=False at zoe.initialize): a LoRA-style
model trains as torch.optim.AdamW trains it, its frozen weights never change, and they hold no
optimizer state or gradient buffer in zoe (model_state_bytes and the NVMe bytes in use drop by
exactly those states)."""
import math

import pytest
import torch

zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

from zoe_torch_models import LoRANet, clone, config, lora_batches, train_torch, train_zoe  # noqa: E402

STEPS = 5
LR = 3e-3
PART = 2048  # a zoe module's flat group is padded to a multiple of this (x the world size)


def lora_model():
    torch.manual_seed(0)
    return LoRANet()


def sub(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    return d


def frozen_names(model):
    return [n for n, p in model.named_parameters() if not p.requires_grad]


def test_lora_stage3_nvme_matches_torch_and_frozen_weights_stay(tmp_path):
    """Stage 3, parameters and optimizer states on NVMe: losses within 1e-6 relative of
    torch.optim.AdamW's (frozen parameters requires_grad=False there too: no update, no decay), the
    frozen weights bit-identical to their initial values after every step."""
    model = lora_model()
    ref = clone(model)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = lora_batches(STEPS)
    eng = zoe.initialize(model, config=config(tmp_path, clip=0.0, zero={"stage3_param_persistence_threshold": 0}))
    # A unit with both kinds of parameters is two zoe modules, the frozen one "<unit>[frozen]"; an
    # all-frozen unit is one frozen module.
    units = dict(eng.units())
    assert sorted(units["layers.0"]) == ["layers.0", "layers.0[frozen]"]
    assert units["norm"] == ["norm"] and units["head"] == ["head"]
    z, stats = [], []
    for i, args in enumerate(data):
        loss = eng(*args)
        eng.backward(loss)
        stats.append(eng.step())
        z.append(loss.item())
        if i < 3:
            sd = eng.state_dict()
            for n in frozen_names(ref):
                assert torch.equal(sd[n], init[n]), f"step {i + 1}: frozen {n} changed"
    t = train_torch(ref, data, lr=LR, clip=0.0)
    for i, (a, b) in enumerate(zip(z, t)):
        assert abs(a - b) <= 1e-6 * abs(b), f"step {i + 1}: zoe loss {a}, torch {b}"
    assert all(s.stepped and not s.skipped for s in stats)
    got, want = eng.state_dict(), ref.state_dict()
    assert set(got) == set(want)
    for n in want:
        if n in frozen_names(ref):
            assert torch.equal(got[n], want[n]), n
        else:
            d = (got[n] - want[n]).abs().max().item()
            assert 0 < (got[n] - init[n]).abs().max().item(), f"{n} never trained"
            assert d <= 1e-5, f"{n}: max |zoe - torch| = {d}"
    eng.close()


def padded(zm):
    return -(-sum(math.prod(s) for s in zm.shapes) // PART) * PART


def test_frozen_parameters_hold_no_states(tmp_path):
    """Stage 3, every module partitioned, parameters and optimizer states on NVMe: the NVMe bytes in
    use are the fp32 parameter partitions of every zoe module plus 16 bytes (master, m, v, gradient
    accumulator) per element of the trainable ones only; model_state_bytes drops by 16 bytes per
    frozen element (master, m, v and gradient) against the same model with all parameters trainable."""
    zero = {"stage3_param_persistence_threshold": 0}
    frozen = zoe.initialize(lora_model(), config=config(sub(tmp_path, "a"), zero=zero))
    all_trained = lora_model()
    all_trained.requires_grad_(True)
    plain = zoe.initialize(all_trained, config=config(sub(tmp_path, "b"), zero=zero))
    nf = sum(p.numel() for p in lora_model().parameters() if not p.requires_grad)
    assert plain.model_state_bytes() - frozen.model_state_bytes() == 16 * nf
    assert frozen.model_state_bytes() < 0.5 * plain.model_state_bytes()
    assert any(zm.frozen for zm in frozen._zmods) and not any(zm.frozen for zm in plain._zmods)
    for eng in (frozen, plain):
        want = sum(4 * padded(zm) + (0 if zm.frozen else 16 * padded(zm)) for zm in eng._zmods)
        assert eng.memory_in_use()["nvme"] == want
    for eng in (frozen, plain):  # and training keeps it so
        for x, y in lora_batches(2):
            loss = eng(x, y)
            eng.backward(loss)
            eng.step()
        want = sum(4 * padded(zm) + (0 if zm.frozen else 16 * padded(zm)) for zm in eng._zmods)
        assert eng.memory_in_use()["nvme"] == want
        assert eng.high_water()["nvme"] == want
    frozen.close()
    plain.close()


def test_checkpoint_round_trip_and_consolidate(tmp_path):
    """Save after 3 steps, resume in a fresh engine: steps 4-5 give the uninterrupted run's losses
    bit for bit; zoe.consolidate gives the frozen weights exactly and the names of the model."""
    data = lora_batches(STEPS)
    whole = zoe.initialize(lora_model(), config=config(sub(tmp_path, "w")))
    want, _ = train_zoe(whole, data)
    first = zoe.initialize(lora_model(), config=config(sub(tmp_path, "f")))
    train_zoe(first, data[:3])
    first.save_checkpoint(tmp_path / "ckpt", tag="step-3")
    second = zoe.initialize(lora_model(), config=config(sub(tmp_path, "s")))
    second.load_checkpoint(tmp_path / "ckpt")
    got, _ = train_zoe(second, data[3:])
    assert got == want[3:]
    sd = zoe.consolidate(tmp_path / "ckpt")
    ref = lora_model()
    assert set(sd) == set(ref.state_dict())
    for n in frozen_names(ref):
        assert torch.equal(sd[n], ref.state_dict()[n]), n
    plain = lora_model()
    plain.load_state_dict(sd)
    for e in (whole, first, second):
        e.close()


def test_flipping_requires_grad_after_initialize_is_refused(tmp_path):
    model = lora_model()
    eng = zoe.initialize(model, config=config(tmp_path, stage=0, opt="none", param="none"))
    x, y = lora_batches(1)[0]
    eng.backward(eng(x, y))
    eng.step()
    model.layers[0].base.weight.requires_grad_(True)
    with pytest.raises(zoe.ZoeError, match=r"layers\.0\.base\.weight.*requires_grad=True.*zoe\.initialize"):
        eng(x, y)
    model.layers[0].base.weight.requires_grad_(False)
    model.head.bias.requires_grad_(False)
    with pytest.raises(zoe.ZoeError, match=r"head\.bias.*requires_grad=False"):
        eng(x, y)
    model.head.bias.requires_grad_(True)
    eng.backward(eng(x, y))  # usable again
    eng.step()
    eng.close()
