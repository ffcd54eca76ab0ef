"""A parameter that gets no gradient in some steps (an expert no micro-batch routes to, a branch a
step does not take): torch.optim.AdamW leaves it as it is and does not count the step, so its
bias correction afterwards uses its own number of updates. zoe does the same (the Updater's
skipped_steps), at stage 2 with the states in host RAM and at stage 3 with everything on NVMe: the
losses and weights of 8 steps in which the second expert sits out steps 1, 3, 4 and 7 are torch's
to fp32 rounding, where counting the engine's steps would put them 1e-3 apart after its first
update. A checkpoint keeps the counts: stopped after step 4 and resumed, the same bits as the
uninterrupted run."""
import copy

import pytest
import torch

zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

from zoe_torch_models import Experts, config, gpt_batches  # noqa: E402

WHICH = [0, 1, 0, 0, 1, 1, 0, 1]  # the expert of each step: expert 1 gets no gradient in steps 1, 3, 4, 7


def run_zoe(eng, data, which):
    losses = []
    for (x, y), k in zip(data, which):
        loss = eng(x, y, k)
        eng.backward(loss)
        eng.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("where", ["stage2-cpu", "stage3-nvme"])
def test_adamw_counts_each_parameters_own_steps(where, tmp_path):
    torch.manual_seed(0)
    model = Experts()
    ref = copy.deepcopy(model)
    data = gpt_batches(len(WHICH))
    cfg = (config(tmp_path, stage=2, opt="cpu", param="none", clip=0.0) if where == "stage2-cpu"
           else config(tmp_path, stage=3, opt="nvme", param="nvme", clip=0.0))
    eng = zoe.initialize(model, config=cfg)
    got = run_zoe(eng, data, WHICH)
    opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    want = []
    for (x, y), k in zip(data, WHICH):
        opt.zero_grad(set_to_none=True)
        loss = ref(x, y, k)
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert max(abs(a - b) / abs(b) for a, b in zip(got, want)) <= 1e-6, (got, want)
    sd = eng.state_dict()
    worst = max((sd[n] - p.detach()).abs().max().item() for n, p in ref.named_parameters())
    assert worst <= 1e-6, worst
    eng.close()


def test_checkpoint_keeps_the_counts(tmp_path):
    torch.manual_seed(0)
    model = Experts()
    data = gpt_batches(len(WHICH))
    cfg = config(tmp_path / "swap", stage=3, opt="nvme", param="nvme", clip=0.0)
    (tmp_path / "swap").mkdir()
    whole = run_zoe(zoe.initialize(copy.deepcopy(model), config=cfg), data, WHICH)
    eng = zoe.initialize(copy.deepcopy(model), config=cfg)
    first = run_zoe(eng, data[:4], WHICH[:4])
    eng.save_checkpoint(tmp_path / "ckpt", tag="step-4")
    eng.close()
    manifest = (tmp_path / "ckpt" / "step-4" / "manifest.json").read_text()
    assert "skipped_steps" in manifest
    resumed = zoe.initialize(copy.deepcopy(model), config=cfg)
    resumed.load_checkpoint(tmp_path / "ckpt")
    rest = run_zoe(resumed, data[4:], WHICH[4:])
    assert first + rest == whole
