"""zoe's GPT-2 export against a GPT-2 written from scratch in PyTorch (no transformers): train a
tiny model with zoe, export it with `zoe ckpt consolidate --format hf-gpt2`, load the safetensors
by hand, and check that GPT-2's forward gives zoe's own training loss on the same batch."""
import json
import math

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from zoe_testlib import read_safetensors, run_zoe  # noqa: E402

STEPS = 4  # the checkpoint is saved after step 3; step 4's loss is computed with its weights


def gpt2_loss(w, cfg, tokens, targets):
    """GPT-2 (pre-LN, learned positions, tanh GELU, tied head) in float64; mean cross-entropy."""
    d, nh = cfg["n_embd"], cfg["n_head"]
    hd = d // nh
    eps = cfg["layer_norm_epsilon"]
    t = {k: torch.from_numpy(v).double() for k, v in w.items()}
    x_ids = torch.tensor(tokens, dtype=torch.long)
    B, T = x_ids.shape
    h = t["transformer.wte.weight"][x_ids] + t["transformer.wpe.weight"][:T]

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (d,), t[p + ".weight"], t[p + ".bias"], eps)

    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        a = ln(h, p + "ln_1") @ t[p + "attn.c_attn.weight"] + t[p + "attn.c_attn.bias"]  # Conv1D: x W + b
        q, k, v = a.split(d, dim=2)
        q, k, v = (z.view(B, T, nh, hd).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, d)
        h = h + y @ t[p + "attn.c_proj.weight"] + t[p + "attn.c_proj.bias"]
        m = ln(h, p + "ln_2") @ t[p + "mlp.c_fc.weight"] + t[p + "mlp.c_fc.bias"]
        m = torch.nn.functional.gelu(m, approximate="tanh")
        h = h + m @ t[p + "mlp.c_proj.weight"] + t[p + "mlp.c_proj.bias"]
    h = ln(h, "transformer.ln_f")
    logits = h @ t["transformer.wte.weight"].T
    y = torch.tensor(targets, dtype=torch.long)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny fp32 model trained for STEPS steps on a text file, saved after step 3."""
    root = tmp_path_factory.mktemp("hf")
    rng = np.random.default_rng(7)
    words = "the quick brown fox jumps over a lazy dog while zero offload streams tensors".split()
    text = "\n".join(" ".join(rng.choice(words, 10)) for _ in range(600))
    data = root / "text.txt"
    data.write_text(text)
    save = root / "ckpt"
    save.mkdir()
    train = run_zoe("train", "--preset", "tiny", "--steps", STEPS, "--save-every", 3, "--save-dir", save,
                    "--precision", "fp32", "--data", data, "--quiet", "--json")
    assert len(train["losses"]) == STEPS
    return {"root": root, "data": data, "save": save, "train": train}


def export(trained, name, dtype="fp32"):
    out = trained["root"] / name
    j = run_zoe("ckpt", "consolidate", trained["save"], "--format", "hf-gpt2", "--dtype", dtype, "--out", out,
                "--json")
    assert j["format"] == "hf-gpt2"
    w, meta = read_safetensors(out / "model.safetensors")
    cfg = json.loads((out / "config.json").read_text())
    return w, meta, cfg


def test_config_and_names(trained):
    w, meta, cfg = export(trained, "hf")
    assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu_new"
    dims = (cfg["vocab_size"], cfg["n_positions"], cfg["n_embd"], cfg["n_layer"], cfg["n_head"])
    assert dims == (256, 64, 64, 2, 4)
    assert cfg["tie_word_embeddings"] is True
    assert cfg["layer_norm_epsilon"] == pytest.approx(1e-5)
    assert meta["zoe_step"] == "3" and meta["zoe_export"] == "hf-gpt2"
    d = 64
    want = {"transformer.wte.weight": (256, d), "transformer.wpe.weight": (64, d),
            "transformer.ln_f.weight": (d,), "transformer.ln_f.bias": (d,)}
    for i in range(2):
        p = f"transformer.h.{i}."
        want.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
                     p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
                     p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
                     p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                     p + "mlp.c_fc.weight": (d, 4 * d), p + "mlp.c_fc.bias": (4 * d,),
                     p + "mlp.c_proj.weight": (4 * d, d), p + "mlp.c_proj.bias": (d,)})
    assert {k: v.shape for k, v in w.items()} == want


def test_conv1d_weights_are_zoe_weights_transposed(trained):
    w, _, _ = export(trained, "hf")
    zoe_file = trained["root"] / "zoe.safetensors"
    run_zoe("ckpt", "consolidate", trained["save"], "--out", zoe_file, "--json")
    z, _ = read_safetensors(zoe_file)
    pairs = {"qkv_w": "attn.c_attn.weight", "proj_w": "attn.c_proj.weight", "fc1_w": "mlp.c_fc.weight",
             "fc2_w": "mlp.c_proj.weight"}
    for i in range(2):
        for zn, hn in pairs.items():
            np.testing.assert_array_equal(w[f"transformer.h.{i}.{hn}"], z[f"block.{i}.{zn}"].T)
    np.testing.assert_array_equal(w["transformer.wte.weight"], z["embed.wte"])


def test_gpt2_forward_matches_zoe_training_loss(trained):
    w, _, cfg = export(trained, "hf")
    # The batch zoe train drew at step 4, and zoe's forward on it with the checkpoint's weights.
    ev = run_zoe("ckpt", "eval", trained["save"], "--data", trained["data"], "--train-batch", STEPS, "--json")
    zoe_loss = trained["train"]["losses"][STEPS - 1]
    assert ev["loss"] == pytest.approx(zoe_loss, rel=1e-6)  # same kernels, same weights, same batch
    ours = gpt2_loss(w, cfg, ev["tokens"], ev["targets"])
    assert ours == pytest.approx(zoe_loss, rel=1e-5), f"GPT-2 forward {ours} vs zoe {zoe_loss}"
    # Not a trivially equal number: the untrained model's loss differs.
    assert abs(trained["train"]["losses"][0] - zoe_loss) > 1e-3


def test_gpt2_forward_matches_zoe_eval_on_given_tokens(trained):
    w, _, cfg = export(trained, "hf")
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 256, size=(3, 33)).tolist()
    tok = trained["root"] / "tokens.json"
    tok.write_text(json.dumps(rows))
    ev = run_zoe("ckpt", "eval", trained["save"], "--tokens", tok, "--json")
    assert ev["batch"] == 3 and ev["seq"] == 32
    ours = gpt2_loss(w, cfg, [r[:-1] for r in rows], [r[1:] for r in rows])
    assert ours == pytest.approx(ev["loss"], rel=1e-5)


def test_bf16_export_is_the_fp32_export_rounded(trained):
    w32, _, _ = export(trained, "hf")
    w16, _, cfg = export(trained, "hf-bf16", "bf16")
    assert cfg["torch_dtype"] == "bfloat16"
    for k, v in w32.items():
        want = torch.from_numpy(v).to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(w16[k], want, err_msg=k)


def test_bad_format_and_heads_are_refused(trained):
    p = run_zoe("ckpt", "consolidate", trained["save"], "--format", "onnx", "--out", trained["root"] / "x",
                json_out=False, check=False)
    assert p.returncode == 1 and "--format onnx" in p.stderr
    p = run_zoe("ckpt", "consolidate", trained["save"], "--format", "hf-gpt2", "--n-head", 5, "--out",
                trained["root"] / "x", json_out=False, check=False)
    assert p.returncode == 1 and "--n-head 5" in p.stderr
    assert not (trained["root"] / "x").exists()


@pytest.mark.parametrize("command", [("consolidate", "--format", "hf-gpt2"), ("eval",)])
def test_n_head_contradicting_the_checkpoint_is_refused(trained, command):
    # The tiny preset trains with 4 heads; 2 also divides the width, so the export would compute
    # another function with rc 0.
    out = trained["root"] / ("contradiction-" + command[0])
    args = ["--out", out] if command[0] == "consolidate" else ["--data", trained["data"], "--train-batch", 1]
    p = run_zoe("ckpt", *command[:1], trained["save"], *command[1:], "--n-head", 2, *args, json_out=False,
                check=False)
    assert p.returncode == 1, p.stderr
    assert "--n-head 2 contradicts" in p.stderr and "4 heads" in p.stderr, p.stderr
    assert not out.exists()
    # The checkpoint's own count is accepted when given.
    p = run_zoe("ckpt", *command[:1], trained["save"], *command[1:], "--n-head", 4, *args, json_out=False)


def test_export_refuses_a_directory_it_did_not_write(trained):
    other = trained["root"] / "other-model"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "llama"}')
    (other / "model-00001-of-00002.safetensors").write_bytes(b"x" * 100)
    before = sorted(p.name for p in trained["root"].iterdir())
    for fmt in ("hf-gpt2",):
        p = run_zoe("ckpt", "consolidate", trained["save"], "--format", fmt, "--out", other, json_out=False,
                    check=False)
        assert p.returncode == 1, p.stderr
        assert f"--out {other} is not empty" in p.stderr and "choose a new directory" in p.stderr, p.stderr
    assert (other / "config.json").read_text() == '{"model_type": "llama"}'
    assert sorted(p.name for p in other.iterdir()) == ["config.json", "model-00001-of-00002.safetensors"]
    assert sorted(p.name for p in trained["root"].iterdir()) == before  # no temporary left behind
    # An empty directory, and zoe's own earlier export, are written (the latter replaced whole).
    empty = trained["root"] / "empty"
    empty.mkdir()
    export(trained, "empty")
    export(trained, "empty")
    assert sorted(p.name for p in empty.iterdir()) == [".zoe-export.json", "config.json", "model.safetensors"]
    # A file of the user's added to zoe's export makes it theirs: refused, kept.
    (empty / "notes.txt").write_text("mine")
    p = run_zoe("ckpt", "consolidate", trained["save"], "--format", "hf-gpt2", "--out", empty, json_out=False,
                check=False)
    assert p.returncode == 1 and "notes.txt" in p.stderr, p.stderr
    assert (empty / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in trained["root"].iterdir()) == sorted(before + ["empty"])
