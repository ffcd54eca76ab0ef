"""zoe's optimizer.type "AdamMini" (src/optim/adam_mini.h, src/zero/updater_adam_mini.cpp) through
the PyTorch front-end, on a tiny Llama (grouped-query attention) built from a LlamaConfig, at stage 3
with the parameters and the optimizer states on NVMe, fp32, against the `adam-mini` package's
Adam_mini (version 1.1.1) given the same named parameters, dim and heads:

- losses within 1e-5 relative at every step over 50 steps, weights within 1e-5;
- the blocks are the package's: each head of q_proj and k_proj, each row of the embedding, the head,
  v_proj, o_proj and the MLP, each norm whole; a run whose q_proj shares one moment a row instead
  (another partition) leaves the reference, so the comparison sees the partition;
- the optimizer's NVMe bytes: m only beside the master (Adam-mini's v is one float a block, in host
  memory), so a step writes fewer bytes than AdamW's;
- m packed as int8 blocks (zoe.optimizer_states "int8") stays within 2e-3 of the package's losses;
- the config: dim, n_heads and n_kv_heads are Adam-mini's keys (refused with another type), taken
  from a Hugging Face model's config where not given, and a partition that does not fit the model
  names optimizer.params.dim and n_heads."""
import math
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")
adam_mini = pytest.importorskip("adam_mini", reason="the adam-mini package is not installed")
os.environ["HF_HUB_OFFLINE"] = "1"

from zoe_torch_models import config, permutation_batches, run_distance, tiny_llama  # noqa: E402

STEPS = 50
VOCAB = 128
DIM, HEADS, KV_HEADS = 32, 4, 2  # tiny_llama's hidden size, heads and key/value heads
PARAMS = {"lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1}


def build(seed=0):
    return tiny_llama(seed, VOCAB)


def batches(n):
    return permutation_batches(n, VOCAB)


def train_reference(model, data):
    opt = adam_mini.Adam_mini(named_parameters=model.named_parameters(), lr=PARAMS["lr"],
                              betas=tuple(PARAMS["betas"]), eps=PARAMS["eps"],
                              weight_decay=PARAMS["weight_decay"], dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS,
                              verbose=False)
    losses = []
    for ids in data:
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def zoe_config(tmp_path, params=None, type_="AdamMini", **kw):
    c = config(tmp_path, stage=3, opt="nvme", param="nvme", clip=0.0, micro=2,
               zero={"stage3_param_persistence_threshold": 0}, **kw)
    p = dict(PARAMS, dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS) if params is None else params
    c["optimizer"] = {"type": type_, "params": p}
    return c


def train_zoe(tmp_path, data, **kw):
    eng = zoe.initialize(build(), config=zoe_config(tmp_path, **kw))
    losses, written = [], []
    for ids in data:
        out = eng(input_ids=ids, labels=ids)
        eng.backward(out.loss)
        st = eng.step()
        assert st.stepped and not st.skipped
        losses.append(out.loss.item())
        written.append(st.step_bytes_nvme_write)
    assert st.high_water["nvme"] > 0
    sd = {n: t.detach().clone() for n, t in eng.state_dict().items()}
    eng.close()
    return losses, sd, written


distance = run_distance


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data = batches(STEPS)
    z = train_zoe(tmp_path_factory.mktemp("nvme"), data)
    ref = train_reference(build(), data)
    init = {n: p.detach().clone() for n, p in build().named_parameters()}
    return data, z, ref, init


def test_tracks_the_adam_mini_package(runs):
    """Losses within 1e-5 relative at every step, weights within 1e-5, and the run trained and
    moved the weights far more than that."""
    _, z, ref, init = runs
    loss, weight = distance(z, ref)
    moved = max((ref[1][n] - init[n]).abs().max().item() for n in init)
    print(f"\nAdam-mini vs the adam-mini package over {STEPS} steps: loss {loss:.3g} relative, weights "
          f"{weight:.3g} (moved {moved:.3g}); losses {ref[0][0]:.4f} -> {ref[0][-1]:.4f}")
    assert all(math.isfinite(x) for x in z[0]) and ref[0][-1] < ref[0][0] - 1.0, "the run did not train"
    assert loss <= 1e-5, f"zoe {z[0]}\nreference {ref[0]}"
    assert weight <= 1e-5
    assert moved > 1000 * 1e-5


def test_another_partition_leaves_the_reference(runs, tmp_path):
    """Heads of dim*dim/n_heads elements: with n_heads 2 zoe cuts q_proj and k_proj into other
    blocks (2 and 1 instead of 4 and 2), and the run leaves the package's by far more than 1e-5."""
    data = runs[0][:10]
    ref = train_reference(build(), data)
    (tmp_path / "same").mkdir()
    (tmp_path / "other").mkdir()
    same = train_zoe(tmp_path / "same", data)
    other = train_zoe(tmp_path / "other", data, params=dict(PARAMS, dim=DIM, n_heads=2))
    near, far = distance(same, ref)[1], distance(other, ref)[1]
    print(f"\nweights vs the package after 10 steps: the package's blocks {near:.3g}, other heads {far:.3g}")
    assert near <= 1e-5 and far > 100 * max(near, 1e-6), (near, far)


def test_writes_fewer_nvme_bytes_than_adamw(runs, tmp_path):
    """Beside the master only m goes to NVMe (and its gradient sums): a steady step writes about
    0.75x the bytes of AdamW's on the same model and placement (0.750 measured: v's 4 of the 16 bytes
    an element AdamW writes; the bound leaves room for the swapper's read-ahead share)."""
    data, z, _, _ = runs
    params = {k: v for k, v in PARAMS.items()}
    adamw = train_zoe(tmp_path, data[:4], type_="AdamW", params=params)
    ratio = z[2][3] / adamw[2][3]
    print(f"\nNVMe bytes written in a steady step: Adam-mini {z[2][3]}, AdamW {adamw[2][3]} ({ratio:.3f}x)")
    assert ratio <= 0.76


def test_int8_m_stays_near_the_package(runs, tmp_path):
    """m as int8 blocks (optim/lowbit.h's signed map): the losses stay within 2e-3 relative of the
    package's over 50 steps (fp32 m: 1e-5), and the run is not the fp32 one."""
    data, z, ref, _ = runs
    q = train_zoe(tmp_path, data, optimizer_states="int8")
    loss = distance(q, ref)[0]
    print(f"\nint8 m vs the package over {STEPS} steps: loss {loss:.3g} relative")
    assert loss <= 2e-3 and q[0] != z[0]


def test_heads_come_from_the_model_config(runs, tmp_path):
    """Without optimizer.params dim/n_heads/n_kv_heads, a Hugging Face model's own hidden_size and
    heads are used (not the package's 2048/32): the same bits as giving them; a value given is kept."""
    data = runs[0][:5]
    (tmp_path / "given").mkdir()
    (tmp_path / "model").mkdir()
    given = train_zoe(tmp_path / "given", data)
    model = train_zoe(tmp_path / "model", data, params=dict(PARAMS))
    assert model[0] == given[0] and all(torch.equal(model[1][n], given[1][n]) for n in given[1])
    eng = zoe.initialize(build(), config=zoe_config(tmp_path, params=dict(PARAMS, n_heads=2)))
    assert (eng.config_value("optimizer.params.dim"), eng.config_value("optimizer.params.n_heads")) == (DIM, 2)
    eng.close()


def test_config_keys(tmp_path):
    """dim, n_heads and n_kv_heads belong to AdamMini (refused with AdamW), betas/eps/weight_decay
    are AdamW's defaults, and heads that do not divide a projection are refused naming the keys."""
    eng = zoe.initialize(build(), config=zoe_config(tmp_path, params={"dim": DIM, "n_heads": HEADS}))
    got = {k: eng.config_value("optimizer.params." + k) for k in ("lr", "betas", "eps", "weight_decay")}
    assert got == {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    eng.close()
    with pytest.raises(Exception, match='optimizer.params.n_heads is optimizer.type "AdamMini"'):
        zoe.initialize(build(), config=zoe_config(tmp_path, type_="AdamW", params={"n_heads": 4}))
    class Bare(torch.nn.Module):  # no Hugging Face config: the package's defaults, refused for this model
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(DIM, DIM)

        def forward(self, x):
            return self.q_proj(x)

    with pytest.raises(Exception, match="optimizer.params.dim 2048 with optimizer.params.n_heads 32"):
        zoe.initialize(Bare(), config=zoe_config(tmp_path, params={}))
    with pytest.raises(Exception, match='zoe.optimizer_states "bf16" with optimizer.type "AdamMini"'):
        zoe.initialize(build(), config=zoe_config(tmp_path, optimizer_states="bf16"))
    with pytest.raises(Exception, match="n_kv_heads 3 does not divide"):
        zoe.initialize(build(), config=zoe_config(tmp_path, params={"dim": DIM, "n_heads": 4, "n_kv_heads": 3}))
