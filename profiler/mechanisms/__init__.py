"""What each checkpointing strategy's mechanism costs, measured (``profiler.calibrate`` runs them).

One ``Mechanism`` per strategy's mechanism (``base``): ``Restart`` (all),
``FullSave`` (deepspeed), ``TwoPhase`` (checkfreq), ``HostCopy`` and ``PeerCopy`` (gemini),
``Differential`` (lowdiff), ``LayerWise`` (layercheck). Together they give
every figure of ``layercheck.calibration.FIGURES``.
"""
from __future__ import annotations

from layercheck import recovery, writer

from .. import checkpointers
from . import layerwise, lowdiff, restart, storage
from .base import Bench, Mechanism
from .layerwise import LayerWise
from .lowdiff import Differential
from .peer import PeerCopy
from .restart import Restart
from .storage import FullSave, HostCopy, TwoPhase

__all__ = ["MECHANISMS", "INSTALLED_VERSIONS", "Bench", "Mechanism"]

MECHANISMS: tuple[Mechanism, ...] = (LayerWise(), FullSave(), TwoPhase(), HostCopy(),
                                     Differential(), PeerCopy(), Restart())
"""In the order they run: the collective ones first, then rank 0's, the spawns last."""

INSTALLED_VERSIONS: dict[str, int] = {
    name: version
    for module in (restart, storage, lowdiff, layerwise, checkpointers, writer, recovery)
    for name, version in module.MECHANISM_VERSIONS.items()}
"""Every mechanism's version as its own module declares it: what ``calibrate`` records in
costs.json (``layercheck.measurement.code_record``)."""
