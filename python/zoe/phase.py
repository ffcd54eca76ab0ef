"""Where the PyTorch front-end's training loop stands: one Phase, held by PhaseState, which makes
every transition and refuses a call the phase does not allow, naming the call and the phase.

    READY or ACCUMULATED or BROKEN (the resting phases: between the calls of the training loop)
      engine(...)             -> FORWARD   -> back to the resting phase it came from
      engine.backward(loss)   -> BACKWARD  -> REDUCING once a gradient reaches zoe's buffers
                                           -> ACCUMULATED when it returns (BROKEN stays BROKEN);
                                              when it raises: BROKEN from REDUCING (zoe holds part
                                              of the micro-batch's gradients), else where it was
      engine.step()           ACCUMULATED at a gradient-accumulation boundary -> READY
      engine.load_checkpoint  -> READY
engine.step(), engine.save_checkpoint(), engine.save_pretrained() and engine.load_checkpoint()
are refused inside engine(...) or engine.backward() (from the model's forward or a hook), and so
are engine(...) and engine.backward() themselves: each needs every unit released and no
gradient on its way. The hooks (hooks.py) read the phase: a unit called outside
FORWARD, BACKWARD or REDUCING with gradients enabled is a direct call of the model.
"""
import contextlib
import enum

from ._zoe import ZoeError


class Phase(enum.Enum):
    READY = "ready"              # no gradients held: after initialize, a step or load_checkpoint
    FORWARD = "forward"          # inside engine(...)
    BACKWARD = "backward"        # inside engine.backward(), before any gradient reached zoe
    REDUCING = "reducing"        # inside engine.backward(), gradients reaching zoe's buffers
    ACCUMULATED = "accumulated"  # gradients of one or more micro-batches wait for engine.step()
    BROKEN = "broken"            # a backward failed after some of its gradients had reached zoe


_RESTING = (Phase.READY, Phase.ACCUMULATED, Phase.BROKEN)
_RUNNING = {Phase.FORWARD: "engine(...)", Phase.BACKWARD: "engine.backward()", Phase.REDUCING: "engine.backward()"}


class PhaseState:
    """The phase and the counts it is made of: micro-batches run (backward calls that returned),
    those since the last update, updates, and the micro-batch whose backward broke."""

    def __init__(self, accumulation_steps):
        self.phase = Phase.READY
        self.accumulation_steps = accumulation_steps
        self.micro_steps = 0
        self.pending_backward = 0
        self.global_steps = 0
        self.failed_micro_batch = None

    @property
    def in_forward(self):
        return self.phase is Phase.FORWARD

    @property
    def in_backward(self):
        """Inside engine.backward (a reentrant activation checkpoint recomputes its forward there)."""
        return self.phase in (Phase.BACKWARD, Phase.REDUCING)

    def at_boundary(self):
        return self.pending_backward > 0 and self.micro_steps % self.accumulation_steps == 0

    def require_resting(self, call):
        """Refuses `call` inside engine(...) or engine.backward()."""
        if self.phase in _RESTING:
            return
        running = _RUNNING[self.phase]
        raise ZoeError(f"{call}: called inside {running} (the front-end's phase is '{self.phase.value}'): call it "
                       f"from the training loop once {running} has returned, not from the model's forward or "
                       "a hook")

    def require_boundary(self, call):
        """Refuses `call` (a save) while gradients wait for engine.step()."""
        self.require_resting(call)
        if self.pending_backward:
            raise ZoeError(f"{call}: {self.pending_backward} micro-batch(es) of gradients are waiting for "
                           "engine.step(); save at a step boundary")

    def _resting(self):
        if self.failed_micro_batch is not None:
            return Phase.BROKEN
        return Phase.ACCUMULATED if self.pending_backward else Phase.READY

    @contextlib.contextmanager
    def forward(self):
        """engine(...): FORWARD while the model's forward runs, then the resting phase again."""
        self.require_resting("engine(...)")
        self.phase = Phase.FORWARD
        try:
            yield
        finally:
            self.phase = self._resting()

    @contextlib.contextmanager
    def backward(self):
        """engine.backward(): BACKWARD (REDUCING from the first gradient that reaches zoe) while it
        runs; a micro-batch more when it returns, BROKEN when it raises after a gradient came."""
        self.require_resting("engine.backward()")
        self.phase = Phase.BACKWARD
        try:
            yield
        except BaseException:
            if self.phase is Phase.REDUCING:
                self.failed_micro_batch = self.micro_steps + 1
            self.phase = self._resting()
            raise
        self.micro_steps += 1
        self.pending_backward += 1
        self.phase = self._resting()

    def gradient_arrived(self):
        """A gradient reached zoe's buffers (a hook on a parameter's AccumulateGrad node)."""
        if self.phase is Phase.BACKWARD:
            self.phase = Phase.REDUCING

    def check_step(self):
        """engine.step(): True at a gradient-accumulation boundary (an update runs), False between
        boundaries; refused after a broken backward, before any backward, and inside one."""
        if self.phase is Phase.BROKEN:
            raise ZoeError(f"engine.step(): the backward of micro-batch {self.failed_micro_batch} failed after some "
                           "of its gradients had reached zoe: the gradients are incomplete, so no step is taken; "
                           "resume from a checkpoint (engine.load_checkpoint)")
        self.require_resting("engine.step()")
        if self.phase is Phase.READY:
            raise ZoeError("engine.step() before engine.backward(): there are no gradients to step with "
                           f"(micro-batches since the last step: 0, global steps: {self.global_steps})")
        return self.micro_steps % self.accumulation_steps == 0

    def stepped(self):
        """The update of a boundary ran: its gradients are spent."""
        self.pending_backward = 0
        self.global_steps += 1
        self.phase = Phase.READY

    def restored(self, micro_steps, global_steps):
        """engine.load_checkpoint() restored the counts of a step boundary."""
        self.micro_steps = micro_steps
        self.global_steps = global_steps
        self.pending_backward = 0
        self.failed_micro_batch = None
        self.phase = Phase.READY
