"""engine.gathered_parameters(dtype=None, rank0_only=False): the current weights, one full tensor
at a time, in the model's own names (the two-rank case is in test_torch_mpi.py):
- the same tensors as zoe.consolidate of a checkpoint saved at that step, in
  model.named_parameters()' order, a tied parameter once; dtype=torch.bfloat16 gives the fp32
  tensors cast;
- loaded into a plain copy of the model, the copy's loss is the engine's;
- the iterator holds one zoe module at a time (numpy's allocations, which tracemalloc sees, and the
  modules' arrays, which the binding counts; an array let go is reused for the next module's read);
- misuse (a dtype that is not floating, mid-accumulation, training while the iterator is open) is
  refused by name and the engine trains on."""
import tracemalloc

import pytest
import torch

zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

from zoe_torch_models import GPT, clone, config, gpt_batches, make_model, train_zoe  # noqa: E402


@pytest.mark.parametrize("place", [("nvme", "nvme", 3), ("cpu", "none", 2), ("none", "none", 0)])
def test_same_tensors_as_a_consolidated_checkpoint(place, tmp_path):
    opt, param, stage = place
    model = make_model("gpt")
    plain = clone(model)
    eng = zoe.initialize(model, config=config(tmp_path, stage=stage, opt=opt, param=param))
    data = gpt_batches(4)
    train_zoe(eng, data[:3])
    got = list(eng.gathered_parameters())
    names = [n for n, _ in plain.named_parameters()]
    assert [n for n, _ in got] == names  # lm_head.weight is wte.weight's: once, under wte's name
    want = zoe.consolidate(eng.save_checkpoint(str(tmp_path / "ckpt")))
    for n, t in got:
        assert t.dtype == torch.float32 and torch.equal(t, want[n]), n
    # Each module's array let go at once is reused for the next read; the arrays held (got's) are not.
    again = {n: t.clone() for n, t in eng.gathered_parameters()}
    for n, t in got:
        assert torch.equal(again[n], t) and torch.equal(t, want[n]), n
    bf = dict(eng.gathered_parameters(dtype=torch.bfloat16))
    for n, t in got:
        assert bf[n].dtype == torch.bfloat16 and torch.equal(bf[n], t.to(torch.bfloat16)), n
    assert [n for n, _ in eng.gathered_parameters(rank0_only=True)] == names  # rank 0 of 1

    # The weights in an inference copy: its loss on the next batch is the engine's.
    with torch.no_grad():
        params = dict(plain.named_parameters())
        for n, t in eng.gathered_parameters():
            params[n].copy_(t)
        want_loss = plain(*data[3]).item()
    loss = eng(*data[3])
    eng.backward(loss)
    eng.step()
    assert loss.item() == pytest.approx(want_loss, rel=1e-6)
    eng.close()


def test_holds_one_module_at_a_time(tmp_path):
    """A GPT of 12 layers (about 0.6 MB of fp32 weights, its largest tensor 16 KB): the Python
    side's allocations while the iterator runs peak below 2 of its largest zoe module (the one
    read, and the one whose last tensor the loop still holds: the tensors are views of their
    module's array) and 3 of its largest tensor, where keeping them would take the whole model."""
    torch.manual_seed(0)
    model = GPT(layers=12)
    largest = max(p.numel() for p in model.parameters()) * 4
    total = sum(p.numel() for p in model.parameters()) * 4
    eng = zoe.initialize(model, config=config(tmp_path))
    train_zoe(eng, gpt_batches(1))
    tracemalloc.start()
    n = 0
    for _, t in eng.gathered_parameters():
        n += t.numel()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    module = max(sum(torch.Size(s).numel() for s in zm.shapes) for zm in eng._layout.zmods) * 4
    assert n * 4 == total and total > 20 * largest and total > 8 * module
    assert peak < 2 * module + 3 * largest, f"peak {peak} bytes, largest module {module}, tensor {largest}, model {total}"
    # The modules' arrays themselves (4096-byte aligned, outside tracemalloc's view): at most two
    # at once, each at most twice its module (one kept array serves a smaller module).
    arrays = eng._eng.read_arrays_peak_bytes()
    assert 0 < arrays <= 2 * (2 * module + 4096), f"arrays {arrays} bytes at once, largest module {module}"
    eng.close()


def test_misuse_is_refused_by_name(tmp_path):
    eng = zoe.initialize(make_model("gpt"), config=config(tmp_path, gas=2))
    data = gpt_batches(6)
    with pytest.raises(zoe.ZoeError, match=r"gathered_parameters\(dtype=torch.int32\)"):
        eng.gathered_parameters(dtype=torch.int32)
    eng.backward(eng(*data[0]))
    with pytest.raises(zoe.ZoeError, match=r"engine.gathered_parameters\(\).*waiting for"):
        eng.gathered_parameters()
    eng.backward(eng(*data[1]))
    eng.step()
    it = eng.gathered_parameters()
    next(it)
    eng.backward(eng(*data[2]))
    with pytest.raises(zoe.ZoeError, match=r"gathered_parameters\(\): the engine ran a micro-batch"):
        next(it)
    eng.backward(eng(*data[3]))
    eng.step()
    assert len(list(eng.gathered_parameters())) == len(list(make_model("gpt").parameters()))
    eng.close()
