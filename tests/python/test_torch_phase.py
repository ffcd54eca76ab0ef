"""zoe's PyTorch front-end: where the training loop stands (zoe/phase.py's one Phase). The
transitions of a training loop, and the engine's calls made from the wrong place (inside the
model's forward or inside engine.backward), each refused with a ZoeError that names the call and
the phase, after which training goes on as if the call had not been made."""
import pytest
import torch

zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

from zoe.phase import Phase, PhaseState  # noqa: E402
from zoe_torch_models import clone, config, gpt_batches, make_model  # noqa: E402


def _raises_inside(ctx):
    with pytest.raises(RuntimeError, match="boom"):
        with ctx:
            raise RuntimeError("boom")


def test_transitions_of_a_training_loop():
    """Two micro-batches per step: forward and backward move the phase and come back to rest;
    a backward that fails before any gradient reached zoe leaves the phase where it was, one
    that fails after breaks it until a checkpoint is loaded."""
    s = PhaseState(accumulation_steps=2)
    assert s.phase is Phase.READY
    with pytest.raises(zoe.ZoeError, match=r"engine\.step\(\) before engine\.backward\(\)"):
        s.check_step()
    with s.forward():
        assert s.phase is Phase.FORWARD and s.in_forward and not s.in_backward
        with pytest.raises(zoe.ZoeError, match=r"^engine\(\.\.\.\): called inside engine\(\.\.\.\) \(the "
                                               r"front-end's phase is 'forward'\)"):
            with s.forward():
                pass
        for call in (s.check_step, lambda: s.require_boundary("engine.save_checkpoint('c')")):
            with pytest.raises(zoe.ZoeError, match="called inside engine\\(\\.\\.\\.\\) .*phase is 'forward'"):
                call()
    assert s.phase is Phase.READY
    with s.backward():
        assert s.phase is Phase.BACKWARD and s.in_backward
        s.gradient_arrived()
        assert s.phase is Phase.REDUCING and s.in_backward
        with pytest.raises(zoe.ZoeError, match=r"^engine\.backward\(\): called inside engine\.backward\(\) "
                                               r"\(the front-end's phase is 'reducing'\)"):
            with s.backward():
                pass
    assert (s.phase, s.micro_steps, s.pending_backward) == (Phase.ACCUMULATED, 1, 1)
    assert not s.at_boundary() and s.check_step() is False  # between boundaries: no update
    with pytest.raises(zoe.ZoeError, match=r"1 micro-batch\(es\) of gradients are waiting for engine\.step\(\)"):
        s.require_boundary("engine.save_checkpoint('c')")
    _raises_inside(s.forward())
    assert s.phase is Phase.ACCUMULATED
    _raises_inside(s.backward())  # no gradient had come: the micro-batch never happened
    assert (s.phase, s.micro_steps, s.pending_backward) == (Phase.ACCUMULATED, 1, 1)
    with s.backward():
        s.gradient_arrived()
    assert s.at_boundary() and s.check_step() is True
    s.stepped()
    assert (s.phase, s.pending_backward, s.global_steps) == (Phase.READY, 0, 1)
    s.require_boundary("engine.save_checkpoint('c')")

    with pytest.raises(RuntimeError, match="boom"):
        with s.backward():
            s.gradient_arrived()
            raise RuntimeError("boom")
    assert s.phase is Phase.BROKEN
    with pytest.raises(zoe.ZoeError, match="the backward of micro-batch 3 failed .* incomplete"):
        s.check_step()
    with s.forward():  # a broken loop may still run forwards (an evaluation, say)
        pass
    assert s.phase is Phase.BROKEN
    s.restored(micro_steps=2, global_steps=1)
    assert (s.phase, s.micro_steps, s.global_steps, s.failed_micro_batch) == (Phase.READY, 2, 1, None)


def _reference_norm(model, x, y):
    model(x, y).backward()
    return torch.norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()


def test_step_inside_the_forward_is_refused_and_loses_nothing(tmp_path):
    """engine.step() from a forward hook of the model, with a micro-batch's gradients waiting:
    refused, naming engine.step() and the phase 'forward'; the step that follows from the
    training loop uses that micro-batch's gradients (its norm is torch's)."""
    model = make_model("gpt")
    ref = clone(model)
    (x, y), (x2, y2) = gpt_batches(2)
    eng = zoe.initialize(model, config=config(tmp_path, clip=0))
    eng.backward(eng(x, y))

    def step_in_forward(module, inputs):
        eng.step()

    hook = model.h[1].register_forward_pre_hook(step_in_forward)
    with pytest.raises(zoe.ZoeError, match=r"engine\.step\(\): called inside engine\(\.\.\.\) \(the front-end's "
                                           r"phase is 'forward'\): call it from the training loop"):
        eng(x2, y2)
    hook.remove()
    assert not any(zm.refs for zm in eng._zmods)
    stats = eng.step()
    norm = _reference_norm(ref, x, y)
    assert stats.stepped and stats.step == 1 and abs(stats.grad_norm - norm) <= 1e-5 * norm, (stats.grad_norm, norm)
    eng.close()


def test_engine_call_inside_the_forward_is_refused(tmp_path):
    """engine(...) from a forward hook of the model: refused before it touches the fetched units
    of the forward that is running; the next forward's loss is torch's."""
    model = make_model("gpt")
    ref = clone(model)
    (x, y), = gpt_batches(1)
    eng = zoe.initialize(model, config=config(tmp_path, clip=0))
    hook = model.h[2].register_forward_pre_hook(lambda m, inputs: eng(x, y))
    with pytest.raises(zoe.ZoeError, match=r"engine\(\.\.\.\): called inside engine\(\.\.\.\) \(the front-end's "
                                           r"phase is 'forward'\)"):
        eng(x, y)
    hook.remove()
    loss = eng(x, y)
    assert abs(loss.item() - ref(x, y).item()) <= 1e-6 * abs(loss.item())
    eng.close()


def test_checkpoint_calls_inside_the_backward_are_refused(tmp_path):
    """engine.load_checkpoint and engine.save_checkpoint from an autograd hook inside
    engine.backward: refused, naming the call and the phase 'backward'."""
    model = make_model("gpt")
    (x, y), = gpt_batches(1)
    eng = zoe.initialize(model, config=config(tmp_path, clip=0))
    eng.backward(eng(x, y))
    eng.step()
    eng.save_checkpoint(tmp_path / "ckpt", tag="one")
    for call, name in ((lambda: eng.load_checkpoint(tmp_path / "ckpt", tag="one"), "load_checkpoint"),
                       (lambda: eng.save_checkpoint(tmp_path / "ckpt", tag="two"), "save_checkpoint")):
        loss = eng(x, y)
        loss.register_hook(lambda g, call=call: call() and None)
        with pytest.raises(zoe.ZoeError, match=rf"engine\.{name}\(.*\): called inside engine\.backward\(\) "
                                               r"\(the front-end's phase is 'backward'\)"):
            eng.backward(loss)
    assert not any(zm.refs for zm in eng._zmods)
    eng.close()
