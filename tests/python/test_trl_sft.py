"""TRL's SFTTrainer on zoe through zoe.hf.ZoeTrainerMixin (examples/trainer_sft.py's
ZoeSFTTrainer): on one-digit additions with a character tokenizer, both built in the script, it
trains (the loss falls) and matches TRL's SFTTrainer on plain torch (its own AdamW; the same seed,
data order and schedule, no dropout) to 1e-4 over 20 steps; the example runs with its parameters
and optimizer states on NVMe and saves a model transformers loads."""
import importlib.util
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl", reason="TRL is not installed (python/requirements-compare.txt)")
pytest.importorskip("datasets", reason="datasets is not installed (python/requirements-compare.txt)")
zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")
os.environ["HF_HUB_OFFLINE"] = "1"

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "trainer_sft.py")


def example():
    spec = importlib.util.spec_from_file_location("trainer_sft", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("offload", ["none", "nvme"])
def test_sft_trainer_on_zoe_matches_trl_on_plain_torch(tmp_path, offload):
    ex = example()
    # fp32 on both sides (SFTConfig's default bf16=True is torch's autocast in one, zoe's bf16 compute copy
    # in the other: another arithmetic).
    ref = ex.train(str(tmp_path / "torch"), 20, bf16=False)
    zero = {"stage": 3}
    if offload == "nvme":
        zero.update(offload_param={"device": "nvme", "nvme_path": str(tmp_path)},
                    offload_optimizer={"device": "nvme", "nvme_path": str(tmp_path)})
    got = ex.train(str(tmp_path / "zoe"), 20, {"zero_optimization": zero}, bf16=False)
    assert got.zoe_engine.compute_dtype() == torch.float32
    assert got.zoe_engine is not None and got.optimizer.state == {}
    a, b = ex.losses(ref), ex.losses(got)
    assert len(a) == len(b) == 20
    d = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    print(f"{offload}: max relative loss difference over 20 steps {d:.2e}; loss {b[0]:.3f} -> {b[-1]:.3f}")
    assert d <= 1e-4, (a, b)
    assert sum(b[-5:]) / 5 < sum(b[:5]) / 5 - 0.3, b  # it trains


def test_trainer_sft_example(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(zoe.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, EXAMPLE, "--steps", "30", "--out", str(out), "--nvme-path",
                        str(tmp_path / "nvme")], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "TRL SFTTrainer on zoe (stage 3, NVMe): loss" in r.stdout, r.stdout
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 2
    r = subprocess.run([sys.executable, EXAMPLE, "--steps", "1"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--steps must be at least 2" in r.stderr
