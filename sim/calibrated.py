"""A costs.json as the simulator reads it: every figure its strategies declare, checked.

The contract reads a calibration schema-agnostic (``layercheck.contract.calibration``:
the figures a file holds); the simulator owns the schema (``sim.strategies.SCHEMA``,
each strategy's ``FIGURES``) and checks a calibration against it when it reads one:
complete (a figure a costs.json predates is filled in with its declared default,
marked ``assumed`` and named in ``filled``), none unknown, each in its unit and range.
The profiler writes its calibrations as this ``Calibration``, so every costs.json holds
the simulator's figures in its report order.
"""
from __future__ import annotations

from pathlib import Path

from layercheck.contract import calibration as contract
from layercheck.contract.figure import Band, Figure, FigureSpec

from .strategies import SCHEMA

__all__ = ["FIGURES", "Calibration", "read_calibration", "checked", "band_of"]

FIGURES: dict[str, FigureSpec] = SCHEMA
"""Every figure of a calibration: name -> unit, users, meaning, range, default, band rule,
in the strategies' report order. ``sim.costs.CostModel`` has one entry per figure."""


class Calibration(contract.Calibration):
    """A complete set of ``FIGURES``, with where they were measured."""

    schema = FIGURES


def read_calibration(path: str | Path) -> Calibration:
    """Load ``path`` (a costs.json, or a trace folder holding one), checked against ``FIGURES``."""
    return contract.read_calibration(path, Calibration)


def checked(calibration: contract.Calibration) -> Calibration:
    """``calibration`` (a trace's, read schema-agnostic) checked against ``FIGURES``, as
    ``read_calibration`` would have read its file; CalibrationError where it fails."""
    if isinstance(calibration, Calibration):
        return calibration
    where = calibration.name or contract.COSTS_FILE
    return Calibration.from_dict(calibration.to_dict(), where=where)


def band_of(name: str, figure: Figure) -> Band | None:
    """``contract.band_of`` of ``figure`` by its declaration, ``FIGURES[name]``."""
    return contract.band_of(figure, FIGURES[name])
