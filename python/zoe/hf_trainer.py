"""zoe.hf.Trainer: transformers' Trainer, training through zoe's engine.

    trainer = zoe.hf.Trainer(model=model, args=TrainingArguments(...), train_dataset=ds,
                             zoe_config="zoe.json")       # or a dict; or args=zoe.hf.TrainingArguments(deepspeed=...)
    trainer.train(); trainer.evaluate(); trainer.save_model(out)

The Trainer's own loop runs unchanged (data order, logging, callbacks, evaluation, checkpoint
rotation); a few of its documented hooks hand the model to zoe:
- create_optimizer / create_scheduler: zoe.initialize(model, config) with the config's DeepSpeed
  "auto" values filled from the TrainingArguments (resolve_config), at the start of train() when
  the number of steps is known. The optimizer the Trainer steps is zoe's engine (AdamW with its
  states wherever zoe keeps them; no torch optimizer is made over the parameters), and zoe's
  scheduler sets the rate of each update (the Trainer's scheduler.step() is a no-op).
- _wrap_model: the model the Trainer calls runs its forward through the engine; training_step
  sends the backward there (accelerator.backward -> engine.backward).
- _clip_grad_norm / _get_grad_norm / _get_learning_rate: zoe clips by gradient_clipping inside its
  step; the logged grad_norm (before clipping) and learning_rate are the update's own.
- _save (save_model): engine.save_pretrained, the folder from_pretrained loads.
- _save_optimizer_and_scheduler / _load_from_checkpoint / _load_optimizer_and_scheduler: zoe's
  checkpoint (every state, wherever it lives) inside checkpoint-N, next to the Trainer's
  trainer_state.json and RNG states; resume_from_checkpoint restores it.

ZoeTrainerMixin holds all of it, for any Trainer subclass: class MySFT(ZoeTrainerMixin, SFTTrainer).
"""
import contextlib
import copy
import dataclasses
import json
import logging
import math
import os
import sys
import weakref

import torch
import torch.nn as nn
import transformers
from transformers.trainer import TRAINING_ARGS_NAME

from . import _zoe, hf
from ._zoe import ZoeError

logger = logging.getLogger(__name__)

# TrainingArguments.optim values that are AdamW (zoe's optimizer), and lr_scheduler_type values
# that zoe's schedules (DeepSpeed's WarmupLR and WarmupDecayLR) express.
_ADAMW = ("adamw_torch", "adamw_torch_fused", "adamw_hf")
_SCHEDULES = ("constant", "constant_with_warmup", "linear")


class TrainingArguments(transformers.TrainingArguments):
    """transformers.TrainingArguments whose `deepspeed` (a DeepSpeed config: a path or a dict, "auto"
    values included) is zoe's config: kept for zoe.hf.Trainer, not handed to transformers' DeepSpeed
    integration, so DeepSpeed need not be installed."""

    def __post_init__(self):
        ds, self.deepspeed = self.deepspeed, None
        try:
            super().__post_init__()
        finally:
            self.deepspeed = ds


def _read_config(config, what):
    """A config given as a dict or a JSON file's path, as a new dict."""
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        try:
            with open(path, "r", encoding="utf-8") as f:
                return json.load(f)
        except OSError as e:
            raise ZoeError(f"zoe.hf.Trainer: cannot read {what} {path}: {e.strerror} (errno {e.errno})") from None
        except ValueError as e:
            raise ZoeError(f"zoe.hf.Trainer: {what} {path} is not JSON: {e}") from None
    raise ZoeError(f"zoe.hf.Trainer: {what} must be a dict or the path of a JSON file, got {type(config).__name__}")


class _Filler:
    """DeepSpeed's HF integration (HfTrainerDeepSpeedConfig.fill_match) over a config dict: a key
    set to "auto" takes the TrainingArguments value; a missing key takes it too (add=True); a key
    set to another value than the TrainingArguments' is a mismatch."""

    def __init__(self, config):
        self.config = config
        self.mismatches = []

    def node(self, key, create):
        *path, leaf = key.split(".")
        node = self.config
        for p in path:
            if not isinstance(node.get(p), dict):
                if not create:
                    return None, leaf
                node[p] = {}
            node = node[p]
        return node, leaf

    def has(self, key):
        node, leaf = self.node(key, False)
        return node is not None and leaf in node

    def fill(self, key, value, hf_key=None, add=True):
        node, leaf = self.node(key, add)
        if node is None:
            return
        if leaf not in node:
            if add:
                node[leaf] = value
            return
        if node[leaf] == "auto":
            node[leaf] = value
        elif hf_key is not None and node[leaf] != value:
            self.mismatches.append(f"{key}={node[leaf]!r} but TrainingArguments {hf_key}={value!r}")


def _enum_value(x):
    return getattr(x, "value", x)


def _hidden_size(model):
    cfg = getattr(model, "config", None)
    for c in (cfg, getattr(cfg, "text_config", None)):
        if c is None:
            continue
        if getattr(c, "hidden_size", None):
            return c.hidden_size
        if getattr(c, "hidden_sizes", None):
            return max(c.hidden_sizes)
    return None


def resolve_config(config, args, model, max_steps, what="zoe_config", warn=True):
    """The zoe config (a dict) for training `model` with TrainingArguments `args` over `max_steps`
    updates: `config` (a dict, a JSON file's path, or None) with DeepSpeed's "auto" values filled
    in as DeepSpeed's HF integration fills them, the keys the Trainer's loop depends on taken from
    `args` where missing, and the optimizer and scheduler sections made from `args` where the
    config has none. Refuses (ZoeError, naming the key) a value that disagrees with `args`, an
    "auto" it cannot fill, and TrainingArguments zoe cannot honour. warn: log where zoe's update
    differs from transformers' own (weight decay, the schedule's convention)."""
    cfg = _read_config(config, what) if config is not None else {}
    if not isinstance(cfg, dict):
        raise ZoeError(f"zoe.hf.Trainer: {what} must hold a JSON object, got {type(cfg).__name__}")
    f = _Filler(cfg)
    micro, ga = args.per_device_train_batch_size, args.gradient_accumulation_steps
    f.fill("train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size")
    f.fill("gradient_accumulation_steps", ga, "gradient_accumulation_steps")
    f.fill("train_batch_size", micro * ga * args.world_size,
           "per_device_train_batch_size x gradient_accumulation_steps x world size", add=False)
    f.fill("gradient_clipping", args.max_grad_norm, "max_grad_norm")
    for key, on, name in (("fp16.enabled", args.fp16 or args.fp16_full_eval, "fp16"),
                          ("bf16.enabled", args.bf16 or args.bf16_full_eval, "bf16")):
        f.fill(key, bool(on), name, add=bool(on))
    _fill_optimizer(f, args, warn)
    _fill_scheduler(f, args, max_steps, warn)
    _fill_hidden_size_keys(f, model)
    if f.mismatches:
        raise ZoeError(f"zoe.hf.Trainer: {what} disagrees with the TrainingArguments: {'; '.join(f.mismatches)}. "
                       "Set the key to \"auto\" (or leave it out) to take the TrainingArguments value, or change "
                       "the TrainingArguments")
    left = _auto_keys(cfg)
    if left:
        raise ZoeError(f"zoe.hf.Trainer: {what} has \"auto\" at {', '.join(left)}, which the Trainer does not fill: "
                       "give a value")
    return cfg


def _fill_optimizer(f, args, warn):
    lr = args.learning_rate
    if not f.has("optimizer"):
        optim = _enum_value(args.optim)
        if optim not in _ADAMW:
            raise ZoeError(f"zoe.hf.Trainer: TrainingArguments optim={optim!r} is not an optimizer zoe runs: zoe's "
                           f"engine updates with AdamW (optim one of {', '.join(_ADAMW)}, or an \"optimizer\" section "
                           "in the config: type AdamW or Adam)")
        f.config["optimizer"] = {"type": "AdamW", "params": {}}
    f.fill("optimizer.params.lr", lr, "learning_rate")
    # Each type's own params only: Lion has no eps, Adagrad no betas (the config refuses them).
    kind = str(f.config["optimizer"].get("type", "AdamW")).lower()
    if kind != "adagrad":
        f.fill("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "adam_beta1+adam_beta2")
    if kind != "lion":
        f.fill("optimizer.params.eps", args.adam_epsilon, "adam_epsilon")
    f.fill("optimizer.params.weight_decay", args.weight_decay, "weight_decay")
    wd = f.config["optimizer"].get("params", {}).get("weight_decay", 0)
    if warn and isinstance(wd, (int, float)) and wd > 0:
        logger.warning("zoe.hf.Trainer: weight_decay %g applies to every trained parameter, as DeepSpeed's "
                       "optimizer does (transformers' own AdamW leaves biases and norm weights out)", wd)


def _fill_scheduler(f, args, max_steps, warn):
    warmup = args.get_warmup_steps(max_steps)
    if f.has("scheduler"):
        f.fill("scheduler.params.warmup_min_lr", 0, add=False)
        f.fill("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate", add=False)
        f.fill("scheduler.params.warmup_num_steps", max(1, warmup), "warmup_steps", add=False)
        decay = f.config["scheduler"].get("type") == "WarmupDecayLR"
        f.fill("scheduler.params.total_num_steps", max_steps, "max_steps (calculated)", add=decay)
        return
    kind = _enum_value(args.lr_scheduler_type)
    if kind not in _SCHEDULES:
        raise ZoeError(f"zoe.hf.Trainer: TrainingArguments lr_scheduler_type={kind!r} is not a schedule zoe runs: "
                       f"use one of {', '.join(_SCHEDULES)}, or a \"scheduler\" section in the config (WarmupLR or "
                       "WarmupDecayLR)")
    if args.lr_scheduler_kwargs:
        raise ZoeError(f"zoe.hf.Trainer: TrainingArguments lr_scheduler_kwargs={args.lr_scheduler_kwargs!r} is not "
                       "taken by zoe's schedules: leave it empty, or give a \"scheduler\" section in the config")
    if kind == "constant" or (kind == "constant_with_warmup" and warmup == 0):
        return
    params = {"warmup_min_lr": 0, "warmup_max_lr": args.learning_rate, "warmup_num_steps": max(1, warmup),
              "warmup_type": "linear"}
    if kind == "linear":
        params["total_num_steps"] = max_steps
    f.config["scheduler"] = {"type": "WarmupLR" if kind == "constant_with_warmup" else "WarmupDecayLR",
                             "params": params}
    if warn:
        logger.warning("zoe.hf.Trainer: lr_scheduler_type %r runs as DeepSpeed's %s: update k takes the schedule's "
                       "value at step k-2 (the first two updates at 0, warmups of at least 2 steps), one update "
                       "later than transformers' own scheduler", kind, f.config["scheduler"]["type"])


def _fill_hidden_size_keys(f, model):
    keys = {"zero_optimization.reduce_bucket_size": lambda h: h * h,
            "zero_optimization.stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
            "zero_optimization.stage3_param_persistence_threshold": lambda h: 10 * h}
    auto = [k for k in keys if f.has(k) and f.node(k, False)[0][k.rsplit(".", 1)[1]] == "auto"]
    if not auto:
        return
    h = _hidden_size(model)
    if h is None:
        raise ZoeError(f"zoe.hf.Trainer: the model's config has no hidden_size to fill \"auto\" at {', '.join(auto)}: "
                       "give a value")
    for k in auto:
        f.fill(k, keys[k](h), add=False)


def _auto_keys(node, prefix=""):
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _auto_keys(v, f"{prefix}{k}.")
    elif node == "auto":
        out.append(prefix[:-1])
    return out


class _EngineModule(nn.Module):
    """The model as the Trainer calls it: its forward runs through zoe's engine, its tensor inputs
    moved to engine.device. The model is its `module` (accelerate's unwrap does not know this
    wrapper: _get_name gives the model's own name for the Trainer's label smoother)."""

    def __init__(self, engine):
        super().__init__()
        self.module = engine.module
        self.engine = engine

    def forward(self, *args, **kwargs):
        dev = self.engine.device

        def to(x):
            return x.to(dev) if isinstance(x, torch.Tensor) and x.device != dev else x

        return self.engine.forward(*[to(a) for a in args], **{k: to(v) for k, v in kwargs.items()})

    def _get_name(self):
        m = self.module
        if hf.is_peft_model(m):
            m = m.get_base_model()
        return m._get_name()


class _ZoeOptimizer:
    """What the Trainer steps as its optimizer: zoe's engine. step() runs zoe's update (norm,
    clipping, AdamW wherever the states live, the scheduled rate) and records its StepStats."""

    def __init__(self, trainer):
        self._trainer = trainer
        self.param_groups = [{"params": [], "lr": trainer._zoe_lr()}]
        self.state = {}
        self.stats = None

    def step(self, closure=None):
        if closure is not None:
            raise ZoeError("zoe.hf.Trainer: the optimizer's step takes no closure (zoe's engine updates from the "
                           "gradients its backward gathered)")
        t = self._trainer
        self.stats = t.zoe_engine.step()
        if not self.stats.stepped:
            raise ZoeError(f"zoe.hf.Trainer: the Trainer stepped after micro-batch {t.zoe_engine._phase.micro_steps}, "
                           "between zoe's gradient-accumulation boundaries (gradient_accumulation_steps "
                           f"{t.zoe_engine.gradient_accumulation_steps})")
        if t._zoe_grad_norm is not None and self.stats.grad_norm is not None:
            t._zoe_grad_norm.fill_(self.stats.grad_norm)
        self.param_groups[0]["lr"] = t._zoe_lr()

    def zero_grad(self, set_to_none=True):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        pass


class _ZoeScheduler:
    """The Trainer's scheduler: zoe's schedule is the engine's (config "scheduler"), so step() does
    nothing; get_last_lr() is the rate of the last update."""

    def __init__(self, trainer):
        self._trainer = trainer

    def step(self, *args, **kwargs):
        pass

    def get_last_lr(self):
        return [self._trainer._zoe_lr()]

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        pass


@contextlib.contextmanager
def _backward_through(accelerator, fn):
    """accelerator.backward is `fn` inside the block (an attribute of this accelerator only)."""
    had = "backward" in vars(accelerator)
    old = vars(accelerator).get("backward")
    accelerator.backward = fn
    try:
        yield
    finally:
        if had:
            accelerator.backward = old
        else:
            del accelerator.backward


_ENGINES = weakref.WeakSet()  # the engines of the zoe trainers alive, for _serve_fused_heads


def _serve_fused_heads(engine):
    """TRL's trainers compute the loss with a fused LM head that reads lm_head.weight outside
    lm_head's forward, inside trl.trainer.utils.maybe_gather_lm_head_ctx(weight, bias) (a gather
    under DeepSpeed ZeRO-3, else nothing). zoe holds that weight the same way, so the context is
    made to hold it through engine.parameters_in_use where the parameters are a zoe engine's, and
    left as TRL wrote it elsewhere."""
    _ENGINES.add(engine)
    utils = sys.modules.get("trl.trainer.utils")
    given = getattr(utils, "maybe_gather_lm_head_ctx", None)
    if given is None or getattr(given, "_zoe_serves", False):
        return

    def maybe_gather_lm_head_ctx(*params):
        held = [p for p in params if p is not None]
        for eng in list(_ENGINES):
            if held and all(id(p) in eng._layout.owner for p in held):
                return eng.parameters_in_use(*held)
        return given(*params)

    maybe_gather_lm_head_ctx._zoe_serves = True
    utils.maybe_gather_lm_head_ctx = maybe_gather_lm_head_ctx


class ZoeTrainerMixin:
    """Makes a transformers Trainer (or any subclass of it: TRL's SFTTrainer, ...) train through zoe:
    class MyTrainer(ZoeTrainerMixin, SomeTrainer). It takes zoe_config= (a dict or a JSON file's
    path, DeepSpeed-style, "auto" values filled from the TrainingArguments), or reads
    args.deepspeed (zoe.hf.TrainingArguments(deepspeed=...)); with neither, zoe's defaults and
    the TrainingArguments. After train() starts, trainer.zoe_engine is the engine and
    trainer.zoe_config the config it was made with."""

    def __init__(self, *args, zoe_config=None, **kwargs):
        for name in ("optimizers", "optimizer_cls_and_kwargs"):
            given = kwargs.get(name)
            if given is not None and given != (None, None):
                raise ZoeError(f"zoe.hf.Trainer: {name}= is not taken: zoe's engine is the optimizer (AdamW) and "
                               "runs the schedule; set them in the config's \"optimizer\" and \"scheduler\" "
                               "sections or the TrainingArguments")
        if kwargs.get("model_init") is not None:
            raise ZoeError("zoe.hf.Trainer: model_init= is not taken (zoe holds the parameters of the one model it "
                           "was given): pass model=")
        targs = kwargs.get("args")
        ds = getattr(targs, "deepspeed", None)
        if ds and not isinstance(targs, TrainingArguments):
            # transformers' own TrainingArguments set up its DeepSpeed integration (DeepSpeed is
            # installed): the same arguments without it; zoe reads the config.
            kwargs["args"] = dataclasses.replace(targs, deepspeed=None)
        if ds and zoe_config is not None:
            raise ZoeError("zoe.hf.Trainer: both zoe_config= and TrainingArguments deepspeed= are given: give one")
        self._zoe_source = (zoe_config, "zoe_config") if zoe_config is not None else (
            (ds, "TrainingArguments.deepspeed") if ds else (None, "zoe_config"))
        self.zoe_engine = None
        self.zoe_config = None
        self._zoe_module = None
        self._zoe_resume = None
        self._zoe_grad_norm = None
        super().__init__(*args, **kwargs)
        if getattr(self.args, "torch_compile", False):
            raise ZoeError("zoe.hf.Trainer: TrainingArguments torch_compile=True is not taken: zoe's hooks run the "
                           "model's modules eagerly; set torch_compile=False")
        # Checked now, so that a bad key fails here (the schedule's length is train()'s).
        cfg = resolve_config(self._zoe_source[0], self.args, self.model, max(1, self.args.max_steps),
                             self._zoe_source[1], warn=False)
        _zoe.parse_config(json.dumps(cfg), max(1, self.args.world_size))

    # -------------------------------------------------------------------------------------
    # The engine

    def _zoe_planned_steps(self):
        """The updates train() will run (the scheduler's total_num_steps)."""
        if self.args.max_steps > 0 or self.train_dataset is None:
            return max(1, self.args.max_steps)
        return self.set_initial_training_values(self.args, self.get_train_dataloader())[6]

    def _zoe_start(self, max_steps):
        """zoe.initialize(model, config): once, at the first train() (or evaluate, predict)."""
        if self.zoe_engine is not None:
            return self.zoe_engine
        from .engine import initialize

        src, what = self._zoe_source
        cfg = resolve_config(src, self.args, self.model, max_steps, what)
        eng = initialize(self.model, config=cfg)
        if eng.world_size != self.args.world_size:
            eng.close()
            raise ZoeError(f"zoe.hf.Trainer: zoe's engine has {eng.world_size} rank(s) (from MPI), the Trainer "
                           f"{self.args.world_size} process(es): each rank would train on the same data. Launch one "
                           "process (python script.py)")
        self.zoe_engine, self.zoe_config = eng, cfg
        self._zoe_module = _EngineModule(eng)
        _serve_fused_heads(eng)
        if self._zoe_resume is not None:
            self._zoe_load(self._zoe_resume)
        return eng

    def _zoe_lr(self):
        eng = self.zoe_engine
        if eng is None:
            return self.args.learning_rate
        lr = eng._last.get("lr")
        if lr is not None:
            return lr
        sched = self.zoe_config.get("scheduler")
        return sched["params"].get("warmup_min_lr", 0.0) if sched else eng.config_value("optimizer.params.lr")

    @staticmethod
    def _zoe_check_checkpoint(path):
        if not os.path.isfile(os.path.join(path, "latest")):
            raise ZoeError(f"zoe.hf.Trainer: resume_from_checkpoint={path!r} holds no zoe checkpoint (no 'latest' "
                           "file): resume from a checkpoint-N folder that zoe.hf.Trainer wrote; to start from a "
                           "model's weights, load the model with from_pretrained instead")

    def _zoe_load(self, path):
        self._zoe_check_checkpoint(path)
        self.zoe_engine.load_checkpoint(path)
        self._zoe_resume = None

    def _zoe_check_accumulation(self, max_steps):
        ga = self.args.gradient_accumulation_steps
        try:
            n = len(self.get_train_dataloader())
        except TypeError:
            return
        if ga > 1 and n % ga and max_steps >= math.ceil(n / ga):
            raise ZoeError(f"zoe.hf.Trainer: an epoch has {n} micro-batches, not a multiple of "
                           f"gradient_accumulation_steps {ga}: its last update would take {n % ga}, and zoe's engine "
                           "takes the same number every update. Set dataloader_drop_last=True with a dataset that "
                           "fills whole updates, or gradient_accumulation_steps dividing the micro-batches")

    # -------------------------------------------------------------------------------------
    # The Trainer's hooks

    def create_optimizer(self, model=None):
        self._zoe_check_accumulation(self.state.max_steps)
        self._zoe_start(self.state.max_steps)
        self.optimizer = _ZoeOptimizer(self)
        return self.optimizer

    def create_scheduler(self, num_training_steps, optimizer=None):
        if self.zoe_engine is None:
            self._zoe_start(num_training_steps)
        self.lr_scheduler = _ZoeScheduler(self)
        self._created_lr_scheduler = True
        return self.lr_scheduler

    def _wrap_model(self, model, training=True, dataloader=None):
        if self.zoe_engine is None:
            return super()._wrap_model(model, training=training, dataloader=dataloader)
        return self._zoe_module

    def _move_model_to_device(self, model, device):
        pass  # zoe places the parameters (zoe.device); buffers go with them at initialize

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.zoe_engine is None:
            return super().training_step(model, inputs, num_items_in_batch)
        eng = self.zoe_engine

        def backward(loss, **kwargs):
            # The Trainer's loss is already divided for accumulation; zoe's engine averages the
            # micro-batches' gradients itself.
            eng.backward(loss * eng.gradient_accumulation_steps)

        with _backward_through(self.accelerator, backward):
            return super().training_step(model, inputs, num_items_in_batch)

    def _clip_grad_norm(self, model):
        if self.zoe_engine is None:
            return super()._clip_grad_norm(model)
        # zoe clips inside its step (gradient_clipping); the norm is filled in when the step runs.
        self._zoe_grad_norm = torch.tensor(float("nan"))
        return self._zoe_grad_norm

    def _get_grad_norm(self, model, grad_norm=None):
        if self.zoe_engine is None:
            return super()._get_grad_norm(model, grad_norm)
        if grad_norm is None:
            grad_norm = self._zoe_grad_norm = torch.tensor(float("nan"))
        return grad_norm

    def _get_learning_rate(self):
        if self.zoe_engine is None:
            return super()._get_learning_rate()
        return self._zoe_lr()

    def evaluate(self, *args, **kwargs):
        self._zoe_start(self._zoe_planned_steps())
        return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        self._zoe_start(self._zoe_planned_steps())
        return super().predict(*args, **kwargs)

    def _save(self, output_dir=None, state_dict=None):
        if self.zoe_engine is None:
            return super()._save(output_dir, state_dict=state_dict)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        eng = self.zoe_engine
        if hf.is_hf_model(eng.module) or hf.is_peft_model(eng.module):
            eng.save_pretrained(output_dir)  # every rank reads, rank 0 writes
        else:
            import safetensors.torch

            sd = eng.state_dict()
            if self.args.should_save:
                os.makedirs(output_dir, exist_ok=True)
                safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()},
                                            os.path.join(output_dir, "model.safetensors"), metadata={"format": "pt"})
        if not self.args.should_save:
            return
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _save_optimizer_and_scheduler(self, output_dir):
        if self.zoe_engine is None:
            return super()._save_optimizer_and_scheduler(output_dir)
        # zoe's checkpoint: every state, the schedule's position and the model's buffers
        # (output_dir/global_stepN, named by output_dir/latest), as DeepSpeed's engine writes it.
        self.zoe_engine.save_checkpoint(output_dir)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if self.zoe_engine is None:
            self._zoe_check_checkpoint(resume_from_checkpoint)
            self._zoe_resume = resume_from_checkpoint  # loaded when the engine is made
            return
        self._zoe_load(resume_from_checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint):
        if self.zoe_engine is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        # zoe's checkpoint, loaded by _load_from_checkpoint, held them.

    def _load_best_model(self):
        if self.zoe_engine is None:
            return super()._load_best_model()
        self._zoe_load(self.state.best_model_checkpoint)


class Trainer(ZoeTrainerMixin, transformers.Trainer):
    """transformers.Trainer training through zoe's engine (ZoeTrainerMixin says how):
    Trainer(model=..., args=TrainingArguments(...), train_dataset=..., zoe_config=...)."""
