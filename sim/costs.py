"""The cost model: what each checkpointing mechanism costs, and where each number came from.

``CostModel`` is a validated mapping over the calibration schema
(``sim.calibrated.FIGURES``, the union of the figures the strategy
modules declare, ``sim.strategies``): one entry (and attribute) per figure, a
``provenance`` record for each (measured, derived, published, fit, assumed,
given or transferred, with the method; ``stale_cost`` also with its interval).
Its defaults are the figures' declared defaults, the paper's server. Two kinds
exist:

- a **calibration**: ``costs.json`` written by ``python -m profiler calibrate``
  next to a captured trace, every mechanism timed on that machine and model
  (``CostModel.from_calibration``); a captured trace uses its own by default; a
  figure the file predates is its declared default, marked assumed;
- **paper-a100**: the paper's server (one node, 8x A100 40 GB, Lustre;
  LayerCheck, IEEE CLUSTER 2026, see ``shared/design/LAYERCHECK.md``), built
  from published figures (``CostModel.paper_a100``); the presets use it.

Bandwidths are decimal GB/s (1 GB = 1e9 bytes, as the paper's 106.6 GB for
7.6e9 parameters x 14 bytes). Overrides (``with_overrides``, the CLI's
``--write-gbps`` ...) are marked ``given``.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping as MappingABC
from dataclasses import field
from pathlib import Path
from typing import Any, Mapping

from layercheck.contract.calibration import Band, CalibrationError, Figure
from .calibrated import Calibration, band_of, checked, read_calibration

from .errors import SimError
from .strategies import SCHEMA as FIGURES  # the owner's declarations: CostModel's fields below

__all__ = ["CostModel", "GB", "COST_MODELS", "PAPER_A100", "declared_band"]

GB = 1e9
PAPER_A100 = "paper-a100"
COST_MODELS = (PAPER_A100,)
"""Named cost models (``--costs NAME``); anything else is a costs.json path."""

def _paper_figures() -> dict[str, Figure]:
    """Every figure's declared default: the paper's value with its provenance."""
    return {name: spec.default for name, spec in FIGURES.items()}


class _CostModel(MappingABC):
    """What ``CostModel`` does (its fields are made from the schema below)."""

    def __post_init__(self) -> None:
        for name, spec in FIGURES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or (value < 0 and not spec.signed):
                raise SimError(f"CostModel.{name}={value!r} must be a finite number"
                               + ("" if spec.signed else " >= 0"))
        for name, spec in FIGURES.items():
            if spec.unit in ("GB/s", "steps") and getattr(self, name) == 0:
                raise SimError(f"CostModel.{name}=0 must be positive ({spec.unit})")
        for name, spec in FIGURES.items():
            low, high = spec.range
            if not low <= getattr(self, name) <= high:
                unit = "" if spec.unit == "1" else f" {spec.unit}"
                allowed = f"below {low:g}{unit}" if high == math.inf else \
                    f"outside {low:g} to {high:g}{unit}"
                raise SimError(f"CostModel.{name}={getattr(self, name)!r} is {allowed} "
                               f"({spec.meaning})")
            if spec.whole:
                if getattr(self, name) != int(getattr(self, name)):
                    raise SimError(f"CostModel.{name}={getattr(self, name)!r} must be a whole "
                                   f"number of {spec.unit}")
                object.__setattr__(self, name, int(getattr(self, name)))
        prov = dict(self.provenance)
        for name in FIGURES:
            record = prov.get(name)
            if record is None or not math.isclose(record.value, getattr(self, name), rel_tol=1e-12):
                prov[name] = Figure(value=getattr(self, name), source="given",
                                    method="given by the user (an override of the cost model)")
        object.__setattr__(self, "provenance", prov)

    # -- construction ------------------------------------------------------------
    @classmethod
    def paper_a100(cls, **overrides: Any) -> "CostModel":
        """The paper's server, every figure from a published number, a fit or a stated assumption."""
        return cls().with_overrides(**overrides) if overrides else cls()

    @classmethod
    def from_calibration(cls, calibration: Calibration) -> "CostModel":
        """The figures of a ``costs.json`` (``python -m profiler calibrate``), a trace's
        included (read schema-agnostic: checked here, ``calibrated.checked``)."""
        try:
            calibration = checked(calibration)
        except CalibrationError as exc:
            raise SimError(str(exc)) from None
        return cls(**{n: calibration.figures[n].value for n in FIGURES}, name=calibration.name,
                   description=calibration.description, provenance=dict(calibration.figures))

    @classmethod
    def named(cls, spec: str) -> "CostModel":
        """``paper-a100``, or the path of a costs.json (or of a trace folder holding one)."""
        if spec == PAPER_A100:
            return cls.paper_a100()
        if not Path(spec).exists():
            raise SimError(f"--costs {spec!r}: neither a named cost model ({', '.join(COST_MODELS)}) "
                           "nor a costs.json file or trace folder")
        try:
            return cls.from_calibration(read_calibration(spec))
        except CalibrationError as exc:
            raise SimError(str(exc)) from None

    def with_overrides(self, **changes: Any) -> "CostModel":
        """A copy with ``changes`` applied; each changed figure is marked ``given``."""
        unknown = sorted(set(changes) - set(FIGURES))
        if unknown:
            raise SimError(f"unknown cost figures {unknown}; known: {list(FIGURES)}")
        prov = {n: r for n, r in self.provenance.items() if n not in changes}
        try:
            return dataclasses.replace(self, **changes, provenance=prov)
        except SimError as exc:
            raise SimError(str(exc).replace("CostModel.", "--").replace("_", "-")) from None

    # -- the mechanisms ------------------------------------------------------------
    def save_s(self, nbytes: float) -> float:
        """A synchronous full save (deepspeed): training waits for all of it."""
        return nbytes / (self.save_gbps * GB)

    def snapshot_s(self, nbytes: float) -> float:
        """The blocking first phase of a two-phase save (checkfreq)."""
        return nbytes / (self.snapshot_gbps * GB)

    def persist_s(self, nbytes: float) -> float:
        """The background second phase: host memory to storage."""
        return nbytes / (self.persist_gbps * GB)

    def host_copy_s(self, nbytes: float) -> float:
        return nbytes / (self.host_copy_gbps * GB)

    def diff_bytes(self, full_bytes: float) -> float:
        """A step's compressed differential (lowdiff), for a model state of ``full_bytes``."""
        return self.diff_fraction * full_bytes

    def diff_snapshot_s(self, nbytes: float) -> float:
        """A step's differential on the training side (lowdiff): compressing ``nbytes``
        of it and handing them to the writer process."""
        return nbytes / (self.diff_snapshot_gbps * GB)

    def diff_replay_s(self, nbytes: float) -> float:
        """Replaying ``nbytes`` of differentials onto a loaded full checkpoint (lowdiff)."""
        return nbytes / (self.diff_replay_gbps * GB)

    def peer_s(self, nbytes: float) -> float:
        return nbytes / (self.peer_gbps * GB)

    def load_s(self, nbytes: float) -> float:
        """Loading a full checkpoint saved synchronously (without the restart)."""
        return self.load_fixed_s + nbytes / (self.load_gbps * GB)

    def async_load_s(self, nbytes: float) -> float:
        return self.load_fixed_s + nbytes / (self.async_load_gbps * GB)

    def peer_load_s(self, nbytes: float) -> float:
        """Recovering GEMINI's copy from a peer's memory. The peer's DRAM is reached over
        the same fabric as the storage servers and no training traffic competes during
        recovery, so it is never slower than loading the same bytes from storage."""
        return self.load_fixed_s + nbytes / (max(self.peer_gbps, self.load_gbps) * GB)

    def lc_load_s(self, nbytes: float) -> float:
        """A LayerCheck composite restore (plan, read, verify, apply)."""
        return self.lc_load_fixed_s + nbytes / (self.lc_load_gbps * GB)

    def tier_load_s(self, nbytes: float) -> float:
        """A restore from a memory tier (tiered): every committed slot read and verified,
        the chosen copy checked and copied in, its fixed part folded into the rate (as
        calibrate and the validation's probe time it whole)."""
        return nbytes / (self.tier_restore_gbps * GB)

    # -- reporting ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the name and every figure with its value, unit and provenance."""
        return {"name": self.name, "description": self.description,
                "figures": {n: {**self.provenance[n].to_dict(), "value": getattr(self, n),
                                "unit": FIGURES[n].unit} for n in FIGURES}}

    def band(self, name: str) -> Band | None:
        """The band ``name`` is varied across (``declared_band`` of its record)."""
        return declared_band(name, self.provenance[name])

    def sources(self) -> dict[str, int]:
        """How many figures come from each kind of source (for a report's header)."""
        out: dict[str, int] = {}
        for name in FIGURES:
            src = self.provenance[name].source
            out[src] = out.get(src, 0) + 1
        return out



    # -- the mapping ----------------------------------------------------------------
    def __getitem__(self, name: str) -> float:
        if name not in FIGURES:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self):
        return iter(FIGURES)

    def __len__(self) -> int:
        return len(FIGURES)


CostModel = dataclasses.make_dataclass(
    "CostModel",
    [(name, "int" if spec.whole else "float", field(default=spec.default.value))
     for name, spec in FIGURES.items()]
    + [("name", "str", field(default=PAPER_A100)),
       ("description", "str", field(
           default="the paper's server: 1 node, 8x A100 40 GB, Lustre, DeepSpeed ZeRO-3")),
       ("provenance", "Mapping[str, Figure]", field(default_factory=_paper_figures))],
    bases=(_CostModel,), frozen=True, kw_only=True)
CostModel.__module__ = __name__
CostModel.__doc__ = """Seconds and bandwidths of every mechanism: a validated, immutable mapping
from each figure of ``sim.calibrated.FIGURES`` to its value, each also an attribute
(``costs.save_gbps``; meanings: the figure's declaration). Defaults are the declared
defaults, the paper's server; ``provenance`` says where each value came from (a value that
differs from its record is marked given)."""


def declared_band(name: str, record: Figure) -> Band | None:
    """The band of ``record`` (``calibrated.band_of``), where a paper-a100 figure
    read back from a preset's costs.json (its value, source and method the paper's, the band
    not written there) has the paper's band."""
    spec = FIGURES.get(name)
    paper = None if spec is None else spec.default
    if record.band is None and paper is not None and paper.band is not None and \
            (record.value, record.source, record.method) == (paper.value, paper.source, paper.method):
        return paper.band
    return band_of(name, record)
