"""Hugging Face transformers models under zoe: engine.save_pretrained(), initialize(weights=...),
and zoe.hf.Trainer (hf_trainer.py: transformers' Trainer training through zoe; zoe.hf.ZoeTrainerMixin
for any Trainer subclass; zoe.hf.TrainingArguments, whose deepspeed= is zoe's config).

save_pretrained writes what transformers' own save_pretrained writes (config.json,
generation_config.json, model.safetensors or model-0000i-of-0000n.safetensors with
model.safetensors.index.json above max_shard_size), streamed: each safetensors file's header is
computed from the shapes first, then every tensor is read from zoe (read_master) and written in
turn, so at most one parameter is held in host memory, however large the model.

weights= reads a folder of safetensors (one file, or shards with their index) tensor by tensor
into zoe's initialisation of each module: the model may be built on the meta device and be larger
than host memory.

Nothing here imports transformers (hf_trainer.py does, when zoe.hf.Trainer is first used): a model
is a Hugging Face model when it has a `config` with to_json_file (a PreTrainedModel).
"""
import copy
import json
import os
import re
import struct

import numpy as np
import torch

from ._zoe import ZoeError

# transformers 5's default max_shard_size for save_pretrained (4.x used "5GB").
DEFAULT_MAX_SHARD_SIZE = "50GB"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")

_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
              torch.bool: "BOOL"}


def is_hf_model(model):
    cfg = getattr(model, "config", None)
    return cfg is not None and hasattr(cfg, "to_json_file")


def parse_size(size, what="max_shard_size"):
    """An int (bytes) or a string as transformers takes it: "5GB" (10^9), "5GiB" (2^30), "200MB"."""
    if isinstance(size, int) and size > 0:
        return size
    units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9,
             "TB": 10**12, "B": 1}
    if isinstance(size, str):
        s = size.strip().upper()
        for u, mult in units.items():
            if s.endswith(u) and s[:-len(u)].strip():
                try:
                    n = float(s[:-len(u)])
                except ValueError:
                    break
                if n > 0:
                    return int(n * mult)
    raise ZoeError(f"engine.save_pretrained: {what} must be a positive number of bytes or a size such as "
                   f"\"5GB\" or \"500MiB\", got {size!r}")


def _tied_targets(model):
    """The parameter names transformers leaves out of a checkpoint as tied copies of another
    (PreTrainedModel.all_tied_weights_keys in transformers 5, _tied_weights_keys before)."""
    keys = getattr(model, "all_tied_weights_keys", None)
    if keys is None:
        keys = getattr(model, "_tied_weights_keys", None)
    if isinstance(keys, dict):
        return set(keys)
    if isinstance(keys, (list, tuple, set)):
        return set(keys)
    return set()


def saved_parameters(engine):
    """[(name, zoe module index, parameter index, shape)] of the parameters to write: one name per
    tensor, the one transformers keeps for tied weights."""
    targets = _tied_targets(engine.module)
    groups = {}  # primary name -> all names of the tensor
    for alias, name in engine._aliases.items():
        groups.setdefault(name, [name]).append(alias)
    out = []
    for zm in engine._zmods:
        for i, (n, s) in enumerate(zip(zm.names, zm.shapes)):
            name = engine._torch_names[f"{zm.name}.{n}"]
            names = groups.get(name, [name])
            keep = [x for x in names if x not in targets] or names
            out.append((keep[0], zm.index, i, tuple(s)))
    return out


def persistent_buffers(model):
    """[(name, tensor)] of the buffers model.state_dict() would hold (non-persistent ones left out)."""
    out, seen = [], set()
    for mn, mod in model.named_modules():
        for bn, b in mod._buffers.items():
            if b is None or bn in mod._non_persistent_buffers_set or id(b) in seen:
                continue
            seen.add(id(b))
            out.append((f"{mn}.{bn}" if mn else bn, b))
    return out


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _plan_shards(entries, limit):
    """entries: [(name, nbytes, ...)] in order -> lists of entries, each under `limit` bytes unless
    one tensor alone is larger (transformers' rule: a tensor is never split)."""
    shards, cur, size = [], [], 0
    for e in entries:
        if cur and size + e[1] > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(e)
        size += e[1]
    if cur or not shards:
        shards.append(cur)
    return shards


def _header(shard, st_dtype_of):
    """The safetensors header bytes (length prefix included) for the shard's tensors, in order."""
    meta = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, nbytes, shape, dtype, _ in shard:
        meta[name] = {"dtype": st_dtype_of(dtype), "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    text = json.dumps(meta, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(text)) + text


def _tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype is torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def is_peft_model(model):
    """A PEFT model (peft.PeftModel and its task subclasses), told without importing peft: its
    adapters' configs in peft_config and the wrapped model behind get_base_model()."""
    return isinstance(getattr(model, "peft_config", None), dict) and callable(getattr(model, "get_base_model", None))


def save_pretrained(engine, save_directory, max_shard_size=None, dtype=None):
    """See Engine.save_pretrained."""
    model = engine.module
    if is_peft_model(model):
        return save_peft_adapter(engine, save_directory, max_shard_size, dtype)
    if max_shard_size is None:
        max_shard_size = DEFAULT_MAX_SHARD_SIZE
    if not is_hf_model(model):
        raise ZoeError(f"engine.save_pretrained: the model ({type(model).__name__}) is not a Hugging Face "
                       "transformers model (it has no .config with to_json_file): use engine.save_checkpoint() "
                       "or engine.state_dict()")
    engine._phase.require_boundary(f"engine.save_pretrained({save_directory!r})")
    out_dtype = _out_dtype(dtype)
    limit = parse_size(max_shard_size)
    save_directory = os.fspath(save_directory)
    writer = engine.rank == 0
    if writer:
        os.makedirs(save_directory, exist_ok=True)

    # (name, nbytes, shape, dtype, source): source is (zoe module, parameter) or a buffer tensor.
    entries = []
    for name, mi, pi, shape in saved_parameters(engine):
        entries.append((name, _numel(shape) * out_dtype.itemsize, shape, out_dtype, (mi, pi)))
    for name, b in persistent_buffers(model):
        if b.device.type == "meta":
            raise ZoeError(f"engine.save_pretrained: buffer '{name}' is still on the meta device (the model was "
                           "built on meta and nothing gave the buffer values)")
        bd = out_dtype if b.is_floating_point() else b.dtype
        if bd not in _ST_DTYPES:
            raise ZoeError(f"engine.save_pretrained: buffer '{name}' has dtype {b.dtype}, which safetensors "
                           "cannot hold")
        entries.append((name, b.numel() * bd.itemsize, tuple(b.shape), bd, b))
    shards = _plan_shards(entries, limit)
    n = len(shards)
    files = [WEIGHTS_NAME] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]

    if writer:
        # Files of an earlier save into the same folder that this one does not overwrite (transformers
        # removes them too: from_pretrained would otherwise find a stale index or shard).
        for f in os.listdir(save_directory):
            if (f == WEIGHTS_INDEX_NAME or f == WEIGHTS_NAME or _SHARD_RE.match(f)) and f not in files:
                os.remove(os.path.join(save_directory, f))
    for fname, shard in zip(files, shards):
        fh = open(os.path.join(save_directory, fname), "wb") if writer else None
        try:
            if fh:
                fh.write(_header(shard, _ST_DTYPES.__getitem__))
            for name, nbytes, shape, dt, src in shard:
                if isinstance(src, tuple):
                    # read_master gathers from every rank: each rank reads, in the same order.
                    a = engine._eng.read_master(src[0], src[1], max(1, _numel(shape)))
                    t = torch.from_numpy(a)[:_numel(shape)].view(shape).to(dt)
                else:
                    t = src.to(dt)
                if fh:
                    data = _tensor_bytes(t)
                    assert len(data) == nbytes, (name, len(data), nbytes)
                    fh.write(data)
        finally:
            if fh:
                fh.close()
    if not writer:
        return save_directory
    if n > 1:
        index = {"metadata": {"total_size": sum(e[1] for e in entries)},
                 "weight_map": {e[0]: f for f, shard in zip(files, shards) for e in shard}}
        with open(os.path.join(save_directory, WEIGHTS_INDEX_NAME), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2, sort_keys=True)
            f.write("\n")
    _save_configs(model, save_directory, out_dtype)
    return save_directory


def _out_dtype(dtype):
    out = torch.float32 if dtype is None else dtype
    if out not in (torch.float32, torch.bfloat16, torch.float16):
        raise ZoeError(f"engine.save_pretrained: dtype must be torch.float32, torch.bfloat16 or torch.float16, "
                       f"got {dtype!r}")
    return out


def save_peft_adapter(engine, save_directory, max_shard_size=None, dtype=None):
    """engine.save_pretrained of a PEFT model: what PEFT's own save_pretrained writes (its
    adapter_config.json, adapter_model.safetensors with PEFT's key names, README.md; one
    subfolder per further adapter), for PeftModel.from_pretrained(base, dir). PEFT chooses the
    tensors from stand-ins of the model's state_dict (meta tensors, no values), and only those are
    read from zoe: the frozen base is not read."""
    from peft.utils import get_peft_model_state_dict

    model = engine.module
    if max_shard_size is not None:
        raise ZoeError(f"engine.save_pretrained({os.fspath(save_directory)!r}): max_shard_size does not apply to a "
                       "PEFT model: its adapter is written as one file, as PEFT's save_pretrained writes it "
                       "(leave max_shard_size out)")
    engine._phase.require_boundary(f"engine.save_pretrained({save_directory!r})")
    out_dtype = _out_dtype(dtype)
    sources = _state_sources(engine)
    stand_ins = {}
    for key, (shape, dt, _) in sources.items():
        stand_ins[key] = torch.empty(shape, dtype=out_dtype if dt.is_floating_point else dt, device="meta")
    key_of = {id(t): k for k, t in stand_ins.items()}
    wanted = {}
    for adapter in model.peft_config:
        chosen = get_peft_model_state_dict(model, state_dict=stand_ins, adapter_name=adapter)
        unknown = sorted(k for k, v in chosen.items() if id(v) not in key_of)
        if unknown:
            raise ZoeError(f"engine.save_pretrained: PEFT's state for adapter {adapter!r} "
                           f"({model.peft_config[adapter].peft_type}) holds tensors that are not the model's own "
                           f"({', '.join(unknown[:5])}): zoe writes adapters whose tensors are the model's parameters "
                           "and buffers (LoRA and the like)")
        wanted.update((key_of[id(v)], None) for v in chosen.values())
    # Every rank reads (read_master gathers from all ranks), in the same order; rank 0 writes.
    state = {k: _read_state(engine, sources[k][2], sources[k][0]).to(out_dtype if sources[k][1].is_floating_point
                                                                      else sources[k][1])
             for k in wanted}
    model.save_pretrained(os.fspath(save_directory), state_dict=state, is_main_process=engine.rank == 0)
    return os.fspath(save_directory)


def _state_sources(engine):
    """{state_dict key: (shape, dtype, source)} of the model: a parameter's source is (zoe module,
    index) (fp32 masters), a persistent buffer's the tensor."""
    from .checkpoints import state_buffers

    out = {}
    for zm in engine._zmods:
        for i, (n, s) in enumerate(zip(zm.names, zm.shapes)):
            out[engine._torch_names[f"{zm.name}.{n}"]] = (tuple(s), torch.float32, (zm.index, i))
    for alias, name in engine._aliases.items():
        out[alias] = out[name]
    for key, b in state_buffers(engine.module):
        out[key] = (tuple(b.shape), b.dtype, b)
    return out


def _read_state(engine, src, shape):
    if isinstance(src, tuple):
        a = engine._eng.read_master(src[0], src[1], max(1, _numel(shape)))
        return torch.from_numpy(a)[:_numel(shape)].view(shape).clone()
    return src.detach().to("cpu", copy=True)


def checkpoint_configs(model):
    """What `zoe ckpt consolidate D --format hf` needs of a transformers model, kept in the
    checkpoint's trainer state: config.json's contents as save_pretrained writes them (fp32), and
    generation_config.json's when the model generates."""
    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "dtype") or not hasattr(cfg, "torch_dtype"):
        cfg.dtype = torch.float32
    else:
        cfg.torch_dtype = torch.float32
    cfg.architectures = [type(model).__name__]
    out = {"config": json.loads(cfg.to_json_string(use_diff=False))}
    gen = getattr(model, "generation_config", None)
    can_generate = getattr(model, "can_generate", None)
    if gen is not None and callable(can_generate) and can_generate():
        out["generation_config"] = json.loads(gen.to_json_string(use_diff=False))
    return out


def _save_configs(model, save_directory, out_dtype):
    cfg = copy.deepcopy(model.config)
    # The dtype the weights were written in: from_pretrained's dtype="auto" reads it.
    if hasattr(cfg, "dtype") or not hasattr(cfg, "torch_dtype"):
        cfg.dtype = out_dtype
    else:
        cfg.torch_dtype = out_dtype
    cfg.architectures = [type(model).__name__]
    cfg.to_json_file(os.path.join(save_directory, "config.json"))
    gen = getattr(model, "generation_config", None)
    can_generate = getattr(model, "can_generate", None)
    if gen is not None and callable(can_generate) and can_generate():
        gen.to_json_file(os.path.join(save_directory, "generation_config.json"))


# -------------------------------------------------------------------------------------------
# Loading: initialize(weights=folder)


class WeightsFolder:
    """A folder of safetensors (model.safetensors, or shards named by model.safetensors.index.json,
    or any *.safetensors files) read one tensor at a time."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if os.path.isfile(self.path) and self.path.endswith(".safetensors"):
            files = [self.path]
        elif os.path.isdir(self.path):
            index = os.path.join(self.path, WEIGHTS_INDEX_NAME)
            if os.path.isfile(index):
                with open(index, "r", encoding="utf-8") as f:
                    wm = json.load(f).get("weight_map")
                if not isinstance(wm, dict):
                    raise ZoeError(f"zoe.initialize: weights: {index} has no \"weight_map\" object")
                files = [os.path.join(self.path, f) for f in dict.fromkeys(wm.values())]
            else:
                files = sorted(os.path.join(self.path, f) for f in os.listdir(self.path)
                               if f.endswith(".safetensors"))
            if not files:
                raise ZoeError(f"zoe.initialize: weights: no *.safetensors file in {self.path}")
        else:
            raise ZoeError(f"zoe.initialize: weights={self.path!r} is neither a folder nor a .safetensors file")
        self.shapes = {}   # name -> shape
        self.where = {}    # name -> file
        for fn in files:
            if not os.path.isfile(fn):
                raise ZoeError(f"zoe.initialize: weights: {fn}, named by {WEIGHTS_INDEX_NAME}, does not exist")
            for name, shape in _read_header(fn).items():
                self.shapes[name] = shape
                self.where[name] = fn
        self._open = {}

    def get(self, name):
        from safetensors import safe_open

        fn = self.where[name]
        h = self._open.get(fn)
        if h is None:
            h = self._open[fn] = safe_open(fn, framework="pt")
        return h.get_tensor(name)

    def close(self):
        self._open.clear()


def _read_header(fn):
    with open(fn, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ZoeError(f"zoe.initialize: weights: {fn} is not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 << 20:
            raise ZoeError(f"zoe.initialize: weights: {fn} is not a safetensors file (header length {n})")
        try:
            meta = json.loads(f.read(n))
        except ValueError as e:
            raise ZoeError(f"zoe.initialize: weights: {fn}: the safetensors header is not JSON ({e})") from None
    return {k: tuple(v["shape"]) for k, v in meta.items() if k != "__metadata__"}


def check_weights(folder, engine):
    """Raises ZoeError naming every missing, extra or wrongly shaped tensor of `folder` against the
    model's parameters and persistent buffers; returns {parameter name: name in the folder}."""
    model = engine.module
    groups = {}
    for alias, name in engine._aliases.items():
        groups.setdefault(name, [name]).append(alias)
    source = {}  # parameter name -> its name in the folder
    missing, shape_bad = [], []
    used = set()
    for zm in engine._zmods:
        for n, s in zip(zm.names, zm.shapes):
            primary = engine._torch_names[f"{zm.name}.{n}"]
            names = groups.get(primary, [primary])
            found = [c for x in names for c in _renamed(x) if c in folder.shapes]
            used.update(found)
            if not found:
                fused = next((f for c in _renamed(primary) for f in [_per_expert_source(c, tuple(s), folder)] if f),
                             None)
                if fused is None:
                    missing.append(primary)
                else:
                    source[primary] = fused
                    used.update(n for group in fused[1] for n in group)
                continue
            for x in found:
                if folder.shapes[x] != tuple(s):
                    shape_bad.append(f"{x}: {list(folder.shapes[x])} in the folder, {list(s)} in the model")
            source[primary] = found[0]
    bufs = {}
    for name, b in persistent_buffers(model):
        if name in folder.shapes:
            used.add(name)
            if folder.shapes[name] != tuple(b.shape) and b.device.type != "meta":
                shape_bad.append(f"{name}: {list(folder.shapes[name])} in the folder, {list(b.shape)} in the model")
            bufs[name] = name
    # Keys transformers itself skips on load (an old checkpoint's rotary inv_freq, say).
    ignore = [re.compile(r) for r in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []]
    extra = sorted(k for k in set(folder.shapes) - used if not any(r.search(k) for r in ignore))
    problems = []
    if missing:
        problems.append(f"missing {len(missing)}: {', '.join(missing[:10])}{'...' if len(missing) > 10 else ''}")
    if extra:
        problems.append(f"extra (not in the model) {len(extra)}: {', '.join(extra[:10])}"
                        f"{'...' if len(extra) > 10 else ''}")
    if shape_bad:
        problems.append(f"wrong shape {len(shape_bad)}: {'; '.join(shape_bad[:10])}")
    if problems:
        hint = (" (zoe reads the model's own parameter names; a checkpoint in another layout, such as the "
                "per-expert MoE weights transformers converts while loading, is not converted)"
                if missing and extra else "")
        raise ZoeError(f"zoe.initialize: weights={folder.path!r} does not match the model "
                       f"({type(model).__name__}): {' | '.join(problems)}{hint}")
    return source, bufs


# transformers 5 fuses the experts of an MoE layer into 3D parameters and converts per-expert
# checkpoints while loading (its conversion_mapping); the two layouts of its common families:
# fused name -> the per-expert names concatenated along dim 0 for each expert, then stacked.
_EXPERT_LAYOUTS = {
    "gate_up_proj": (("gate_proj.weight", "up_proj.weight"), ("w1.weight", "w3.weight")),
    "down_proj": (("down_proj.weight",), ("w2.weight",)),
}


# Module renamings transformers 5 applies while loading (its conversion_mapping): the model's
# name fragment -> the fragment a checkpoint of the original layout has (mixtral's MoE block).
_RENAMED = ((".mlp.", ".block_sparse_moe."),)


def _renamed(name):
    """The names `name` may have in a checkpoint: its own first, then the original layouts'."""
    return [name] + [name.replace(a, b) for a, b in _RENAMED if a in name]


def _per_expert_source(name, shape, folder):
    """("experts", [[names of expert 0], [names of expert 1], ...]) when `name` is a fused
    experts parameter (prefix.experts.gate_up_proj / down_proj, shape [E, ...]) that the folder
    holds per expert (qwen2_moe's gate_proj/up_proj/down_proj or mixtral's w1/w3/w2), else None."""
    prefix, _, leaf = name.rpartition(".")
    if not prefix.endswith("experts") or leaf not in _EXPERT_LAYOUTS or len(shape) != 3:
        return None
    for parts in _EXPERT_LAYOUTS[leaf]:
        groups = [[f"{prefix}.{e}.{p}" for p in parts] for e in range(shape[0])]
        if not all(n in folder.shapes for g in groups for n in g):
            continue
        rows = [sum(folder.shapes[n][0] for n in g) for g in groups]
        if all(r == shape[1] and all(folder.shapes[n][1:] == shape[2:] for n in g) for r, g in zip(rows, groups)):
            return ("experts", groups)
    return None


def init_weights_fn(model):
    """transformers' own initialisation for a meta-built PreTrainedModel (its _init_weights, one
    submodule at a time), or None when the model has none."""
    fn = getattr(model, "_init_weights", None)
    if not is_hf_model(model) or not callable(fn):
        return None
    return fn


class WeightsSource:
    """initialize(weights=...): the folder checked against the engine's model, its persistent
    buffers loaded, and each zoe module's values read on demand (values(zm))."""

    def __init__(self, path, engine):
        self.folder = WeightsFolder(path)
        self.engine = engine
        self.source, bufs = check_weights(self.folder, engine)
        by_name = dict(persistent_buffers(engine.module))
        owners = {}
        for mn, mod in engine.module.named_modules():
            for bn in mod._buffers:
                owners[f"{mn}.{bn}" if mn else bn] = (mod, bn)
        for name in bufs:
            t = self.folder.get(name)
            b = by_name[name]
            mod, bn = owners[name]
            if b.device.type == "meta":
                mod._buffers[bn] = t.to(b.dtype)
            else:
                with torch.no_grad():
                    b.copy_(t.to(b.dtype))

    def values(self, zm):
        out = []
        eng = self.engine
        for n, s in zip(zm.names, zm.shapes):
            name = eng._torch_names[f"{zm.name}.{n}"]
            src = self.source[name]
            if isinstance(src, tuple):  # per-expert tensors -> the fused [E, ...] parameter
                t = torch.stack([torch.cat([self.folder.get(n) for n in g], 0) for g in src[1]])
            else:
                t = self.folder.get(src)
            a = t.to(torch.float32).reshape(-1).numpy()
            out.append(a if a.size else np.zeros(1, dtype=np.float32))
        return out

    def close(self):
        self.folder.close()


# -------------------------------------------------------------------------------------------
# zoe.hf.Trainer (hf_trainer.py, which imports transformers: loaded on first use)

_TRAINER_NAMES = ("Trainer", "TrainingArguments", "ZoeTrainerMixin", "resolve_config")


def __getattr__(name):
    if name in _TRAINER_NAMES:
        from . import hf_trainer

        return getattr(hf_trainer, name)
    raise AttributeError(f"module 'zoe.hf' has no attribute {name!r}")
