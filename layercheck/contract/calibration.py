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

Schema-agnostic: this module reads and writes the figures a file holds and checks
each record (``Figure``), but knows no figure by name. Which figures a calibration
must hold, in which unit and range, with which default, is its reader's: a subclass
names them in ``schema`` (name -> ``FigureSpec``, ``layercheck.contract.figure``), and
the simulator's (``sim.figures.Calibration``, its strategies' declarations) is the one
the profiler writes and the simulator reads. Against a schema, a costs.json written
before a figure was declared reads with that figure filled in from its declared default (the
paper's value), marked ``assumed`` and named in ``Calibration.filled``, its
method saying so; a carried-over default (``stale_cost``'s) stays
``transferred``. Each figure says where it came from (``SOURCES``) and how.
Rates are decimal GB/s (1 GB = 1e9 bytes), times are seconds.
``samples`` (the raw repeats), ``bytes`` and ``seconds`` (what a rate was
computed from) and ``low``/``high`` (an interval around the value, e.g. a
95% confidence interval) are optional.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

from .band import Band
from .userfile import RefusedFile, read_json
from .figure import (SOURCES, STALE_COST_CAPTURE, TRANSFERRED_STALE_COST, CalibrationError, Figure,
                     FigureSpec)

__all__ = ["SCHEMA_VERSION", "COSTS_FILE", "SOURCES", "Band", "Figure", "FigureSpec",
           "Calibration", "CalibrationError", "band_of", "read_calibration", "write_calibration",
           "TRANSFERRED_STALE_COST", "STALE_COST_CAPTURE"]

SCHEMA_VERSION = 1
COSTS_FILE = "costs.json"

def band_of(figure: Figure, spec: FigureSpec) -> Band | None:
    """The band ``figure`` (declared by ``spec``) is varied across, absolute and holding
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
    rule = spec.band
    if rule is None or not rule.relative:
        return None if rule is None else rule.around(float(figure.value))
    # a relative rule around a value near the top of the figure's range would leave float64
    # (a given --write-gbps 1e307, ten times): the band stops at the range's ends
    value, (low, high) = float(figure.value), spec.range
    top = min(high, sys.float_info.max)
    return Band(low=min(max(value * rule.low, low), top), high=min(value * rule.high, top),
                reason=rule.reason)

@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The figures of a costs.json, with where they were measured: as the file holds
    them, or, in a subclass that names its ``schema``, every figure of it, checked."""

    schema: ClassVar[Mapping[str, FigureSpec] | None] = None
    """The figures a calibration holds (name -> declaration, in report order), or None:
    schema-agnostic, the figures as given."""

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
    """Which code measured the figures (``layercheck.contract.measurement.code_record``); empty in a
    costs.json written before it was recorded (``layercheck.contract.measurement.outdated``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "filled", tuple(self.filled))
        if self.schema is None:
            return
        missing = [n for n in self.schema if n not in self.figures]
        if missing:
            raise CalibrationError(f"{self.name}: missing figures {missing}; re-run "
                                   "`python -m profiler calibrate`")
        unknown = sorted(set(self.figures) - set(self.schema))
        if unknown:
            raise CalibrationError(f"{self.name}: unknown figures {unknown}; "
                                   f"known: {list(self.schema)}")
        for name, spec in self.schema.items():
            figure = self.figures[name]
            if not spec.signed and min(figure.value, *figure.interval) < 0:
                raise CalibrationError(f"{self.name}: {name} must be >= 0")
            if spec.unit in ("GB/s", "steps") and figure.value <= 0:
                raise CalibrationError(f"{self.name}: {name} must be positive")
            if spec.unit == "1" and not spec.signed and figure.value > 1:
                raise CalibrationError(f"{self.name}: {name} must be in [0, 1]")
            if spec.whole and figure.value != int(figure.value):
                raise CalibrationError(f"{self.name}: {name} must be a whole number of {spec.unit}")

    def value(self, name: str) -> float:
        return float(self.figures[name].value)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "name": self.name,
                "description": self.description, "model": dict(self.model),
                "machine": dict(self.machine), "full_bytes": self.full_bytes,
                **({"code": dict(self.code)} if self.code else {}),
                "figures": {n: self.figures[n].to_dict() for n in (self.schema or self.figures)}}

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
        for name, spec in (cls.schema or {}).items():
            if name not in parsed:
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
    """``default`` as the record of a file that lacks ``name``: the method says so, and the
    source is ``assumed`` (the paper's figure stands in for one nobody measured on this
    file's machine), except that a carried-over measurement stays ``transferred`` (its
    method names the job it was measured on)."""
    source = default.source if default.source == "transferred" else "assumed"
    return dataclasses.replace(default, source=source, method=(
        f"filled in on reading (this costs.json predates {name}) with the default "
        f"({default.source}), {default.method}"))


def read_calibration(path: str | Path, kind: type[Calibration] = Calibration) -> Calibration:
    """Load and validate ``path`` (a costs.json, or a trace folder holding one) as a ``kind``
    (its ``schema``'s figures; the figures as written for ``Calibration`` itself)."""
    path = Path(path)
    if path.is_dir():
        path = path / COSTS_FILE
    if not path.exists():
        raise CalibrationError(f"{path}: no such costs file; measure one with "
                               f"`python -m profiler calibrate --trace {path.parent}`")
    # the same reading as trace._read_json, with this module's error class (trace.py
    # keeps its own: a costs file is optional in a trace and reports as TraceError there)
    try:
        data = read_json(path)
    except RefusedFile as exc:
        raise CalibrationError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise CalibrationError(f"{path}: expected a JSON object")
    return kind.from_dict(data, where=str(path))


def write_calibration(calibration: Calibration, path: str | Path) -> Path:
    """Write ``calibration`` to ``path`` (a file, or a folder that gets costs.json)."""
    path = Path(path)
    if path.is_dir():
        path = path / COSTS_FILE
    path.write_text(json.dumps(calibration.to_dict(), indent=2) + "\n")
    return path
