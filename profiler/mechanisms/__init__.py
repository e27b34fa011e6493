"""What each checkpointing strategy's mechanism costs, measured (``profiler.calibrate`` runs them).

One ``Mechanism`` per strategy's mechanism (``base``): ``Restart`` (all),
``FullSave`` (deepspeed), ``TwoPhase`` (checkfreq), ``HostCopy`` and ``PeerCopy`` (gemini),
``Differential`` (lowdiff), ``LayerWise`` (layercheck), ``JitDetection`` (jit). Each is
declared once, as data, in ``layercheck.contract.measurement.CODE`` (its version and the
figures it measures; the simulator reads that table without torch), and registers those
figures (``Mechanism.figures``, filled in from the declaration). Together they must cover
every figure of ``sim.calibrated.FIGURES`` that ``python -m profiler
calibrate`` measures (``FigureSpec.measured_by``), each exactly once: ``check_coverage``,
which ``calibrate`` runs before it times anything. A new strategy's figures therefore
need a mechanism here, in ``MECHANISMS``, and its line in ``CODE``.
"""
from __future__ import annotations

from typing import Sequence

from sim.calibrated import FIGURES
from layercheck.contract.figure import CALIBRATE

from ..errors import ProfilerError
from .base import Bench, Mechanism
from .jit import JitDetection
from .tier import MemoryTierCopy, MemoryTierRestore, MemoryTierThread
from .layerwise import LayerWise
from .lowdiff import Differential
from .peer import PeerCopy
from .restart import Restart
from .storage import FullSave, HostCopy, TwoPhase

__all__ = ["MECHANISMS", "Bench", "Mechanism", "check_coverage",
           "check_measured"]

MECHANISMS: tuple[Mechanism, ...] = (LayerWise(), FullSave(), TwoPhase(), HostCopy(),
                                     MemoryTierCopy(), MemoryTierRestore(), MemoryTierThread(),
                                     Differential(), PeerCopy(),
                                     JitDetection(), Restart())
"""In the order they run: the collective ones first, then rank 0's, the spawns last."""

def check_coverage(mechanisms: Sequence[Mechanism] = MECHANISMS) -> None:
    """Refuse (``ProfilerError``, naming what to fix) a set of mechanisms that leaves a
    figure ``calibrate`` must measure unregistered, registers one twice, or registers a
    figure nobody declared or one another command measures."""
    owner: dict[str, str] = {}
    for mechanism in mechanisms:
        if not set(mechanism.stated) <= set(mechanism.figures):
            raise ProfilerError(f"mechanism {mechanism.name!r} states {list(mechanism.stated)} "
                                f"but registers only {list(mechanism.figures)}: register them")
        for name in mechanism.figures:
            if name not in FIGURES:
                raise ProfilerError(f"mechanism {mechanism.name!r} registers {name!r}, which no "
                                    "strategy declares (sim.strategies): declare it or drop it")
            if FIGURES[name].measured_by != CALIBRATE:
                raise ProfilerError(f"mechanism {mechanism.name!r} registers {name!r}, which "
                                    f"`{FIGURES[name].measured_by}` measures, not calibrate")
            if name in owner:
                raise ProfilerError(f"{name!r} is registered by both {owner[name]!r} and "
                                    f"{mechanism.name!r}: one mechanism measures each figure")
            owner[name] = mechanism.name
    missing = [n for n, spec in FIGURES.items() if spec.measured_by == CALIBRATE and n not in owner]
    if missing:
        raise ProfilerError(f"no mechanism measures {missing}: add one to "
                            "profiler.mechanisms.MECHANISMS that registers them (Mechanism.figures)")


def check_measured(mechanism: Mechanism, figures: dict) -> None:
    """Refuse a measurement that returned other figures than its mechanism registers."""
    if set(figures) != set(mechanism.figures):
        raise ProfilerError(f"mechanism {mechanism.name!r} registers {sorted(mechanism.figures)} "
                            f"but measured {sorted(figures)}: make the two agree")
