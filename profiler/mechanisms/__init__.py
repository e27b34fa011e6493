"""What each checkpointing strategy's mechanism costs, measured (``profiler.calibrate`` runs them).

One ``Mechanism`` per strategy's mechanism (``base``): ``Restart`` (all),
``FullSave`` (deepspeed), ``TwoPhase`` (checkfreq), ``HostCopy`` and ``PeerCopy`` (gemini),
``Differential`` (lowdiff), ``LayerWise`` (layercheck). Together they give
every figure of ``layercheck.calibration.FIGURES``.
"""
from __future__ import annotations

from .base import Bench, Mechanism
from .layerwise import LayerWise
from .lowdiff import Differential
from .peer import PeerCopy
from .restart import Restart
from .storage import FullSave, HostCopy, TwoPhase

__all__ = ["MECHANISMS", "Bench", "Mechanism"]

MECHANISMS: tuple[Mechanism, ...] = (LayerWise(), FullSave(), TwoPhase(), HostCopy(),
                                     Differential(), PeerCopy(), Restart())
"""In the order they run: the collective ones first, then rank 0's, the spawns last."""
