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

``FIGURES`` is the union of the figures the strategies declare, one module per
strategy, which ``sim.strategies`` declares here on import (``FigureSchema.declare``;
this module imports nothing of the simulator); the declaration, ``FigureSpec``, and
the record, ``Figure``, are in ``layercheck.contract.figure``. A costs.json written before a figure
was declared reads with that figure filled in from its declared default (the
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
from typing import Any, Mapping

from .band import Band
from .userfile import RefusedFile, read_json
from .figure import (SOURCES, STALE_COST_CAPTURE, TRANSFERRED_STALE_COST, CalibrationError, Figure,
                     FigureSpec)

__all__ = ["SCHEMA_VERSION", "COSTS_FILE", "FIGURES", "SOURCES", "Band", "Figure", "FigureSpec",
           "FigureSchema", "Calibration", "CalibrationError", "band_of", "read_calibration", "write_calibration",
           "TRANSFERRED_STALE_COST", "STALE_COST_CAPTURE"]

SCHEMA_VERSION = 1
COSTS_FILE = "costs.json"

OWNERS_GROUP = "layercheck.figures"
"""The entry-point group under which a package registers a module that declares figures."""


class FigureSchema(Mapping):
    """``FIGURES``: the figures every calibration holds, declared by their owners.

    The strategies declare their figures beside their models (one module each;
    ``sim.strategies`` declares the union of its modules' on import, ``declare``); the
    contract reads what was declared and never imports its owners (imports point one
    way: the library imports nothing of the simulator). Reading the schema before any
    owner declared it is a ``CalibrationError`` that says so."""

    def __init__(self) -> None:
        self._owners: dict[str, dict[str, FigureSpec]] = {}
        self._union: dict[str, FigureSpec] = {}

    def declare(self, owner: str, specs: Mapping[str, FigureSpec]) -> None:
        """Declare ``specs`` (name -> ``FigureSpec``, in report order) as ``owner``'s figures,
        replacing what ``owner`` declared before (a reload declares again). A figure another
        owner declared, or one without a default (what a costs.json that predates it reads
        as), is refused with the fix."""
        for name, spec in specs.items():
            if not isinstance(spec, FigureSpec):
                raise CalibrationError(f"{owner}: figure {name!r} must be a FigureSpec, not "
                                       f"{type(spec).__name__}")
            if spec.default is None:
                raise CalibrationError(f"{owner}: figure {name!r} declares no default: give the "
                                       "paper's value with its provenance (FigureSpec.default)")
            for other, theirs in self._owners.items():
                if other != owner and name in theirs:
                    raise CalibrationError(f"figure {name!r} is declared by both {other} and "
                                           f"{owner}: declare it once, where it is owned")
        self._owners[owner] = dict(specs)
        self._union = {n: s for declared in self._owners.values() for n, s in declared.items()}

    def _specs(self) -> dict[str, FigureSpec]:
        if not self._union:
            self._discover()
        if not self._union:
            raise CalibrationError("no cost figures are declared yet: the strategies declare "
                                   "them (sim.strategies, on import); install the project "
                                   "(pip install -e .) or import sim before reading or making a "
                                   "calibration")
        return self._union

    def _discover(self) -> None:
        """Load the owners installed packages register under the entry-point group
        ``OWNERS_GROUP`` (the simulator's strategies do, in pyproject.toml): a plug-in
        found by its own registration, so the contract still names none of them."""
        from importlib.metadata import entry_points
        for point in entry_points(group=OWNERS_GROUP):
            point.load()  # importing the owner declares its figures

    def __getitem__(self, name: str) -> FigureSpec:
        return self._specs()[name]

    def __iter__(self):
        return iter(self._specs())

    def __len__(self) -> int:
        return len(self._specs())

    def __repr__(self) -> str:
        return f"FIGURES({list(self._union)})"


FIGURES = FigureSchema()
"""Every figure of a calibration: name -> unit, users, meaning, range, default, band rule,
in the strategies' report order. The simulator's ``CostModel`` has one entry per figure."""


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
    if rule is None or not rule.relative:
        return None if rule is None else rule.around(float(figure.value))
    # a relative rule around a value near the top of the figure's range would leave float64
    # (a given --write-gbps 1e307, ten times): the band stops at the range's ends
    value, (low, high) = float(figure.value), FIGURES[name].range
    top = min(high, sys.float_info.max)
    return Band(low=min(max(value * rule.low, low), top), high=min(value * rule.high, top),
                reason=rule.reason)

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
    """Which code measured the figures (``layercheck.contract.measurement.code_record``); empty in a
    costs.json written before it was recorded (``layercheck.contract.measurement.outdated``)."""

    def __post_init__(self) -> None:
        missing = [n for n in FIGURES if n not in self.figures]
        if missing:
            raise CalibrationError(f"{self.name}: missing figures {missing}; re-run "
                                   "`python -m profiler calibrate`")
        unknown = sorted(set(self.figures) - set(FIGURES))
        if unknown:
            raise CalibrationError(f"{self.name}: unknown figures {unknown}; known: {list(FIGURES)}")
        object.__setattr__(self, "filled", tuple(self.filled))
        for name, spec in FIGURES.items():
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


def read_calibration(path: str | Path) -> Calibration:
    """Load and validate ``path`` (a costs.json, or a trace folder holding one)."""
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
    return Calibration.from_dict(data, where=str(path))


def write_calibration(calibration: Calibration, path: str | Path) -> Path:
    """Write ``calibration`` to ``path`` (a file, or a folder that gets costs.json)."""
    path = Path(path)
    if path.is_dir():
        path = path / COSTS_FILE
    path.write_text(json.dumps(calibration.to_dict(), indent=2) + "\n")
    return path
