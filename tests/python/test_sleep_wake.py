"""engine.sleep() / engine.wake() / engine.is_asleep (the two-rank case is in test_torch_mpi.py):
- sleeping after every step gives the losses and weights of never sleeping, bit for bit, for
  stages 0-3 and offload none/cpu/nvme, fp32 and bf16, with gradient accumulation;
- while asleep the device holds nothing (memory_in_use()["device"] == 0) and the copies are in
  host memory, or on NVMe when zoe.host_budget has no room;
- gathered_parameters() after wake() gives the consolidated checkpoint's tensors;
- misuse (mid-step, twice, a forward or a step while asleep, wake while awake) is refused by
  name, and the run goes on with the bits of one that never slept."""
import pytest
import torch

zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

from zoe_torch_models import config, gpt_batches, make_model  # noqa: E402

PLACEMENTS = [  # (stage, offload_optimizer, offload_param)
    (0, "none", "none"), (1, "cpu", "none"), (2, "nvme", "none"), (2, "none", "none"),
    (3, "none", "none"), (3, "cpu", "cpu"), (3, "nvme", "nvme"), (3, "cpu", "none"),
]


def run(tmp, place, dtype, sleep, steps=3, gas=2, **zoe_keys):
    stage, opt, param = place
    tmp.mkdir(parents=True, exist_ok=True)
    eng = zoe.initialize(make_model("gpt"), config=config(tmp, stage=stage, opt=opt, param=param, gas=gas,
                                                          dtype=dtype, **zoe_keys))
    data = gpt_batches(steps * gas)
    losses, seen = [], []
    for k in range(steps):
        for j in range(gas):
            loss = eng(*data[k * gas + j])
            eng.backward(loss)
            losses.append(loss.item())
        eng.step()
        if sleep:
            before = eng.memory_in_use()
            eng.sleep()
            seen.append((before, eng.memory_in_use(), eng.is_asleep))
            eng.wake()
            assert not eng.is_asleep
    weights = {n: t.clone() for n, t in eng.master_params().items()}
    eng.close()
    return losses, weights, seen


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("place", PLACEMENTS, ids=lambda p: f"s{p[0]}-{p[1]}-{p[2]}")
def test_sleeping_after_every_step_gives_the_bits_of_never_sleeping(place, dtype, tmp_path):
    l0, w0, _ = run(tmp_path / "a", place, dtype, sleep=False)
    l1, w1, seen = run(tmp_path / "b", place, dtype, sleep=True)
    assert l0 == l1
    for n in w0:
        assert torch.equal(w0[n], w1[n]), n
    for before, asleep, flag in seen:
        assert flag
        assert asleep["device"] == 0 and asleep["device_partitions"] == 0
        assert asleep["host"] - before["host"] >= before["device"], (before, asleep)


def test_a_full_host_budget_sends_the_copies_to_nvme(tmp_path):
    """zoe sizes its swap and staging buffers within zoe.host_budget: 56MiB leaves no room."""
    place = (2, "nvme", "none")
    l0, w0, _ = run(tmp_path / "a", place, "fp32", sleep=False, host_budget="56MiB")
    l1, w1, seen = run(tmp_path / "b", place, "fp32", sleep=True, host_budget="56MiB")
    assert l0 == l1 and all(torch.equal(w0[n], w1[n]) for n in w0)
    before, asleep, _ = seen[-1]
    assert before["device"] > 0 and asleep["device"] == 0
    assert asleep["nvme"] - before["nvme"] >= before["device"] // 2, (before, asleep)


def test_gathered_parameters_after_wake_are_the_checkpoints(tmp_path):
    eng = zoe.initialize(make_model("gpt"), config=config(tmp_path, stage=3, opt="cpu", param="cpu"))
    for x, y in gpt_batches(2):
        eng.backward(eng(x, y))
        eng.step()
    eng.sleep()
    eng.wake()
    got = dict(eng.gathered_parameters())
    want = zoe.consolidate(eng.save_checkpoint(str(tmp_path / "ckpt")))
    for n, t in got.items():
        assert torch.equal(t, want[n]), n
    eng.close()


def test_misuse_is_refused_by_name_and_nothing_is_lost(tmp_path):
    place = (3, "cpu", "none")
    data = gpt_batches(6)
    eng = zoe.initialize(make_model("gpt"), config=config(tmp_path, stage=3, opt="cpu", param="none", gas=2))
    with pytest.raises(zoe.ZoeError, match=r"wake\(\) while the engine is awake"):
        eng.wake()
    eng.backward(eng(*data[0]))
    with pytest.raises(zoe.ZoeError, match=r"engine.sleep\(\): 1 micro-batch\(es\) of gradients are waiting"):
        eng.sleep()
    eng.backward(eng(*data[1]))
    eng.step()
    eng.sleep()
    with pytest.raises(zoe.ZoeError, match=r"sleep\(\) while the engine is asleep"):
        eng.sleep()
    with pytest.raises(zoe.ZoeError, match=r"engine\(\.\.\.\) while the engine is asleep: call engine.wake\(\) first"):
        eng(*data[2])
    with pytest.raises(zoe.ZoeError, match=r"while the engine is asleep"):
        dict(eng.gathered_parameters())
    with pytest.raises(zoe.ZoeError, match=r"save\(\) while the engine is asleep"):
        eng.save_checkpoint(str(tmp_path / "ckpt"))
    assert eng.is_asleep
    eng.wake()
    losses = []
    for j in range(2, 6):
        loss = eng(*data[j])
        eng.backward(loss)
        losses.append(loss.item())
        eng.step()
    weights = eng.master_params()
    eng.close()
    l0, w0, _ = run(tmp_path / "plain", place, "fp32", sleep=False, steps=3)
    assert l0[2:] == losses
    assert all(torch.equal(w0[n], weights[n]) for n in w0)
