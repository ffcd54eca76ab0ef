"""engine.train_batch's layer-major schedule for Hugging Face decoder-only causal LMs.

The micro-batch schedule runs each micro-batch through the whole model; with parameters offloaded,
each decoder layer is fetched 2G times a step. Here each layer is fetched once in the forward and
once in the backward for all G micro-batches (include/zoe/engine.h's layer-major contract):

1. inputs: each micro-batch through the model up to its first decoder layer (no gradient), which
   records the layer's inputs (the hidden states and the keyword arguments the model computed for
   it: masks, positions, rotary embeddings) and stops the forward;
2. forward: each layer once, every micro-batch through it without gradients, its input kept
   (the RNG state too, so that a recompute draws the same dropout);
3. head: per micro-batch, the model's forward with the layers replaced by the stored outputs, the
   last one a leaf: torch.autograd.grad gives the loss's gradient at the last hidden state and the
   gradients of the head's parameters without running zoe's gradient hooks. A parameter of a module
   step 1 fetched (a head tied to the embedding) keeps its share for step 5; the others (an untied
   head, the final norm) go to zoe now, micro-batch after micro-batch;
4. backward: each layer once (held), every micro-batch in order: the layer recomputed from its
   input with gradients, its backward from the stored output gradient; zoe's gradient hooks
   reduce its gradients as the micro-batch schedule does;
5. embedding: per micro-batch, the model's forward up to the first layer with gradients, the
   embedding's gradients from the first layer's input gradient, plus a tied parameter's head
   share, handed to zoe once.

The zoe modules outside the layers (embedding, final norm, head) stay fetched from their first
fetch to the end of steps 1, 3 and 5: a step fetches them at most three times, whatever G.

Every module's gradients are reduced once per micro-batch, in micro-batch order, from the same
values. Micro-batch g draws its random numbers (dropout) from its own stream (streams.py), in the
order the micro-batch schedule's forward draws them: the embedding's in step 1 (replayed in step 5),
each layer's in step 2 (replayed by its recompute in step 4), the head's in step 3. So the losses
and weights are those of the micro-batch schedule, bit for bit, with dropout on too.
"""
import contextlib
import copy

import torch

from .activations import SavedActivation
from .phase import Phase
from .streams import rng_state, set_rng_state

# Where the decoder layers of a transformers causal LM are (the architectures the HF tests cover).
_STACKS = ("model.layers", "transformer.h", "gpt_neox.layers")


class _Stop(Exception):
    """Raised by the first layer's stand-in once it has what it was placed to record."""


def decoder_stack(model):
    """The ModuleList of decoder layers of an HF causal LM (model.config.is_decoder-style models
    transformers builds with a `layers`/`h` list), or None."""
    if not hasattr(model, "config") or getattr(model.config, "is_encoder_decoder", False):
        return None
    for path in _STACKS:
        mod = model
        for part in path.split("."):
            mod = getattr(mod, part, None)
            if mod is None:
                break
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0:
            return mod
    return None


class _StandIn(torch.nn.Module):
    """Takes a module's place (a decoder layer's in the list, the input embedding's in the head
    pass), with no parameters and no zoe hooks: `fn(args, kwargs)` gives its output. Other
    attributes the model reads from it (attention_type, ...) come from the module it stands in for."""

    def __init__(self, layer, fn):
        super().__init__()
        object.__setattr__(self, "_layer", layer)
        object.__setattr__(self, "_fn", fn)

    def forward(self, *args, **kwargs):
        return self._fn(args, kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_layer"), name)


@contextlib.contextmanager
def _stand_ins(stack, fns):
    """The layers of `stack` replaced by stand-ins calling fns[i], and put back."""
    layers = list(stack)
    try:
        for i, layer in enumerate(layers):
            stack[i] = _StandIn(layer, fns[i])
        yield layers
    finally:
        for i, layer in enumerate(layers):
            stack[i] = layer


@contextlib.contextmanager
def _embedding_stood_in(model, dtype):
    """For the head pass (step 3), where the layers' stand-ins return the stored outputs and the
    input embedding's output is never used: an nn.Embedding that no other module shares a
    parameter with (a head tied to it needs it fetched) is replaced by a stand-in giving zeros of
    its output's shape and dtype, so it is neither fetched nor held through the pass; put back."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    where = None
    if isinstance(emb, torch.nn.Embedding) and not (out is not None and any(p is emb.weight for p in out.parameters())):
        where = next(((m, n) for m in model.modules() for n, c in m.named_children() if c is emb), None)
    if where is None:
        yield
        return

    def zeros(args, kwargs):
        ids = args[0] if args else kwargs["input"]
        return torch.zeros(*ids.shape, emb.embedding_dim, dtype=dtype, device=ids.device)

    parent, name = where
    setattr(parent, name, _StandIn(emb, zeros))
    try:
        yield
    finally:
        setattr(parent, name, emb)


def _hidden(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _is_cache(v):
    """A transformers KV cache object (DynamicCache, ...): the model makes an empty one per forward
    when use_cache is on, and each layer stores its keys and values in it."""
    return type(v).__name__.endswith("Cache") and hasattr(v, "update")


def _fresh(v):
    # Each layer call gets the empty cache it had in the micro-batch schedule's forward (its
    # update() then returns the keys and values laid out as there: the same bits).
    return copy.deepcopy(v) if _is_cache(v) else v


def _recorded(args, kwargs):
    """A layer's arguments as recorded before any layer ran: caches copied while still empty."""
    return tuple(_fresh(a) for a in args), {k: _fresh(v) for k, v in kwargs.items()}


def _with_hidden(args, kwargs, h):
    args = tuple(_fresh(a) for a in args)
    kwargs = {k: _fresh(v) for k, v in kwargs.items()}
    if args:
        return (h,) + args[1:], kwargs
    kwargs["hidden_states"] = h
    return (), kwargs


class LayerMajor:
    """One train_batch step in the layer-major order (the module docstring). engine: zoe's Engine."""

    def __init__(self, engine, stack):
        self.e = engine
        self.stack = stack
        self.hooks = engine._unit_hooks
        self.layout = engine._layout
        by_module = {id(u.module): i for i, u in enumerate(self.layout.units)}
        self.layer_units = [by_module.get(id(layer)) for layer in stack]
        self.supported = all(u is not None for u in self.layer_units)
        # The trained parameters outside the decoder layers (embedding, final norm, head), as
        # (zoe module, index, parameter): their gradients come from steps 3 and 5.
        in_layers = set(self.layer_units)
        self.outer = [(zm, i, p) for zm in self.layout.zmods if not zm.frozen and zm.unit not in in_layers
                      for i, p in enumerate(zm.params) if p.requires_grad]

    # --- the engine's phase and fetches ----------------------------------------------------------

    @contextlib.contextmanager
    def _phase(self, phase):
        ps = self.e._phase
        was = ps.phase
        ps.phase = phase
        try:
            with self.hooks.saved_tensors():
                yield
        finally:
            if ps.phase in (Phase.FORWARD, Phase.BACKWARD, Phase.REDUCING):
                ps.phase = was

    @contextlib.contextmanager
    def _held(self, layer):
        zms = [self.layout.zmods[zi] for zi in self.layout.units[self.layer_units[layer]].zmods]
        for zm in zms:
            self.e._fetcher.acquire(zm)
        try:
            yield
        finally:
            for zm in zms:
                self.e._fetcher.release(zm)

    @contextlib.contextmanager
    def _outer_kept(self):
        """The zoe modules outside the decoder layers (embedding, final norm, head) that a phase's
        micro-batches fetch, held from their first fetch to the phase's end: fetched once per
        phase instead of once per micro-batch. A module is held only once one of the phase's
        micro-batches has fetched it, so the device holds what the micro-batch schedule holds."""
        f = self.e._fetcher
        in_layers = set(self.layer_units)
        held = []

        def keep(zm):
            if zm.unit not in in_layers and zm not in held:
                zm.refs += 1  # fetched just now (refs 1): one more reference, no second fetch
                held.append(zm)

        f.on_fetch = keep
        try:
            yield held
        finally:
            f.on_fetch = None
            for zm in held:
                if zm.refs > 0:
                    f.release(zm)

    def _call(self, batch):
        from .engine import _losses_in_fp32

        # As engine(...) runs the model: a bf16/fp16 model's loss computed in float32.
        with _losses_in_fp32(self.e._dtype):
            if isinstance(batch, dict):
                return self.e.module(**batch)
            if isinstance(batch, (tuple, list)):
                return self.e.module(*batch)
            return self.e.module(batch)

    # --- the five phases -----------------------------------------------------------------------

    def _inputs(self, batches):
        """Step 1: (hidden states, args, kwargs) of the first layer for every micro-batch."""
        out = []

        def record(args, kwargs):
            a, kw = _recorded(args, kwargs)
            out.append((_hidden(args, kwargs), a, kw))
            raise _Stop()

        fns = [record] + [None] * (len(self.stack) - 1)
        self.starts = [self.streams.state(g) for g in range(len(batches))]
        with self._outer_kept() as held:
            for g, b in enumerate(batches):
                with self._phase(Phase.FORWARD), torch.no_grad(), _stand_ins(self.stack, fns), self.streams.use(g):
                    try:
                        self._call(b)
                    except _Stop:
                        pass
            # The modules before the first layer (the embedding, and a head tied to it): their
            # gradients wait for step 5; the head's own go to zoe in step 3.
            self.before_layers = {zm.index for zm in held}
        return out

    def _forward(self, inputs):
        """Step 2: h[l][g] (layer l's input of micro-batch g), the RNG states, the output format."""
        G, L = len(inputs), len(self.stack)
        h = [[None] * G for _ in range(L + 1)]
        rng = [[None] * G for _ in range(L)]
        for g, (h0, _, _) in enumerate(inputs):
            h[0][g] = h0
        self.tuple_out = True
        acts = self.e._acts
        for l, layer in enumerate(self.stack):
            with self._held(l), self._phase(Phase.FORWARD), torch.no_grad():
                for g, (_, args, kwargs) in enumerate(inputs):
                    with self.streams.use(g):
                        rng[l][g] = rng_state(self.e.device)
                        a, kw = _with_hidden(args, kwargs, h[l][g])
                        out = layer(*a, **kw)
                    self.tuple_out = isinstance(out, tuple)
                    h[l + 1][g] = out[0] if self.tuple_out else out
            # With zoe.activation_offload, layer l's inputs go to the activation store (device,
            # host, NVMe under its budgets), the last micro-batch's first: the backward loads them
            # layer by layer, micro-batches in order, the reverse of their save order (the order
            # the store reads ahead in).
            for g in reversed(range(G)):
                h[l][g] = acts.keep(h[l][g])
        return h, rng

    def _wrap(self, y):
        return (y,) if self.tuple_out else y

    def _head(self, batches, h, loss_fn):
        """Step 3: the losses, the gradient at the last hidden state, and the head parameters'
        gradients (those shared with the embedding kept apart, per micro-batch)."""
        scale = self.e._eng.loss_scale()
        losses, dh, shares = [], [], []
        with self._outer_kept(), _embedding_stood_in(self.e.module, self.e._dtype):
            for g in range(len(batches)):
                loss, d, share = self._head_of(g, batches[g], h, loss_fn, scale)
                losses.append(loss)
                dh.append(d)
                shares.append(share)
        return losses, dh, shares

    def _head_of(self, g, batch, h, loss_fn, scale):
        """Step 3 for micro-batch g: (its loss, the gradient at its last hidden state, its head
        parameters' gradients by (zoe module, parameter))."""
        from .engine import _loss_of

        L = len(self.stack)
        leaf = h[L][g].detach().requires_grad_()
        after_layers = self.streams.state(g)

        def out_of(i):
            def fn(args, kwargs):
                if i == L - 1:  # the head draws on from where the layers' forward left the stream
                    set_rng_state(after_layers, self.e.device)
                return self._wrap(leaf if i == L - 1 else h[i + 1][g])

            return fn

        with self._phase(Phase.FORWARD), _stand_ins(self.stack, [out_of(i) for i in range(L)]), self.streams.use(g):
            loss = _loss_of(self._call(batch), batch, loss_fn, g)
            params = [p for _, _, p in self.outer]
            grads = torch.autograd.grad(loss * scale if scale != 1.0 else loss, [leaf] + params, allow_unused=True)
        # A module of the head that the embedding pass does not use (an untied head, the final
        # norm) gets its gradients now: its G reductions follow each other in micro-batch order,
        # as the engine's layer-major contract asks, and nothing waits in memory for step 5.
        share, now = {}, []
        for (zm, i, _), gr in zip(self.outer, grads[1:]):
            if gr is None:
                continue
            if zm.index in self.before_layers:
                share[(zm.index, i)] = gr
            else:
                now.append((zm, i, gr))
        if now:
            with self._phase(Phase.BACKWARD):
                for zm, i, gr in now:
                    self.hooks.gradient(zm, i, gr)
                self.hooks.finish_backward()
        self._release_held()
        return float(loss.detach().float()), grads[0], share

    def _release_held(self):
        for zm in self.layout.zmods:
            if zm.bw_held and zm.grad_views is None:
                zm.bw_held = False
                self.e._fetcher.release(zm)

    def _backward(self, inputs, h, rng, dh):
        """Step 4: each layer's backward for every micro-batch in order; returns the gradients at
        the first layer's input."""
        G = len(inputs)
        for l in reversed(range(len(self.stack))):
            layer = self.stack[l]
            with self._held(l):
                nxt = []
                for g, (_, args, kwargs) in enumerate(inputs):
                    with self._phase(Phase.BACKWARD):
                        stored = h[l][g]
                        if isinstance(stored, SavedActivation):
                            stored = self.e._acts.unpack(stored)
                        h[l][g] = None
                        x = stored.detach().requires_grad_()
                        set_rng_state(rng[l][g], self.e.device)
                        a, kw = _with_hidden(args, kwargs, x)
                        out = layer(*a, **kw)
                        y = out[0] if isinstance(out, tuple) else out
                        torch.autograd.backward(y, dh[g])
                        self.hooks.finish_backward()
                    nxt.append(x.grad)
                dh = nxt
        assert len(dh) == G
        return dh

    def _embedding(self, batches, dh0, shares):
        """Step 5: the embedding's gradients from the first layer's input gradients, with the
        tied head share, into zoe once per micro-batch; then the head-only gradients."""
        with self._outer_kept():
            for g, b in enumerate(batches):
                self._embedding_of(g, b, dh0, shares)

    def _embedding_of(self, g, b, dh0, shares):
        """Step 5 for micro-batch g."""
        got = []

        def record(args, kwargs):
            got.append(_hidden(args, kwargs))
            raise _Stop()

        set_rng_state(self.starts[g], self.e.device)  # step 1's draws again (the embedding's dropout)
        with self._phase(Phase.FORWARD), _stand_ins(self.stack, [record] + [None] * (len(self.stack) - 1)):
            try:
                self._call(b)
            except _Stop:
                pass
        e = got[0]
        share = shares[g]
        with self._phase(Phase.BACKWARD):
            grads = torch.autograd.grad(e, [p for _, _, p in self.outer], dh0[g], allow_unused=True)
            for (zm, i, _), gr in zip(self.outer, grads):
                head = share.pop((zm.index, i), None)
                if gr is None and head is None:
                    continue
                total = head if gr is None else gr if head is None else head + gr
                self.hooks.gradient(zm, i, total)
            self.hooks.finish_backward()
        self._release_held()

    def step(self, batches, loss_fn, streams):
        """The step's five phases; streams: the micro-batches' random streams (MicroBatchStreams)."""
        self.streams = streams
        inputs = self._inputs(batches)
        h, rng = self._forward(inputs)
        losses, dh, shares = self._head(batches, h, loss_fn)
        dh0 = self._backward(inputs, h, rng, dh)
        self.e._acts.end_micro_batch()
        self._embedding(batches, dh0, shares)
        ps = self.e._phase
        ps.micro_steps += len(batches)
        ps.pending_backward += len(batches)
        ps.phase = ps._resting()
        return losses

