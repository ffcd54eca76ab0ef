"""zoe's PyTorch front-end: checkpoints (save at 10, resume, 11-20 bit-identical; consolidate into a
plain model) and misuse errors (tests 5 and 6 of issue 13)."""
import json

import pytest
import torch

zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

from zoe_torch_models import clone, config, gpt_batches, make_model, train_zoe  # noqa: E402


def test_resume_bit_identical_and_consolidate(tmp_path):
    data = gpt_batches(20)
    cfg = config(tmp_path / "swap")
    (tmp_path / "swap").mkdir()
    full, _ = train_zoe(zoe.initialize(make_model("gpt"), config=cfg), data)

    eng = zoe.initialize(make_model("gpt"), config=cfg)
    first, _ = train_zoe(eng, data[:10])
    client = {"epoch": 3, "rng": torch.tensor([1, 2, 3]), "note": "ten"}
    path = eng.save_checkpoint(tmp_path / "ckpt", tag="step-10", client_state=client)
    assert path.endswith("step-10") and (tmp_path / "ckpt" / "latest").read_text().strip() == "step-10"
    eng.close()

    resumed = zoe.initialize(make_model("gpt", seed=123), config=cfg)  # other weights: all come from the checkpoint
    where, got = resumed.load_checkpoint(tmp_path / "ckpt")
    assert got["epoch"] == 3 and got["note"] == "ten" and torch.equal(got["rng"], client["rng"])
    assert resumed.global_steps == 10
    rest, _ = train_zoe(resumed, data[10:])
    assert first + rest == full, "steps 11-20 after resuming differ from the uninterrupted run"

    # consolidate: full fp32 tensors under the model's own names, into a plain model.
    sd = zoe.consolidate(tmp_path / "ckpt")
    plain = make_model("gpt", seed=7)
    assert set(sd) == set(plain.state_dict())
    assert sd["lm_head.weight"] is sd["wte.weight"]
    plain.load_state_dict(sd)
    x, y = data[10]
    eng2 = zoe.initialize(make_model("gpt", seed=5), config=cfg)
    eng2.load_checkpoint(tmp_path / "ckpt", tag="step-10")
    with torch.no_grad():
        assert plain(x, y).item() == eng2(x, y).item()
    # The trainer state is plain JSON a script can read.
    man = json.loads((tmp_path / "ckpt" / "step-10" / "manifest.json").read_text())
    assert man["trainer"]["zoe_torch"]["global_steps"] == 10


def test_config_error_names_the_key(tmp_path):
    with pytest.raises(zoe.ZoeError, match=r"zero_optimization\.stagee"):
        zoe.initialize(make_model("conv"), config={"zero_optimization": {"stagee": 1}})
    bad = tmp_path / "ds.json"
    bad.write_text('{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD"}}')
    with pytest.raises(zoe.ZoeError, match="SGD"):
        zoe.initialize(make_model("conv"), config=str(bad))
    with pytest.raises(zoe.ZoeError, match="cannot read config file .*missing.json"):
        zoe.initialize(make_model("conv"), config=str(tmp_path / "missing.json"))


def test_not_a_module():
    with pytest.raises(zoe.ZoeError, match="must be a torch.nn.Module, got builtins.dict"):
        zoe.initialize({"w": torch.zeros(3)}, config={})


def test_step_before_backward(tmp_path):
    eng = zoe.initialize(make_model("conv"), config=config(tmp_path, stage=2, opt="none", param="none"))
    with pytest.raises(zoe.ZoeError, match=r"step\(\) before engine\.backward\(\)"):
        eng.step()


def test_parameter_created_after_initialize(tmp_path):
    model = make_model("conv")
    eng = zoe.initialize(model, config=config(tmp_path, stage=1, opt="none", param="none"))
    model.mlp[3].extra = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(zoe.ZoeError, match=r"parameter 'mlp\.3\.extra' .* added to the model after zoe\.initialize"):
        eng(torch.zeros(1, 1, 8, 8), torch.zeros(1, dtype=torch.long))


def test_parameter_used_outside_its_unit_is_refused(tmp_path):
    """A head that uses the embedding's weight directly in the root forward (outside every unit)
    fails (torch's own error, kept as it was raised) with zoe's note naming the units, never
    silently with stale data."""

    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.mid = torch.nn.Linear(4, 4)

        def forward(self, i):
            return (self.mid(self.emb(i)) @ self.emb.weight.t()).sum()

    eng = zoe.initialize(Bad(), config=config(tmp_path, stage=3, opt="none", param="none"))
    with pytest.raises(RuntimeError) as info:
        eng(torch.tensor([1, 2]))
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "only available inside the forward of its unit; units: emb, mid" in notes, notes


def test_save_between_micro_batches_refused(tmp_path):
    eng = zoe.initialize(make_model("gpt"), config=config(tmp_path, gas=2))
    x, y = gpt_batches(1)[0]
    eng.backward(eng(x, y))
    with pytest.raises(zoe.ZoeError, match="waiting for engine.step"):
        eng.save_checkpoint(tmp_path / "c")


def test_step_stats_fields(tmp_path):
    eng = zoe.initialize(make_model("conv"), config=config(tmp_path))
    x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
    eng.backward(eng(x, y))
    s = eng.step()
    assert s.stepped and s.skipped is False and s.grad_norm > 0 and s.step == 1
    assert set(s.high_water) == {"device", "host", "nvme"} and s.high_water["nvme"] > 0
    assert eng.module is not None and clone(eng.module) is not None
