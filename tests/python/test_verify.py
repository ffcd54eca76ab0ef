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


def _hf_files(tmp_path):
    hf = tmp_path / "hf.json"
    hf.write_text('{"model_type": "llama", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, '
                  '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, '
                  '"max_position_embeddings": 64, "attention_dropout": 0.1}')
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, '
                  '"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 3, '
                  f'"offload_param": {{"device": "nvme", "nvme_path": "{nvme}"}}, '
                  f'"offload_optimizer": {{"device": "nvme", "nvme_path": "{nvme}"}}}}}}')
    return str(ds), str(hf)


def test_hf_config_verifies_a_hugging_face_model(tmp_path, capsys):
    """zoe verify --hf-config (zoe.verification.main, which the zoe command runs): a Llama from its
    config, stage 3 on NVMe, its attention dropout on (each micro-batch's masks drawn from its own
    stream, the same in both runs): identical, the dropout named; a missing config is refused
    naming it."""
    pytest.importorskip("transformers")
    import json
    import subprocess
    import sys
    from zoe import verification

    ds, hf = _hf_files(tmp_path)
    assert verification.main(["--config", ds, "--hf-config", hf, "--steps", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["verdict"] == "identical" and r["first_divergence"] is None, r
    assert r["dropout"] == ["attention_dropout"] and len(r["losses"]["configured"]) == 4
    assert verification.main(["--config", ds, "--hf-config", str(tmp_path / "absent.json")]) == 2
    assert "absent.json" in capsys.readouterr().err
    # Under a launcher of several processes (mpirun's variables here): refused, not run on every rank.
    with pytest.MonkeyPatch.context() as m:
        m.setenv("OMPI_COMM_WORLD_SIZE", "2")
        assert verification.main(["--config", ds, "--hf-config", hf, "--steps", "2"]) == 2
        assert "runs in one process" in capsys.readouterr().err
    # The whole chain where the package ships the zoe executable (pip install .): the zoe command
    # runs the C++ verify, which runs zoe.verification in this interpreter.
    exe = os.path.join(os.path.dirname(zoe.__file__), "bin", "zoe")
    if os.access(exe, os.X_OK):
        p = subprocess.run([sys.executable, "-m", "zoe._cli", "verify", "--config", ds, "--hf-config", hf,
                            "--steps", "2", "--json"], capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if k != "ZOE_PYTHON"})
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout.strip().splitlines()[-1])["verdict"] == "identical"
