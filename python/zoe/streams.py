"""engine.train_batch's random streams: one per micro-batch, so that both schedules draw the same
numbers.

The micro-batch schedule runs micro-batch 0's whole forward before micro-batch 1's; the layer-major
schedule runs every micro-batch through a layer before the next layer. Drawn from torch's one
default stream, the dropout masks of a layer would come in another order, and the two schedules
would train on different masks. So train_batch gives micro-batch g of a step its own stream, seeded
with micro_batch_seed(step, g): each schedule draws micro-batch g's masks from that stream in
the order its forward meets them, and both schedules give the same bits with dropout on.

torch's default generators (the CPU's, and the engine's GPU's) are put back as train_batch found
them: train_batch draws nothing from them. The masks are fixed by torch.manual_seed (through
torch.initial_seed()), the step and the micro-batch, so a resumed run draws the masks the
uninterrupted run drew.
"""
import contextlib

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def micro_batch_seed(step, micro_batch, base=None):
    """The seed of micro-batch `micro_batch` (0-based) of optimizer step `step` (engine.global_steps
    when train_batch is called) in engine.train_batch: splitmix64 over (base, step, micro_batch),
    a non-negative int below 2**63. base defaults to torch.initial_seed() (what torch.manual_seed
    set). Plain torch draws the same masks with torch.manual_seed(micro_batch_seed(...)) before
    each micro-batch."""
    base = torch.initial_seed() if base is None else base
    x = _splitmix64(base & _MASK64)
    x = _splitmix64(x ^ (step & _MASK64))
    x = _splitmix64(x ^ (micro_batch & _MASK64))
    return x >> 1


def rng_state(device):
    """torch's default generators' state: the CPU's, and device's where it is a GPU."""
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return cpu, cuda


def set_rng_state(state, device):
    cpu, cuda = state
    torch.random.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


class MicroBatchStreams:
    """The G streams of one train_batch call. with streams.use(g): ... runs its body on micro-batch
    g's stream, from where that stream's last use left it; close() puts torch's generators back."""

    def __init__(self, step, count, device):
        self.device = device
        self.outer = rng_state(device)
        self.states = []
        base = torch.initial_seed()
        for g in range(count):
            seed = micro_batch_seed(step, g, base)
            cpu = torch.Generator().manual_seed(seed).get_state()
            cuda = None
            if device.type == "cuda":
                with torch.cuda.device(device):
                    torch.cuda.manual_seed(seed)
                cuda = torch.cuda.get_rng_state(device)
            self.states.append((cpu, cuda))
        set_rng_state(self.outer, device)

    def state(self, g):
        return self.states[g]

    @contextlib.contextmanager
    def use(self, g):
        set_rng_state(self.states[g], self.device)
        try:
            yield
        finally:
            self.states[g] = rng_state(self.device)

    def close(self):
        set_rng_state(self.outer, self.device)
