"""The first values of the parameters and buffers zoe takes at initialize.

A parameter's values come from weights= (a folder of safetensors, hf.WeightsSource), else from
the model's own tensor, or, for a model built on the meta device, from its unit's initialisation
(materialize: init_fn(module), else reset_parameters() and a transformers model's own
_init_weights). Meta-device parameters become empty CPU parameters first (a meta tensor cannot
take CPU data in place); each gets real storage only while zoe initialises its unit. Meta buffers
become real tensors on the engine's device, and those nothing wrote are initialised by their
module's initializer or refused by name (init_buffers). The engine reads the values through its
initialize callback (ParameterValues), one zoe module at a time, after which the model's copy
goes: zoe holds the parameters.
"""
import contextlib
import math

import numpy as np
import torch
import torch.nn as nn

from . import hf
from . import _zoe
from ._zoe import ZoeError


def unmeta_params(model):
    """Meta-device parameters become empty CPU parameters (shared ones stay shared); returns
    {id(new parameter): its real shape}."""
    meta_shapes = {}
    replaced = {}
    for mod in model.modules():
        for k, p in list(mod._parameters.items()):
            if p is None or p.device.type != "meta":
                continue
            if id(p) not in replaced:
                q = nn.Parameter(torch.empty(0, dtype=p.dtype), requires_grad=p.requires_grad)
                replaced[id(p)] = q
                meta_shapes[id(q)] = tuple(p.shape)
            mod._parameters[k] = replaced[id(p)]
    return meta_shapes


def unmeta_buffers(model, device):
    """Meta-device buffers become tensors on `device` (NaN when floating, zeros otherwise);
    returns [(module, {buffer name: (the tensor put there, its version)})], by which
    _unset_buffer tells a buffer nothing wrote, whatever its dtype."""
    out = []
    for mod in model.modules():
        placed = {}
        for k, b in list(mod._buffers.items()):
            if b is None or b.device.type != "meta":
                continue
            t = (torch.full(b.shape, float("nan"), dtype=b.dtype, device=device) if b.is_floating_point() else
                 torch.zeros(b.shape, dtype=b.dtype, device=device))
            mod._buffers[k] = t
            placed[k] = (t, t._version)
        if placed:
            out.append((mod, placed))
    return out


def _unset_buffer(mod, k, placed):
    """True when buffer k of mod is still the tensor unmeta_buffers put there and nothing wrote
    it since (no in-place write, no replacement), or is floating with a NaN left in it."""
    b = mod._buffers.get(k)
    t, version = placed
    if b is None:
        return False
    if b is t and b._version == version:
        return True
    return b.is_floating_point() and bool(torch.isnan(b).any())


class ParameterValues:
    """The engine's initialize callback: (zoe module mi, parameter pi) -> its values as a flat
    float32 array. A zoe module's values are gathered at its first parameter; an error on the way
    is kept in `failed` (raised once the engine's call returns) and later modules get zeros."""

    def __init__(self, engine, init_fn, source):
        self._engine = engine
        self._layout = engine._layout
        self._init_fn = init_fn
        self._source = source
        self._materialized = set()  # units given storage (a unit's zoe modules come one after the other)
        self._scratch = _UnitScratch()
        self.values = {}
        self.failed = []

    def __call__(self, mi, pi):
        if pi == 0:
            self._gather(self._layout.zmods[mi])
        return self.values[pi]

    def _gather(self, zm):
        values = self.values
        values.clear()
        try:
            if not self.failed and self._source is not None:
                values.update(enumerate(self._source.values(zm)))
            elif not self.failed and zm.unit not in self._materialized and \
                    any(id(p) in self._layout.meta_shapes for p in zm.params):
                self._materialized.add(zm.unit)
                materialize(self._engine, zm.unit, self._init_fn, self._scratch)
        except Exception as e:  # noqa: BLE001 (re-raised by initialize_parameters, as it was)
            self.failed.append(e)
        for i, (p, s) in enumerate(zip(zm.params, zm.shapes)):
            if self.failed:
                values[i] = np.zeros(max(1, int(np.prod(s))), dtype=np.float32)
            elif i not in values:
                values[i] = p.detach().to("cpu", torch.float32).reshape(-1).numpy()
        for p in zm.params:  # the model's copy goes: zoe holds the parameters now
            p.data = self._engine._fetcher.placeholder


def initialize_parameters(engine, init_fn, weights):
    """The engine initialises every zoe module from ParameterValues. weights=: a folder of
    safetensors, checked against the model before anything is read."""
    source = hf.WeightsSource(weights, engine) if weights is not None else None
    values = ParameterValues(engine, init_fn, source)
    engine._eng.initialize(values)
    values.values.clear()
    if source is not None:
        source.close()
    if values.failed:
        raise values.failed[0]


class _UnitScratch:
    """The storage meta-built units are initialised in, one unit at a time: one flat buffer per
    dtype, grown to the largest unit and reused, so that each unit's values land in pages already
    touched (fresh pages cost the kernel's zero-fill, about as much as drawing the values). A
    unit's parameters keep their views until its last zoe module was handed to the engine (a
    unit's zoe modules come one after the other); the next unit's take() reuses the storage."""

    def __init__(self):
        self._flat = {}
        self._used = {}

    def reset(self):
        self._used = {}

    def take(self, shape, dtype):
        n = math.prod(shape)
        if n == 0:
            return torch.empty(shape, dtype=dtype)
        at = self._used.get(dtype, 0)
        flat = self._flat.get(dtype)
        if flat is None or flat.numel() < at + n:
            # Grown (the old buffer stays alive through the views of this unit taken before).
            flat = torch.empty(max(at + n, 2 * flat.numel() if flat is not None else 0), dtype=dtype)
            self._flat[dtype] = flat
            at = 0  # the views taken so far keep the old buffer; this one starts afresh
        self._used[dtype] = at + n
        return flat[at:at + n].view(shape) if shape else flat[at:at + 1].view(())


_FAST_FILL_MIN = 1 << 16  # elements: below it torch's own draw is as quick


def _fast_fill(name, fill, names):
    """Tensor.<name> drawing with zoe's `fill` where it can (see _parallel_random_fills)."""
    base = getattr(torch._C, "TensorBase", None) or torch._C._TensorBase  # torch 1.x: _TensorBase
    torch_own = getattr(base, name)

    def method(self, *args, **kwargs):
        extra = set(kwargs) - set(names) - {"generator"}
        if (kwargs.get("generator") is None and not extra and len(args) <= 2 and self.device.type == "cpu" and
                self.dtype == torch.float32 and self.is_contiguous() and self.numel() >= _FAST_FILL_MIN and
                type(self) in (torch.Tensor, nn.Parameter)):
            lo, hi = (float(args[i]) if i < len(args) else float(kwargs.get(n, (0.0, 1.0)[i]))
                      for i, n in enumerate(names))
            seed = int(torch.randint(-2 ** 63, 2 ** 63 - 1, (), dtype=torch.int64)) % 2 ** 64
            fill(self.detach().numpy().reshape(-1), lo, hi, seed)
            return self
        return torch_own(self, *args, **kwargs)

    method.__name__ = name
    return method


@contextlib.contextmanager
def _parallel_random_fills():
    """While a meta-built unit gets its default initialisation (reset_parameters, transformers'
    _init_weights), Tensor.normal_ and Tensor.uniform_ (and so torch.nn.init's normal_, uniform_,
    kaiming_uniform_, xavier_normal_, trunc_normal_, ...) into a contiguous float32 CPU tensor of
    at least 64 Ki elements, with no generator of the caller's, draw with zoe's counter-based
    generator on every core this process may use (zoe.fill_normal/fill_uniform) instead of torch's
    serial one: the same distributions, seeded from torch's default generator (one draw per
    tensor), so torch.manual_seed still fixes every value; the values are not the ones torch's
    generator would give. Other draws go to torch. The two methods are replaced on torch.Tensor for
    the block (process-wide: another thread's draw in that window takes the same rule)."""
    saved = {n: torch.Tensor.__dict__.get(n) for n in ("normal_", "uniform_")}
    torch.Tensor.normal_ = _fast_fill("normal_", _zoe.fill_normal, ("mean", "std"))
    torch.Tensor.uniform_ = _fast_fill("uniform_", _zoe.fill_uniform, ("from", "to"))
    try:
        yield
    finally:
        for n, m in saved.items():
            if m is None:
                delattr(torch.Tensor, n)
            else:
                setattr(torch.Tensor, n, m)


def materialize(engine, ui, init_fn, scratch=None):
    """Gives a meta-device unit real storage on the CPU (in `scratch`, a _UnitScratch, when given)
    and initialises it: init_fn(module) for every submodule when given, else each submodule's
    reset_parameters()."""
    layout = engine._layout
    unit = layout.units[ui]
    zms = [zm for zm in layout.zmods if zm.unit == ui]
    mods = [unit.module] if unit.direct else list(unit.module.modules())
    meta = [(zm, n, p) for zm in zms for n, p in zip(zm.names, zm.params) if id(p) in layout.meta_shapes]
    if scratch is not None:
        scratch.reset()
    for zm in zms:
        for p, shape in zip(zm.params, zm.shapes):
            # NaN until an initializer writes it: a parameter nothing initialises is found below.
            if scratch is not None and p.is_floating_point():
                p.data = scratch.take(tuple(shape), p.dtype).fill_(float("nan"))
            else:
                p.data = torch.full(shape, float("nan"), dtype=p.dtype)
    hf_init = hf.init_weights_fn(engine.module) if init_fn is None else None
    # A caller's init_fn draws with torch's generator, as it would without zoe.
    fills = _parallel_random_fills() if init_fn is None else contextlib.nullcontext()
    with _scratch_params(layout, mods), fills:
        for m in mods:
            with _naming_module(engine.module, m, init_fn):
                if init_fn is not None:
                    init_fn(m)
                elif hf_init is not None:  # a transformers model: its own _init_weights, as from_config runs it
                    _hf_then_reset(m, hf_init)
                elif hasattr(m, "reset_parameters"):
                    m.reset_parameters()
    for zm, n, p in meta:
        if p.is_floating_point() and _has_nan(p.data):
            how = "init_fn left it (or part of it) unset" if init_fn is not None else \
                "no reset_parameters() of its module covers it"
            raise ZoeError(f"zoe.initialize: parameter '{layout.torch_names[f'{zm.name}.{n}']}' was built on "
                           f"the meta device and nothing gave it values ({how}): pass "
                           "init_fn=lambda module: ... that initialises every parameter of a module, or "
                           "build the model on the CPU")


def _has_nan(t):
    # A sum is NaN where an element is (or where infinities cancel: the exact test decides).
    return not bool(torch.isfinite(t.sum())) and bool(torch.isnan(t).any())


def _hf_then_reset(m, hf_init):
    """transformers' from_config runs every module's reset_parameters() and then _init_weights,
    which overwrites what it covers. The same values' distribution at half the draws where
    _init_weights covers a module's own parameters: _init_weights first; reset_parameters (then
    _init_weights again, in from_config's order) only where a parameter of the module is still
    unset (NaN) after it, where the module has none of its own (its reset_parameters may set its
    children's), or where it has buffers (a BatchNorm's reset_parameters() resets its running
    statistics, which _init_weights may leave alone)."""
    own = [p for p in m._parameters.values() if p is not None and p.numel() > 0 and p.device.type != "meta"]
    if not hasattr(m, "reset_parameters") or any(b is not None for b in m._buffers.values()):
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
        hf_init(m)
        return
    hf_init(m)
    if own and not any(p.is_floating_point() and _has_nan(p.data) for p in own):
        return
    m.reset_parameters()
    hf_init(m)


def init_buffers(engine, meta_buffers, init_fn):
    """The meta-device buffers that neither weights= nor a unit's initialisation wrote, of any
    dtype (a floating one NaN still, or any one never written since it left the meta device:
    a non-persistent position_ids, embed_scale or inv_freq, which no folder holds): their
    module's init_fn(module), else transformers' _init_weights, else reset_running_stats(),
    its other buffers kept as they were; a buffer left unset is refused by name. The module's
    parameters are held by zoe by now:
    the initializer sees meta stand-ins of their shapes, and what it writes there is dropped."""
    hf_init = hf.init_weights_fn(engine.module) if init_fn is None else None
    for mod, placed in meta_buffers:
        unset = [k for k, at in placed.items() if _unset_buffer(mod, k, at)]
        if not unset:
            continue
        # The module's buffers that have their values (from weights=, say) keep them: the
        # initializer is run for the unset ones only.
        keep = {k: b.detach().clone() for k, b in mod._buffers.items() if b is not None and k not in unset}
        with _scratch_params(engine._layout, [mod], recurse=True), _naming_module(engine.module, mod, init_fn):
            if init_fn is not None:
                init_fn(mod)
            elif hf_init is not None:
                hf_init(mod)
            elif hasattr(mod, "reset_running_stats"):
                mod.reset_running_stats()
        _put_back(mod, keep)
        for k in unset:
            if _unset_buffer(mod, k, placed[k]):
                _refuse_unset_buffer(engine.module, mod, k)


def _put_back(mod, keep):
    """The buffers an initializer of the unset ones overwrote get their kept values back."""
    with torch.no_grad():
        for k, v in keep.items():
            b = mod._buffers.get(k)
            if b is not None and b.shape == v.shape and b.dtype == v.dtype:
                b.copy_(v)
            else:
                mod._buffers[k] = v


def _refuse_unset_buffer(model, mod, k):
    b = mod._buffers[k]
    kind = "non-persistent" if k in mod._non_persistent_buffers_set else "persistent"
    raise ZoeError(f"zoe.initialize: buffer '{_module_name(model, mod, k)}' ({kind}, {b.dtype}, shape "
                   f"{list(b.shape)}) was built on the meta device and nothing gave it values: "
                   "pass init_fn=lambda module: ... that sets it"
                   + (", or weights= a folder holding it" if kind == "persistent" else
                      " (a non-persistent buffer is in no weights folder)")
                   + ", or build the model on the CPU")


def _module_name(model, mod, leaf=None):
    name = next((n for n, m in model.named_modules() if m is mod), "?")
    if leaf is None:
        return name or "(the model itself)"
    return f"{name}.{leaf}" if name else leaf


@contextlib.contextmanager
def _naming_module(model, mod, init_fn):
    """An exception of an initializer gets a note naming the module it ran on and what to do."""
    try:
        yield
    except ZoeError:
        raise
    except Exception as e:
        if hasattr(e, "add_note"):
            who = "init_fn" if init_fn is not None else "its reset_parameters() or transformers' _init_weights"
            e.add_note(f"zoe.initialize: raised by {who} on module '{_module_name(model, mod)}' "
                       f"({type(mod).__name__}) of the meta-built model: pass init_fn=lambda module: ... that "
                       "initialises it, or weights= a folder holding its tensors, or build the model on the CPU")
        raise


@contextlib.contextmanager
def _scratch_params(layout, mods, recurse=False):
    """While an initializer runs on `mods`, each of their parameters with no storage here (held
    by zoe, or its unit not initialised yet: a tied weight's other module) is a meta-device
    stand-in of its real shape, which in-place initialisation accepts and drops; the
    parameters are put back afterwards."""
    swapped = []
    try:
        for m in mods:
            for sub in (m.modules() if recurse else [m]):
                for k, p in list(sub._parameters.items()):
                    loc = layout.owner.get(id(p)) if p is not None else None
                    if loc is None or p.numel() > 0:
                        continue
                    shape = layout.zmods[loc[0]].shapes[loc[1]]
                    sub._parameters[k] = nn.Parameter(torch.empty(shape, dtype=p.dtype, device="meta"),
                                                      requires_grad=p.requires_grad)
                    swapped.append((sub, k, p))
        yield
    finally:
        for sub, k, p in reversed(swapped):
            sub._parameters[k] = p
