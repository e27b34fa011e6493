"""No checkpoints: a failure restarts the job (it declares no figure of its own)."""
from __future__ import annotations

from layercheck.contract.figure import FigureSpec

from .base import Strategy

__all__ = ["NoCheckpoint", "FIGURES", "STRATEGIES"]

FIGURES: dict[str, FigureSpec] = {
}
"""The figures this module declares (``sim.calibrated.FIGURES`` is the union)."""


class NoCheckpoint(Strategy):
    """No checkpoints: a failure restarts the job from step 0."""
    name = "none"
    label = "no checkpoints: a failure restarts the job"


STRATEGIES = (NoCheckpoint,)
"""The strategies this module models (``sim.strategies.STRATEGIES`` is every module's)."""
