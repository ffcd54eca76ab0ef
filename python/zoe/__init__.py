"""zoe: train any torch.nn.Module larger than device memory, DeepSpeed style.

    engine = zoe.initialize(model, config="ds_config.json")   # or a dict
    loss = engine(batch); engine.backward(loss); stats = engine.step()
    engine.save_checkpoint("ckpt", tag="step-100", client_state={...})
    state_dict = zoe.consolidate("ckpt")                      # full fp32, the model's own names
"""
from ._zoe import ZoeError
from .engine import Engine, StepStats, consolidate, initialize

__all__ = ["Engine", "StepStats", "ZoeError", "consolidate", "initialize", "rank_and_world"]


def rank_and_world():
    """(rank, world size) of this process: from MPI under mpirun, else (0, 1)."""
    from . import _zoe

    return _zoe.runtime()
