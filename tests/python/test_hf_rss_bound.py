"""The front-end holds no whole copy of a model in any form: a Llama of 48M parameters (0.77 GB of
fp32 model states, 0.19 GB of fp32 parameters), built on the meta device, initialised and trained at
stage 3 with parameters and optimizer states on NVMe under a 64 MiB host budget, in a process of its
own. Its peak RSS beyond what importing torch, transformers and zoe took stays under half the
model's bf16 parameters (a quarter of its fp32 ones): a whole fp32 or bf16 copy (of the parameters,
their gradients or the initial values) would pass that, one layer at a time does not."""
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
cfg = transformers.LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1536, num_hidden_layers=12,
                               num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64,
                               tie_word_embeddings=False)
with torch.device("meta"):
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
nvme = sys.argv[1]
ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                            "offload_optimizer": {"device": "nvme", "nvme_path": nvme}},
      "zoe": {"device_budget": "96MiB", "host_budget": "64MiB"}}
eng = zoe.initialize(model, config=ds)
after_init = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
g = torch.Generator().manual_seed(0)
losses = []
for _ in range(2):
    ids = torch.randint(0, 8000, (1, 16), generator=g)
    out = eng(input_ids=ids, labels=ids)
    eng.backward(out.loss)
    eng.step()
    losses.append(out.loss.item())
print(json.dumps({"base": base, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "after_init": after_init, "params": eng.num_params(), "losses": losses}))
eng.close()
'''


def test_front_end_rss_stays_below_a_whole_model_copy(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    n = d["params"]
    assert n > 45_000_000, n
    grown = d["peak"] - d["base"]
    print(f"{n / 1e6:.1f}M parameters: peak RSS {d['peak'] / 1e6:.0f} MB, {grown / 1e6:.0f} MB beyond the imports "
          f"({d['after_init'] - d['base']:.0f} B at initialisation); a bf16 copy is {2 * n / 1e6:.0f} MB")
    assert all(l == l and l < 20 for l in d["losses"]), d["losses"]
    assert grown < n, (grown, n)  # half a bf16 copy: n bytes
