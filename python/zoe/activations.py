"""Checkpointed activations of a torch model through zoe's activation store (include/zoe/activations.h).

What goes to the store: the tensors torch.utils.checkpoint keeps for the backward at a region's
boundary, that is the region's positional tensor inputs. Both of its modes save them as saved
tensors outside the region's own saved-tensor hooks: the reentrant mode through
CheckpointFunction's ctx.save_for_backward, the non-reentrant one through its frame's
save_inputs (_NoopSaveInputs in older torch 2 releases). The engine's pack hook therefore sees
them, and this module recognises them by the function of torch.utils.checkpoint that saves them
(the nearest Python frame). transformers' gradient_checkpointing_enable() calls
torch.utils.checkpoint, so it is covered the same way, reentrant or not. Everything inside a
region is recomputed by torch in the backward (its RNG state stashed and replayed by torch,
preserve_rng_state=True, the default) and never reaches the store.

Kept where torch keeps them: parameters and views of parameters (the engine packs those as
descriptors before asking here), tensors smaller than zoe.activation_min_bytes, tensors not in
the engine device's memory or not strided, keyword tensor arguments of a region (torch's closure
holds them), every activation outside checkpoint regions, and anything saved outside a training
forward of engine(...) (a recompute in the backward, an inference call, torch.no_grad()).

A boundary tensor is saved as its bytes (a contiguous copy when it is not contiguous) and becomes
a SavedActivation: the store's id and the tensor's shape, dtype and device. Its unpack in the
backward allocates the tensor, loads the bytes into it (the store waits for them) and keeps it
in the handle for a second unpack, until autograd frees the handle. The engine ends the store's
micro-batch after each backward (and before a forward whose previous forward had no backward):
nothing saved outlives its micro-batch.
"""
import torch
import torch.utils.checkpoint as _tuc

def _code_of(fn):
    fn = getattr(fn, "__wrapped__", fn)  # a decorated function (torch._disable_dynamo)
    return getattr(fn, "__code__", None)


def _boundary_codes():
    """The code objects of torch.utils.checkpoint's functions that save a region's inputs (those
    the torch version at hand has)."""
    fns = [getattr(_tuc, n, None) for n in ("checkpoint", "_checkpoint_impl", "_checkpoint_without_reentrant_generator",
                                          "_checkpoint_without_reentrant_generator_impl")]
    frame = getattr(_tuc, "_CheckpointFrame", None)
    fns.append(getattr(frame, "save_inputs", None))
    return frozenset(c for c in map(_code_of, fns) if c is not None)


_BOUNDARY_CODES = _boundary_codes()
# Whether this torch's non-reentrant checkpoint saves a region's inputs as saved tensors (torch 2.1
# and later); before, a closure holds them, out of the hooks' reach, and they stay where they are.
NON_REENTRANT_COVERED = hasattr(getattr(_tuc, "_CheckpointFrame", None), "save_inputs") or \
    hasattr(_tuc, "_NoopSaveInputs")
_AUTOGRAD_FUNCTION_FILE = getattr(torch.autograd.function, "__file__", None)
_COMPREHENSIONS = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>")


def saved_by_checkpoint(frame):
    """Whether the tensor being packed is saved by torch.utils.checkpoint at a region's boundary:
    `frame` is the first Python frame above the pack hook. Frames of torch.autograd.Function.apply
    and of comprehensions are stepped over."""
    for _ in range(4):
        if frame is None:
            return False
        code = frame.f_code
        if code in _BOUNDARY_CODES:
            return True
        if code.co_filename != _AUTOGRAD_FUNCTION_FILE and code.co_name not in _COMPREHENSIONS:
            return False
        frame = frame.f_back
    return False


class SavedActivation:
    """A region input in zoe's activation store: its id and geometry; `tensor` once loaded."""

    __slots__ = ("id", "shape", "dtype", "device", "tensor", "__weakref__")

    def __init__(self, ident, t):
        self.id, self.shape, self.dtype, self.device = ident, t.shape, t.dtype, t.device
        self.tensor = None


class ActivationOffload:
    """The engine's side of the store: which saved tensors go there, and their loads."""

    def __init__(self, store, device, sync, min_bytes):
        self._store = store          # _zoe.ActivationStore (Engine::activations())
        self._device = device        # the engine's torch.device: the store's addresses are its memory
        self._sync = sync            # waits for torch's kernels on that device
        self.mode = store.offload()  # zoe.activation_offload as the engine uses it
        self.min_bytes = min_bytes   # zoe.activation_min_bytes
        self.saved = 0               # tensors saved in the current micro-batch
        self.loaded = 0              # of which loaded back
        self.bytes_saved = 0
        self.last = {"saved": 0, "loaded": 0, "bytes_saved": 0}  # of the micro-batch ended last

    @property
    def enabled(self):
        return self.mode != "none"

    def pack(self, t, frame):
        """A SavedActivation for a checkpoint region's input worth moving, else t itself."""
        nbytes = t.numel() * t.element_size()
        if nbytes < max(1, self.min_bytes) or t.device != self._device or not saved_by_checkpoint(frame):
            return t
        src = t.detach().contiguous()
        self._sync()  # the store reads src now, maybe on its own stream
        ident = self._store.save(src.data_ptr(), nbytes)
        self.saved += 1
        self.bytes_saved += nbytes
        return SavedActivation(ident, t)

    def keep(self, t):
        """A SavedActivation for any tensor worth moving (the layer-major schedule's layer inputs,
        layer_major.py), else t itself."""
        nbytes = t.numel() * t.element_size()
        if not self.enabled or nbytes < max(1, self.min_bytes) or t.device != self._device:
            return t
        src = t.detach().contiguous()
        self._sync()
        ident = self._store.save(src.data_ptr(), nbytes)
        self.saved += 1
        self.bytes_saved += nbytes
        return SavedActivation(ident, t)

    def unpack(self, h):
        """The saved tensor, loaded back from the store on first use."""
        if h.tensor is None:
            dst = torch.empty(h.shape, dtype=h.dtype, device=h.device)
            self._sync()  # dst's memory may have been in use by kernels still queued
            self._store.load(h.id, dst.data_ptr())
            h.tensor = dst
            self.loaded += 1
        return h.tensor

    def end_micro_batch(self):
        """Drops whatever this micro-batch saved and did not load (a forward with gradients on
        and no backward, a backward that failed); its counts become `last`."""
        if not self.enabled:
            return
        self.last = {"saved": self.saved, "loaded": self.loaded, "bytes_saved": self.bytes_saved}
        self.saved = self.loaded = self.bytes_saved = 0
        self._store.end_micro_batch()

    def stats(self):
        """The store's ActivationStats, with the front-end's counts: the current micro-batch's
        (saved, loaded, bytes_saved) and the last ended one's (last_saved, ...)."""
        d = dict(self._store.stats())
        d.update(offload=self.mode, min_bytes=self.min_bytes, saved=self.saved, loaded=self.loaded,
                 bytes_saved=self.bytes_saved)
        d.update({"last_" + k: v for k, v in self.last.items()})
        return d
