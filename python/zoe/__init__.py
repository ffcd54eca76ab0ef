"""zoe: train any torch.nn.Module larger than device memory, DeepSpeed style.

    engine = zoe.initialize(model, config="ds_config.json")   # or a dict
    loss = engine(batch); engine.backward(loss); stats = engine.step()
    engine.save_checkpoint("ckpt", tag="step-100", client_state={...})
    state_dict = zoe.consolidate("ckpt")                      # full fp32, the model's own names

The names load on first use: `import zoe` alone (the `zoe` command's entry point) loads neither
torch nor the C++ extension.
"""

__all__ = ["Engine", "StepStats", "ZoeError", "consolidate", "initialize", "micro_batch_seed", "rank_and_world",
           "verify"]

_ENGINE_NAMES = ("Engine", "StepStats", "consolidate", "initialize")


def _extension():
    """The C++ extension, loaded after torch where torch is installed: both link NCCL (a CUDA
    build of torch its own, newer copy), and the library loaded first serves both, so torch's
    must come first."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    from . import _zoe

    return _zoe


def __getattr__(name):
    if name in _ENGINE_NAMES:
        from . import engine

        return getattr(engine, name)
    if name == "verify":  # zoe.verify(model_fn, config, batches, steps)
        from .verification import verify

        return verify
    if name == "micro_batch_seed":  # train_batch's seed of a step's micro-batch (streams.py)
        from .streams import micro_batch_seed

        return micro_batch_seed
    if name == "ZoeError":
        return _extension().ZoeError
    if name == "hf":  # zoe.hf.Trainer and the Hugging Face helpers
        import importlib

        return importlib.import_module(".hf", __name__)
    raise AttributeError(f"module 'zoe' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_ENGINE_NAMES) + ["ZoeError", "micro_batch_seed"])


def rank_and_world():
    """(rank, world size) of this process: from MPI under mpirun/srun, from torchrun's variables under
    torchrun (gloo), else (0, 1)."""
    return _extension().runtime()
