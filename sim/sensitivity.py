"""What the ranking hangs on: every figure nobody measured here, varied across its band.

``sensitivity(scenario, mtbf_s=...)`` runs the scenario once at the cost model's
point values and then, one figure at a time, at the low and at the high end of
each figure's band (``CostModel.band``: the band declared with the figure, else
its ``FigureSpec`` rule; ``layercheck.contract.calibration.band_of``). A figure measured
on this machine has no band and is not varied. Every run faces the same
failures (common random numbers), so a difference between two runs is the
figure's, not the draw's.

The result gives each strategy's effective-ratio range per figure (a tornado:
``Sensitivity.frame``) and names the figures whose band can change which
strategy ranks first, and to which (``Sensitivity.flips``).

The default run is smaller than ``python -m sim``'s (``SEEDS`` seeds over a
``WINDOW_S`` window) because it is 1 + 2 x figures runs; the work bound
(``sim.workbound``) is checked for all of them together before the first.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pandas as pd

from .calibrated import FIGURES

from .api import Scenario, simulate
from .errors import SimError
from .report import leader_line
from .tables import WIDTH, Column, render
from .workbound import bound_work

__all__ = ["SEEDS", "WINDOW_S", "Sensitivity", "sensitivity", "banded", "at_value"]

SEEDS = 5
WINDOW_S = 14 * 86400.0
"""The default run: 5 seeds over 14 days per point (python -m sim's are 10 over 30 days):
about 40 points on a preset in well under 30 s on one core."""


@dataclass(frozen=True, kw_only=True)
class Sensitivity:
    """The point run and each figure's two ends (contract in the module doc)."""

    scenario: str
    mtbf_s: float | None
    seeds: int
    window_s: float
    protocol: str
    point: dict[str, float]
    """Effective ratio per strategy at the cost model's own values."""
    rows: tuple[dict[str, Any], ...]
    """One per varied figure: figure, source, unit, value, low, high, reason, and per end
    (low, high) the ratio of every strategy (``ratios_low``, ``ratios_high``) and the
    strategy ranked first there (``leader_low``, ``leader_high``)."""
    unvaried: tuple[dict[str, str], ...]
    """Figures not varied, each with why (measured here, or a band of no width)."""

    @property
    def leader(self) -> str:
        return _leader(self.point)

    def frame(self) -> pd.DataFrame:
        """Long form for a tornado: one row per (figure, strategy), with the point ratio, the
        ratio at each end of the band, and ``swing`` = the range's width; figures ordered by
        their widest swing over all strategies, widest first."""
        out = []
        for row in self.rows:
            for name, point in self.point.items():
                low, high = row["ratios_low"][name], row["ratios_high"][name]
                out.append({"figure": row["figure"], "strategy": name, "point": point,
                            "at_low": low, "at_high": high, "min": min(low, high, point),
                            "max": max(low, high, point), "swing": abs(high - low),
                            "band": f"{_g(row['low'])} .. {_g(row['high'])} {_unit(row['unit'])}".strip()})
        df = pd.DataFrame(out, columns=["figure", "strategy", "point", "at_low", "at_high", "min",
                                        "max", "swing", "band"])
        if df.empty:
            return df
        order = df.groupby("figure")["swing"].max().sort_values(ascending=False).index.tolist()
        df["figure"] = pd.Categorical(df["figure"], categories=order, ordered=True)
        return df.sort_values(["figure", "strategy"]).reset_index(drop=True).astype({"figure": str})

    def flips(self) -> list[dict[str, Any]]:
        """Each (figure, end) at which another strategy ranks first: figure, end ('low' or
        'high'), the figure's value there, and ``leader`` (who ranks first then)."""
        out = []
        for row in self.rows:
            for end in ("low", "high"):
                if row[f"leader_{end}"] != self.leader:
                    out.append({"figure": row["figure"], "end": end, "value": row[end],
                                "leader": row[f"leader_{end}"],
                                "ratio": row[f"ratios_{end}"][row[f"leader_{end}"]]})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "mtbf_s": self.mtbf_s, "seeds": self.seeds,
                "window_s": self.window_s, "protocol": self.protocol, "leader": self.leader,
                "point": self.point, "figures": list(self.rows), "unvaried": list(self.unvaried),
                "flips": self.flips()}

    def text(self, *, width: int | None = WIDTH) -> str:
        """The report ``python -m sim sensitivity`` prints: the table in blocks of ``width``
        columns (``sim.tables``; None: one line a figure), the verdict under it."""
        lines = [f"{self.scenario}: each figure not measured here varied across its band, one at "
                 f"a time ({self.seeds} seeds x {self.window_s / 86400:g} days a point, the same "
                 f"failures in every run; protocol {self.protocol})",
                 f"ranked first at the cost model's values: {self.leader} "
                 f"({self.point[self.leader]:.3f})", ""]
        df = self.frame()
        names = list(self.point)
        rows = []
        for figure, group in df.groupby("figure", sort=False):
            cells = {r.strategy: f"{r.min:.3f}-{r.max:.3f}" for r in group.itertuples()}
            rows.append([figure, group["band"].iloc[0], *(cells[n] for n in names)])
        lines.append(render([Column("figure", 22, left=True), Column("band", 24, left=True),
                             *(Column(n, 11) for n in names)], rows, keep=1, width=width))
        lines.append(leader_line(self.point, what="the highest ratio at the cost model's values",
                                 fmt=lambda v: f"{v:.3f}", gap=lambda v: f"{v:+.3f} ahead of"))
        flips = self.flips()
        lines.append("")
        if flips:
            for f in flips:
                lines.append(f"{f['figure']} at its {f['end']} end ({_g(f['value'])}) puts "
                             f"{f['leader']} first ({f['ratio']:.3f}) instead of {self.leader}")
        else:
            lines.append(f"no figure's band changes which strategy ranks first ({self.leader})")
        if self.unvaried:
            lines.append("not varied: " + "; ".join(f"{u['figure']} ({u['why']})"
                                                    for u in self.unvaried))
        return "\n".join(lines)


def sensitivity(scenario: Scenario, *, mtbf_s: float | None, strategies: Sequence[str] | None = None,
                seeds: int = SEEDS, window_s: float = WINDOW_S,
                figures: Sequence[str] | None = None,
                progress: Callable[[int, int], None] | None = None) -> Sensitivity:
    """The point run, then every banded figure (or those of ``figures``) at each end of its
    band, on the same failures; refused (``SimError``) before any run if the whole passes
    the simulator's work bound. ``progress(done, total)`` is called as each run ends."""
    names = scenario.strategy_names(strategies)
    chosen = list(FIGURES) if figures is None else list(figures)
    unknown = [f for f in chosen if f not in FIGURES]
    if unknown:
        raise SimError(f"unknown cost figures {unknown}; known: {', '.join(FIGURES)}")
    costs = scenario.costs
    varied, unvaried = banded(scenario, chosen)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise SimError(f"seeds={seeds!r} must be a positive integer")
    if not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and window_s > 0):
        raise SimError(f"window_s={window_s!r} must be a positive number of seconds")
    bound_work(scenario.failures, [mtbf_s] * (1 + 2 * len(varied)), seeds=seeds,
               window_s=float(window_s), strategies=len(names), engine="fast",
               mean_step_s=float(scenario.workload.compute_s.mean()))

    runs = iter(range(1, 2 + 2 * len(varied)))
    if progress is not None:
        progress(0, 1 + 2 * len(varied))

    def ratios(s: Scenario) -> dict[str, float]:
        df = simulate(s, mtbf_s=mtbf_s, strategies=names, seeds=seeds, window_s=window_s)
        if progress is not None:
            progress(next(runs), 1 + 2 * len(varied))
        return dict(zip(df["strategy"], df["effective_ratio"].astype(float)))

    rows = []
    for name, record, band in varied:
        row: dict[str, Any] = {"figure": name, "source": record.source, "unit": FIGURES[name].unit,
                               "value": float(getattr(costs, name)), "low": band.low,
                               "high": band.high, "reason": band.reason}
        for end in ("low", "high"):
            row[f"ratios_{end}"] = ratios(at_value(scenario, name, row[end]))
            row[f"leader_{end}"] = _leader(row[f"ratios_{end}"])
        rows.append(row)
    return Sensitivity(scenario=scenario.name, mtbf_s=mtbf_s, seeds=seeds, window_s=float(window_s),
                       protocol=scenario.protocol, point=ratios(scenario), rows=tuple(rows),
                       unvaried=tuple(unvaried))


def banded(scenario: Scenario, names: Sequence[str]) -> tuple[list[tuple[str, Any, Any]],
                                                             list[dict[str, str]]]:
    """Of the cost figures ``names``, those varied (name, provenance record, band) and those
    not, each with why: measured here, no band, a band of no width, or a phi given for the
    run. The sensitivity's and the verdict's one rule."""
    costs = scenario.costs
    varied, unvaried = [], []
    for name in names:
        record, band = costs.provenance[name], costs.band(name)
        if name == "stale_cost" and scenario.stale_figure().source == "given":
            unvaried.append({"figure": name, "why": "given for this run (--stale-cost)"})
        elif band is None:
            why = "measured here" if record.source == "measured" else "no band declared"
            unvaried.append({"figure": name, "why": why})
        elif band.high <= band.low:
            unvaried.append({"figure": name, "why": f"band of no width ({_g(band.low)})"})
        else:
            varied.append((name, record, band))
    return varied, unvaried


def at_value(scenario: Scenario, name: str, value: float) -> Scenario:
    """``scenario`` with one figure set to ``value`` (a batch rounded to whole steps; phi's
    end given to the scenario too, so the accounting follows it)."""
    if FIGURES[name].unit == "steps":
        value = max(1, round(value))
    costs = scenario.costs.with_overrides(**{name: value})
    extra = {"stale_cost": value, "stale_as_useful": False} if name == "stale_cost" else {}
    return dataclasses.replace(scenario, costs=costs, **extra)


def _leader(ratios: dict[str, float]) -> str:
    return max(ratios, key=lambda n: ratios[n])


def _g(value: float) -> str:
    return f"{value:.3g}"


def _unit(unit: str) -> str:
    return "" if unit == "1" else unit
