"""Checkpointing strategies: one module each, declaring its model and its cost figures.

Each strategy module (``base`` for what all share) holds

- ``FIGURES``: the cost figures it owns, each a ``layercheck.contract.figure.FigureSpec`` (unit,
  range, meaning, the paper's default with its provenance, the band ``python -m sim
  sensitivity`` varies it across, what measures it) -- a figure is declared once, by one
  module; other strategies may read it;
- ``STRATEGIES``: its ``Strategy`` classes (the model: ``base``'s contract).

``MODULES`` below is the registry, in report order. ``SCHEMA``, the union of their
``FIGURES``, is the calibration schema (``sim.calibrated.FIGURES``): every ``costs.json``'s
and ``sim.costs.CostModel``'s figures. Adding a strategy is one module
here, its test, its profiler mechanism (``profiler.mechanisms``) and its name in
``MODULES``.
"""
from __future__ import annotations

from layercheck.contract.figure import FigureSpec

from ..errors import SimError
from . import base, checkfreq, deepspeed, gemini, jit, layercheck, lowdiff, none, tiered
from .base import PROTOCOLS, Cadence, Footprint, Schedule, Strategy
from .checkfreq import CHECKFREQ_OVERHEAD, CheckFreq
from .deepspeed import DeepSpeed
from .gemini import Gemini
from .layercheck import LayerCheck, LayerCheckSync
from .lowdiff import NATIVE_DIFF_BATCH, LowDiff
from .none import NoCheckpoint
from .tiered import Tiered

__all__ = ["Cadence", "Footprint", "Schedule", "Strategy", "STRATEGIES", "MODULES", "SCHEMA", "schema",
           "get_strategy", "PROTOCOLS", "CHECKFREQ_OVERHEAD", "NATIVE_DIFF_BATCH",
           "NoCheckpoint", "DeepSpeed", "CheckFreq", "Gemini", "LowDiff", "LayerCheck",
           "LayerCheckSync", "Tiered"]

MODULES = (base, none, deepspeed, checkfreq, gemini, lowdiff, layercheck, jit, tiered)
"""The registry: every strategy module, in report order."""


def schema(modules=MODULES) -> dict[str, FigureSpec]:
    """The union of ``modules``' ``FIGURES``, in their order; a figure declared twice is
    an error that names both modules (each figure has one owner)."""
    out: dict[str, FigureSpec] = {}
    owner: dict[str, str] = {}
    for module in modules:
        for name, spec in module.FIGURES.items():
            if name in out:
                raise SimError(f"cost figure {name!r} is declared by both {owner[name]} and "
                               f"{module.__name__}: declare it once, in the strategy that owns "
                               "it, and read it from the others")
            if spec.default is None:
                raise SimError(f"cost figure {name!r} ({module.__name__}) declares no default: "
                               "give the paper's value with its provenance (FigureSpec.default)")
            out[name], owner[name] = spec, module.__name__
    return out


SCHEMA: dict[str, FigureSpec] = schema()
"""Every cost figure: name -> declaration, the calibration schema (``sim.calibrated``
checks every costs.json the simulator reads against it; the contract knows no figure)."""

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for module in MODULES for cls in module.STRATEGIES}
"""Every strategy by name, in report order."""


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; an unknown name is an error that lists the known ones."""
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise SimError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}") from None
