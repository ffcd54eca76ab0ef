"""zoe.verify: trust a placement for a user's own model, in one call (the `zoe verify` command's check).

    report = zoe.verify(lambda: MyModel(), "ds_config.json", batches, steps=4)
    assert report["verdict"] == "identical", report["first_divergence"]

Trains `steps` steps twice from model_fn()'s weights, on the same micro-batches: in the placement the
config asks for, and in a reference placement (ZeRO stage 0, nothing offloaded, no device budget,
activations kept on the device, the micro-batch schedule; the same precision, optimizer, state
formats, batch and clipping). It compares the losses, the gradient norms and every master parameter
after each step, and at the end every optimizer state (master, Adam's m and v, from each run's
checkpoint), bit for bit: zoe's placements give the same bits on one rank, so a difference is a
wrong result, and the report names the first step and tensor that differ.
"""
import copy
import json
import os
import shutil
import tempfile

import torch

from ._zoe import ZoeError


def _config_dict(config):
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(config) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise ZoeError(f"zoe.verify: config {os.fspath(config)!r}: {e}") from None
    raise ZoeError(f"zoe.verify: config must be a dict or a path to a JSON file, got {type(config).__name__}")


def reference_config(config):
    """The reference placement of `config` (a dict): everything on the device of one rank."""
    ref = _config_dict(config)
    zero = dict(ref.get("zero_optimization", {}))
    for k in ("offload_param", "offload_optimizer", "cpu_offload", "cpu_offload_params"):
        zero.pop(k, None)
    zero["stage"] = 0
    ref["zero_optimization"] = zero
    z = dict(ref.get("zoe", {}))
    for k in ("device_budget", "host_budget", "offload_ratio", "activation_device_budget",
              "activation_host_budget", "activation_nvme_path"):
        z.pop(k, None)
    z["activation_offload"] = "none"
    z["schedule"] = "micro-batch"
    ref["zoe"] = z
    return ref


def _first_difference(a, b, what):
    """(name, differing elements, elements) of the first tensor of dict a that differs from b's."""
    for name in a:
        x, y = torch.as_tensor(a[name]), torch.as_tensor(b[name])
        if x.shape != y.shape or not torch.equal(x.view(torch.int32), y.view(torch.int32)):
            n = int((x.view(torch.int32) != y.view(torch.int32)).sum()) if x.shape == y.shape else x.numel()
            return f"{name}.{what}", n, x.numel()
    return None


def verify(model_fn, config, batches, steps=None, loss_fn=None, work_dir=None):
    """Returns {"verdict": "identical" | "diverged", "first_divergence": {"step", "tensor"} | None,
    "losses": {"configured", "reference"}, "grad_norms": {...}, ...}.

    model_fn(): a new model with the same initial weights at each call (seed inside it). batches:
    micro-batches as engine.train_batch takes them (dicts of keyword arguments, tuples, tensors),
    gradient_accumulation_steps of them per step, `steps` steps (default: as many as they make).
    loss_fn(output, batch): as in train_batch. work_dir: where the checkpoints are kept (default:
    a temporary directory, removed). One process (force_local)."""
    from .engine import initialize
    from . import _zoe

    cfg = _config_dict(config)
    ref = reference_config(cfg)
    batches = list(batches)
    configured = initialize(model_fn(), cfg, force_local=True)
    reference = initialize(model_fn(), ref, force_local=True)
    runs = {"configured": configured, "reference": reference}
    g = configured.gradient_accumulation_steps
    steps = len(batches) // g if steps is None else steps
    if steps < 1 or len(batches) < steps * g:
        raise ZoeError(f"zoe.verify: {len(batches)} micro-batches make {len(batches) // g} steps of "
                       f"gradient_accumulation_steps {g}; give at least {max(1, steps) * g}")
    losses = {k: [] for k in runs}
    norms = {k: [] for k in runs}
    first, detail = None, None
    for s in range(steps):
        step_batches = batches[s * g:(s + 1) * g]
        for k, eng in runs.items():
            losses[k] += eng.train_batch(step_batches, loss_fn=loss_fn)
            norms[k].append(eng.last_step_stats.grad_norm)
        if losses["configured"][-g:] != losses["reference"][-g:]:
            first = {"step": s + 1, "tensor": "loss"}
        elif norms["configured"][-1] != norms["reference"][-1]:
            first = {"step": s + 1, "tensor": "grad_norm"}
        else:
            detail = _first_difference(configured.master_params(), reference.master_params(), "master")
            if detail:
                first = {"step": s + 1, "tensor": detail[0]}
        if first:
            break
    if first is None:
        root = work_dir or tempfile.mkdtemp(prefix="zoe-verify-")
        try:
            dirs = {}
            for k, eng in runs.items():
                dirs[k] = os.path.join(root, k)
                os.makedirs(dirs[k], exist_ok=True)
                eng.save_checkpoint(dirs[k], tag="verify")
            for kind in ("master", "exp_avg", "exp_avg_sq"):
                a = _zoe.read_checkpoint(dirs["configured"], kind)[0]
                b = _zoe.read_checkpoint(dirs["reference"], kind)[0]
                detail = _first_difference(a, b, kind)
                if detail:
                    first = {"step": steps, "tensor": detail[0]}
                    break
        finally:
            if work_dir is None:
                shutil.rmtree(root, ignore_errors=True)
    for eng in runs.values():
        eng.close()
    report = {"verdict": "identical" if first is None else "diverged", "first_divergence": first, "steps": steps,
              "losses": losses, "grad_norms": norms,
              "compared": "losses, gradient norms and masters after every step; master, exp_avg and exp_avg_sq "
                          "of every parameter at the end"}
    if detail:
        report["differing_elements"], report["tensor_elements"] = detail[1], detail[2]
    return report


def _hf_model_fn(hf_config, seed):
    """A causal LM of the Hugging Face config (a config.json, a folder holding one, or a name the
    local cache has), randomly initialised from seed; and the names of its dropout settings that
    are on (kept: train_batch draws each micro-batch's masks from a stream of its own, so both runs
    and both schedules draw the same masks)."""
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(hf_config)
    dropout = [k for k, v in sorted(cfg.to_dict().items())
               if ("dropout" in k or "pdrop" in k) and isinstance(v, float) and v != 0.0]

    def model_fn():
        torch.manual_seed(seed)
        try:
            return transformers.AutoModelForCausalLM.from_config(cfg)
        except ValueError as e:
            raise ZoeError(f"--hf-config {hf_config}: not a causal LM transformers can build: {e}") from None
    return model_fn, cfg, dropout


def _launcher_world():
    """(variable, size) where a launcher started this process among several, else None."""
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "WORLD_SIZE"):
        v = os.environ.get(var, "")
        if v.isdigit() and int(v) > 1:
            return var, int(v)
    return None


def main(argv=None):
    """`zoe verify --config ds.json --hf-config CONFIG [--steps K] [--seq T] [--seed S] [--json]`:
    zoe.verify on a Hugging Face causal LM built from its config (random weights, random tokens;
    nothing is downloaded). The `zoe` command runs this for --hf-config."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="zoe verify", description=main.__doc__)
    ap.add_argument("--config", required=True, help="the DeepSpeed-style config to verify")
    ap.add_argument("--hf-config", required=True,
                    help="a transformers config.json, a folder holding one, or a model name in the local cache")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work-dir", default=None, help="where the two runs' checkpoints are kept (default: removed)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    try:
        launched = _launcher_world()
        if launched:
            raise ZoeError(f"zoe verify --hf-config runs in one process (both placements on one rank), and this is "
                           f"one of {launched[1]} processes ({launched[0]}): run it without mpirun, srun or "
                           "torchrun; `mpirun -np N zoe verify` without --hf-config compares N ranks with one")
        if a.steps < 1 or a.seq < 2:
            raise ZoeError(f"zoe verify: --steps {a.steps} and --seq {a.seq}: give --steps >= 1 and --seq >= 2")
        cfg = _config_dict(a.config)
        try:
            model_fn, hf_cfg, dropout = _hf_model_fn(a.hf_config, a.seed)
        except (OSError, ValueError) as e:
            raise ZoeError(f"zoe verify --hf-config {a.hf_config}: {e}") from None
        micro = int(cfg.get("train_micro_batch_size_per_gpu", 1))
        gas = int(cfg.get("gradient_accumulation_steps", 1))
        g = torch.Generator().manual_seed(a.seed)
        batches = []
        for _ in range(a.steps * gas):
            ids = torch.randint(0, hf_cfg.vocab_size, (micro, a.seq), generator=g)
            batches.append({"input_ids": ids, "labels": ids})
        report = verify(model_fn, cfg, batches, steps=a.steps, work_dir=a.work_dir)
    except ZoeError as e:
        sys.stderr.write(f"zoe verify: error: {e}\n")
        return 2
    report.update({"config": str(a.config), "hf_config": str(a.hf_config), "dropout": dropout})
    first = report["first_divergence"]
    if a.json:
        print(json.dumps(report))
    elif first is None:
        print(f"zoe verify: identical. {a.steps} steps of {a.hf_config} in {a.config} and in the reference "
              "placement (stage 0, nothing offloaded) gave the same losses, gradient norms and optimizer states, "
              "bit for bit." + (f" (Dropout on: {', '.join(dropout)}.)" if dropout else ""))
    else:
        print(f"zoe verify: DIVERGED at step {first['step']}: {first['tensor']} differs from the reference "
              "placement's.")
    return 0 if first is None else 1


if __name__ == "__main__":
    import sys
    sys.exit(main())
