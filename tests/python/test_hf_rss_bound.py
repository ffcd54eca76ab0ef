"""The front-end holds no whole copy of a model in any form: Llamas of 12 and 36 layers (46M and
122M parameters, 0.74 and 1.95 GB of fp32 model states), built on the meta device, initialised and
trained three steps at stage 3 with parameters and optimizer states on NVMe under a 96 MiB device
and a 128 MiB host budget, each in a process of its own. The larger one's peak RSS is the smaller
one's within half the added parameters' bf16 bytes: a copy of the model in any form (its
parameters, gradients or initial values, even in bf16) grows with it and fails that; what stays is
the imports, zoe's budgets and one layer at a time. zoe's own high-water marks stay within its
budgets."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

CHILD = r'''
import json, os, resource, sys, time
import torch, transformers, zoe

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

base = rss()
cfg = transformers.LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1536,
                               num_hidden_layers=int(sys.argv[2]),
                               num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64,
                               tie_word_embeddings=False)
with torch.device("meta"):
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
nvme = sys.argv[1]
ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                            "offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
      "zoe": {"device_budget": "96MiB", "host_budget": "128MiB"}}
eng = zoe.initialize(model, config=ds)
after_init = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
g = torch.Generator().manual_seed(0)
losses = []
for _ in range(3):
    ids = torch.randint(0, 8000, (1, 16), generator=g)
    out = eng(input_ids=ids, labels=ids)
    eng.backward(out.loss)
    st = eng.step()
    losses.append(out.loss.item())
print(json.dumps({"base": base, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "after_init": after_init, "params": eng.num_params(), "losses": losses,
                  "high_water": st.high_water}))
eng.close()
'''


def run(layers, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    nvme = tmp_path / f"nvme-{layers}"
    nvme.mkdir()
    out = subprocess.run([sys.executable, "-c", CHILD, str(nvme), str(layers)], capture_output=True, text=True,
                         env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{layers} layers, {d['params'] / 1e6:.1f}M parameters: peak RSS {d['peak'] / 1e6:.0f} MB "
          f"({(d['peak'] - d['base']) / 1e6:.0f} MB beyond the imports), zoe's high water {d['high_water']}")
    assert all(x == x and x < 20 for x in d["losses"]), d["losses"]
    assert d["high_water"]["device"] <= 96 << 20 and d["high_water"]["host"] <= 128 << 20, d["high_water"]
    return d


def test_front_end_rss_does_not_grow_with_the_model(tmp_path):
    small, big = run(12, tmp_path), run(36, tmp_path)
    added = big["params"] - small["params"]
    assert added > 70_000_000, added
    grown = big["peak"] - small["peak"]
    print(f"peak RSS grew {grown / 1e6:.0f} MB for {added / 1e6:.0f}M more parameters "
          f"(their bf16 bytes: {2 * added / 1e6:.0f} MB)")
    assert grown < added, (grown, added)  # half the added parameters' bf16 bytes
