"""The strategies a validation runs for real, by the simulator's names, in its report order.

Each is a ``profiler.checkpointers.Checkpointer``: DeepSpeed's and LayerCheck's
there, CheckFreq's in ``profiler.twophase``, GEMINI's in ``profiler.inmemory``,
LowDiff's in ``profiler.differential`` (which build on the classes there).
"""
from __future__ import annotations

from .checkpointers import Checkpointer, FullCheckpointer, LayerCheckpointer
from .differential import DiffCheckpointer
from .inmemory import PeerCheckpointer
from .twophase import TwoPhaseCheckpointer

__all__ = ["CHECKPOINTERS"]

CHECKPOINTERS: dict[str, type[Checkpointer]] = {
    c.name: c for c in (FullCheckpointer, TwoPhaseCheckpointer, PeerCheckpointer,
                        DiffCheckpointer, LayerCheckpointer)}
