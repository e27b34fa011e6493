"""Just-in-time checkpointing (Gupta et al., "Just-In-Time Checkpointing: Low Cost Error
Recovery from Deep Learning Training Failures", EuroSys 2024), and the figures of its
detection and of the replicas it needs.

What the model takes from the paper (its abstract, the one part read for this module:
microsoft.com/en-us/research/publication/just-in-time-checkpointing-low-cost-error-
recovery-from-deep-learning-training-failures): no periodic checkpoints ("nearly zero
steady state overhead"); when a failure happens, the surviving data-parallel replicas
still hold the model and optimizer state in GPU memory, so the job checkpoints then ("just
in time") and "recovery from failures with just a single minibatch iteration of work
replayed by all GPUs". So every completed step is a recovery point and a failure loses at
most the minibatch it interrupted (the engine charges exactly the part of the step done).

What this model assumes, each a figure with its band (``python -m sim sensitivity``):

- the recovery is, in order: the failure detected (``jit_detect_s``), a surviving replica
  saving the full state with the framework's synchronous save (``save_gbps``, DeepSpeed's
  figure: the paper's mechanism saves the state a replica holds; its own write rate is not
  in the abstract), the restart (``restart_s``) and the load of that checkpoint
  (``load_s``), the same load as DeepSpeed's;
- a failure that takes every replica of some rank's state (``jit_replica_loss_probability``)
  leaves nothing to checkpoint; this model keeps no periodic fallback, so the job restarts
  from its start (a deployment that pairs JIT with rare periodic saves is not modelled);
- the bytes of the failure-time checkpoints are not counted as written (they are written
  only at failures, not on the run's schedule).
"""
from __future__ import annotations

import numpy as np

from layercheck.contract.band import Band
from layercheck.contract.figure import Figure, FigureSpec
from ..placement import HOST_LOSS_SHARE, HOST_LOSS_SOURCE

from .base import Strategy, _Builder

__all__ = ["JustInTime", "JIT_PAPER", "FIGURES", "STRATEGIES"]

JIT_PAPER = "Gupta et al., Just-In-Time Checkpointing (EuroSys 2024)"

FIGURES: dict[str, FigureSpec] = {
    "jit_detect_s": FigureSpec("s", "jit", "from a failure to the survivors starting their "
                                            "just-in-time checkpoint: the failure detected (a "
                                            "dead peer's closed connection, or a hung "
                                            "collective's timeout)",
        band=Band(low=0.1, high=10.0, relative=True, reason=(
            "a detection measured on one machine (a killed peer seen through its closed "
            "socket) says little of a hung GPU, which only a timeout catches: a tenth to "
            "ten times")),
        default=Figure(value=60.0, source="assumed", method=(
            f"{JIT_PAPER} gives no detection time in its abstract; one minute, a judgment "
            "between a crash seen at once (the peer's connection closes) and a hang caught "
            "by a watchdog"), band=Band(low=1.0, high=600.0, reason=(
                "low: a crashed process detected within a second through its closed "
                "connection; high: PyTorch's default NCCL collective timeout, 10 minutes "
                "(torch.distributed.init_process_group), what a hung GPU costs with no "
                "watchdog of its own")))),
    "jit_replica_loss_probability": FigureSpec("1", "jit", "chance that a failure takes every "
                                                            "replica of some rank's state (then "
                                                            "nothing survives to checkpoint "
                                                            "and the job restarts)",
        band=Band(low=0.0, high=1.0, reason=(
            "0: a full replica of each rank's state on another host and independent host "
            "failures; 1: no replica at all (one ZeRO-3 or FSDP group over every GPU)")),
        default=Figure(value=round(HOST_LOSS_SHARE, 4), source="assumed", method=(
            "as GEMINI's peer loss (sim.placement): the failures that take a host's "
            f"memory, {HOST_LOSS_SOURCE}, 32 / 419 = {HOST_LOSS_SHARE:.4f}, assuming each "
            "rank's state has a replica on another GPU of the server (data parallelism "
            "across ZeRO groups); the paper's own setup, one ZeRO-3 group over the 8 GPUs, "
            "has none, where the figure is 1"), band=Band(low=0.0, high=1.0, reason=(
                "0: replicas on other hosts, failing independently; 1: no replica (the "
                "LayerCheck paper's ZeRO-3 over every GPU of its one server)")))),
    "jit_overhead_fraction": FigureSpec("1", "jit", "the steady-state cost of being ready to "
                                                     "checkpoint just in time, as a fraction "
                                                     "of each step's compute",
        band=Band(low=0.0, high=0.01, reason=(
            "0 to 1% of a step, a judgment of \"nearly zero\"")),
        default=Figure(value=0.0, source="published", method=(
            f"{JIT_PAPER}, abstract: \"nearly zero steady state overhead\" (no periodic "
            "checkpoint; the user-level variant adds no work to a step)"),
            band=Band(low=0.0, high=0.01, reason=(
                "0 to 1% of a step, a judgment of \"nearly zero\" (the transparent variant "
                "intercepts the job's GPU calls)")))),
}
"""The figures this module declares (``sim.calibrated.FIGURES`` is the union)."""


class JustInTime(Strategy):
    """Just-in-time checkpointing: nothing written while training; every completed step
    is a recovery point, reached after a failure by detecting it, a surviving replica
    saving its state, the restart and the load (module doc). A failure that takes every
    replica (``jit_replica_loss_probability``) restarts the job from its start."""
    name = "jit"
    label = "just-in-time: a surviving replica checkpoints after the failure, one step replayed"
    compared = False            # from outside the LayerCheck paper's comparison: run when named

    def _checkpoints(self, b: _Builder) -> None:
        b.snap[1:] = b.costs.jit_overhead_fraction * b.workload.compute_s
        b.commit[:] = True          # the survivors hold every completed step's state

    def _backup(self, b: _Builder) -> None:
        b.backup = np.full(b.steps + 1, np.nan)     # nothing outside the replicas' memory

    def _recovery(self, b: _Builder) -> np.ndarray:
        c = b.costs
        return np.full(b.steps + 1, c.jit_detect_s + c.save_s(b.full) + c.restart_s
                       + c.load_s(b.full))

    def _recovery_backup(self, b: _Builder) -> np.ndarray:
        return np.full(b.steps + 1, b.costs.restart_s)      # the job's start (position 0)

    def _backup_probability(self, b: _Builder) -> float:
        return b.costs.jit_replica_loss_probability


STRATEGIES = (JustInTime,)
"""The strategies this module models (``sim.strategies.STRATEGIES`` is every module's)."""
