"""zoe's PyTorch front-end: a torch.nn.Module trained by zoe's engine, DeepSpeed style.

Each unit (see units.py) is one zoe module, or two when some of its parameters have
requires_grad=False at initialize: those go into a frozen zoe module ("<unit>[frozen]", or the unit's
own name when all are frozen) that holds only the parameters, with no fp32 master, Adam m/v or
gradient buffer in any tier; the unit fetches both. Its parameters live in zoe (device, host or NVMe as
configured); torch sees empty placeholders, except while the unit runs:
- forward: a pre-hook fetches the unit and points each parameter's .data at zoe's gathered buffer
  (the compute dtype, no copy); a post-hook releases it and wraps the outputs in _UnitEdge;
- backward: _UnitEdge's backward re-fetches the unit before autograd reaches its ops. Saved
  tensors that are (views of) parameters are packed as (parameter, view geometry) and rebuilt on
  unpack from the re-fetched buffer, so autograd never reads memory zoe has handed back;
- gradients: a post-hook on each parameter's AccumulateGrad node copies the gradient into zoe's
  buffer and drops torch's copy; when every gradient of a zoe module is in, reduce_grads runs and
  the module is released. engine.backward() finishes the modules whose gradients were partial.
A parameter shared by several units (tied embeddings) belongs to the first; the others fetch its
zoe module too, and a unit used several times per forward is fetched each time (reference counts).

Devices: with zoe.device "cuda" the engine's buffers are CUDA memory, wrapped without a copy
through __cuda_array_interface__ (_as_tensor); the model's inputs and buffers live there too
(engine.device). torch's kernels run on its current stream: before a buffer goes back to zoe
(release, reduce_grads, step) that stream is synchronized, as include/zoe/engine.h requires.
In a CUDA backward, torch's autograd runs the hooks (and so these engine calls) on its thread for
the device while the caller's thread waits in backward(): the calls stay one at a time.

Activation checkpointing (torch.utils.checkpoint, transformers' gradient_checkpointing_enable):
with zoe.activation_offload cpu or nvme, the same pack hook sends the tensors a checkpoint region
keeps for its backward (its inputs) to zoe's activation store, and the unpack loads them back;
activations.py says which tensors go and which stay. The store's micro-batch ends with each
backward.
"""
import base64
import contextlib
import io
import json
import os
import sys
import weakref
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn

from . import _zoe, hf
from ._zoe import ZoeError
from .activations import ActivationOffload, SavedActivation
from .units import partition

_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_FORMAT = 1  # of the "zoe_torch" section of a checkpoint's trainer state


class StepStats:
    """What engine.step() returns. stepped: False between gradient-accumulation boundaries (no
    update ran: the other fields are those of the last update, high_water the current marks)."""

    def __init__(self, d, stepped):
        self.stepped = stepped
        self.step = d.get("step", 0)
        self.skipped = d.get("skipped", False)
        self.grad_norm = d.get("grad_norm", None)
        self.loss_scale = d.get("loss_scale", 1.0)
        self.lr = d.get("lr", None)
        self.high_water = dict(d.get("high_water", {"device": 0, "host": 0, "nvme": 0}))
        self.times = {k: v for k, v in d.items() if k.startswith("t_")}
        self.bytes = {k: v for k, v in d.items() if k.startswith("bytes_")}
        # Every StepStats field by name (include/zoe/step_stats.h declares them once); each is also
        # an attribute (stats.speculative_kept, stats.per_param_nvme_read, ...).
        self.fields = dict(d)

    def __getattr__(self, name):
        fields = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        raise AttributeError(f"StepStats has no field {name!r}")

    def __repr__(self):
        return (f"StepStats(stepped={self.stepped}, step={self.step}, skipped={self.skipped}, "
                f"grad_norm={self.grad_norm}, loss_scale={self.loss_scale}, lr={self.lr}, "
                f"high_water={self.high_water})")


class _SavedParam:
    """A saved tensor that was a view of zoe parameter (zmod, index): rebuilt at unpack."""

    __slots__ = ("zm", "p", "offset", "size", "stride")

    def __init__(self, zm, p, offset, size, stride):
        self.zm, self.p, self.offset, self.size, self.stride = zm, p, offset, size, stride


class _UnitEdge(torch.autograd.Function):
    """Identity on tensors at a unit's edge; its backward tells the engine `event` for the unit:
    on its outputs "_pre_backward" (fetch the unit before autograd enters it), on its inputs
    "_post_backward" (the unit's backward has run: its frozen modules can go)."""

    @staticmethod
    def forward(ctx, engine_ref, unit_index, event, *tensors):
        ctx.engine_ref = engine_ref
        ctx.unit_index = unit_index
        ctx.event = event
        return tuple(t.detach() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        eng = ctx.engine_ref()
        if eng is not None:
            getattr(eng, ctx.event)(ctx.unit_index)
        return (None, None, None) + grads


class _ZMod:
    """One zoe module: a unit's own parameters that require grad, or (frozen) those that do not."""

    def __init__(self, index, name, params, names, shapes, unit, frozen=False):
        self.index = index
        self.name = name
        self.unit = unit              # index of the unit that owns it
        self.frozen = frozen          # a frozen zoe module: parameters only, no states or gradients
        self.params = params          # torch Parameters, registration order
        self.names = names            # their names relative to the unit
        self.shapes = shapes
        self.refs = 0                 # fetch reference count (forward uses, backward hold)
        self.bw_held = False          # fetched for backward until its gradients are in
        self.flat = None              # current flat torch views of the fetched buffers
        self.cache_key = None         # the pointers `flat` was built from
        self.grad_views = None        # this micro-batch's gradient buffers (torch views)
        self.received = set()         # parameter indices whose gradient is in grad_views
        self.n_grad = sum(1 for p in params if p.requires_grad)


def _load_config(config):
    if isinstance(config, dict):
        return json.dumps(config)
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        try:
            with open(path, "r", encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise ZoeError(f"zoe.initialize: cannot read config file {path}: {e.strerror} (errno {e.errno})") from None
    raise ZoeError(f"zoe.initialize: config must be a dict or a path to a JSON file, got {type(config).__name__}")


def _to_b64(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _from_b64(text):
    return torch.load(io.BytesIO(base64.b64decode(text)), map_location="cpu")


def _as_tensor(view, dtype, device):
    """One engine buffer as a flat torch tensor over the same memory (no copy): a NumPy array
    (host memory, the CPU device) through torch.from_numpy, a _zoe.DeviceView (CUDA memory)
    through its __cuda_array_interface__ on `device`. bf16 comes as int16 and is viewed as dtype."""
    if isinstance(view, np.ndarray):
        t = torch.from_numpy(view)
    else:
        t = torch.as_tensor(view, device=device)
        if t.data_ptr() != view.ptr:
            raise ZoeError(f"zoe: the engine's buffer at {view.ptr:#x} came to torch as a copy on {t.device} "
                           f"(engine device {device}): zoe's buffers must be wrapped in place")
    if dtype is torch.bfloat16:
        t = t.view(torch.bfloat16)
    return t


def _view_ptr(view):
    """The address of an engine buffer (a NumPy array or a _zoe.DeviceView)."""
    return view.__array_interface__["data"][0] if isinstance(view, np.ndarray) else view.ptr


class Engine:
    """The wrapped model (engine.module) and zoe's engine under it. Made by zoe.initialize()."""

    def __init__(self, model, config, zoe_units=None, unit_params=None, init_fn=None, force_local=False,
                 weights=None):
        if not isinstance(model, nn.Module):
            raise ZoeError(f"zoe.initialize: model must be a torch.nn.Module, got {type(model).__module__}."
                           f"{type(model).__name__}")
        text = _load_config(config)
        if not force_local:
            _zoe.check_launcher()  # torchrun's variables without mpirun/srun: refused before MPI starts
        self._eng = _zoe.Engine(text, force_local)
        self.module = model
        self.rank = self._eng.rank
        self.world_size = self._eng.world_size
        _check_launcher(self.world_size, force_local)
        self.device = self._engine_device()
        self.gradient_accumulation_steps = self._eng.gradient_accumulation_steps()
        self._micro_steps = 0        # backward() calls so far
        self._pending_backward = 0   # backward() calls since the last update
        self._global_steps = 0       # engine.step() calls that reached a boundary
        self._last = {}
        self._hooks = []
        self._grad_accs = []
        self._live = {}              # data_ptr of a fetched parameter buffer -> (zmod, param index)
        self._in_forward = False
        self._in_backward = False    # inside engine.backward (a reentrant checkpoint recomputes there)
        self._grads_arrived = False  # a gradient reached zoe in the current engine.backward
        self._partial_grads = None   # the micro-batch whose backward failed after gradients arrived
        self._check_model(model)
        self._build(model, zoe_units, unit_params, init_fn, weights)
        self._acts = ActivationOffload(self._eng.activations(), self.device, self._sync,
                                       self.config_value("zoe.activation_min_bytes"))

    # ---------------------------------------------------------------------------------------
    # Setup


    def config_value(self, key):
        """The value of any config key by its JSON path ("zero_optimization.stage",
        "optimizer.params.lr"), as the engine uses it: defaults filled in, DeepSpeed's "auto"
        resolved. Raises ZoeError naming the key when there is no such key."""
        return json.loads(self._eng.config_value(key))

    def _engine_device(self):
        """Where the engine computes, as a torch.device: the CPU, or the GPU the engine picks with
        zoe.device "cuda" (local rank modulo the GPUs seen; _build checks it against the first
        buffer fetched)."""
        if self._eng.device() != "cuda":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise ZoeError("zoe.initialize: zoe.device is \"cuda\" but torch sees no GPU "
                           f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}): install a CUDA "
                           "build of torch, or set zoe.device to \"cpu\"")
        return torch.device("cuda", self._eng.local_rank % torch.cuda.device_count())

    def _sync(self):
        """Waits for torch's kernels on the engine's device (its current stream) before a buffer
        goes back to zoe: include/zoe/engine.h's contract for device memory. Nothing on the CPU."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _check_model(self, model):
        """Refuses parameters zoe cannot take as they are: on a device other than the CPU or meta,
        or in a floating dtype that is neither fp32 nor the compute dtype the config chooses."""
        compute = _DTYPES[self._eng.compute_dtype()]
        for n, p in model.named_parameters():
            if p.device.type not in ("cpu", "meta"):
                raise ZoeError(f"zoe.initialize: parameter '{n}' is on {p.device}: give zoe the model on the CPU "
                               "(or built on the meta device); zoe places every parameter itself "
                               "(zero_optimization.offload_param, zoe.device)")
            if p.is_floating_point() and p.dtype not in (torch.float32, compute):
                raise ZoeError(f"zoe.initialize: parameter '{n}' is {p.dtype}, and zoe computes in {compute} with "
                               "fp32 master weights: give zoe the model in torch.float32 and choose the compute "
                               "dtype in the config (fp16.enabled or bf16.enabled)")

    def _build(self, model, zoe_units, unit_params, init_fn, weights=None):
        # Meta-device parameters become empty CPU parameters (a meta tensor cannot take CPU data in
        # place); each gets real storage only while zoe initialises its unit (_materialize).
        self._meta_shapes = {}
        replaced = {}
        for mod in model.modules():
            for k, p in list(mod._parameters.items()):
                if p is None or p.device.type != "meta":
                    continue
                if id(p) not in replaced:
                    q = nn.Parameter(torch.empty(0, dtype=p.dtype), requires_grad=p.requires_grad)
                    replaced[id(p)] = q
                    self._meta_shapes[id(q)] = tuple(p.shape)
                mod._parameters[k] = replaced[id(p)]
        del replaced
        meta_buffers = _unmeta_buffers(model, self.device)
        self._units = partition(model, zoe_units, unit_params)
        owner = {}  # id(param) -> (zmod index, param index)
        self._zmods = []
        self._torch_names = {}  # "<zoe module>.<param>" -> the model's own parameter name
        full_names = {}
        for mn, mod in model.named_modules(remove_duplicate=False):
            for pn, p in mod._parameters.items():
                if p is not None:
                    full_names.setdefault(id(p), []).append(f"{mn}.{pn}" if mn else pn)
        for ui, u in enumerate(self._units):
            # A unit's own parameters: those that require grad in one zoe module, the others
            # (requires_grad=False at initialize) in a frozen one, which holds no optimizer states
            # and no gradients in any tier.
            own = [(n, p) for n, p in u.named_parameters() if id(p) not in owner]
            trained = [(n, p) for n, p in own if p.requires_grad]
            frozen = [(n, p) for n, p in own if not p.requires_grad]
            for group, is_frozen in ((trained, False), (frozen, True)):
                if not group:
                    continue
                name = u.name + "[frozen]" if is_frozen and trained else u.name
                zm = _ZMod(len(self._zmods), name, [p for _, p in group], [n for n, _ in group],
                           [self._meta_shapes.get(id(p), tuple(p.shape)) for _, p in group], ui, is_frozen)
                for i, (n, p) in enumerate(group):
                    owner[id(p)] = (zm.index, i)
                    self._torch_names[f"{zm.name}.{n}"] = full_names[id(p)][0]
                self._zmods.append(zm)
            fetch = []
            for _, p in u.named_parameters():
                zi = owner[id(p)][0]
                if zi not in fetch:
                    fetch.append(zi)
            u.zmods = fetch
        self._owner = owner
        # Tied names: every further name of a shared parameter -> its first name.
        self._aliases = {n: names[0] for names in full_names.values() for n in names[1:]}
        # A unit that holds only its module's own parameters (the root's, or a module cut open)
        # stays fetched while the units inside it run: the engine keeps room for it beside them.
        unit_mods = {id(u.module) for u in self._units}
        held_units = {ui for ui, u in enumerate(self._units)
                      if u.direct and any(id(m) in unit_mods for m in u.module.modules() if m is not u.module)}
        # So does a zoe module that several units use (an embedding tied to the head): fetched in
        # the backward from the head's gradient to the embedding's, its gradients open all along.
        shared = {zi for zi in range(len(self._zmods)) if sum(zi in u.zmods for u in self._units) > 1}
        for zm in self._zmods:
            specs = [(n, list(s) if len(s) else [1]) for n, s in zip(zm.names, zm.shapes)]
            held = zm.index in shared or any(zm.index in self._units[ui].zmods for ui in held_units)
            self._eng.add_module(zm.name, specs, zm.frozen, held)
        self._dtype = _DTYPES[self._eng.compute_dtype()]
        # Released parameters point at a 0-element tensor of the compute dtype on the engine's
        # device: torch drops a parameter's AccumulateGrad node (and the hook zoe put on it) when
        # .data changes dtype or device, so neither changes between a fetch and a release.
        self._placeholder = torch.empty(0, dtype=self._dtype, device=self.device)
        if self.device.type != "cpu":
            # The model's buffers (running statistics, ...) go where its forward runs.
            for mod in model.modules():
                for k, b in mod._buffers.items():
                    if b is not None and b.device.type == "cpu":
                        mod._buffers[k] = b.to(self.device)

        values = {}
        failed = []  # an error of the callback: raised here, after the engine's call returns
        materialized = set()  # units given storage (a unit's zoe modules come one after the other)
        # weights=: a folder of safetensors, checked against the model before anything is read.
        source = hf.WeightsSource(weights, self) if weights is not None else None

        def init(mi, pi):
            if pi == 0:
                values.clear()
                zm = self._zmods[mi]
                try:
                    if not failed and source is not None:
                        values.update(enumerate(source.values(zm)))
                    elif not failed and zm.unit not in materialized and \
                            any(id(p) in self._meta_shapes for p in zm.params):
                        materialized.add(zm.unit)
                        self._materialize(zm.unit, init_fn)
                except Exception as e:  # noqa: BLE001 (re-raised below, as it was)
                    failed.append(e)
                for i, (p, s) in enumerate(zip(zm.params, zm.shapes)):
                    if failed:
                        values[i] = np.zeros(max(1, int(np.prod(s))), dtype=np.float32)
                    elif i not in values:
                        values[i] = p.detach().to("cpu", torch.float32).reshape(-1).numpy()
                for p in zm.params:  # the model's copy goes: zoe holds the parameters now
                    p.data = self._placeholder
            return values[pi]

        self._eng.initialize(init)
        values.clear()
        if source is not None:
            source.close()
        if failed:
            raise failed[0]
        self._init_buffers(meta_buffers, init_fn)
        # AccumulateGrad post-hooks, created while each parameter has its real shape and dtype (the
        # node records them and checks every gradient against them); the nodes are kept alive.
        with torch.enable_grad():
            for zm in self._zmods:
                self._acquire(zm)
                if zm.flat and zm.flat[0].device != self.device:
                    raise ZoeError(f"zoe.initialize: the engine's buffers are on {zm.flat[0].device}, the front-end "
                                   f"expected {self.device} (zoe.device {self._eng.device()!r}, local rank "
                                   f"{self._eng.local_rank})")
                for i, p in enumerate(zm.params):
                    if p.requires_grad:
                        acc = p.expand_as(p).grad_fn.next_functions[0][0]
                        acc.register_hook(self._make_grad_hook(zm, i))
                        self._grad_accs.append(acc)
                self._release(zm)
        ref = weakref.ref(self)
        for ui, u in enumerate(self._units):
            if not u.zmods:
                continue
            self._hooks.append(u.module.register_forward_pre_hook(_pre_hook(ref, ui)))
            self._hooks.append(u.module.register_forward_hook(_post_hook(ref, ui)))
        # The model's own state_dict would hold the 0-element placeholders: it points here instead.
        for mod in model.modules():
            if any(p is not None and id(p) in owner for p in mod._parameters.values()):
                self._hooks.append(mod._register_state_dict_hook(_state_dict_refused))

    def _materialize(self, ui, init_fn):
        """Gives a meta-device unit real storage on the CPU and initialises it: init_fn(module) for
        every submodule when given, else each submodule's reset_parameters()."""
        unit = self._units[ui]
        zms = [zm for zm in self._zmods if zm.unit == ui]
        mods = [unit.module] if unit.direct else list(unit.module.modules())
        meta = [(zm, n, p) for zm in zms for n, p in zip(zm.names, zm.params) if id(p) in self._meta_shapes]
        for zm in zms:
            for p, shape in zip(zm.params, zm.shapes):
                # NaN until an initializer writes it: a parameter nothing initialises is found below.
                p.data = torch.full(shape, float("nan"), dtype=p.dtype)
        hf_init = hf.init_weights_fn(self.module) if init_fn is None else None
        with self._scratch_params(mods):
            for m in mods:
                with self._naming_module(m, init_fn):
                    if init_fn is not None:
                        init_fn(m)
                    elif hasattr(m, "reset_parameters"):
                        m.reset_parameters()
                    if hf_init is not None:  # a transformers model: its own _init_weights, as from_config runs it
                        hf_init(m)
        for zm, n, p in meta:
            if p.is_floating_point() and bool(torch.isnan(p.data).any()):
                how = "init_fn left it (or part of it) unset" if init_fn is not None else \
                    "no reset_parameters() of its module covers it"
                raise ZoeError(f"zoe.initialize: parameter '{self._torch_names[f'{zm.name}.{n}']}' was built on "
                               f"the meta device and nothing gave it values ({how}): pass "
                               "init_fn=lambda module: ... that initialises every parameter of a module, or "
                               "build the model on the CPU")

    def _init_buffers(self, meta_buffers, init_fn):
        """The meta-device buffers that neither weights= nor a unit's initialisation wrote, of any
        dtype (a floating one NaN still, or any one never written since it left the meta device:
        a non-persistent position_ids, embed_scale or inv_freq, which no folder holds): their
        module's init_fn(module), else transformers' _init_weights, else reset_running_stats(),
        its other buffers kept as they were; a buffer left unset is refused by name. The module's
        parameters are held by zoe by now:
        the initializer sees meta stand-ins of their shapes, and what it writes there is dropped."""
        hf_init = hf.init_weights_fn(self.module) if init_fn is None else None
        for mod, placed in meta_buffers:
            unset = [k for k, at in placed.items() if _unset_buffer(mod, k, at)]
            if not unset:
                continue
            # The module's buffers that have their values (from weights=, say) keep them: the
            # initializer is run for the unset ones only.
            keep = {k: b.detach().clone() for k, b in mod._buffers.items() if b is not None and k not in unset}
            with self._scratch_params([mod], recurse=True), self._naming_module(mod, init_fn):
                if init_fn is not None:
                    init_fn(mod)
                elif hf_init is not None:
                    hf_init(mod)
                elif hasattr(mod, "reset_running_stats"):
                    mod.reset_running_stats()
            with torch.no_grad():
                for k, v in keep.items():
                    b = mod._buffers.get(k)
                    if b is not None and b.shape == v.shape and b.dtype == v.dtype:
                        b.copy_(v)
                    else:
                        mod._buffers[k] = v
            for k in unset:
                if _unset_buffer(mod, k, placed[k]):
                    b = mod._buffers[k]
                    kind = "non-persistent" if k in mod._non_persistent_buffers_set else "persistent"
                    raise ZoeError(f"zoe.initialize: buffer '{self._module_name(mod, k)}' ({kind}, {b.dtype}, shape "
                                   f"{list(b.shape)}) was built on the meta device and nothing gave it values: "
                                   "pass init_fn=lambda module: ... that sets it"
                                   + (", or weights= a folder holding it" if kind == "persistent" else
                                      " (a non-persistent buffer is in no weights folder)")
                                   + ", or build the model on the CPU")

    def _module_name(self, mod, leaf=None):
        name = next((n for n, m in self.module.named_modules() if m is mod), "?")
        if leaf is None:
            return name or "(the model itself)"
        return f"{name}.{leaf}" if name else leaf

    @contextlib.contextmanager
    def _naming_module(self, mod, init_fn):
        """An exception of an initializer gets a note naming the module it ran on and what to do."""
        try:
            yield
        except ZoeError:
            raise
        except Exception as e:
            if hasattr(e, "add_note"):
                who = "init_fn" if init_fn is not None else "its reset_parameters() or transformers' _init_weights"
                e.add_note(f"zoe.initialize: raised by {who} on module '{self._module_name(mod)}' "
                           f"({type(mod).__name__}) of the meta-built model: pass init_fn=lambda module: ... that "
                           "initialises it, or weights= a folder holding its tensors, or build the model on the CPU")
            raise

    @contextlib.contextmanager
    def _scratch_params(self, mods, recurse=False):
        """While an initializer runs on `mods`, each of their parameters with no storage here (held
        by zoe, or its unit not initialised yet: a tied weight's other module) is a meta-device
        stand-in of its real shape, which in-place initialisation accepts and drops; the
        parameters are put back afterwards."""
        swapped = []
        try:
            for m in mods:
                for sub in (m.modules() if recurse else [m]):
                    for k, p in list(sub._parameters.items()):
                        loc = self._owner.get(id(p)) if p is not None else None
                        if loc is None or p.numel() > 0:
                            continue
                        shape = self._zmods[loc[0]].shapes[loc[1]]
                        sub._parameters[k] = nn.Parameter(torch.empty(shape, dtype=p.dtype, device="meta"),
                                                          requires_grad=p.requires_grad)
                        swapped.append((sub, k, p))
            yield
        finally:
            for sub, k, p in reversed(swapped):
                sub._parameters[k] = p

    # ---------------------------------------------------------------------------------------
    # Fetch / release

    def _acquire(self, zm):
        zm.refs += 1
        if zm.refs > 1:
            return
        try:
            arrays = self._eng.fetch(zm.index)
        except BaseException:
            zm.refs -= 1  # not fetched: nothing to release
            raise
        key = tuple(_view_ptr(a) for a in arrays)
        if torch.is_inference_mode_enabled():
            # The views are kept (zm.flat) and used by later training steps: no inference tensors.
            with torch.inference_mode(False):
                self._point_params(zm, arrays, key)
        else:
            self._point_params(zm, arrays, key)

    def _point_params(self, zm, arrays, key):
        """Points zm's parameters at the fetched buffers (torch views of them, cached by address)."""
        if key != zm.cache_key:
            zm.flat = [_as_tensor(a, self._dtype, self.device) for a in arrays]
            zm.cache_key = key
        for i, (p, t, s) in enumerate(zip(zm.params, zm.flat, zm.shapes)):
            p.data = t.view(s) if s else t.view(())
            self._live[zm.cache_key[i]] = (zm.index, i)

    def _release(self, zm):
        zm.refs -= 1
        if zm.refs > 0:
            return
        for ptr in zm.cache_key:
            self._live.pop(ptr, None)
        for p in zm.params:
            p.data = self._placeholder
        self._sync()
        self._eng.release(zm.index)

    def _pre_forward(self, ui, inputs=()):
        if not (self._in_forward or self._in_backward or not torch.is_grad_enabled()):
            # Inference (torch.no_grad(), torch.inference_mode(), model.generate()) may call the
            # model directly: no gradient and no saved tensor outlives the call, so fetching and
            # releasing each unit around its forward is all it needs. A training forward may not.
            raise ZoeError(f"zoe: the model's unit '{self._units[ui].name}' was called directly after "
                           "zoe.initialize() with gradients enabled: its parameters live in zoe, which trains "
                           "it only through the engine: call engine(...) (engine.module is the model) instead "
                           "of the model (inference under torch.no_grad() may call the model itself, "
                           "engine.module.generate(...) too)")
        for zi in self._units[ui].zmods:
            for p in self._zmods[zi].params:
                if p.dtype != self._dtype or p.device != self.device:
                    raise ZoeError(f"zoe: a parameter of unit '{self._units[ui].name}' is now {p.dtype} on "
                                   f"{p.device} (model.to(...) after zoe.initialize()), but zoe computes in "
                                   f"{self._dtype} on its own device: choose the compute dtype in the config "
                                   "(fp16.enabled or bf16.enabled) and the placement with zero_optimization "
                                   "and zoe.device, not with model.to()")
        if self._in_backward:
            # A recompute (activation checkpointing) inside the backward: the unit is held for the
            # backward, released when its gradients are in, as _pre_backward holds it. torch 2's
            # non-reentrant checkpoint may stop a recompute part-way (no forward hook then), so
            # nothing here waits for _post_forward.
            self._pre_backward(ui)
        else:
            for zi in self._units[ui].zmods:
                self._acquire(self._zmods[zi])
        if torch.is_grad_enabled() and any(self._zmods[zi].n_grad == 0 for zi in self._units[ui].zmods):
            return _wrap_inputs(weakref.ref(self), ui, inputs)
        return None

    def _post_backward(self, ui):
        """The unit's backward has run: its modules with no gradient to wait for go."""
        for zi in self._units[ui].zmods:
            zm = self._zmods[zi]
            if zm.n_grad == 0 and zm.bw_held:
                zm.bw_held = False
                self._release(zm)

    def _post_forward(self, ui, output):
        if not self._in_backward:  # a recompute's hold is the backward's (_pre_forward)
            for zi in self._units[ui].zmods:
                self._release(self._zmods[zi])
        if not torch.is_grad_enabled():
            return output
        return _wrap_outputs(weakref.ref(self), ui, output)

    def _pre_backward(self, ui):
        for zi in self._units[ui].zmods:
            zm = self._zmods[zi]
            if not zm.bw_held:
                zm.bw_held = True
                self._acquire(zm)

    # Saved tensors: parameters and their views travel as descriptors (see the module docstring);
    # a checkpoint region's inputs in a training forward go to the activation store when it offloads.
    def _pack(self, t):
        if t.layout != torch.strided:
            return t
        loc = self._live.get(_storage_ptr(t)) if self._live else None
        if loc is not None:
            return _SavedParam(loc[0], loc[1], t.storage_offset(), t.size(), t.stride())
        if self._acts.enabled and self._in_forward and not self._in_backward:
            return self._acts.pack(t, sys._getframe(1))
        return t

    def _unpack(self, obj):
        if isinstance(obj, SavedActivation):
            return self._acts.unpack(obj)
        if not isinstance(obj, _SavedParam):
            return obj
        zm = self._zmods[obj.zm]
        if zm.refs == 0:  # reached before its unit's boundary (an op outside any unit): fetch now
            zm.bw_held = True
            self._acquire(zm)
        return zm.flat[obj.p].as_strided(obj.size, obj.stride, obj.offset)

    # ---------------------------------------------------------------------------------------
    # Gradients

    def _make_grad_hook(self, zm, i):
        ref = weakref.ref(self)
        p = zm.params[i]

        def hook(grad_inputs, grad_outputs):
            eng = ref()
            g = p.grad
            p.grad = None
            if eng is None or g is None:
                return
            eng._grads_arrived = True
            if zm.grad_views is None:
                zm.grad_views = [_as_tensor(a, eng._dtype, eng.device) for a in eng._eng.grads(zm.index)]
            dst = zm.grad_views[i].view(g.shape)
            if i in zm.received:
                dst.add_(g)
            else:
                dst.copy_(g)
                zm.received.add(i)
            if len(zm.received) == zm.n_grad:
                eng._finish_grads(zm)

        return hook

    def _finish_grads(self, zm):
        if zm.grad_views is not None:
            # The parameters that got no gradient (frozen, or not used in this micro-batch): a
            # step in which none did leaves them as they are, as torch.optim.AdamW does.
            has_grad = [i in zm.received for i in range(len(zm.params))]
            zm.grad_views = None
            zm.received.clear()
            self._sync()
            self._eng.reduce_grads(zm.index, has_grad)
        if zm.bw_held:
            zm.bw_held = False
            self._release(zm)

    # ---------------------------------------------------------------------------------------
    # The training loop

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """Runs the wrapped model's forward (its tensor inputs on engine.device)."""
        self._check_new_params()
        self._check_inputs(args, kwargs)
        if any(zm.refs for zm in self._zmods):
            # Held by a direct inference call of the model that raised (nothing else holds a
            # module between forwards): released before they pile up.
            self._reset_fetches()
        if self._acts.saved:
            # The previous forward's checkpointed inputs, never used by a backward.
            self._acts.end_micro_batch()
        self._in_forward = True
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack), _losses_in_fp32(self._dtype):
                return self.module(*args, **kwargs)
        except ZoeError:
            self._reset_fetches()
            self._end_activations(failing=True)
            raise
        except Exception as e:
            # The user's own error, as it was raised (type and traceback), with where zoe stood.
            self._reset_fetches()
            self._end_activations(failing=True)
            if hasattr(e, "add_note"):
                e.add_note(f"zoe: raised in the forward of {type(self.module).__name__} run by zoe's engine "
                           "(a parameter is only available inside the forward of its unit; units: "
                           f"{', '.join(u.name for u in self._units[:8])}{'...' if len(self._units) > 8 else ''})")
            raise
        finally:
            self._in_forward = False

    def backward(self, loss):
        """loss.backward() with the loss scale (fp16); gradients go to zoe as they are computed."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ZoeError(f"engine.backward: loss must be a one-element tensor, got {_describe(loss)}")
        if not loss.requires_grad:
            raise ZoeError("engine.backward: the loss does not require grad (computed under torch.no_grad(), "
                           "or by no parameter of the model)")
        scale = self._eng.loss_scale()
        self._in_backward = True
        self._grads_arrived = False
        failing = True
        try:
            # The saved-tensor hooks stay on through the backward: a reentrant activation checkpoint
            # recomputes its forward there and must save parameters as descriptors too.
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                (loss * scale if scale != 1.0 else loss).backward()
            failing = False
        finally:
            self._in_backward = False
            if failing and self._grads_arrived:
                self._partial_grads = self._micro_steps + 1
            # Modules whose gradients are partial (a parameter unused this micro-batch), then any
            # fetch an error left.
            for zm in reversed(self._zmods):
                if zm.grad_views is not None or zm.bw_held:
                    self._finish_grads(zm)
            self._end_activations(failing)
        self._micro_steps += 1
        self._pending_backward += 1
        return loss

    def is_gradient_accumulation_boundary(self):
        return self._pending_backward > 0 and self._micro_steps % self.gradient_accumulation_steps == 0

    def step(self):
        """At a gradient-accumulation boundary: norm, clipping and AdamW wherever the states live;
        otherwise nothing (stats.stepped is False)."""
        if self._partial_grads is not None:
            raise ZoeError(f"engine.step(): the backward of micro-batch {self._partial_grads} failed after some of "
                           "its gradients had reached zoe: the gradients are incomplete, so no step is taken; "
                           "resume from a checkpoint (engine.load_checkpoint)")
        if self._pending_backward == 0:
            raise ZoeError("engine.step() before engine.backward(): there are no gradients to step with "
                           f"(micro-batches since the last step: 0, global steps: {self._global_steps})")
        if self._micro_steps % self.gradient_accumulation_steps != 0:
            d = dict(self._last)
            d["high_water"] = self.high_water()
            return StepStats(d, stepped=False)
        self._check_new_params()
        self._sync()
        d = self._eng.step()
        self._pending_backward = 0
        self._global_steps += 1
        self._last = d
        return StepStats(d, stepped=True)

    @property
    def global_steps(self):
        return self._global_steps

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def loss_scale(self):
        return self._eng.loss_scale()

    def compute_dtype(self):
        return self._dtype

    def high_water(self):
        return dict(self._last.get("high_water", {"device": 0, "host": 0, "nvme": 0}))

    def memory_in_use(self):
        return self._eng.memory_in_use()

    def activation_stats(self):
        """The activation store's counters (include/zoe/activations.h's ActivationStats: the last
        micro-batch's checkpoint_bytes and tier_bytes {device, host, nvme}, high-water marks, bytes
        per link, t_stall), the offload setting and min_bytes, and the current micro-batch's
        tensors saved, loaded and bytes_saved by the front-end."""
        return self._acts.stats()

    def model_state_bytes(self):
        return self._eng.model_state_bytes()

    def device_budget_bytes(self):
        return self._eng.device_budget_bytes()

    def num_params(self):
        return self._eng.num_params()

    def units(self):
        """[(unit name, [zoe module names it fetches])]"""
        return [(u.name, [self._zmods[z].name for z in u.zmods]) for u in self._units]

    def master_params(self):
        """{name: full fp32 master tensor} (gathered from every rank; a copy)."""
        out = OrderedDict()
        for zm in self._zmods:
            for i, (n, s) in enumerate(zip(zm.names, zm.shapes)):
                numel = 1
                for d in s:
                    numel *= d
                a = self._eng.read_master(zm.index, i, numel)
                out[self._torch_names[f"{zm.name}.{n}"]] = torch.from_numpy(a).view(s)
        return out

    def state_dict(self):
        """The model's state_dict, with the keys model.state_dict() has (so load_state_dict(strict=True)
        takes it): full fp32 parameters from zoe, tied ones under each name, and the persistent
        buffers from torch (non-persistent ones, such as a rotary inv_freq, are not state)."""
        sd = self.master_params()
        for alias, name in self._aliases.items():
            sd[alias] = sd[name]
        for n, b in state_buffers(self.module):
            sd[n] = b.detach().to("cpu", copy=True)
        return sd

    def save_pretrained(self, save_directory, max_shard_size=None, dtype=None):
        """A Hugging Face transformers model's folder, as its own save_pretrained writes it and
        from_pretrained loads it: config.json (generation_config.json), model.safetensors, or
        model-0000i-of-0000n.safetensors and model.safetensors.index.json when the tensors exceed
        max_shard_size (default transformers' "50GB"; an int is bytes). The fp32 masters (or
        dtype: torch.bfloat16 / torch.float16), streamed one tensor at a time from wherever zoe
        holds them; tied weights once, under the name transformers keeps. A PEFT model (LoRA, ...)
        gets its adapter as PEFT's save_pretrained writes it (adapter_config.json,
        adapter_model.safetensors), for PeftModel.from_pretrained(base, dir); the frozen base is
        not written. Every rank calls it; rank 0 writes. Returns save_directory."""
        return hf.save_pretrained(self, save_directory, max_shard_size=max_shard_size, dtype=dtype)

    # ---------------------------------------------------------------------------------------
    # Checkpoints

    def save_checkpoint(self, save_dir, tag=None, client_state=None):
        """Saves every state (zoe's, wherever it lives) into save_dir/tag with client_state and the
        model's buffers (every rank calls it). Returns the checkpoint directory."""
        if self._pending_backward:
            raise ZoeError(f"engine.save_checkpoint({save_dir!r}): {self._pending_backward} micro-batch(es) of "
                           "gradients are waiting for engine.step(); save at a step boundary")
        tag = tag if tag is not None else f"global_step{self._global_steps}"
        os.makedirs(save_dir, exist_ok=True)
        state = {"zoe_torch": {
            "format": _FORMAT,
            "micro_steps": self._micro_steps,
            "global_steps": self._global_steps,
            "names": self._torch_names,
            "aliases": self._aliases,
            "buffers": _to_b64({n: b.detach().cpu() for n, b in self.module.named_buffers()}),
            # The state_dict's buffer keys (persistent buffers, every name) -> their key in "buffers".
            "state_buffers": _state_buffer_keys(self.module),
            "client_state": _to_b64(client_state if client_state is not None else {}),
            "last_stats": self._last,
        }}
        # For `zoe ckpt consolidate D --format hf`; not of a PEFT model, whose folder would be the
        # wrapper's (base_model.model.* names), loaded by from_pretrained as a random model.
        if hf.is_hf_model(self.module) and not hf.is_peft_model(self.module):
            state["zoe_torch"]["hf"] = hf.checkpoint_configs(self.module)
        self._eng.save(os.fspath(save_dir), str(tag), json.dumps(state))
        return os.path.join(os.fspath(save_dir), str(tag))

    def load_checkpoint(self, load_dir, tag=None):
        """Restores a checkpoint (load_dir's latest, or load_dir/tag) into this engine's placement
        and world size. Returns (checkpoint path, client_state)."""
        path = os.fspath(load_dir) if tag is None else os.path.join(os.fspath(load_dir), str(tag))
        trainer = json.loads(self._eng.load(path) or "{}")
        zt = trainer.get("zoe_torch")
        if zt is None:
            return path, {}
        if zt.get("format") != _FORMAT:
            raise ZoeError(f"engine.load_checkpoint({path!r}): trainer state zoe_torch.format is "
                           f"{zt.get('format')!r}, this zoe reads {_FORMAT}")
        if zt.get("names") != self._torch_names:
            raise ZoeError(f"engine.load_checkpoint({path!r}): the checkpoint's parameters were cut into other "
                           "units than this model's (zoe_torch.names differ)")
        self._micro_steps = zt["micro_steps"]
        self._global_steps = zt["global_steps"]
        self._pending_backward = 0
        self._partial_grads = None
        self._last = zt.get("last_stats", {})
        buffers = _from_b64(zt["buffers"])
        own = dict(self.module.named_buffers())
        for n, b in buffers.items():
            if n in own:
                own[n].copy_(b)
        return path, _from_b64(zt["client_state"])

    def close(self):
        """Removes the hooks and frees zoe's engine (the model is unusable afterwards)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._grad_accs.clear()
        self._eng.close()

    # ---------------------------------------------------------------------------------------

    def _check_new_params(self):
        for n, p in self.module.named_parameters():
            if id(p) not in self._owner:
                raise ZoeError(f"zoe: parameter '{n}' (shape {list(p.shape)}) was added to the model after "
                               "zoe.initialize(): zoe does not hold it; create every parameter before initialize")
            zm = self._zmods[self._owner[id(p)][0]]
            if p.requires_grad == zm.frozen:
                now, then = ("True", "False") if p.requires_grad else ("False", "True")
                raise ZoeError(f"zoe: parameter '{n}' has requires_grad={now}, but it was {then} at "
                               "zoe.initialize(): zoe fixed the frozen parameters there (a frozen one has no "
                               "optimizer states or gradient buffers in zoe). Set requires_grad before "
                               "zoe.initialize() (to change it later: engine.state_dict() into a new model and "
                               "a new zoe.initialize())")

    def _check_inputs(self, args, kwargs):
        """The first tensor argument must be on the engine's device (one check per forward)."""
        named = [(f"argument {i}", a) for i, a in enumerate(args)]
        named += [(f"argument {k!r}", v) for k, v in kwargs.items()]
        for what, x in named:
            if isinstance(x, torch.Tensor):
                if x.device != self.device:
                    raise ZoeError(f"engine(...): {what} is a tensor on {x.device}, but zoe's engine computes on "
                                   f"{self.device} (zoe.device {self._eng.device()!r}): move the inputs to "
                                   "engine.device (x.to(engine.device))")
                return

    def _end_activations(self, failing):
        """Ends the activation store's micro-batch; while another error is on its way, an error
        of this one is not raised over it."""
        try:
            self._acts.end_micro_batch()
        except ZoeError:
            if not failing:
                raise

    def _reset_fetches(self):
        for zm in self._zmods:
            while zm.refs > 0:
                self._release(zm)
            zm.bw_held = False


def _unmeta_buffers(model, device):
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
    """True when buffer k of mod is still the tensor _unmeta_buffers put there and nothing wrote
    it since (no in-place write, no replacement), or is floating with a NaN left in it."""
    b = mod._buffers.get(k)
    t, version = placed
    if b is None:
        return False
    if b is t and b._version == version:
        return True
    return b.is_floating_point() and bool(torch.isnan(b).any())


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


def _storage_ptr(t):
    """The address of t's storage (untyped_storage: torch 2's; storage() warns there)."""
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()


def _check_launcher(world, force_local):
    """torchrun (or torch.distributed.launch) sets WORLD_SIZE; zoe's ranks come from MPI. Several
    processes that each find an MPI world of one would each train alone on their own data."""
    env = os.environ.get("WORLD_SIZE", "")
    if force_local or world != 1 or not env.isdigit() or int(env) <= 1:
        return
    raise ZoeError(f"zoe.initialize: WORLD_SIZE={env} is set (torchrun or torch.distributed.launch), but this "
                   "process is rank 0 of 1: zoe's ranks come from MPI, so each process would train alone. Launch "
                   f"with MPI instead: mpirun -np {env} python your_script.py, or srun -n {env} --mpi=pmix python "
                   "your_script.py under Slurm (one process per device; see python/README.md)")


# The loss functions of torch.nn.functional (and so of the nn loss modules, which call them) that
# torch.autocast runs in float32 whatever the dtype of their inputs.
_FP32_LOSSES = ("cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
                "binary_cross_entropy", "binary_cross_entropy_with_logits", "poisson_nll_loss",
                "cosine_embedding_loss", "hinge_embedding_loss", "margin_ranking_loss", "soft_margin_loss",
                "triplet_margin_loss", "multi_margin_loss", "multilabel_margin_loss", "ctc_loss")


def _losses_in_fp32(dtype):
    """With bf16 or fp16 compute, a forward's loss functions take their bf16/fp16 inputs in float32
    (a torch function mode), as torch.autocast does: the loss comes back in float32 whether the
    model computes it with torch.nn.CrossEntropyLoss (T5, BERT) or upcasts its logits itself (the
    causal LMs' loss_function), and is computed in float32 from the compute-dtype logits. Nothing
    with fp32 compute."""
    mode_cls = getattr(torch.overrides, "TorchFunctionMode", None)
    if dtype is torch.float32 or mode_cls is None:
        return contextlib.nullcontext()
    fns = {getattr(torch.nn.functional, n) for n in _FP32_LOSSES if hasattr(torch.nn.functional, n)}

    def up(x):
        return x.float() if isinstance(x, torch.Tensor) and x.dtype is dtype else x

    class LossesInFp32(mode_cls):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in fns:
                args = tuple(up(a) for a in args)
                kwargs = {k: up(v) for k, v in kwargs.items()}
            return func(*args, **kwargs)

    return LossesInFp32()


def _describe(x):
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {list(x.shape)}"
    return type(x).__name__


def _state_dict_refused(module, state_dict, prefix, local_metadata):
    raise ZoeError(f"zoe: {type(module).__name__}.state_dict() after zoe.initialize() would hold 0-element "
                   "placeholders (zoe holds the parameters): use engine.state_dict() for the full fp32 tensors, "
                   "or engine.save_checkpoint() and zoe.consolidate(dir)")


def _pre_hook(ref, ui):
    def hook(module, inputs):
        eng = ref()
        if eng is not None:
            return eng._pre_forward(ui, inputs)
        return None

    return hook


def _wrap_inputs(ref, ui, inputs):
    """The positional inputs with those that require grad passed through one _UnitEdge (None
    when none does: nothing to wrap)."""
    at = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.requires_grad]
    if not at:
        return None
    wrapped = _UnitEdge.apply(ref, ui, "_post_backward", *[inputs[i] for i in at])
    out = list(inputs)
    for i, w in zip(at, wrapped):
        out[i] = w
    return tuple(out)


def _post_hook(ref, ui):
    def hook(module, inputs, output):
        eng = ref()
        if eng is None:
            return None
        return eng._post_forward(ui, output)

    return hook


def _wrap_outputs(ref, ui, output):
    """output with every tensor that requires grad passed through one _UnitEdge."""
    flat = []

    def collect(x):
        if isinstance(x, torch.Tensor):
            if x.requires_grad:
                flat.append(x)
        elif isinstance(x, (tuple, list)):
            for y in x:
                collect(y)
        elif isinstance(x, dict):
            for y in x.values():
                collect(y)

    collect(output)
    if not flat:
        return output
    wrapped = iter(_UnitEdge.apply(ref, ui, "_pre_backward", *flat))

    def rebuild(x):
        if isinstance(x, torch.Tensor):
            return next(wrapped) if x.requires_grad else x
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*[rebuild(y) for y in x])
        if isinstance(x, (tuple, list)):
            return type(x)(rebuild(y) for y in x)
        if isinstance(x, dict):
            return type(x)((k, rebuild(v)) for k, v in x.items())
        return x

    return rebuild(output)


def initialize(model=None, config=None, zoe_units=None, unit_params=None, init_fn=None, force_local=False,
               weights=None, **_deepspeed_args):
    """Wraps `model` (a torch.nn.Module, built on the CPU or the meta device) in a zoe engine.

    config: a dict or the path of a DeepSpeed-style JSON file. zoe_units: the units (modules or
    qualified names) instead of the default cut; unit_params: cut by parameter count instead.
    init_fn(module): initialises meta-device modules (default: their reset_parameters(), and a
    transformers model's own _init_weights). weights: a folder of safetensors (a Hugging Face
    model folder: model.safetensors, or shards with model.safetensors.index.json) whose tensors
    initialise the parameters and persistent buffers, read one module at a time (the model may be
    built on the meta device); a missing, extra or wrongly shaped tensor is refused by name.
    DeepSpeed's other arguments (optimizer, model_parameters, ...) are refused when given."""
    extra = {k: v for k, v in _deepspeed_args.items() if v is not None}
    if extra:
        raise ZoeError(f"zoe.initialize: argument(s) {', '.join(sorted(extra))} not supported (the optimizer and "
                       "scheduler come from the config's \"optimizer\" and \"scheduler\" sections)")
    if config is None:
        raise ZoeError("zoe.initialize: config is required (a dict or the path of a JSON file)")
    return Engine(model, config, zoe_units=zoe_units, unit_params=unit_params, init_fn=init_fn,
                  force_local=force_local, weights=weights)


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
