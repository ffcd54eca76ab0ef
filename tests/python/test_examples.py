"""The examples run: examples/train_hf.py fine-tunes a Llama-architecture model with NVMe offload for
a few steps, the loss falls, and the folder it saves loads in transformers with the trained
model's loss and an engine's logits; examples/trainer_hf.py does the same through zoe.hf.Trainer,
and resumes from its checkpoint."""
import json
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def test_train_hf_example(tmp_path):
    out, nvme = tmp_path / "out", tmp_path / "nvme"
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(zoe.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "train_hf.py"), "--steps", "5", "--out", str(out),
                        "--nvme-path", str(nvme)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss ([\d.]+)$", r.stdout, re.M)]
    assert len(losses) == 5 and losses[-1] < losses[0], r.stdout
    final = float(re.search(r"^final loss ([\d.]+)$", r.stdout, re.M).group(1))

    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    data = torch.randint(0, hf.config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = hf(input_ids=data, labels=data)
    assert abs(got.loss.item() - final) <= 1e-5 * final + 1e-6, (got.loss.item(), final)

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf.config)
    cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": str(nvme)},
                                 "offload_optimizer": {"device": "nvme", "nvme_path": str(nvme)}}}
    eng = zoe.initialize(model, config=cfg, weights=out)
    eng.eval()
    with torch.no_grad():
        want = eng(input_ids=data).logits
    eng.close()
    d = (got.logits - want).abs().max().item()
    assert d <= 1e-5, f"max |from_pretrained - engine| logits = {d}"


def test_trainer_hf_example(tmp_path):
    """examples/trainer_hf.py: zoe.hf.Trainer with NVMe offload, evaluation, checkpoints and
    save_model; run again with --resume it goes on from its last checkpoint."""
    out, nvme = tmp_path / "out", tmp_path / "nvme"
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(zoe.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, os.path.join(EXAMPLES, "trainer_hf.py"), "--out", str(out), "--nvme-path", str(nvme)]
    r = subprocess.run(cmd + ["--steps", "12"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    steps = re.findall(r"^step +(\d+) +loss ([\d.]+)$", r.stdout, re.M)
    assert [int(s) for s, _ in steps] == list(range(1, 13)) and float(steps[-1][1]) < float(steps[0][1]), r.stdout
    assert {"checkpoint-10", "checkpoint-12", "model.safetensors", "config.json"} <= set(os.listdir(out))
    assert transformers.AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 4

    r = subprocess.run(cmd + ["--steps", "14", "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    resumed = re.findall(r"^step +(\d+) +loss ([\d.]+)$", r.stdout, re.M)
    assert [int(s) for s, _ in resumed] == list(range(1, 15)) and resumed[:12] == steps, r.stdout


def test_rl_loop_example(tmp_path):
    """examples/rl_loop.py: generation on an inference copy while the engine sleeps, a GRPO step
    through zoe, the weights streamed back with gathered_parameters(): the reward rises."""
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(zoe.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "rl_loop.py"), "--nvme-path", str(tmp_path),
                        "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["rose"] and out["last5"] - out["first5"] >= 0.1, out
    assert out["device_bytes_asleep"] == 0
