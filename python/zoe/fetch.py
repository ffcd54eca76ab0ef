"""Fetch and release: a zoe module's parameters pointed at the engine's gathered buffers, and back.

While fetched, each parameter's .data is a view of zoe's buffer in the compute dtype (no copy);
released, it is a 0-element placeholder of the compute dtype on the engine's device: torch drops
a parameter's AccumulateGrad node (and the hook zoe put on it) when .data changes dtype or
device, so neither changes between a fetch and a release. Fetches are reference counted (a unit
used several times per forward, a module several units use, the backward's hold).

Devices: with zoe.device "cuda" the engine's buffers are CUDA memory, wrapped without a copy
through __cuda_array_interface__ (as_tensor). Before a buffer goes back to zoe (release,
reduce_grads, step) torch's current stream is synchronized, as include/zoe/engine.h requires.
"""
import numpy as np
import torch

from ._zoe import ZoeError


def as_tensor(view, dtype, device):
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


def view_ptr(view):
    """The address of an engine buffer (a NumPy array or a _zoe.DeviceView)."""
    return view.__array_interface__["data"][0] if isinstance(view, np.ndarray) else view.ptr


def storage_ptr(t):
    """The address of t's storage (untyped_storage: torch 2's; storage() warns there)."""
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()


class Fetcher:
    """Fetches and releases the engine's zoe modules (units.ZMod) for torch. It reaches the binding
    and the stream synchronization through the engine (engine._eng, engine._sync()) at each call.

    live: the address of each fetched parameter buffer -> (zoe module index, parameter index), by
    which a saved tensor is recognised as (a view of) a parameter."""

    def __init__(self, engine):
        self._engine = engine
        self.dtype = engine.compute_dtype()
        self.device = engine.device
        self.live = {}
        self.placeholder = torch.empty(0, dtype=self.dtype, device=self.device)
        # Called with each zoe module this fetcher has just fetched (layer_major.py keeps some).
        self.on_fetch = None
        self.fetches = 0  # Engine.fetch calls so far (the tests count them)

    def acquire(self, zm):
        zm.refs += 1
        if zm.refs > 1:
            return
        try:
            arrays = self._engine._eng.fetch(zm.index)
        except BaseException:
            zm.refs -= 1  # not fetched: nothing to release
            raise
        self.fetches += 1
        if self.on_fetch is not None:
            self.on_fetch(zm)
        key = tuple(view_ptr(a) for a in arrays)
        if torch.is_inference_mode_enabled():
            # The views are kept (zm.flat) and used by later training steps: no inference tensors.
            with torch.inference_mode(False):
                self._point_params(zm, arrays, key)
        else:
            self._point_params(zm, arrays, key)

    def _point_params(self, zm, arrays, key):
        """Points zm's parameters at the fetched buffers (torch views of them, cached by address)."""
        if key != zm.cache_key:
            zm.flat = [as_tensor(a, self.dtype, self.device) for a in arrays]
            zm.cache_key = key
        for i, (p, t, s) in enumerate(zip(zm.params, zm.flat, zm.shapes)):
            p.data = t.view(s) if s else t.view(())
            self.live[zm.cache_key[i]] = (zm.index, i)

    def release(self, zm):
        zm.refs -= 1
        if zm.refs > 0:
            return
        for ptr in zm.cache_key:
            self.live.pop(ptr, None)
        for p in zm.params:
            p.data = self.placeholder
        self._engine._sync()
        self._engine._eng.release(zm.index)

    def release_all(self, zmods):
        """Releases every fetch still held (an error's leftovers), the backward's holds included."""
        for zm in zmods:
            while zm.refs > 0:
                self.release(zm)
            zm.bw_held = False
