"""zoe's PyTorch front-end: a torch.nn.Module trained by zoe's engine, DeepSpeed style.

This file is the API: zoe.initialize, the Engine it returns, StepStats, zoe.consolidate. The
front-end's parts, each in its file:
- units.py: how the model is cut into units, and the zoe modules that hold their parameters;
- build.py: unit building, the model's parameters into the engine's zoe modules (a Layout);
- values.py: their first values (the model's tensors, weights=, a meta-built model's initializers);
- fetch.py: fetch and release, a parameter pointed at zoe's gathered buffer and back;
- hooks.py: the forward, backward, gradient and saved-tensor hooks that run the units in torch;
- phase.py: where the training loop stands (one Phase), every transition, and the calls each
  phase refuses;
- checkpoints.py: save_checkpoint, load_checkpoint, state_dict, consolidate;
- hf.py: Hugging Face models (save_pretrained, weights=); activations.py: the activation store.

Devices: with zoe.device "cuda" the engine's buffers are CUDA memory, and the model's inputs and
buffers live there too (engine.device). torch's kernels run on its current stream: before a
buffer goes back to zoe (release, reduce_grads, step) that stream is synchronized (_sync), as
include/zoe/engine.h requires.
"""
import contextlib
import json
import logging
import os

import torch
import torch.nn as nn

from . import _zoe, build, checkpoints, hf, values
from ._zoe import ZoeError
from .activations import ActivationOffload
from .checkpoints import consolidate, state_buffers  # noqa: F401 (zoe.engine.consolidate, zoe.engine.state_buffers)
from .fetch import Fetcher
from .fetch import as_tensor as _as_tensor  # noqa: F401 (zoe.engine._as_tensor, read by the tests)
from .fetch import view_ptr as _view_ptr  # noqa: F401 (zoe.engine._view_ptr, read by the tests)
from .hooks import UnitHooks
from .phase import PhaseState
from .streams import MicroBatchStreams
from .streams import micro_batch_seed  # noqa: F401 (zoe.engine.micro_batch_seed)

logger = logging.getLogger(__name__)


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



class Engine:
    """The wrapped model (engine.module) and zoe's engine under it. Made by zoe.initialize()."""

    def __init__(self, model, config, zoe_units=None, unit_params=None, init_fn=None, force_local=False,
                 weights=None):
        if not isinstance(model, nn.Module):
            raise ZoeError(f"zoe.initialize: model must be a torch.nn.Module, got {type(model).__module__}."
                           f"{type(model).__name__}")
        text = _adam_mini_shape(model, _load_config(config))
        if not force_local:
            _zoe.check_launcher()  # torchrun's variables in a zoe built without gloo: refused
        self._eng = _zoe.Engine(text, force_local)
        self.module = model
        self.rank = self._eng.rank
        self.world_size = self._eng.world_size
        _check_launcher(self.world_size, force_local)
        self.device = self._engine_device()
        self.gradient_accumulation_steps = self._eng.gradient_accumulation_steps()
        self._dtype = build.DTYPES[self._eng.compute_dtype()]
        self._phase = PhaseState(self.gradient_accumulation_steps)
        self._last = {}
        self.last_step_stats = None  # train_batch()'s step
        build.check_model(model, self._dtype)
        self._fetcher = Fetcher(self)
        self._build(model, zoe_units, unit_params, init_fn, weights)
        self._acts = ActivationOffload(self._eng.activations(), self.device, self._sync,
                                       self.config_value("zoe.activation_min_bytes"))

    def _build(self, model, zoe_units, unit_params, init_fn, weights):
        """The model's parameters into the engine's zoe modules (build.py), their values
        (values.py), and the hooks (hooks.py)."""
        meta_shapes = values.unmeta_params(model)
        meta_buffers = values.unmeta_buffers(model, self.device)
        self._layout = build.plan(model, zoe_units, unit_params, meta_shapes)
        build.register(self._eng, self._layout)
        build.buffers_to(model, self.device)
        values.initialize_parameters(self, init_fn, weights)
        values.init_buffers(self, meta_buffers, init_fn)
        self._unit_hooks = UnitHooks(self, self._layout, self._phase, self._fetcher)
        self._unit_hooks.install(model)

    # The layout's tables and the fetched buffers' addresses under the names hf.py and the tests read.
    @property
    def _zmods(self):
        return self._layout.zmods

    @property
    def _torch_names(self):
        return self._layout.torch_names

    @property
    def _aliases(self):
        return self._layout.aliases

    @property
    def _live(self):
        return self._fetcher.live

    def config_value(self, key):
        """The value of any config key by its JSON path ("zero_optimization.stage",
        "optimizer.params.lr"), as the engine uses it: defaults filled in, DeepSpeed's "auto"
        resolved. Raises ZoeError naming the key when there is no such key."""
        return json.loads(self._eng.config_value(key))

    def _engine_device(self):
        """Where the engine computes, as a torch.device: the CPU, or the GPU the engine picks with
        zoe.device "cuda" (local rank modulo the GPUs seen; the hooks check it against the first
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

    # ---------------------------------------------------------------------------------------
    # The training loop

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """Runs the wrapped model's forward (its tensor inputs on engine.device)."""
        if self._eng.is_asleep():
            raise ZoeError("engine(...) while the engine is asleep: call engine.wake() first")
        with self._phase.forward():
            _check_new_params(self.module, self._layout)
            self._check_inputs(args, kwargs)
            if any(zm.refs for zm in self._layout.zmods):
                # Held by a direct inference call of the model that raised (nothing else holds a
                # module between forwards): released before they pile up.
                self._fetcher.release_all(self._layout.zmods)
            if self._acts.saved:
                # The previous forward's checkpointed inputs, never used by a backward.
                self._acts.end_micro_batch()
            try:
                with self._unit_hooks.saved_tensors(), _losses_in_fp32(self._dtype):
                    return self.module(*args, **kwargs)
            except Exception as e:
                self._fetcher.release_all(self._layout.zmods)
                self._end_activations(failing=True)
                if not isinstance(e, ZoeError) and hasattr(e, "add_note"):
                    # The user's own error, as it was raised (type and traceback), with where zoe stood.
                    units = self._layout.units
                    e.add_note(f"zoe: raised in the forward of {type(self.module).__name__} run by zoe's engine "
                               "(a parameter is only available inside the forward of its unit; units: "
                               f"{', '.join(u.name for u in units[:8])}{'...' if len(units) > 8 else ''})")
                raise

    def backward(self, loss):
        """loss.backward() with the loss scale (fp16); gradients go to zoe as they are computed."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ZoeError(f"engine.backward: loss must be a one-element tensor, got {_describe(loss)}")
        if not loss.requires_grad:
            raise ZoeError("engine.backward: the loss does not require grad (computed under torch.no_grad(), "
                           "or by no parameter of the model)")
        scale = self._eng.loss_scale()
        with self._phase.backward():
            failing = True
            try:
                with self._unit_hooks.saved_tensors():
                    (loss * scale if scale != 1.0 else loss).backward()
                failing = False
            finally:
                self._unit_hooks.finish_backward()
                self._end_activations(failing)
        return loss

    def is_gradient_accumulation_boundary(self):
        return self._phase.at_boundary()

    def step(self):
        """At a gradient-accumulation boundary: norm, clipping and AdamW wherever the states live;
        otherwise nothing (stats.stepped is False)."""
        if not self._phase.check_step():
            d = dict(self._last)
            d["high_water"] = self.high_water()
            return StepStats(d, stepped=False)
        _check_new_params(self.module, self._layout)
        self._sync()
        d = self._eng.step()
        self._phase.stepped()
        self._last = d
        return StepStats(d, stepped=True)

    def train_batch(self, batches, loss_fn=None):
        """One optimizer step over a list of micro-batches (DeepSpeed's pipeline engine's name):
        the forward and backward of each, then engine.step(); returns their losses (floats).

        batches: gradient_accumulation_steps items, each a dict of keyword arguments of the model
        (a Hugging Face batch: input_ids, labels, ...), a tuple of positional arguments, or one
        tensor. loss_fn(output, batch) gives the loss; without it the output is the loss (a
        one-element tensor) or has one (.loss, or ["loss"]: a Hugging Face model given labels).

        With zoe.schedule "layer-major" and a Hugging Face decoder-only causal LM (its decoder
        layers in model.layers, transformer.h or gpt_neox.layers), each decoder layer is fetched
        once in the forward and once in the backward for all the micro-batches (layer_major.py);
        otherwise the micro-batches run one after another through the whole model (the micro-batch
        schedule). Either way the same gradients, summed in the same order, as the same calls made
        by hand. Random draws (dropout): micro-batch g draws from a stream of its own, seeded with
        zoe.micro_batch_seed(engine.global_steps, g) (streams.py), so both schedules draw the same
        masks and give the same bits; torch's default generators are left as they were (calls made
        by hand give the same bits where each micro-batch runs after torch.manual_seed of its seed,
        the seeds all taken first). The step's StepStats are in engine.last_step_stats, whose .schedule says which
        schedule ran (with gradient_accumulation_steps 1 the two are the same calls: "micro-batch";
        a model the layer-major path cannot drive runs the micro-batch schedule, said once)."""
        batches = list(batches)
        if len(batches) != self.gradient_accumulation_steps:
            raise ZoeError(f"engine.train_batch: {len(batches)} micro-batches given, but gradient_accumulation_steps "
                           f"is {self.gradient_accumulation_steps}: give one batch per micro-batch of a step")
        if self._phase.micro_steps % self.gradient_accumulation_steps != 0:
            raise ZoeError("engine.train_batch: a step's micro-batches are already under way (engine.backward() "
                           "was called without engine.step()): finish that step first")
        if self.config_value("zoe.schedule") == "layer-major" and len(batches) > 1:
            from .layer_major import LayerMajor, decoder_stack

            stack = decoder_stack(self.module)
            lm = LayerMajor(self, stack) if stack is not None else None
            if lm is not None and lm.supported:
                streams = MicroBatchStreams(self._phase.global_steps, len(batches), self.device)
                try:
                    losses = lm.step(batches, loss_fn, streams)
                except BaseException:
                    # Part of the step's gradients may have reached zoe: no step is taken from them.
                    self._phase.failed_micro_batch = self._phase.micro_steps + 1
                    self._phase.phase = self._phase._resting()
                    self._fetcher.release_all(self._layout.zmods)
                    raise
                finally:
                    streams.close()
                stats = self.step()
                stats.fields["schedule"] = "layer-major"
                self.last_step_stats = stats
                return losses
            if not getattr(self, "_said_no_layer_major", False):
                self._said_no_layer_major = True
                why = ("the model is not a Hugging Face decoder-only causal LM with its decoder layers in "
                       "model.layers, transformer.h or gpt_neox.layers" if stack is None else
                       "its decoder layers are not zoe units of their own (zoe_units= / unit_params= cut them "
                       "otherwise)")
                logger.warning("zoe.schedule \"layer-major\": %s, so engine.train_batch runs the micro-batch "
                               "schedule (the same results); set zoe.schedule \"micro-batch\" to silence this", why)
        losses = []
        streams = MicroBatchStreams(self._phase.global_steps, len(batches), self.device)
        try:
            for i, b in enumerate(batches):
                with streams.use(i):
                    if isinstance(b, dict):
                        out = self.forward(**b)
                    elif isinstance(b, (tuple, list)):
                        out = self.forward(*b)
                    else:
                        out = self.forward(b)
                    loss = _loss_of(out, b, loss_fn, i)
                    self.backward(loss)
                losses.append(float(loss.detach().float()))
        finally:
            streams.close()
        stats = self.step()
        stats.fields["schedule"] = "micro-batch"
        self.last_step_stats = stats
        return losses

    @property
    def global_steps(self):
        return self._phase.global_steps

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

    # ---------------------------------------------------------------------------------------
    # Sleep and wake: the device for an inference engine between training phases (RL)

    def sleep(self):
        """Gives the device memory back until wake(): at a step boundary (after step(), before the
        next forward), every byte zoe holds on the device (parameters, the partition cache,
        gradient buffers, device-resident optimizer states, the activation store's device share)
        goes to host memory, or to zoe's NVMe swap where zoe.host_budget has no room left, and the
        device memory is freed: memory_in_use()["device"] is 0 while asleep. The model's
        parameters must not be used until wake() (forward and backward raise). Mid-step, while
        asleep, or on a CUDA device (not built yet) it raises ZoeError and changes nothing."""
        self._phase.require_boundary("engine.sleep()")
        self._sync()
        self._eng.sleep()

    def wake(self):
        """Brings back every byte sleep() moved, to the same device addresses: training goes on
        with the bits it would have had without the sleep. Raises ZoeError when not asleep."""
        self._eng.wake()

    @property
    def is_asleep(self):
        return self._eng.is_asleep()

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
        zmods = self._layout.zmods
        return [(u.name, [zmods[z].name for z in u.zmods]) for u in self._layout.units]

    # ---------------------------------------------------------------------------------------
    # State: checkpoints.py and hf.py

    def parameters_in_use(self, *params):
        """A context in which the given parameters of the model are their real tensors, for code
        that reads them outside their own module's forward (as DeepSpeed's GatheredParameters with
        modifier_rank=None): a fused loss reading lm_head.weight, TRL's SFTTrainer for one. Inside
        engine(...) the gradients flow to zoe as from the module's own forward; writes are not kept."""
        return self._unit_hooks.parameters_in_use(params)

    def master_params(self):
        """{name: full fp32 master tensor} (gathered from every rank; a copy)."""
        return checkpoints.master_params(self)

    def gathered_parameters(self, dtype=None, rank0_only=False):
        """The current weights (after the last step), one full tensor at a time, for an inference
        engine's load_weights (vLLM, SGLang) or an HF model: an iterator of (name, tensor), in the
        model's own names (a tied parameter once), zoe module by zoe module in the order of their
        first parameter in model.named_parameters() (for the models zoe wraps, that order itself).
        Each tensor is the fp32 master on the CPU (a view of its module's array, overlapping no
        other tensor yielded), or cast to dtype (torch.bfloat16, ...).
        Each zoe module is read once, whole: the host memory it holds at once is bounded by two of
        the largest zoe module in fp32 (the one read, and the one whose last tensor the caller
        still holds), whatever the model's size. Every rank
        iterates to the end, in step (each tensor is gathered from all ranks); every rank gets
        the same tensors, or with rank0_only=True rank 0 only (the others' iterators yield
        nothing but still take part in the gathers). At a step boundary only."""
        return checkpoints.gathered_parameters(self, dtype=dtype, rank0_only=rank0_only)

    def state_dict(self):
        """The model's state_dict, with the keys model.state_dict() has (so load_state_dict(strict=True)
        takes it): full fp32 parameters from zoe, tied ones under each name, and the persistent
        buffers from torch (non-persistent ones, such as a rotary inv_freq, are not state)."""
        return checkpoints.state_dict(self)

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

    def save_checkpoint(self, save_dir, tag=None, client_state=None):
        """Saves every state (zoe's, wherever it lives) into save_dir/tag with client_state and the
        model's buffers (every rank calls it). Returns the checkpoint directory."""
        return checkpoints.save_checkpoint(self, save_dir, tag, client_state)

    def load_checkpoint(self, load_dir, tag=None):
        """Restores a checkpoint (load_dir's latest, or load_dir/tag) into this engine's placement
        and world size. Returns (checkpoint path, client_state)."""
        return checkpoints.load_checkpoint(self, load_dir, tag)

    def close(self):
        """Removes the hooks and frees zoe's engine (the model is unusable afterwards)."""
        self._unit_hooks.remove()
        self._eng.close()

    # ---------------------------------------------------------------------------------------

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


def _check_new_params(model, layout):
    """Every parameter is zoe's, frozen or trained as it was at initialize."""
    for n, p in model.named_parameters():
        if id(p) not in layout.owner:
            raise ZoeError(f"zoe: parameter '{n}' (shape {list(p.shape)}) was added to the model after "
                           "zoe.initialize(): zoe does not hold it; create every parameter before initialize")
        zm = layout.zmods[layout.owner[id(p)][0]]
        if p.requires_grad == zm.frozen:
            now, then = ("True", "False") if p.requires_grad else ("False", "True")
            raise ZoeError(f"zoe: parameter '{n}' has requires_grad={now}, but it was {then} at "
                           "zoe.initialize(): zoe fixed the frozen parameters there (a frozen one has no "
                           "optimizer states or gradient buffers in zoe). Set requires_grad before "
                           "zoe.initialize() (to change it later: engine.state_dict() into a new model and "
                           "a new zoe.initialize())")


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


def _adam_mini_shape(model, text):
    """optimizer.type "AdamMini" without optimizer.params.dim/n_heads/n_kv_heads: the model's own
    (a Hugging Face config's hidden_size, num_attention_heads, num_key_value_heads), said once,
    instead of the adam-mini package's defaults (2048, 32), which cut a smaller or larger model's
    q/k projections into blocks that are not its heads. A value the config gives is kept."""
    try:
        cfg = json.loads(text)
    except ValueError:
        return text  # the engine's parser names what is wrong
    opt = cfg.get("optimizer") if isinstance(cfg, dict) else None
    mcfg = getattr(model, "config", None)
    if not isinstance(opt, dict) or str(opt.get("type", "")).lower() != "adammini" or mcfg is None:
        return text
    params = opt.setdefault("params", {})
    if not isinstance(params, dict):
        return text
    found = {"dim": getattr(mcfg, "hidden_size", None), "n_heads": getattr(mcfg, "num_attention_heads", None),
             "n_kv_heads": getattr(mcfg, "num_key_value_heads", None)}
    filled = {k: v for k, v in found.items() if k not in params and isinstance(v, int) and v > 0}
    if not filled:
        return text
    params.update(filled)
    logger.info("optimizer.type \"AdamMini\": optimizer.params %s from the model's config (give them to override)",
                ", ".join(f"{k} {v}" for k, v in filled.items()))
    return json.dumps(cfg)


def _check_launcher(world, force_local):
    """torchrun (or torch.distributed.launch) sets WORLD_SIZE; zoe joins its world over gloo (or
    MPI's under mpirun/srun). A runtime that still found a world of one would let each process
    train alone on its own data."""
    env = os.environ.get("WORLD_SIZE", "")
    if force_local or world != 1 or not env.isdigit() or int(env) <= 1:
        return
    raise ZoeError(f"zoe.initialize: WORLD_SIZE={env} is set (torchrun or torch.distributed.launch), but this "
                   "process is rank 0 of 1, so each process would train alone. Launch with torchrun (zoe joins "
                   f"its world over gloo), mpirun -np {env} python your_script.py, or srun -n {env} --mpi=pmix "
                   "python your_script.py under Slurm (one process per device; see python/README.md)")


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


def _loss_of(out, batch, loss_fn, i):
    """The loss of micro-batch i of train_batch: loss_fn(out, batch), else out itself or its .loss."""
    if loss_fn is not None:
        loss = loss_fn(out, batch)
    elif isinstance(out, torch.Tensor):
        loss = out
    elif getattr(out, "loss", None) is not None:
        loss = out.loss
    elif isinstance(out, dict) and out.get("loss") is not None:
        loss = out["loss"]
    else:
        raise ZoeError(f"engine.train_batch: micro-batch {i}: the model returned {_describe(out)}, with no loss: "
                       "give loss_fn(output, batch), or labels for a Hugging Face model")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ZoeError(f"engine.train_batch: micro-batch {i}: the loss must be a one-element tensor, got "
                       f"{_describe(loss)}")
    return loss


def _describe(x):
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {list(x.shape)}"
    return type(x).__name__


def initialize(model=None, config=None, zoe_units=None, unit_params=None, init_fn=None, force_local=False,
               weights=None, **_deepspeed_args):
    """Wraps `model` (a torch.nn.Module, built on the CPU or the meta device) in a zoe engine.

    config: a dict or the path of a DeepSpeed-style JSON file. zoe_units: the units (modules or
    qualified names) instead of the default cut; unit_params: cut by parameter count instead.
    init_fn(module): initialises meta-device modules (default: their reset_parameters(), and a
    transformers model's own _init_weights, whose large normal and uniform fills zoe draws on
    every core, seeded from torch's default generator: docs/pytorch.md). weights: a folder of safetensors (a Hugging Face
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
