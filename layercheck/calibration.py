"""``costs.json``: what each checkpointing mechanism costs on one machine and model.

Torch-free (the simulator reads it). ``python -m profiler calibrate`` measures
the figures on the capture's own model and machine and writes them next to
the trace; the simulator's cost model (``sim.costs.CostModel``) has exactly
these fields, so a calibration is a cost model with its provenance.

A ``costs.json``::

    {"schema_version": 1, "name": "...", "description": "...",
     "model": {...}, "machine": {...}, "full_bytes": 272882456,
     "figures": {"save_gbps": {"value": 0.31, "source": "measured",
                               "method": "engine.save_checkpoint of ... median of 3",
                               "samples": [...], "bytes": 272882456, "seconds": 0.88}, ...}}

Every figure in ``FIGURES`` must be present, except that a figure with a
declared default (``FigureSpec.default``; today only ``stale_cost``, added
after the first costs.json files were written) is filled in with it on
reading, its method saying so; each says where it came from (``SOURCES``)
and how. Rates are decimal GB/s (1 GB = 1e9 bytes), times are seconds.
``samples`` (the raw repeats), ``bytes`` and ``seconds`` (what a rate was
computed from) and ``low``/``high`` (an interval around the value, e.g. a
95% confidence interval) are optional.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .band import Band, BandError

__all__ = ["SCHEMA_VERSION", "COSTS_FILE", "FIGURES", "SOURCES", "Band", "Figure", "FigureSpec",
           "Calibration", "CalibrationError", "band_of", "read_calibration", "write_calibration",
           "TRANSFERRED_STALE_COST", "STALE_COST_CAPTURE"]

SCHEMA_VERSION = 1
COSTS_FILE = "costs.json"

SOURCES = ("measured", "derived", "published", "fit", "assumed", "given", "transferred")
"""measured: timed on this machine by the profiler; derived: computed from
measured or published figures; published: a number from a paper; fit: fitted
to published figures; assumed: a stated parameter nobody measured here (say
why in ``method``); given: set by the user (a command-line override);
transferred: measured on another job, named in ``method``, and carried over."""


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
    unit: str
    """'s', 'GB/s', 'steps' or '1' (a fraction or a probability)."""
    used_by: str
    """The strategies that use it."""
    meaning: str
    default: Figure | None = None
    """Filled in (its method saying so) when a costs.json lacks the figure; None: the
    figure is required."""
    signed: bool = False
    """True: the value may be negative (a measured effect, reported as measured);
    every other figure is >= 0."""
    band: Band | None = None
    """The default band rule (``band_of``): where a figure of this name that nobody measured
    here plausibly lies, for any cost model that gives it no band of its own."""


STALE_COST_CAPTURE = "traces/minilm-200steps"
"""The shipped capture whose measured stale cost factor the presets carry over."""

TRANSFERRED_STALE_COST = Figure(
    value=2.782609437901019, low=0.7615370223706064, high=4.848984063034, source="transferred",
    method=(
        f"carried over from {STALE_COST_CAPTURE}, where `python -m profiler staleness` measured "
        "it on MiniLM-L6 fine-tuning (2026-12-01): a composite recovery at threshold 1e-3 at its "
        "stalest step (81, parameter-weighted staleness 12.0 steps) ended the 200-step job 33.3 "
        "steps behind the failure-free run by held-out loss (phi = 33.3 / 12.0); interval: the "
        "95% paired bootstrap widened by the data-order noise floor (20.9 steps at the end). "
        "Carrying it over assumes a step of staleness costs the same elsewhere; nobody has "
        "measured it on a 7B model (docs/stale-cost.md)"))
"""The stale cost factor a trace without its own measurement uses (the presets): the
measurement on the shipped capture, carried over. The one place the number lives."""

_STORAGE_RULE = Band(low=1 / 3, high=3.0, relative=True, reason=(
    "a storage rate carried from elsewhere: this machine's two calibrations of one model "
    "(traces/minilm-200steps and minilm-1000steps, their costs.json of 2026-12-01) measured DeepSpeed's save at "
    "0.42 and 1.10 GB/s on the same disk, 2.6x apart; a third to three times"))
_COPY_RULE = Band(low=0.5, high=2.0, relative=True, reason=(
    "a copy to host memory carried from elsewhere: the same two calibrations measured "
    "host_copy_gbps at 9.5 and 5.1 GB/s and snapshot_gbps at 3.1 and 2.0 GB/s (up to 1.9x "
    "apart); half to twice"))
_LOAD_FIXED_RULE = Band(low=0.0, high=0.5, reason=(
    "0 where the load is timed whole and folded into its rate (how calibrate measures "
    "load_fixed_s), up to the 0.48 s restore plan measured here (minilm-200steps "
    "lc_load_fixed_s, 2026-12-01)"))


FIGURES: dict[str, FigureSpec] = {
    "restart_s": FigureSpec("s", "all", "a new training process up to a model ready to load "
                                        "(process start, imports, model built from its initial "
                                        "weights), after a failure; all a resume at the job's "
                                        "start costs",
        band=Band(low=0.5, high=2.0, relative=True, reason=(
            "one process's restart measured 10.6 and 10.8 s here (minilm-1000steps, "
            "minilm-200steps), a 2-rank torchrun 19.1 s (minilm-zero3-200steps; 2026-12-01): ranks nearly "
            "double it; half to twice"))),
    "save_gbps": FigureSpec("GB/s", "deepspeed", "synchronous full save of model and optimizer "
                                                 "(training stalls for all of it)",
        band=_STORAGE_RULE),
    "load_fixed_s": FigureSpec("s", "deepspeed, checkfreq, gemini, lowdiff",
                               "fixed part of loading a full checkpoint (open, metadata, placement)",
        band=_LOAD_FIXED_RULE),
    "load_gbps": FigureSpec("GB/s", "deepspeed, gemini (storage tier), lowdiff (base)",
                            "loading a full checkpoint saved synchronously",
        band=_STORAGE_RULE),
    "snapshot_gbps": FigureSpec("GB/s", "checkfreq", "the blocking first phase of a two-phase "
                                                     "save: the state copied to host memory",
        band=_COPY_RULE),
    "persist_gbps": FigureSpec("GB/s", "checkfreq, gemini (storage tier), lowdiff",
                               "the background second phase: host memory to storage",
        band=_STORAGE_RULE),
    "async_load_gbps": FigureSpec("GB/s", "checkfreq", "loading a checkpoint written by the "
                                                       "two-phase save",
        band=_STORAGE_RULE),
    "host_copy_gbps": FigureSpec("GB/s", "gemini, lowdiff (full checkpoints)",
                                 "a plain copy of the full state into host memory",
        band=_COPY_RULE),
    "peer_gbps": FigureSpec("GB/s", "gemini", "the transfer of the in-memory copy to a peer "
                                              "node's CPU memory (and back on recovery)",
        band=Band(low=1.25, high=25.0, reason=(
            "a peer node's CPU memory over the network: from 10 Gb/s Ethernet (1.25 GB/s) to "
            "one 200 Gb/s HDR InfiniBand port (25 GB/s)"))),
    "peer_loss_probability": FigureSpec("1", "gemini", "chance that a failure also destroys the "
                                                       "peer's copy (recovery from storage)",
        band=Band(low=0.0, high=0.2, reason=(
            "0: node failures independent, so GEMINI's copy on another node always survives; "
            "0.2: a judgment (no published figure), one failure in five from a fault domain "
            "wider than a node (a switch, a rack's power) that holds the peer too"))),
    "diff_fraction": FigureSpec("1", "lowdiff", "one step's compressed gradient differential "
                                                "as a fraction of a full checkpoint's bytes",
        band=Band(low=0.8, high=1.25, relative=True, reason=(
            "the LayerCheck paper's storage table puts LowDiff's per-iteration differential at "
            "9.7%, 10.7% and 12.2% of a full checkpoint over its three models, a 1.26x span"))),
    "diff_batch": FigureSpec("steps", "lowdiff", "differentials written together in one batch",
        band=Band(low=1, high=3, reason=(
            "the LayerCheck paper's storage table implies 1.85 iterations per LowDiff write: "
            "1 (every differential its own write) to 3 (one past the 2 used)"))),
    "diff_snapshot_gbps": FigureSpec("GB/s", "lowdiff", "compressing a step's gradient and "
                                                        "copying the differential to host memory "
                                                        "(differential bytes per second of stall)",
        band=_COPY_RULE),
    "diff_replay_gbps": FigureSpec("GB/s", "lowdiff", "recovery: reading and applying "
                                                      "differentials (differential bytes per second)",
        band=_STORAGE_RULE),
    "tracking_fraction": FigureSpec("1", "layercheck", "drift tracking and bookkeeping per step, "
                                                       "as a fraction of the step's compute",
        band=Band(low=0.0, high=0.031, reason=(
            "0 (tracking free) to 0.031, the most measured here (minilm-1000steps "
            "tracking_fraction, on CPU, where tracking shares the cores with compute)"))),
    "lc_snapshot_gbps": FigureSpec("GB/s", "layercheck", "copying the chosen layers (weights and "
                                                         "Adam moments) to host memory",
        band=_COPY_RULE),
    "lc_write_gbps": FigureSpec("GB/s", "layercheck", "the background writer: layer files "
                                                      "written, fsynced and committed",
        band=_STORAGE_RULE),
    "lc_commit_s": FigureSpec("s", "layercheck", "committing one step's training state "
                                                 "(state file, fsyncs, manifest line)",
        band=Band(low=0.1, high=10.0, relative=True, reason=(
            "the three captures here measured 2.1 to 19.6 ms (costs.json of 2026-12-01) (a 9x range): a tenth to ten "
            "times"))),
    "lc_load_fixed_s": FigureSpec("s", "layercheck", "fixed part of a composite restore "
                                                     "(manifest, training state)",
        band=_LOAD_FIXED_RULE),
    "lc_load_gbps": FigureSpec("GB/s", "layercheck", "a composite restore: read, verify and "
                                                     "apply every layer's newest version",
        band=_STORAGE_RULE),
    "stale_cost": FigureSpec("1", "layercheck", (
        "the stale cost factor phi: convergence-equivalent steps lost by a composite recovery "
        "over the parameter-weighted staleness at the recovery (steps); 0: stale layers cost "
        "nothing (the paper's accounting), 1: their updates are lost work; may be negative "
        "(a recovered run ahead of the reference, reported as measured)"),
        default=TRANSFERRED_STALE_COST, signed=True, band=Band(low=0.0, high=1.0, reason=(
            "from the paper's accounting (0: stale layers cost nothing) to every update they "
            "discarded lost (1, the accounting before the figure existed); a phi with an "
            "interval of its own (a measured one) uses that"))),
}
"""Every figure of a calibration: name -> unit, users, meaning, default band rule. The
simulator's ``CostModel`` has one field per entry."""


def band_of(name: str, figure: Figure) -> Band | None:
    """The band ``figure`` (of ``FIGURES[name]``) is varied across, absolute and holding
    its value; None for a figure measured here (its repeats are its own record, not a
    plausible range). In order: the figure's own ``band``; its own interval where that has
    a width (a measured phi's confidence interval); for a measured figure none; else the
    figure's ``FigureSpec.band`` rule around its value."""
    if figure.band is not None:
        return figure.band
    low, high = figure.interval
    if high > low:
        return Band(low=low, high=high, reason=f"its own interval: {figure.method}")
    if figure.source == "measured":
        return None
    rule = FIGURES[name].band
    return None if rule is None else rule.around(float(figure.value))

_POSITIVE = {name for name, spec in FIGURES.items() if spec.unit in ("GB/s", "steps")}


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """A complete set of ``FIGURES``, with where they were measured."""

    name: str
    description: str
    figures: Mapping[str, Figure]
    model: Mapping[str, Any] = field(default_factory=dict)
    machine: Mapping[str, Any] = field(default_factory=dict)
    full_bytes: int | None = None
    """The full checkpoint the rates were measured on (None: not measured here)."""
    filled: tuple[str, ...] = ()
    """Figures the costs.json lacked, filled in with their declared default on reading
    (``FigureSpec.default``); a figure named here is not a measurement of this file's."""
    code: Mapping[str, Any] = field(default_factory=dict)
    """Which code measured the figures (``layercheck.measurement.code_record``); empty in a
    costs.json written before it was recorded (``layercheck.measurement.outdated``)."""

    def __post_init__(self) -> None:
        missing = [n for n in FIGURES if n not in self.figures]
        if missing:
            raise CalibrationError(f"{self.name}: missing figures {missing}; re-run "
                                   "`python -m profiler calibrate`")
        unknown = sorted(set(self.figures) - set(FIGURES))
        if unknown:
            raise CalibrationError(f"{self.name}: unknown figures {unknown}; known: {list(FIGURES)}")
        for name, spec in FIGURES.items():
            if not spec.signed and min(self.figures[name].value,
                                       *self.figures[name].interval) < 0:
                raise CalibrationError(f"{self.name}: {name} must be >= 0")
        object.__setattr__(self, "filled", tuple(self.filled))
        for name in _POSITIVE:
            if self.figures[name].value <= 0:
                raise CalibrationError(f"{self.name}: {name} must be positive")
        if self.figures["peer_loss_probability"].value > 1:
            raise CalibrationError(f"{self.name}: peer_loss_probability must be in [0, 1]")
        if self.figures["diff_batch"].value != int(self.figures["diff_batch"].value):
            raise CalibrationError(f"{self.name}: diff_batch must be a whole number of steps")

    def value(self, name: str) -> float:
        return float(self.figures[name].value)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "name": self.name,
                "description": self.description, "model": dict(self.model),
                "machine": dict(self.machine), "full_bytes": self.full_bytes,
                **({"code": dict(self.code)} if self.code else {}),
                "figures": {n: self.figures[n].to_dict() for n in FIGURES}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "costs.json") -> "Calibration":
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise CalibrationError(f"{where}: schema_version {version!r}; this layercheck reads "
                                   f"{SCHEMA_VERSION} (re-run `python -m profiler calibrate`)")
        figures = data.get("figures")
        if not isinstance(figures, Mapping):
            raise CalibrationError(f"{where}: 'figures' must be an object of figure records")
        code = data.get("code") or {}
        if not isinstance(code, Mapping):
            raise CalibrationError(f"{where}: 'code' must be an object (which code measured "
                                   "the figures); re-run `python -m profiler calibrate`")
        parsed, filled = {}, []
        for name, record in figures.items():
            if not isinstance(record, Mapping):
                raise CalibrationError(f"{where}: figures.{name} must be an object")
            try:
                parsed[name] = Figure.from_dict(record)
            except (CalibrationError, TypeError) as exc:
                raise CalibrationError(f"{where}: figures.{name}: {exc}") from None
        for name, spec in FIGURES.items():
            if name not in parsed and spec.default is not None:
                parsed[name] = _filled(spec.default, name)
                filled.append(name)
        try:
            return cls(name=str(data.get("name", "")), description=str(data.get("description", "")),
                       figures=parsed, model=data.get("model") or {},
                       machine=data.get("machine") or {}, full_bytes=data.get("full_bytes"),
                       filled=tuple(filled), code=code)
        except CalibrationError as exc:
            raise CalibrationError(f"{where}: {exc}") from None


def _filled(default: Figure, name: str) -> Figure:
    """``default`` as the record of a file that lacks ``name``: the method says so."""
    return dataclasses.replace(default, method=(
        f"filled in on reading (this costs.json predates {name}) with the default, "
        f"{default.method}"))


def read_calibration(path: str | Path) -> Calibration:
    """Load and validate ``path`` (a costs.json, or a trace folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / COSTS_FILE
    if not path.is_file():
        raise CalibrationError(f"{path}: no such costs file; measure one with "
                               f"`python -m profiler calibrate --trace {path.parent}`")
    # the same reading as trace._read_json, with this module's error class (trace.py
    # keeps its own: a costs file is optional in a trace and reports as TraceError there)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise CalibrationError(f"{path}: expected a JSON object")
    return Calibration.from_dict(data, where=str(path))


def write_calibration(calibration: Calibration, path: str | Path) -> Path:
    """Write ``calibration`` to ``path`` (a file, or a folder that gets costs.json)."""
    path = Path(path)
    if path.is_dir():
        path = path / COSTS_FILE
    path.write_text(json.dumps(calibration.to_dict(), indent=2) + "\n")
    return path
