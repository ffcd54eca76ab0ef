"""The hooks that run zoe's units inside torch's forward and backward.

Each unit (units.py) holds its parameters in zoe (device, host or NVMe as configured); torch sees
empty placeholders, except while the unit runs (fetch.py):
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
A frozen zoe module (no gradients) is released by the _UnitEdge on its unit's inputs, once the
unit's backward has run.

In a CUDA backward, torch's autograd runs the hooks (and so these engine calls) on its thread for
the device while the caller's thread waits in backward(): the calls stay one at a time.

Activation checkpointing (torch.utils.checkpoint, transformers' gradient_checkpointing_enable):
with zoe.activation_offload cpu or nvme, the same pack hook sends the tensors a checkpoint region
keeps for its backward (its inputs) to zoe's activation store, and the unpack loads them back;
activations.py says which tensors go and which stay. A reentrant checkpoint recomputes its
forward inside engine.backward(): the unit is then held for the backward (phase.py says which
phase allows which call).
"""
import contextlib
import sys
import weakref

import torch

from ._zoe import ZoeError
from .activations import SavedActivation
from .fetch import as_tensor, storage_ptr


class _SavedParam:
    """A saved tensor that was a view of zoe parameter (zmod, index): rebuilt at unpack."""

    __slots__ = ("zm", "p", "offset", "size", "stride")

    def __init__(self, zm, p, offset, size, stride):
        self.zm, self.p, self.offset, self.size, self.stride = zm, p, offset, size, stride


class _UnitEdge(torch.autograd.Function):
    """Identity on tensors at a unit's edge; its backward tells the hooks `event` for the unit: on
    its outputs "pre_backward" (fetch the unit before autograd enters it), on its inputs
    "post_backward" (the unit's backward has run: its frozen modules can go)."""

    @staticmethod
    def forward(ctx, hooks_ref, unit_index, event, *tensors):
        ctx.hooks_ref = hooks_ref
        ctx.unit_index = unit_index
        ctx.event = event
        return tuple(t.detach() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        hooks = ctx.hooks_ref()
        if hooks is not None:
            getattr(hooks, ctx.event)(ctx.unit_index)
        return (None, None, None) + grads


class UnitHooks:
    """The forward, backward, gradient and saved-tensor hooks of one engine's units. The model's
    hooks hold it by a weak reference (the model does not keep the engine alive); it reaches the
    binding, the stream synchronization and the activation store through the engine at each call."""

    def __init__(self, engine, layout, phase, fetcher):
        self._engine = engine
        self._units = layout.units
        self._zmods = layout.zmods
        self._owner = layout.owner
        self._phase = phase
        self._fetch = fetcher
        self._handles = []
        self._grad_accs = []

    def install(self, model):
        """The gradient hooks, each unit's forward pre- and post-hook, and the refusal of the
        model's own state_dict (it would hold the 0-element placeholders)."""
        self._hook_gradients()
        ref = weakref.ref(self)
        for ui, u in enumerate(self._units):
            if not u.zmods:
                continue
            self._handles.append(u.module.register_forward_pre_hook(_pre_hook(ref, ui)))
            self._handles.append(u.module.register_forward_hook(_post_hook(ref, ui)))
        for mod in model.modules():
            if any(p is not None and id(p) in self._owner for p in mod._parameters.values()):
                self._handles.append(mod._register_state_dict_hook(_state_dict_refused))

    def _hook_gradients(self):
        """AccumulateGrad post-hooks, created while each parameter has its real shape, dtype and
        device (the node records them and checks every gradient against them); the nodes are kept
        alive. The first zoe module is fetched, to check that the engine's buffers are where the
        front-end expects them; the others stand in as one element expanded to their shapes (a
        fetch would read every partition from its tier once, for metadata only)."""
        engine = self._engine
        ref = weakref.ref(self)
        one = None
        with torch.enable_grad():
            for zm in self._zmods:
                if one is None:
                    self._fetch.acquire(zm)
                    if zm.flat and zm.flat[0].device != engine.device:
                        raise ZoeError(f"zoe.initialize: the engine's buffers are on {zm.flat[0].device}, the "
                                       f"front-end expected {engine.device} (zoe.device {engine._eng.device()!r}, "
                                       f"local rank {engine._eng.local_rank})")
                    fetched = zm
                    one = torch.empty((), dtype=self._fetch.dtype, device=engine.device)
                else:
                    fetched = None
                    for p, s in zip(zm.params, zm.shapes):
                        p.data = one.expand(tuple(s))
                for i, p in enumerate(zm.params):
                    if p.requires_grad:
                        acc = p.expand_as(p).grad_fn.next_functions[0][0]
                        acc.register_hook(_grad_hook(ref, zm, i))
                        self._grad_accs.append(acc)
                if fetched is not None:
                    self._fetch.release(zm)
                else:
                    for p in zm.params:
                        p.data = self._fetch.placeholder

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._grad_accs.clear()

    def saved_tensors(self):
        """The saved-tensor hooks of a training forward and of engine.backward (where a reentrant
        activation checkpoint recomputes its forward and must save parameters as descriptors too)."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    @contextlib.contextmanager
    def parameters_in_use(self, params):
        """Holds the zoe modules of `params` fetched for the block: code that reads a parameter
        outside its own module's forward (a fused loss reading lm_head.weight) sees the real tensor,
        and autograd saves it as a descriptor, fetched again in the backward. In a backward the
        hold lasts until the module's gradients are in, as a backward's unpack holds it."""
        zms = []
        for p in params:
            if p is None:
                continue
            loc = self._owner.get(id(p))
            if loc is None:
                raise ZoeError(f"engine.parameters_in_use: a tensor of shape {tuple(p.shape)} is not a parameter of "
                               "the model zoe holds")
            if self._zmods[loc[0]] not in zms:
                zms.append(self._zmods[loc[0]])
        if self._phase.in_backward:
            self.hold_for_backward(zms)
            yield
            return
        for zm in zms:
            self._fetch.acquire(zm)
        try:
            yield
        finally:
            for zm in reversed(zms):
                self._fetch.release(zm)

    def hold_for_backward(self, zms):
        for zm in zms:
            if not zm.bw_held:
                zm.bw_held = True
                self._fetch.acquire(zm)

    # ---------------------------------------------------------------------------------------
    # A unit's forward and backward

    def _check_unit_call(self, ui):
        if not (self._phase.in_forward or self._phase.in_backward or not torch.is_grad_enabled()):
            # Inference (torch.no_grad(), torch.inference_mode(), model.generate()) may call the
            # model directly: no gradient and no saved tensor outlives the call, so fetching and
            # releasing each unit around its forward is all it needs. A training forward may not.
            raise ZoeError(f"zoe: the model's unit '{self._units[ui].name}' was called directly after "
                           "zoe.initialize() with gradients enabled: its parameters live in zoe, which trains "
                           "it only through the engine: call engine(...) (engine.module is the model) instead "
                           "of the model (inference under torch.no_grad() may call the model itself, "
                           "engine.module.generate(...) too)")
        dtype, device = self._fetch.dtype, self._fetch.device
        for zi in self._units[ui].zmods:
            for p in self._zmods[zi].params:
                if p.dtype != dtype or p.device != device:
                    raise ZoeError(f"zoe: a parameter of unit '{self._units[ui].name}' is now {p.dtype} on "
                                   f"{p.device} (model.to(...) after zoe.initialize()), but zoe computes in "
                                   f"{dtype} on its own device: choose the compute dtype in the config "
                                   "(fp16.enabled or bf16.enabled) and the placement with zero_optimization "
                                   "and zoe.device, not with model.to()")

    def pre_forward(self, ui, inputs=()):
        self._check_unit_call(ui)
        if self._phase.in_backward:
            # A recompute (activation checkpointing) inside the backward: the unit is held for the
            # backward, released when its gradients are in, as pre_backward holds it. torch 2's
            # non-reentrant checkpoint may stop a recompute part-way (no forward hook then), so
            # nothing here waits for post_forward.
            self.pre_backward(ui)
        else:
            for zi in self._units[ui].zmods:
                self._fetch.acquire(self._zmods[zi])
        if torch.is_grad_enabled() and any(self._zmods[zi].n_grad == 0 for zi in self._units[ui].zmods):
            return _wrap_inputs(weakref.ref(self), ui, inputs)
        return None

    def post_forward(self, ui, output):
        if not self._phase.in_backward:  # a recompute's hold is the backward's (pre_forward)
            for zi in self._units[ui].zmods:
                self._fetch.release(self._zmods[zi])
        if not torch.is_grad_enabled():
            return output
        return _wrap_outputs(weakref.ref(self), ui, output)

    def pre_backward(self, ui):
        self.hold_for_backward([self._zmods[zi] for zi in self._units[ui].zmods])

    def post_backward(self, ui):
        """The unit's backward has run: its modules with no gradient to wait for go."""
        for zi in self._units[ui].zmods:
            zm = self._zmods[zi]
            if zm.n_grad == 0 and zm.bw_held:
                zm.bw_held = False
                self._fetch.release(zm)

    # ---------------------------------------------------------------------------------------
    # Saved tensors: parameters and their views travel as descriptors (see the module docstring);
    # a checkpoint region's inputs in a training forward go to the activation store when it offloads.

    def pack(self, t):
        if t.layout != torch.strided:
            return t
        live = self._fetch.live
        loc = live.get(storage_ptr(t)) if live else None
        if loc is not None:
            return _SavedParam(loc[0], loc[1], t.storage_offset(), t.size(), t.stride())
        acts = self._engine._acts
        if acts.enabled and self._phase.in_forward:
            return acts.pack(t, sys._getframe(1))
        return t

    def unpack(self, obj):
        if isinstance(obj, SavedActivation):
            return self._engine._acts.unpack(obj)
        if not isinstance(obj, _SavedParam):
            return obj
        zm = self._zmods[obj.zm]
        if zm.refs == 0:  # reached before its unit's boundary (an op outside any unit): fetch now
            zm.bw_held = True
            self._fetch.acquire(zm)
        return zm.flat[obj.p].as_strided(obj.size, obj.stride, obj.offset)

    # ---------------------------------------------------------------------------------------
    # Gradients

    def gradient(self, zm, i, g):
        """Parameter i of zm got gradient g (torch's copy is dropped): into zoe's buffer; the
        module's gradients are reduced once all are in."""
        self._phase.gradient_arrived()
        if zm.grad_views is None:
            eng = self._engine._eng
            zm.grad_views = [as_tensor(a, self._fetch.dtype, self._fetch.device) for a in eng.grads(zm.index)]
        dst = zm.grad_views[i].view(g.shape)
        if i in zm.received:
            dst.add_(g)
        else:
            dst.copy_(g)
            zm.received.add(i)
        if len(zm.received) == zm.n_grad:
            self.finish_grads(zm)

    def finish_grads(self, zm):
        if zm.grad_views is not None:
            # The parameters that got no gradient (frozen, or not used in this micro-batch): a
            # step in which none did leaves them as they are, as torch.optim.AdamW does.
            has_grad = [i in zm.received for i in range(len(zm.params))]
            zm.grad_views = None
            zm.received.clear()
            self._engine._sync()
            self._engine._eng.reduce_grads(zm.index, has_grad)
        if zm.bw_held:
            zm.bw_held = False
            self._fetch.release(zm)

    def finish_backward(self):
        """The end of engine.backward: the modules whose gradients are partial (a parameter unused
        this micro-batch), then any fetch an error left."""
        for zm in reversed(self._zmods):
            if zm.grad_views is not None or zm.bw_held:
                self.finish_grads(zm)


def _grad_hook(ref, zm, i):
    p = zm.params[i]

    def hook(grad_inputs, grad_outputs):
        hooks = ref()
        g = p.grad
        p.grad = None
        if hooks is None or g is None:
            return
        hooks.gradient(zm, i, g)

    return hook


def _state_dict_refused(module, state_dict, prefix, local_metadata):
    raise ZoeError(f"zoe: {type(module).__name__}.state_dict() after zoe.initialize() would hold 0-element "
                   "placeholders (zoe holds the parameters): use engine.state_dict() for the full fp32 tensors, "
                   "or engine.save_checkpoint() and zoe.consolidate(dir)")


def _pre_hook(ref, ui):
    def hook(module, inputs):
        hooks = ref()
        if hooks is not None:
            return hooks.pre_forward(ui, inputs)
        return None

    return hook


def _post_hook(ref, ui):
    def hook(module, inputs, output):
        hooks = ref()
        if hooks is None:
            return None
        return hooks.post_forward(ui, output)

    return hook


def _wrap_inputs(ref, ui, inputs):
    """The positional inputs with those that require grad passed through one _UnitEdge (None
    when none does: nothing to wrap)."""
    at = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.requires_grad]
    if not at:
        return None
    wrapped = _UnitEdge.apply(ref, ui, "post_backward", *[inputs[i] for i in at])
    out = list(inputs)
    for i, w in zip(at, wrapped):
        out[i] = w
    return tuple(out)


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
    wrapped = iter(_UnitEdge.apply(ref, ui, "pre_backward", *flat))

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
