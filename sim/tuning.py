"""The recommendation: from budgets to the LayerCheck setting with the best effective ratio.

    budgets = Budgets(max_bytes=500e9, max_staleness=100, max_write_share=0.05)
    advice = recommend(trace, scenario, budgets, mtbf_s=1800, seeds=10)
    print(advice.text()); advice.config                # a LayerCheckConfig to paste

Every setting of the grid (default: the fair comparison's search grid,
``sim.settings.layercheck_grid``) is replayed exactly on the trace's drift; those
within the budgets that are on the bytes-staleness front of their interval and
Smax (``sim.frontier.fronts``: a setting off it writes more and is staler than
one on it, so it cannot lose less to the simulator) are simulated on the same
failures, with the paper's default and the trace's recorded setting beside
them; the highest effective ratio wins, and the best baseline within the same
budgets is found beside it (``best_baseline``). Budgets that no setting meets
are a ``SimError`` that names the budget that binds.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd

from layercheck.contract.config import LayerCheckConfig
from layercheck.contract.decision import paper_default, recorded_config
from layercheck.contract.trace import Trace

from .api import Scenario
from .budgets import Budgets
from .engine import compiled_kernel
from .errors import SimError
from .frontier import (SETTING_COLUMNS, Evaluation, Grid, config_line, describe, evaluate,
                       fronts, rate, write_bandwidth)
from .report import leader_line
from .settings import layercheck_grid
from .units import format_duration

__all__ = ["Budgets", "Recommendation", "recommend", "candidates", "evaluate_with_references",
           "best_baseline"]

ROLES = ("grid", "paper default", "recorded")
"""``role`` column: a grid point, the paper's default, the setting the trace was recorded with."""


def evaluate_with_references(trace: Trace, grid: Grid | None = None, *,
                             bandwidth: float | None = None) -> Evaluation:
    """``sim.frontier.evaluate`` of the grid (default: the search grid of the fair
    comparison, ``sim.settings.layercheck_grid``) plus the paper's default and the trace's
    recorded setting (column ``role``)."""
    grid = grid or layercheck_grid(trace)[0]
    configs = [*grid.configs(), paper_default(trace.num_steps), recorded_config(trace)]
    result = evaluate(trace, configs, bandwidth=bandwidth)
    result.table["role"] = [ROLES[0]] * grid.size + [ROLES[1], ROLES[2]]
    return result


def candidates(table: pd.DataFrame, budgets: Budgets) -> np.ndarray:
    """Rows worth simulating: grid settings within the budgets on the front of bytes
    against mean weighted staleness of their interval and Smax (``sim.frontier.fronts``)."""
    return fronts(table, budgets.within(table) & (table["role"] == ROLES[0]).to_numpy())


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
    baseline: dict[str, Any] | None = None
    """The best baseline within the same budgets, on the same failures (``sim.fair``):
    strategy, setting, effective_ratio, ci95; None where none was compared."""

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
                    "config": self.budget_mode.to_dict(), "config_line": config_line(self.budget_mode)},
                "best_baseline": self.baseline,
                "against_best_baseline": None if self.baseline is None else
                self.best["effective_ratio"] - self.baseline["effective_ratio"]}

    def _against(self) -> list[str]:
        """Where the recommendation stands against the best baseline (fair protocol)."""
        b = self.baseline
        if b is None:
            return []
        gap = self.best["effective_ratio"] - b["effective_ratio"]
        where = "ahead of" if gap > 0 else "behind"
        return ["", f"Against the best baseline within the same budgets, on the same failures (every "
                f"baseline at its own best setting, python -m sim's fair protocol): {b['strategy']} "
                f"at {b['setting']}, {b['effective_ratio']:.4f} +- {b['ci95']:.4f}; the recommended "
                f"setting is {abs(gap):.4f} {where} it."]

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
        verdict = leader_line({label: row["effective_ratio"] for label, row in
                               (("recommended", self.best), ("paper default", self.paper),
                                ("recorded", self.recorded))})
        rows.append(verdict)
        gain = self.best["effective_ratio"] - self.paper["effective_ratio"]
        budgets = ", ".join(f"{flag} {_limit(flag, limit)}" for flag, _, limit
                            in self.budgets.limits().values()) or "none"
        binding = self.binding()
        why = (f"Why: the highest effective ratio of the {self.simulated} settings simulated (the "
               f"bytes/staleness fronts, each interval and Smax, of the {self.within} of "
               f"{self.grid_size} grid settings "
               f"within the budgets), {gain:+.4f} against the paper's default, which writes "
               f"{_gb(self.paper['bytes_written'])} and is {self.paper['mean_weighted_staleness']:.0f} "
               f"steps stale on average.")
        lines = [f"{self.trace}: MTBF {format_duration(self.mtbf_s)}, {self.seeds} seeds, costs "
                 f"{self.costs}; write bandwidth {self.bandwidth[0] / 1e9:.3g} GB/s "
                 f"({self.bandwidth[1]})",
                 f"budgets: {budgets}" + (f" (binding: {', '.join(binding)})" if binding else ""),
                 "", *rows, "", why, *self._against(), "", "Paste:", f"    {self.line}"]
        if self.budget_mode is not None:
            lines += ["Or hold the budget online on a run that drifts differently (budget mode):",
                      f"    {config_line(self.budget_mode)}"]
        return "\n".join(lines)


def recommend(trace: Trace, scenario: Scenario, budgets: Budgets, *, mtbf_s: float,
              seeds: int = 10, window_s: float | None = None, grid: Grid | None = None,
              result: Evaluation | None = None, baselines: bool = True,
              progress: Callable[[str, int, int], None] | None = None) -> Recommendation:
    """The setting with the best effective ratio at ``mtbf_s`` within ``budgets``
    (module doc). ``result``: an ``evaluate_with_references`` of this trace to reuse;
    ``baselines``: also find the best baseline within the same budgets (``best_baseline``);
    ``progress(stage, done, total)``: called as each stage begins, and at the end."""
    stages = 3 if baselines else 2
    tell = progress or (lambda stage, done, total: None)
    tell("replaying the grid's settings on the trace's drift", 0, stages)
    compiled_kernel(load=True)      # many settings: the compiled walks and loop pay for their import
    bandwidth = write_bandwidth(trace, scenario)
    result = result or evaluate_with_references(trace, grid, bandwidth=bandwidth[0])
    table = result.table
    rows = candidates(table, budgets)
    if not rows.size:
        raise SimError(_infeasible(table[table["role"] == ROLES[0]], budgets))
    refs = [int(np.flatnonzero(table["role"] == role)[0]) for role in ROLES[1:]]
    tell(f"simulating {len(rows) + len(refs)} settings", 1, stages)
    rated = rate(result, scenario, rows=[*rows, *refs], mtbf_s=mtbf_s, seeds=seeds,
                 window_s=window_s)
    if baselines:
        tell("the best baseline within the same budgets", 2, stages)
    baseline = best_baseline(scenario, budgets, mtbf_s=mtbf_s, seeds=seeds,
                             window_s=window_s) if baselines else None
    tell("done", stages, stages)
    best = int(rated.loc[rows, "effective_ratio"].idxmax())
    config = result.configs[best]
    return Recommendation(
        trace=trace.name, config=config, best=_row(rated, result, best),
        paper=_row(rated, result, refs[0]), recorded=_row(rated, result, refs[1]),
        budgets=budgets, mtbf_s=mtbf_s, seeds=seeds, costs=scenario.costs.name,
        bandwidth=bandwidth, grid_size=int((table["role"] == ROLES[0]).sum()),
        within=int((budgets.within(table) & (table["role"] == ROLES[0]).to_numpy()).sum()),
        simulated=len(rows), budget_mode=_budget_mode(trace, config, budgets, bandwidth[0]),
        baseline=baseline)


def best_baseline(scenario: Scenario, budgets: Budgets, *, mtbf_s: float, seeds: int = 10,
                  window_s: float | None = None) -> dict[str, Any] | None:
    """The compared baseline with the best effective ratio, each at its own best setting
    within ``budgets`` (LayerCheck's staleness budget aside), on ``scenario``'s failures:
    strategy, setting, effective_ratio, ci95; None where none meets the budgets."""
    from .fair import LAYERCHECK, compare
    names = [n for n in scenario.strategy_names() if n not in LAYERCHECK and n != "none"]
    if not names:
        return None
    result = compare(dataclasses.replace(scenario, interval=None), mtbf_s=mtbf_s,
                     budgets=dataclasses.replace(budgets, max_staleness=None), strategies=names,
                     seeds=seeds, window_s=window_s)
    table = result.table().dropna(subset=["effective_ratio"])
    if table.empty:
        return None
    row = table.loc[table["effective_ratio"].idxmax()]
    return {"strategy": str(row["strategy"]), "setting": str(row["setting"]),
            "effective_ratio": float(row["effective_ratio"]), "ci95": float(row["ci95"])}


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
            "write_share": "write share", "host_bytes": "host memory"}[column]


def _value(column: str, value: float) -> str:
    if column in ("bytes_written", "host_bytes"):
        return _gb(value)
    if column == "write_share":
        return f"{value:.2%}"
    return f"{int(value)} steps"


def _limit(flag: str, limit: float) -> str:
    return f"{limit / 1e9:g}" if flag in ("--max-gb", "--max-host-gb") else f"{limit:g}"


def _gb(nbytes: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if nbytes >= size:
            return f"{nbytes / size:.{2 if unit == 'TB' else 1}f} {unit}"
    return f"{nbytes / 1e3:.1f} kB"
