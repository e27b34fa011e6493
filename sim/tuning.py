"""The recommendation: from budgets to the LayerCheck setting with the best effective ratio.

    budgets = Budgets(max_bytes=500e9, max_staleness=100, max_write_share=0.05)
    advice = recommend(trace, scenario, budgets, mtbf_s=1800, seeds=10)
    print(advice.text()); advice.config                # a LayerCheckConfig to paste

Every setting of the grid (``sim.frontier.Grid``) is replayed exactly on the
trace's drift; those within the budgets that are on the bytes-staleness front
(for each checkpoint interval: a setting off it writes more and is staler
than one on it, so it cannot lose less to the simulator) are simulated on the
same failures, with the paper's default and the trace's recorded setting
beside them; the highest effective ratio wins. Budgets that no setting meets
are a ``SimError`` that names the budget that binds.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from layercheck.config import LayerCheckConfig
from layercheck.contract.decision import paper_default, recorded_config
from layercheck.contract.trace import Trace

from .api import Scenario
from .errors import SimError
from .frontier import (SETTING_COLUMNS, Evaluation, Grid, config_line, describe, evaluate,
                       pareto, rate, write_bandwidth)
from .units import format_duration

__all__ = ["Budgets", "Recommendation", "recommend", "candidates", "evaluate_with_references"]

ROLES = ("grid", "paper default", "recorded")
"""``role`` column: a grid point, the paper's default, the setting the trace was recorded with."""


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """What a setting may cost. None: no limit."""

    max_bytes: float | None = None
    """Bytes written over the run, base checkpoint included (``--max-gb`` x 1e9)."""
    max_staleness: int | None = None
    """No layer's newest copy older than this many steps (the largest staleness)."""
    max_write_share: float | None = None
    """Share of the storage's write bandwidth the writes may take over the job's compute time."""

    def __post_init__(self) -> None:
        for name, flag, what, unit in (("max_bytes", "--max-gb", "GB", 1e9),
                                       ("max_staleness", "--max-staleness", "steps", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                shown = value / unit if isinstance(value, (int, float)) else value
                raise SimError(f"{flag} must be a positive number of {what}, got {shown!r}")
        share = self.max_write_share
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0 < share <= 1):
            raise SimError(f"--max-write-share must be a fraction in (0, 1], e.g. 0.05 for 5%, "
                           f"got {share!r}")

    def limits(self) -> dict[str, tuple[str, str, float]]:
        """Given budgets: table column -> (flag, unit, limit in the column's unit)."""
        out = {}
        if self.max_bytes is not None:
            out["bytes_written"] = ("--max-gb", "GB", float(self.max_bytes))
        if self.max_staleness is not None:
            out["max_staleness"] = ("--max-staleness", "steps", float(self.max_staleness))
        if self.max_write_share is not None:
            out["write_share"] = ("--max-write-share", "", float(self.max_write_share))
        return out

    def within(self, table: pd.DataFrame) -> np.ndarray:
        """True for the rows that meet every budget."""
        ok = np.ones(len(table), dtype=bool)
        for column, (_, _, limit) in self.limits().items():
            ok &= table[column].to_numpy() <= limit
        return ok

    def to_dict(self) -> dict[str, Any]:
        return {"max_gb": None if self.max_bytes is None else self.max_bytes / 1e9,
                "max_staleness": self.max_staleness, "max_write_share": self.max_write_share}


def evaluate_with_references(trace: Trace, grid: Grid | None = None, *,
                             bandwidth: float | None = None) -> Evaluation:
    """``sim.frontier.evaluate`` of the grid plus the paper's default and the trace's
    recorded setting (column ``role``)."""
    grid = grid or Grid.for_trace(trace)
    configs = [*grid.configs(), paper_default(trace.num_steps), recorded_config(trace)]
    result = evaluate(trace, configs, bandwidth=bandwidth)
    result.table["role"] = [ROLES[0]] * grid.size + [ROLES[1], ROLES[2]]
    return result


def candidates(table: pd.DataFrame, budgets: Budgets) -> np.ndarray:
    """Rows worth simulating: within the budgets and, for each interval, on the front
    of bytes against mean weighted staleness."""
    ok = budgets.within(table) & (table["role"] == ROLES[0]).to_numpy()
    keep = np.zeros(len(table), dtype=bool)
    for interval in np.unique(table["interval"]):
        rows = np.flatnonzero(ok & (table["interval"].to_numpy() == interval))
        if rows.size:
            front = pareto(table["bytes_written"].to_numpy()[rows],
                           table["mean_weighted_staleness"].to_numpy()[rows])
            keep[rows[front]] = True
    return np.flatnonzero(keep)


@dataclass(frozen=True)
class Recommendation:
    """The best setting under the budgets, with what it is compared against."""

    trace: str
    config: LayerCheckConfig
    best: dict[str, Any]
    paper: dict[str, Any]
    recorded: dict[str, Any]
    budgets: Budgets
    mtbf_s: float
    seeds: int
    costs: str
    bandwidth: tuple[float, str]
    grid_size: int
    within: int
    simulated: int
    budget_mode: LayerCheckConfig | None
    """The same setting in budget mode (``write_budget``) where a byte or share budget
    was given: it holds the budget on a run whose drift differs from this trace's."""

    @property
    def line(self) -> str:
        return config_line(self.config)

    def binding(self) -> list[str]:
        """Budgets the recommendation uses at least 90% of."""
        out = []
        for column, (flag, _, limit) in self.budgets.limits().items():
            if self.best[column] >= 0.9 * limit:
                out.append(flag)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"trace": self.trace, "mtbf_s": self.mtbf_s, "seeds": self.seeds,
                "costs": self.costs, "budgets": self.budgets.to_dict(),
                "write_bandwidth": {"bytes_per_s": self.bandwidth[0], "source": self.bandwidth[1]},
                "grid_size": self.grid_size, "within_budgets": self.within,
                "simulated": self.simulated, "recommended": self.best, "paper_default": self.paper,
                "recorded": self.recorded, "binding": self.binding(),
                "config": self.config.to_dict(), "config_line": self.line,
                "budget_mode": None if self.budget_mode is None else {
                    "config": self.budget_mode.to_dict(), "config_line": config_line(self.budget_mode)}}

    def text(self) -> str:
        head = (f"{'':<16} {'ratio':>7} {'+-95%':>7} {'written':>10} {'max stale':>10} "
                f"{'mean stale':>11} {'write share':>12}")
        rows = [head, "-" * len(head)]
        for label, row in (("recommended", self.best), ("paper default", self.paper),
                           ("recorded", self.recorded)):
            band = "n/a" if row["ci95"] is None else f"{row['ci95']:.4f}"  # one seed: no band
            rows.append(f"{label:<16} {row['effective_ratio']:>7.4f} {band:>7} "
                        f"{_gb(row['bytes_written']):>10} {row['max_staleness']:>10} "
                        f"{row['mean_weighted_staleness']:>11.1f} {row['write_share']:>12.2%}")
        gain = self.best["effective_ratio"] - self.paper["effective_ratio"]
        budgets = ", ".join(f"{flag} {_limit(flag, limit)}" for flag, _, limit
                            in self.budgets.limits().values()) or "none"
        binding = self.binding()
        why = (f"Why: the highest effective ratio of the {self.simulated} settings simulated (the "
               f"bytes/staleness front of the {self.within} of {self.grid_size} grid settings "
               f"within the budgets), {gain:+.4f} against the paper's default, which writes "
               f"{_gb(self.paper['bytes_written'])} and is {self.paper['mean_weighted_staleness']:.0f} "
               f"steps stale on average.")
        lines = [f"{self.trace}: MTBF {format_duration(self.mtbf_s)}, {self.seeds} seeds, costs "
                 f"{self.costs}; write bandwidth {self.bandwidth[0] / 1e9:.3g} GB/s "
                 f"({self.bandwidth[1]})",
                 f"budgets: {budgets}" + (f" (binding: {', '.join(binding)})" if binding else ""),
                 "", *rows, "", why, "", "Paste:", f"    {self.line}"]
        if self.budget_mode is not None:
            lines += ["Or hold the budget online on a run that drifts differently (budget mode):",
                      f"    {config_line(self.budget_mode)}"]
        return "\n".join(lines)


def recommend(trace: Trace, scenario: Scenario, budgets: Budgets, *, mtbf_s: float,
              seeds: int = 10, window_s: float | None = None, grid: Grid | None = None,
              result: Evaluation | None = None) -> Recommendation:
    """The setting with the best effective ratio at ``mtbf_s`` within ``budgets``
    (module doc). ``result``: an ``evaluate_with_references`` of this trace to reuse."""
    bandwidth = write_bandwidth(trace, scenario)
    result = result or evaluate_with_references(trace, grid, bandwidth=bandwidth[0])
    table = result.table
    rows = candidates(table, budgets)
    if not rows.size:
        raise SimError(_infeasible(table[table["role"] == ROLES[0]], budgets))
    refs = [int(np.flatnonzero(table["role"] == role)[0]) for role in ROLES[1:]]
    rated = rate(result, scenario, rows=[*rows, *refs], mtbf_s=mtbf_s, seeds=seeds,
                 window_s=window_s)
    best = int(rated.loc[rows, "effective_ratio"].idxmax())
    config = result.configs[best]
    return Recommendation(
        trace=trace.name, config=config, best=_row(rated, result, best),
        paper=_row(rated, result, refs[0]), recorded=_row(rated, result, refs[1]),
        budgets=budgets, mtbf_s=mtbf_s, seeds=seeds, costs=scenario.costs.name,
        bandwidth=bandwidth, grid_size=int((table["role"] == ROLES[0]).sum()),
        within=int((budgets.within(table) & (table["role"] == ROLES[0]).to_numpy()).sum()),
        simulated=len(rows), budget_mode=_budget_mode(trace, config, budgets, bandwidth[0]))


def _row(table: pd.DataFrame, result: Evaluation, row: int) -> dict[str, Any]:
    """A row's numbers, with its index in the evaluation (``row``)."""
    out = describe(table.loc[row])
    out.update(describe(result.detail([row]).loc[row]))
    out["row"] = row
    return out


def _budget_mode(trace: Trace, config: LayerCheckConfig, budgets: Budgets,
                 bandwidth: float) -> LayerCheckConfig | None:
    """``config`` with ``write_budget``: the byte and share budgets as bytes per step
    after the base checkpoint (the base itself, one full write, is not counted)."""
    base = config.interval * max(1, -(-config.warmup_steps // config.interval))
    after = trace.num_steps - base
    per_step = []
    if budgets.max_bytes is not None and after > 0:
        per_step.append((budgets.max_bytes - trace.full_checkpoint_bytes) / after)
    if budgets.max_write_share is not None:
        per_step.append(budgets.max_write_share * bandwidth * float(trace.compute_seconds().mean()))
    if not per_step or min(per_step) <= 0:
        return None
    return dataclasses.replace(config, write_budget=float(f"{min(per_step):.4g}"))


def _infeasible(table: pd.DataFrame, budgets: Budgets) -> str:
    """One line naming the budget (or pair of budgets) no grid setting meets."""
    limits = budgets.limits()
    for column, (flag, unit, limit) in limits.items():
        if not (table[column] <= limit).any():
            least = table.loc[table[column].idxmin()]
            return (f"{flag} {_limit(flag, limit)} binds: no setting meets it; the least any of "
                    f"the {len(table)} settings gives is {_value(column, least[column])} "
                    f"({_setting(least)}): raise {flag}")
    columns = list(limits)
    for i, a in enumerate(columns):
        for b in columns[i + 1:]:
            inside = table[table[a] <= limits[a][2]]
            if not (inside[b] <= limits[b][2]).any():
                least = inside.loc[inside[b].idxmin()]
                flag_a, flag_b = limits[a][0], limits[b][0]
                within = f"{flag_a} {_limit(flag_a, limits[a][2])}"
                return (f"{within} and {flag_b} {_limit(flag_b, limits[b][2])} cannot both hold: "
                        f"within {within} the least {_name(b)} is {_value(b, least[b])} "
                        f"({_setting(least)}); relax one")
    return ("the three budgets cannot all hold, though any two can: relax "
            + ", ".join(flag for flag, _, _ in limits.values()))


def _setting(row: Any) -> str:
    return ", ".join(f"{c} {row[c]:g}" for c in SETTING_COLUMNS[:4])


def _name(column: str) -> str:
    return {"bytes_written": "bytes written", "max_staleness": "largest staleness",
            "write_share": "write share"}[column]


def _value(column: str, value: float) -> str:
    if column == "bytes_written":
        return _gb(value)
    if column == "write_share":
        return f"{value:.2%}"
    return f"{int(value)} steps"


def _limit(flag: str, limit: float) -> str:
    return f"{limit / 1e9:g}" if flag == "--max-gb" else f"{limit:g}"


def _gb(nbytes: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if nbytes >= size:
            return f"{nbytes / size:.{2 if unit == 'TB' else 1}f} {unit}"
    return f"{nbytes / 1e3:.1f} kB"
