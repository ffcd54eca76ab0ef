"""Checkpoints and state_dicts of the PyTorch front-end.

engine.save_checkpoint writes zoe's states (wherever they live) through the engine, with the
front-end's own section of the trainer state, "zoe_torch": the counts of the training loop, the
model's parameter names ("<zoe module>.<param>" -> the model's name, tied names), its buffers,
the client_state, and for a transformers model its configs (for `zoe ckpt consolidate --format
hf`). zoe.consolidate reads a checkpoint back as the model's own state_dict. The Hugging Face
folders (engine.save_pretrained, initialize(weights=...)) are hf.py's.
"""
import base64
import io
import json
import math
import os
from collections import OrderedDict

import torch

from . import _zoe, hf
from ._zoe import ZoeError

FORMAT = 1  # of the "zoe_torch" section of a checkpoint's trainer state


def _to_b64(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _from_b64(text):
    return torch.load(io.BytesIO(base64.b64decode(text)), map_location="cpu")


def state_buffers(model):
    """[(key, buffer)] of the buffers model.state_dict() holds: the persistent ones, under every
    name a shared module or buffer has."""
    out = []
    for mn, mod in model.named_modules(remove_duplicate=False):
        for bn, b in mod._buffers.items():
            if b is not None and bn not in mod._non_persistent_buffers_set:
                out.append((f"{mn}.{bn}" if mn else bn, b))
    return out


def _state_buffer_keys(model):
    """{state_dict key of a persistent buffer: its key in model.named_buffers()}."""
    first = {}
    for n, b in model.named_buffers():
        first.setdefault(id(b), n)
    return {n: first[id(b)] for n, b in state_buffers(model) if id(b) in first}


def master_params(engine):
    """{the model's parameter name: full fp32 master tensor} (gathered from every rank; a copy)."""
    out = OrderedDict()
    for zm in engine._layout.zmods:
        for i, (n, s) in enumerate(zip(zm.names, zm.shapes)):
            numel = 1
            for d in s:
                numel *= d
            a = engine._eng.read_master(zm.index, i, numel)
            out[engine._layout.torch_names[f"{zm.name}.{n}"]] = torch.from_numpy(a).view(s)
    return out


def gathered_parameters(engine, dtype=None, rank0_only=False):
    """engine.gathered_parameters: yields (the model's parameter name, full tensor), one parameter
    at a time in the order of model.named_parameters() (a tied parameter once, under the name it
    gives): the current master (fp32), cast to dtype where one is given. An fp32 tensor is a view
    of its zoe module's array, which no other yielded tensor overlaps and zoe does not touch again
    (keeping one keeps that module's array). Each zoe module is read once from wherever zoe holds it (Engine::read_module_master:
    its owned shard, gathered from every rank), so the host memory in use at once is two of the
    largest zoe module in fp32 (the one read, the one whose last tensor the caller still holds):
    it does not grow with the model. Every rank must iterate to the end (the gathers are collectives, in the
    same order on every rank); with rank0_only the other ranks' iterators yield nothing."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ZoeError(f"engine.gathered_parameters(dtype={dtype!r}): dtype must be a floating torch.dtype "
                       "(torch.bfloat16, torch.float16, torch.float32) or None for the fp32 master")
    engine._phase.require_boundary("engine.gathered_parameters()")
    # Each zoe module is read once (Engine::read_module_master), its parameters yielded in the
    # model's order where the model still names them: the zoe modules in the order of their first
    # parameter in model.named_parameters(), the rest after.
    where, modules = {}, []
    for zm in engine._layout.zmods:
        for i, n in enumerate(zm.names):
            where[engine._layout.torch_names[f"{zm.name}.{n}"]] = (zm, i)
    for n, _ in engine.module.named_parameters():
        if n in where and where[n][0] not in modules:
            modules.append(where[n][0])
    modules += [zm for zm in engine._layout.zmods if zm not in modules]
    return _read_each(engine, modules, not rank0_only or engine.rank == 0, dtype)


def _read_each(engine, modules, yields, dtype=None):
    """gathered_parameters' iterator (its checks run when it is called, not at the first next())."""
    phase = engine._phase
    at = (phase.global_steps, phase.micro_steps)
    try:
        yield from _read_modules(engine, modules, yields, dtype, at)
    finally:
        engine._eng.drop_read_arrays()  # the array kept for the next module's read


def _read_modules(engine, modules, yields, dtype, at):
    """Each zoe module read whole (into an array the binding reuses once it is let go), its
    parameters yielded as views of it."""
    phase = engine._phase
    names = engine._layout.torch_names
    for zm in modules:
        if (phase.global_steps, phase.micro_steps) != at:
            raise ZoeError(f"engine.gathered_parameters(): the engine ran a micro-batch or a step while the iterator "
                           f"was open (before {zm.name!r}), so its tensors would mix two steps' weights: take every "
                           "tensor before training on, or call gathered_parameters() again")
        sizes = [math.prod(s) for s in zm.shapes]
        a = engine._eng.read_module_master(zm.index, max(1, sum(sizes)))
        if not yields:
            continue
        flat = torch.from_numpy(a)
        off = 0
        for n, shape, k in zip(zm.names, zm.shapes, sizes):
            t = flat[off:off + k].view(shape)
            off += k
            yield names[f"{zm.name}.{n}"], (t.to(dtype) if dtype is not None and dtype != torch.float32 else t)
            del t  # the module's array goes once the caller lets go of its tensors
        del flat, a


def state_dict(engine):
    """The model's state_dict (engine.state_dict() says what it holds)."""
    sd = master_params(engine)
    for alias, name in engine._layout.aliases.items():
        sd[alias] = sd[name]
    for n, b in state_buffers(engine.module):
        sd[n] = b.detach().to("cpu", copy=True)
    return sd


def save_checkpoint(engine, save_dir, tag, client_state):
    """engine.save_checkpoint: returns the checkpoint directory."""
    phase = engine._phase
    phase.require_boundary(f"engine.save_checkpoint({save_dir!r})")
    tag = tag if tag is not None else f"global_step{phase.global_steps}"
    os.makedirs(save_dir, exist_ok=True)
    model = engine.module
    state = {"zoe_torch": {
        "format": FORMAT,
        "micro_steps": phase.micro_steps,
        "global_steps": phase.global_steps,
        "names": engine._layout.torch_names,
        "aliases": engine._layout.aliases,
        "buffers": _to_b64({n: b.detach().cpu() for n, b in model.named_buffers()}),
        # The state_dict's buffer keys (persistent buffers, every name) -> their key in "buffers".
        "state_buffers": _state_buffer_keys(model),
        "client_state": _to_b64(client_state if client_state is not None else {}),
        "last_stats": engine._last,
    }}
    # For `zoe ckpt consolidate D --format hf`; not of a PEFT model, whose folder would be the
    # wrapper's (base_model.model.* names), loaded by from_pretrained as a random model.
    if hf.is_hf_model(model) and not hf.is_peft_model(model):
        state["zoe_torch"]["hf"] = hf.checkpoint_configs(model)
    engine._eng.save(os.fspath(save_dir), str(tag), json.dumps(state))
    return os.path.join(os.fspath(save_dir), str(tag))


def load_checkpoint(engine, load_dir, tag):
    """engine.load_checkpoint: returns (checkpoint path, client_state)."""
    path = os.fspath(load_dir) if tag is None else os.path.join(os.fspath(load_dir), str(tag))
    engine._phase.require_resting(f"engine.load_checkpoint({path!r})")
    trainer = json.loads(engine._eng.load(path) or "{}")
    zt = trainer.get("zoe_torch")
    if zt is None:
        return path, {}
    if zt.get("format") != FORMAT:
        raise ZoeError(f"engine.load_checkpoint({path!r}): trainer state zoe_torch.format is "
                       f"{zt.get('format')!r}, this zoe reads {FORMAT}")
    if zt.get("names") != engine._layout.torch_names:
        raise ZoeError(f"engine.load_checkpoint({path!r}): the checkpoint's parameters were cut into other "
                       "units than this model's (zoe_torch.names differ)")
    engine._phase.restored(zt["micro_steps"], zt["global_steps"])
    engine._last = zt.get("last_stats", {})
    buffers = _from_b64(zt["buffers"])
    own = dict(engine.module.named_buffers())
    for n, b in buffers.items():
        if n in own:
            own[n].copy_(b)
    return path, _from_b64(zt["client_state"])


def consolidate(checkpoint_dir):
    """A state_dict of full fp32 tensors under the model's own parameter names (tied names
    included) and its persistent buffers as saved, the keys model.state_dict() has, from a save
    directory (its latest) or a checkpoint directory, for model.load_state_dict(strict=True) on a
    plain copy of the model. A checkpoint of `zoe train` gives
    its "<module>.<param>" names."""
    params, trainer_json, _ = _zoe.read_checkpoint(os.fspath(checkpoint_dir))
    trainer = json.loads(trainer_json) if trainer_json else {}
    zt = trainer.get("zoe_torch") if isinstance(trainer, dict) else None
    out = OrderedDict()
    if zt is None:
        for n, a in params.items():
            out[n] = torch.from_numpy(a)
        return out
    names = zt["names"]
    for n, a in params.items():
        if n not in names:
            raise ZoeError(f"zoe.consolidate({checkpoint_dir!r}): parameter {n} of the checkpoint has no entry in "
                           "zoe_torch.names")
        out[names[n]] = torch.from_numpy(a)
    for alias, name in zt["aliases"].items():
        out[alias] = out[name]
    buffers = _from_b64(zt["buffers"])
    # The persistent buffers under the state_dict's keys; a checkpoint written before zoe kept
    # those keys gives every buffer it holds.
    keys = zt.get("state_buffers", {n: n for n in buffers})
    for n, key in keys.items():
        out[n] = buffers[key]
    return out
