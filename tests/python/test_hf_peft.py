"""PEFT (LoRA) models under zoe: trained like torch, and engine.save_pretrained() writes the
adapter as PEFT's own save_pretrained writes it, which PeftModel.from_pretrained loads onto the
base model. Tiny configs built with from_config: nothing is downloaded."""
import copy
import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")
os.environ["HF_HUB_OFFLINE"] = "1"

from test_hf_models import batches, build, hf_config, train_torch, train_zoe  # noqa: E402


def lora(arch, **kw):
    targets = ["c_attn"] if arch == "gpt2" else ["q_proj", "v_proj"]
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, **kw)
    return peft.get_peft_model(build(arch), cfg)


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_save_pretrained_of_a_lora_model_writes_the_adapter(arch, tmp_path):
    """engine.save_pretrained(dir) of a LoRA model writes what PEFT's save_pretrained writes for the
    torch reference after the same training (the same files, adapter_config.json, the same tensor
    names with the same values), and PeftModel.from_pretrained(base, dir) gives the reference's
    logits; the frozen base is not in the folder."""
    from safetensors.torch import load_file

    model = lora(arch)
    ref = copy.deepcopy(model)
    data = batches(4)
    eng = zoe.initialize(model, config=hf_config(tmp_path / "nvme"))
    z, t = train_zoe(eng, data), train_torch(ref, data)
    for a, b in zip(z, t):
        assert abs(a - b) <= 1e-5 * abs(b)
    out, want_dir = tmp_path / "adapter", tmp_path / "peft"
    assert eng.save_pretrained(out) == os.fspath(out)
    ref.save_pretrained(want_dir)
    assert sorted(os.listdir(out)) == sorted(os.listdir(want_dir)) == \
        ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    # PEFT keeps target_modules as a set and writes it in the set's order, which a deepcopy may change.
    def adapter_config(d):
        c = json.loads((d / "adapter_config.json").read_text())
        if isinstance(c.get("target_modules"), list):
            c["target_modules"] = sorted(c["target_modules"])
        return c

    assert adapter_config(out) == adapter_config(want_dir)
    got, want = load_file(out / "adapter_model.safetensors"), load_file(want_dir / "adapter_model.safetensors")
    assert sorted(got) == sorted(want) and all("lora_" in k for k in got)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.allclose(got[k], want[k], atol=2e-5), k
    loaded = peft.PeftModel.from_pretrained(build(arch), out)
    ids = batches(1, seed=9)[0]
    exp = logits(ref, ids)
    assert torch.allclose(logits(loaded, ids), exp, rtol=1e-4, atol=2e-5)
    # Not trivially equal: the base model alone gives other logits.
    assert (logits(build(arch), ids) - exp).abs().max() > 1e-4
    eng.close()


def test_peft_adapter_bf16_and_refusals(tmp_path):
    """dtype=torch.bfloat16 writes the adapter rounded; max_shard_size (transformers' sharding)
    is refused by name for an adapter; a checkpoint of a PEFT model keeps no transformers config, so
    `zoe ckpt consolidate --format hf` cannot write a folder that from_pretrained would load as a
    random model."""
    from safetensors.torch import load_file

    model = lora("llama")
    eng = zoe.initialize(model, config=hf_config(tmp_path / "nvme"))
    train_zoe(eng, batches(2))
    eng.save_pretrained(tmp_path / "fp32")
    eng.save_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    a, b = load_file(tmp_path / "fp32" / "adapter_model.safetensors"), \
        load_file(tmp_path / "bf16" / "adapter_model.safetensors")
    for k in a:
        assert b[k].dtype == torch.bfloat16 and torch.equal(b[k], a[k].to(torch.bfloat16)), k
    with pytest.raises(zoe.ZoeError, match="max_shard_size does not apply to a PEFT model"):
        eng.save_pretrained(tmp_path / "sh", max_shard_size="1MB")
    ckpt = eng.save_checkpoint(tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / os.path.basename(ckpt) / "manifest.json").read_text())
    assert "hf" not in manifest["trainer"]["zoe_torch"]
    eng.close()
    from zoe_testlib import run_zoe

    p = run_zoe("ckpt", "consolidate", ckpt, "--format", "hf", "--out", tmp_path / "o", json_out=False, check=False)
    assert p.returncode != 0 and "--format safetensors" in p.stderr, p.stderr
    assert not (tmp_path / "o" / "model.safetensors").exists()
