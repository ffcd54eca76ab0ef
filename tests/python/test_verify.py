"""zoe.verify(model_fn, config, batches, steps): "identical" for placements zoe trains correctly (stage 3
with parameters and states on NVMe, stage 2 with states in host RAM and the layer-major schedule
asked for), "diverged" naming the first step and tensor when a test hook breaks one offload path on
purpose (ZOE_TEST_FLIP_GRAD_SUM negates one element of one module's gradient sum where the sums
are offloaded), and a clear error for too few batches."""
import os

import pytest

torch = pytest.importorskip("torch")
zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

from zoe_torch_models import config, gpt_batches, make_model  # noqa: E402


def model_fn():
    return make_model("gpt", seed=0)


@pytest.mark.parametrize("placement", ["stage3-nvme", "stage2-cpu-layer-major"])
def test_identical_for_a_correct_placement(placement, tmp_path):
    if placement == "stage3-nvme":
        cfg = config(tmp_path, gas=2)
    else:
        cfg = config(tmp_path, stage=2, opt="cpu", param="none", gas=2, schedule="layer-major")
    r = zoe.verify(model_fn, cfg, gpt_batches(6), steps=3)
    assert r["verdict"] == "identical", r
    assert r["first_divergence"] is None
    assert r["losses"]["configured"] == r["losses"]["reference"]
    assert len(r["losses"]["configured"]) == 6
    assert r["losses"]["configured"][0] != r["losses"]["configured"][-1]


def test_diverged_names_the_first_step_and_tensor(tmp_path, monkeypatch):
    eng = zoe.initialize(model_fn(), config(tmp_path, gas=2), force_local=True)
    first_module = eng._zmods[1].name  # a block's module (the first holds the tied embedding)
    eng.close()
    monkeypatch.setenv("ZOE_TEST_FLIP_GRAD_SUM", f"{first_module}@2")
    r = zoe.verify(model_fn, config(tmp_path, gas=2), gpt_batches(6), steps=3)
    assert r["verdict"] == "diverged", r
    assert r["first_divergence"]["step"] == 2, r
    assert r["first_divergence"]["tensor"].endswith(".master"), r
    assert r["differing_elements"] == 1, r


def test_too_few_batches_is_refused(tmp_path):
    with pytest.raises(zoe.ZoeError, match="give at least 6"):
        zoe.verify(model_fn, config(tmp_path, gas=2), gpt_batches(4), steps=3)
