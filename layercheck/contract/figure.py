"""One cost figure and the declaration of one (``Figure``, ``FigureSpec``): torch-free and
import-free of the rest, so the strategies that declare figures (``sim.strategies``) and the
calibration that reads them (``layercheck.contract.calibration``) share it without a cycle."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from .band import Band, BandError

__all__ = ["SOURCES", "UNIT_RANGES", "SIGNED_RANGE", "CALIBRATE", "CalibrationError", "Figure",
           "FigureSpec", "STALE_COST_CAPTURE", "TRANSFERRED_STALE_COST", "STALE_COST_PARTS"]

SOURCES = ("measured", "derived", "published", "fit", "assumed", "given", "transferred")
"""measured: timed on this machine by the profiler; derived: computed from
measured or published figures; published: a number from a paper; fit: fitted
to published figures; assumed: a stated parameter nobody measured here (say
why in ``method``); given: set by the user (a command-line override);
transferred: measured on another job, named in ``method``, and carried over."""

UNIT_RANGES: dict[str, tuple[float, float]] = {"s": (0.0, 1e7), "GB/s": (1e-6, math.inf),
                                               "steps": (1.0, 1e6), "1": (0.0, 1.0)}
"""Every figure's range by its unit: durations up to 1e7 s (116 days, beyond any window's
use), rates of at least 1 kB/s (any finite rate above: a fast one only shortens a
duration towards 0), batches up to a million steps, fractions and probabilities in
[0, 1]. Past them a figure is a typo that makes durations the engine's float64 times
cannot hold beside a step (ratios above 1, NaN rows)."""
SIGNED_RANGE = (-1e3, 1e3)
"""A signed factor's range (``stale_cost``): a measured phi may be negative (the recovered
run ahead) or above 1 (stale layers cost more steps than they are old)."""

CALIBRATE = "python -m profiler calibrate"
"""What measures a figure unless its declaration names another command."""


class CalibrationError(ValueError):
    """A costs.json is missing, malformed or incomplete; the message says which part."""


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One number and its provenance."""

    value: float
    source: str
    method: str
    """How it was obtained, in words a reader can check (the API timed, repeats, size)."""
    samples: tuple[float, ...] = ()
    """Raw repeats (seconds), where measured."""
    bytes: int | None = None
    seconds: float | None = None
    """What a rate was computed from: ``bytes / seconds / 1e9``."""
    low: float | None = None
    high: float | None = None
    """An interval around ``value`` (both or neither; ``low <= value <= high``), e.g. a
    95% confidence interval; ``method`` says which."""
    band: Band | None = None
    """Where a figure nobody measured here plausibly lies, and why (absolute, holding
    ``value``); None: the figure's ``FigureSpec.band`` rule applies (``band_of``)."""

    def __post_init__(self) -> None:
        # Negative values are refused here for every figure but a signed one (FigureSpec.signed),
        # which Figure cannot know; the Calibration and the CostModel check the rest by name.
        for key in ("value", "low", "high"):
            number = getattr(self, key)
            if number is None and key != "value":
                continue
            if isinstance(number, bool) or not isinstance(number, (int, float)) \
                    or not math.isfinite(number):
                raise CalibrationError(f"{key} {number!r} must be a finite number")
        if (self.low is None) != (self.high is None):
            raise CalibrationError("give both low and high (an interval) or neither")
        if self.low is not None and not self.low <= self.value <= self.high:
            raise CalibrationError(f"interval [{self.low}, {self.high}] must hold value "
                                   f"{self.value} (low <= value <= high)")
        if self.source not in SOURCES:
            raise CalibrationError(f"source {self.source!r} must be one of {', '.join(SOURCES)}")
        if not isinstance(self.method, str) or not self.method.strip():
            raise CalibrationError("method must say how the figure was obtained")
        object.__setattr__(self, "samples", tuple(float(s) for s in self.samples))
        if self.band is not None and (self.band.relative
                                      or not self.band.low <= self.value <= self.band.high):
            raise CalibrationError(f"band [{self.band.low}, {self.band.high}] must hold value "
                                   f"{self.value} in the figure's own unit (not relative)")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "source": self.source, "method": self.method}
        if self.samples:
            out["samples"] = list(self.samples)
        for key in ("bytes", "seconds", "low", "high"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.band is not None:
            out["band"] = self.band.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Figure":
        known = {"value", "source", "method", "samples", "bytes", "seconds", "low", "high", "band"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CalibrationError(f"unknown keys {unknown}; known: {sorted(known)}")
        missing = sorted({"value", "source", "method"} - set(data))
        if missing:
            raise CalibrationError(f"missing {missing}")
        fields = dict(data)
        if "band" in fields:
            try:
                fields["band"] = Band.from_dict(fields["band"])
            except BandError as exc:
                raise CalibrationError(str(exc)) from None
        return cls(**fields)

    @property
    def interval(self) -> tuple[float, float]:
        """``(low, high)``; a figure without an interval is its value at both ends."""
        if self.low is None:
            return (float(self.value), float(self.value))
        return (float(self.low), float(self.high))


@dataclass(frozen=True)
class FigureSpec:
    """The declaration of one cost figure, made once by the strategy that owns it
    (``sim.strategies``): what it is, where its values may lie, its default and the band
    ``python -m sim sensitivity`` varies it across."""

    unit: str
    """'s', 'GB/s', 'steps' or '1' (a fraction or a probability)."""
    used_by: str
    """The strategies that use it."""
    meaning: str
    default: Figure | None = None
    """The paper's value with its provenance: the paper-a100 cost model's figure, and what
    a costs.json that lacks the figure is filled with on reading (marked so)."""
    signed: bool = False
    """True: the value may be negative (a measured effect, reported as measured);
    every other figure is >= 0."""
    band: Band | None = None
    """The default band rule (``band_of``): where a figure of this name that nobody measured
    here plausibly lies, for any cost model that gives it no band of its own."""
    whole: bool = False
    """True: a whole number (a count of steps)."""
    measured_by: str = CALIBRATE
    """The command that measures it on a machine (``profiler.mechanisms`` must cover every
    figure measured by ``CALIBRATE``)."""

    def __post_init__(self) -> None:
        if self.unit not in UNIT_RANGES:
            raise CalibrationError(f"unit {self.unit!r} must be one of {', '.join(UNIT_RANGES)}")
        if self.default is not None and not self.holds(self.default.value):
            raise CalibrationError(f"default {self.default.value!r} outside the figure's range "
                                   f"{self.range}")

    @property
    def range(self) -> tuple[float, float]:
        """Where a value may lie: ``SIGNED_RANGE`` for a signed figure, else its unit's."""
        return SIGNED_RANGE if self.signed else UNIT_RANGES[self.unit]

    def holds(self, value: float) -> bool:
        low, high = self.range
        return low <= value <= high and (not self.whole or value == int(value))


STALE_COST_CAPTURE = "traces/minilm-200steps"
"""The shipped capture whose measured stale cost factor the presets carry over."""

TRANSFERRED_STALE_COST = Figure(
    value=0.6385070073945015, low=0.34804183846786096, high=0.928972176321142,
    source="transferred", method=(
        f"carried over from {STALE_COST_CAPTURE} as measured there, whatever the composition "
        "of the job it is carried to: "
        'python -m profiler staleness on minilm-200steps (minilm): phi of the composite'
        ' LayerCheck restores (every stale layer as it was) at threshold 0.001, 50 '
        'steps after the failure, read as (Delta / S) / (Delta_c / S_c) in steps, the '
        'lost-work control of the same replicate the yardstick; mean of n = 4 '
        'replicates (failure steps [81, 101] x data orders [0, 1]; mean S 11.9 steps); '
        "interval: 95% t-interval over the replicates with the held-out bootstrap's "
        "variance added (replicates' sd 0.164, evaluation se 0.0401); the lost-work "
        'control (every layer and its Adam state S_c steps old, no replay: phi = 1 by '
        'definition) reads Delta_c / S_c = 1.84 [1.07, 2.60] in steps and 0.98 [0.54, '
        '1.41] in learning-rate-weighted steps (n = 4)'
        " (docs/stale-cost.md)"))
"""The stale cost factor of a job whose composition is not known (a costs.json without
one, the paper's server): the shipped capture's whole-composite measurement, carried
over as it is. A job whose trace is known gets ``sim.composite.transfer_stale_cost``
from ``STALE_COST_PARTS`` instead."""

STALE_COST_PARTS = {
    "blocks": Figure(
        value=1.3196210892014741, low=0.14047707366528694, high=2.4987651047376613,
        source="measured", method=(
            'python -m profiler staleness on minilm-200steps (minilm): phi of the '
            'composite with only its non-embedding layers (blocks, head, norms) stale '
            'at threshold 0.001, 50 steps after the failure, read as (Delta / S) / '
            '(Delta_c / S_c) in steps, the lost-work control of the same replicate the '
            'yardstick; mean of n = 4 replicates (failure steps [81, 101] x data orders'
            ' [0, 1]; mean S 2.2 steps); interval: 95% t-interval over the replicates '
            "with the held-out bootstrap's variance added (replicates' sd 0.645, "
            'evaluation se 0.182); the lost-work control (every layer and its Adam '
            'state S_c steps old, no replay: phi = 1 by definition) reads Delta_c / S_c'
            ' = 1.84 [1.07, 2.60] in steps and 0.98 [0.54, 1.41] in '
            'learning-rate-weighted steps (n = 4)')),
    "embedding": Figure(
        value=0.5871140693313213, low=0.23568758695760222, high=0.9385405517050402,
        source="measured", method=(
            'python -m profiler staleness on minilm-200steps (minilm): phi of the '
            'composite with only its embedding layers stale at threshold 0.001, 50 '
            'steps after the failure, read as (Delta / S) / (Delta_c / S_c) in steps, '
            'the lost-work control of the same replicate the yardstick; mean of n = 4 '
            'replicates (failure steps [81, 101] x data orders [0, 1]; mean S 9.7 '
            'steps); interval: 95% t-interval over the replicates with the held-out '
            "bootstrap's variance added (replicates' sd 0.196, evaluation se 0.0507); "
            'the lost-work control (every layer and its Adam state S_c steps old, no '
            'replay: phi = 1 by definition) reads Delta_c / S_c = 1.84 [1.07, 2.60] in '
            'steps and 0.98 [0.54, 1.41] in learning-rate-weighted steps (n = 4)')),
}
"""phi of the shipped capture's composites whose stale part is only the non-embedding
layers (blocks, head, norms) or only the embedding, as `python -m profiler staleness`
measured them there: what ``sim.composite.transfer_stale_cost`` mixes by a job's
composition. The one place these numbers live."""
