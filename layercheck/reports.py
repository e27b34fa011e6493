"""What ``LayerCheck.step()`` and ``LayerCheck.restore()`` report (``checkpoint`` re-exports both)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .contract.policy import Decision

__all__ = ["StepReport", "RestoreReport"]


@dataclass(frozen=True)
class StepReport:
    """What ``step()`` did: the decision, the drift added, and its costs; ``k_scale``:
    the write budget's factor on every threshold at this step (1 without one)."""

    step: int
    decision: Decision
    drift: np.ndarray
    lr: float
    drift_s: float
    stall_s: float
    bytes_queued: int
    k_scale: float = 1.0


@dataclass(frozen=True)
class RestoreReport:
    """What ``restore()`` did; ``plan`` is None on a fresh start. Its seconds add up
    to the whole restore but opening the new timeline."""

    step: int
    plan: Any
    plan_s: float
    """The fixed part: the manifest read, the training state chosen, verified and checked."""
    load_s: float
    """Reading and verifying each layer's chosen version (and any damaged one passed
    over) and checking it against the live model; with the re-reads at the apply
    of layers beyond ``restore_memory``."""
    restore_s: float
    """Copying the verified tensors into the live model and optimizer, and the
    scheduler, RNGs and backend's counters."""
    bytes: int
    """The bytes of this rank's chosen layer files."""
