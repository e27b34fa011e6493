"""The simulator's Python API (what the CLI and the dashboard call). Torch-free.

    from sim import Scenario, simulate, sweep, sweep_figure
    scenario = Scenario.from_preset("qwen2.5-7b")
    table = simulate(scenario, mtbf_s=1800, seeds=10)
    curves = sweep(scenario, mtbf_s=np.geomspace(36, 10800, 20))
    sweep_figure(curves).write_html("mtbf.html")

Every strategy faces the same failure times (common random numbers): seed i of
a call draws its failures from ``SeedSequence([scenario.seed, i])``, scaled by
the MTBF, so results are reproducible and comparable across strategies and
MTBFs.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from layercheck.trace import Trace

from .costs import GB, CostModel
from .engine import LaneResults, run_lanes, run_limit
from .errors import SimError
from .failures import FailureModel
from .intervals import parse_interval, resolve_interval
from .strategies import STRATEGIES, get_strategy
from .theory import limit_ratio_exponential
from .timeline import Timeline
from .workload import Workload

__all__ = ["Scenario", "simulate", "sweep", "sweep_figure", "limit_ratio", "PRESETS",
           "COLUMNS", "LIMIT", "DAY"]

DAY = 86400.0
LIMIT = "limit"
"""The strategy name of the perfect checkpointer's rows in ``sweep``."""
COLUMNS = ("strategy", "effective_ratio", "ci95", "useful_s", "checkpoint_stall_s",
           "lost_work_s", "recovery_s", "failures", "bytes_written")
"""The result columns (and the keys of every JSON row), in order."""


def _presets() -> tuple[str, ...]:
    from .presets import PRESET_NAMES
    return PRESET_NAMES


PRESETS: tuple[str, ...] = _presets()


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Everything a run needs except the MTBF: the job, the costs, the failure
    distribution, the rollback interval rule, the window and the seed."""

    name: str
    workload: Workload
    costs: CostModel = field(default_factory=CostModel)
    failures: FailureModel = field(default_factory=FailureModel)
    interval: str | int = "matched"
    """Steps between rollback strategies' full checkpoints, or matched/young/daly.
    'matched' needs a trace; without one it falls back to 'daly'."""
    window_s: float = 30 * DAY
    """Wall-clock time each run covers (jobs run back to back within it)."""
    seed: int = 0
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "interval", parse_interval(self.interval))
        if not (isinstance(self.window_s, (int, float)) and math.isfinite(self.window_s)
                and self.window_s > 0):
            raise SimError(f"window_s={self.window_s!r} must be a positive number of seconds")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise SimError(f"seed={self.seed!r} must be a non-negative integer")
        if self.interval == "matched" and not self.workload.has_trace:
            object.__setattr__(self, "interval", "daly")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "Scenario":
        """A preset by name (see ``PRESETS``), fields overridable."""
        from .presets import preset_scenario_fields
        return cls(**{**preset_scenario_fields(name), **overrides})

    @classmethod
    def from_trace(cls, trace: Trace, *, costs: CostModel | None = None, **overrides: Any) -> "Scenario":
        """A scenario on any valid trace: compute per step from its steps table,
        layer bytes from its manifest, LayerCheck's writes from its writes table."""
        workload = Workload.from_trace(trace)
        fields_ = {"name": trace.name, "workload": workload, "costs": costs or CostModel(),
                   "description": str(trace.manifest.get("description", ""))}
        return cls(**{**fields_, **overrides})

    @classmethod
    def custom(cls, *, iteration_s: float, iterations: int, checkpoint_gb: float = 106.6,
               checkpoint_s: float | None = None, costs: CostModel | None = None,
               **overrides: Any) -> "Scenario":
        """A what-if job without a trace: equal steps, a full checkpoint of
        ``checkpoint_gb``; ``checkpoint_s`` (the time to write it) sets the write
        bandwidth. LayerCheck needs a trace, so it is not available here."""
        if not (math.isfinite(checkpoint_gb) and checkpoint_gb > 0):
            raise SimError(f"checkpoint size {checkpoint_gb!r} GB must be positive")
        costs = costs or CostModel()
        if checkpoint_s is not None:
            costs = dataclasses.replace(costs, write_gbps=checkpoint_gb / checkpoint_s)
        workload = Workload.custom(iteration_s=iteration_s, iterations=iterations,
                                   full_bytes=int(round(checkpoint_gb * GB)))
        return cls(**{"name": "custom", "workload": workload, "costs": costs,
                      "interval": "daly", **overrides})

    def available(self) -> tuple[str, ...]:
        """Strategies this scenario can run (LayerCheck needs a trace)."""
        return tuple(n for n, c in STRATEGIES.items() if self.workload.has_trace or not c.needs_trace)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (what a report prints under "scenario")."""
        w = self.workload
        return {"name": self.name, "kind": w.kind, "description": self.description,
                "steps_per_job": w.steps, "mean_step_s": float(w.compute_s.mean()),
                "full_checkpoint_bytes": int(w.full_bytes), "staleness_steps": w.staleness,
                "interval": self.interval, "window_s": self.window_s, "seed": self.seed,
                "failures": {"kind": self.failures.kind, "shape": self.failures.shape},
                "costs": self.costs.to_dict()}


def simulate(scenario: Scenario, *, mtbf_s: float | None, strategies: Sequence[str] | None = None,
             seeds: int = 10, window_s: float | None = None,
             interval: str | int | None = None) -> pd.DataFrame:
    """One row per strategy (``COLUMNS`` plus ``interval``): the effective ratio (useful
    compute / wall clock) averaged over ``seeds`` runs with its 95% confidence
    half-width, and the mean seconds per run that went to each use. ``mtbf_s`` may
    be None only for a replayed failure log (played at its own rate)."""
    frame = _run(scenario, [mtbf_s], strategies, seeds, window_s, interval, with_limit=False)
    return frame.drop(columns="mtbf_s").reset_index(drop=True)


def sweep(scenario: Scenario, *, mtbf_s: Sequence[float], strategies: Sequence[str] | None = None,
          seeds: int = 10, window_s: float | None = None, interval: str | int | None = None,
          limit: bool = True) -> pd.DataFrame:
    """Long format: one row per (mtbf_s, strategy), columns ``mtbf_s`` + ``COLUMNS`` +
    ``interval``. With ``limit`` the perfect checkpointer's rows (strategy 'limit':
    free checkpoints, restart cost only) are included, simulated on the same failures."""
    points = [float(m) for m in mtbf_s]
    if not points:
        raise SimError("sweep needs at least one MTBF")
    return _run(scenario, points, strategies, seeds, window_s, interval, with_limit=limit)


def limit_ratio(scenario: Scenario, mtbf_s: float | np.ndarray) -> float | np.ndarray:
    """Closed-form perfect-checkpointer ratio e^(-restart/MTBF) (exponential failures)."""
    return limit_ratio_exponential(scenario.costs.restart_s, mtbf_s)


def sweep_figure(df: pd.DataFrame, *, title: str | None = None):
    """Effective ratio against MTBF, one line per strategy with its 95% band; the
    'limit' rows drawn as a dashed black line."""
    from .report import figure
    return figure(df, title=title)


# ---------------------------------------------------------------------------
def _check_strategies(scenario: Scenario, strategies: Sequence[str] | None) -> list[str]:
    if strategies is None:
        return list(scenario.available())
    names = [s.strip() for s in (strategies.split(",") if isinstance(strategies, str) else strategies)]
    for name in names:
        get_strategy(name)
        if name not in scenario.available():
            raise SimError(f"{name} needs a trace of layer writes: use a preset or --trace")
    if not names:
        raise SimError("no strategies given; choose from " + ", ".join(STRATEGIES))
    return list(dict.fromkeys(names))


def _failure_rows(scenario: Scenario, mtbfs: list[float | None], seeds: int, window_s: float):
    """Failure times and uniforms per (mtbf index, seed), seed i from SeedSequence([seed, i])."""
    times, uniforms = [], []
    for mtbf in mtbfs:
        for i in range(seeds):
            gap_seq, u_seq = np.random.SeedSequence([scenario.seed, i]).spawn(2)
            t = scenario.failures.failure_times(np.random.default_rng(gap_seq), mtbf_s=mtbf,
                                                window_s=window_s)
            times.append(t)
            uniforms.append(np.random.default_rng(u_seq).random(len(t)))
    return times, uniforms


def _run(scenario, mtbfs, strategies, seeds, window_s, interval, *, with_limit) -> pd.DataFrame:
    names = _check_strategies(scenario, strategies)
    if isinstance(seeds, bool) or not isinstance(seeds, (int, np.integer)) or seeds < 1:
        raise SimError(f"seeds={seeds!r} must be a positive integer")
    window = float(scenario.window_s if window_s is None else window_s)
    if not (math.isfinite(window) and window > 0):
        raise SimError(f"window_s={window_s!r} must be positive")
    rule = scenario.interval if interval is None else parse_interval(interval)
    for m in mtbfs:
        if m is None and scenario.failures.kind != "log":
            raise SimError("mtbf is required (e.g. 0.5h) unless failures replay a log")
        if m is not None and not (math.isfinite(m) and m > 0):
            raise SimError(f"mtbf={m!r} must be a positive duration, e.g. 0.5h")
    times, uniforms = _failure_rows(scenario, mtbfs, seeds, window)
    timelines, index, lane_t, lane_row, lane_key = [], {}, [], [], []
    for mi, mtbf in enumerate(mtbfs):
        for name in names:
            steps = _interval_for(name, rule, scenario, mtbf)
            if (name, steps) not in index:
                index[(name, steps)] = len(timelines)
                plan = get_strategy(name).plan(scenario.workload, scenario.costs, interval=steps or 1)
                timelines.append(Timeline.build(plan))
            for i in range(seeds):
                lane_t.append(index[(name, steps)])
                lane_row.append(mi * seeds + i)
                lane_key.append((mi, name, steps))
    res = run_lanes(timelines, np.array(lane_t), times, np.array(lane_row), uniforms, window)
    frame = _aggregate(res, lane_key, mtbfs, window)
    if with_limit:
        lim = run_limit(times, window, scenario.costs.restart_s)
        keys = [(mi, LIMIT, None) for mi in range(len(mtbfs)) for _ in range(seeds)]
        frame = pd.concat([frame, _aggregate(lim, keys, mtbfs, window)], ignore_index=True)
    frame.attrs["events"] = float(res.events.sum())
    return frame


def _interval_for(name: str, rule, scenario: Scenario, mtbf) -> int | None:
    if not STRATEGIES[name].uses_interval:
        return None
    return resolve_interval(rule, scenario.workload, scenario.costs, mtbf)


def _aggregate(res: LaneResults, keys: list, mtbfs: list, window: float) -> pd.DataFrame:
    lanes = pd.DataFrame({"key": keys, "ratio": res.useful_s / window,
                          **{f: getattr(res, f) for f in ("useful_s", "checkpoint_stall_s",
                                                          "lost_work_s", "recovery_s",
                                                          "failures", "bytes_written")}})
    rows = []
    for key, group in lanes.groupby("key", sort=False):
        mi, name, steps = key
        n, ratio = len(group), group["ratio"].to_numpy()
        half = float(stats.t.ppf(0.975, n - 1) * ratio.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
        row = {"mtbf_s": mtbfs[mi], "strategy": name, "effective_ratio": float(ratio.mean()),
               "ci95": half}
        for f in COLUMNS[3:]:
            row[f] = float(group[f].mean())
        row["interval"] = steps
        rows.append(row)
    return pd.DataFrame(rows, columns=["mtbf_s", *COLUMNS, "interval"])
