"""The frontier: what every setting of a grid would write and how stale it would be.

    grid = Grid.for_trace(trace)                       # K x embedding K x Smax x interval
    result = evaluate(trace, grid.configs())           # one exact replay of every setting at once
    front = result.table[result.table["pareto"]]       # least bytes for the staleness
    rated = rate(result, scenario, rows=front.index, mtbf_s=1800, seeds=10)

Every setting is re-decided exactly as the library would decide it on the
trace's drift (``layercheck.contract.lanes``, proven equal to ``layercheck.contract.policy.replay``),
and measured with the one staleness definition (``layercheck.contract.trace``). The
effective ratio is simulated (``sim.api.simulate_writes``: LayerCheck with each
setting's writes, on the same failures) for the rows asked for, typically the
Pareto points: the ratio column is NaN elsewhere.
"""
from __future__ import annotations

import itertools
import math
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import numpy as np
import pandas as pd

from layercheck.contract.config import ConfigError, LayerCheckConfig
from layercheck.contract.decision import PAPER_STEPS, lr_ratio, paper_default, policy_for, recorded_config
from layercheck.contract.lanes import LaneTable, Lanes, replay_many
from layercheck.contract.policy import Policy
from layercheck.contract.replayed import NO_WRITE, run_arrays
from layercheck.contract.trace import Trace

from .api import Scenario, simulate_writes
from .calibrated import checked
from .errors import SimError
from .workload import LayerWrites

# paper_default, recorded_config and PAPER_STEPS are layercheck.contract.decision's, named here too
__all__ = ["Grid", "Evaluation", "evaluate", "rate", "pareto", "fronts", "RATE_CHUNK", "paper_default", "recorded_config",
           "config_line", "write_bandwidth", "describe", "SETTING_COLUMNS", "PAPER_STEPS",
           "BASE_THRESHOLDS", "EMBEDDING_THRESHOLDS"]

BASE_THRESHOLDS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, math.inf)
"""The default grid's base thresholds: half decades (rounded to 3), then Smax only."""
EMBEDDING_THRESHOLDS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
SETTING_COLUMNS = ("base_threshold", "embedding_threshold", "smax", "interval", "warmup_steps")


@dataclass(frozen=True, kw_only=True)
class Grid:
    """The settings to evaluate: every combination of the four knobs, one warm-up."""

    base_thresholds: tuple[float, ...]
    """K at the peak LR for blocks, head and norm (``inf``: only Smax writes)."""
    embedding_thresholds: tuple[float, ...]
    smax: tuple[int, ...]
    intervals: tuple[int, ...]
    warmup_steps: int
    """Kept from the trace (the base checkpoint's step is not a knob of the frontier),
    but never above a setting's Smax: the library requires warmup_steps <= smax, so a
    smaller Smax brings the base checkpoint forward to it."""
    lr_scaling: bool = True

    def __post_init__(self) -> None:
        for name in ("base_thresholds", "embedding_thresholds", "smax", "intervals"):
            values = tuple(getattr(self, name))
            if not values:
                raise SimError(f"grid: {name} is empty; give at least one value")
            object.__setattr__(self, name, values)
        first = (self.base_thresholds[0], self.embedding_thresholds[0], self.smax[0],
                 self.intervals[0])
        try:  # every value once, the others at their first (no cross-check remains)
            for knob, values in enumerate((self.base_thresholds, self.embedding_thresholds,
                                           self.smax, self.intervals)):
                for value in values:
                    self._config(*first[:knob], value, *first[knob + 1:])
        except (ConfigError, TypeError, ValueError) as exc:
            raise SimError(f"grid: {exc}") from None

    @classmethod
    def for_trace(cls, trace: Trace) -> "Grid":
        """The default grid for a trace (400 settings): ``BASE_THRESHOLDS`` (1e-5 to
        1e-1 in half decades, then inf: Smax only), ``EMBEDDING_THRESHOLDS``, four Smax
        values log-spaced over a decade up to the larger of the recorded and the
        paper's (scaled to the run), intervals 1 and 4."""
        recorded, paper = recorded_config(trace), paper_default(trace.num_steps)
        high = max(recorded.smax, paper.smax, 1)
        smax = tuple(int(s) for s in np.unique(np.round(np.geomspace(max(1, high / 10), high, 4))))
        return cls(base_thresholds=BASE_THRESHOLDS, embedding_thresholds=EMBEDDING_THRESHOLDS,
                   smax=smax, intervals=(1, 4), warmup_steps=recorded.warmup_steps,
                   lr_scaling=recorded.lr_scaling)

    @property
    def size(self) -> int:
        return (len(self.base_thresholds) * len(self.embedding_thresholds) * len(self.smax)
                * len(self.intervals))

    def configs(self) -> list[LayerCheckConfig]:
        """Every combination, base threshold varying slowest."""
        return [self._config(k, e, s, i) for k, e, s, i in itertools.product(
            self.base_thresholds, self.embedding_thresholds, self.smax, self.intervals)]

    def _config(self, k: float, e: float, smax: int, interval: int) -> LayerCheckConfig:
        return LayerCheckConfig(base_threshold=float(k), embedding_threshold=float(e),
                                smax=int(smax), interval=int(interval),
                                warmup_steps=min(self.warmup_steps, int(smax)),
                                lr_scaling=self.lr_scaling)


def config_line(config: LayerCheckConfig) -> str:
    """The Python line that builds ``config``'s decision settings, to paste."""
    def num(value: float) -> str:
        return 'float("inf")' if math.isinf(value) else f"{value:.3g}"
    parts = [f"base_threshold={num(config.base_threshold)}",
             f"embedding_threshold={num(config.embedding_threshold)}",
             f"smax={config.smax}", f"warmup_steps={config.warmup_steps}",
             f"interval={config.interval}"]
    if not config.lr_scaling:
        parts.append("lr_scaling=False")
    if config.thresholds:
        parts.append("thresholds=" + repr({k: float(v) for k, v in config.thresholds.items()}))
    if config.write_budget is not None:
        parts.append(f"write_budget={config.write_budget:.4g}")
    return f"LayerCheckConfig({', '.join(parts)})"


def write_bandwidth(trace: Trace, scenario: Scenario | None = None) -> tuple[float, str]:
    """Bytes/s of the storage LayerCheck's writer writes to, and where the figure
    comes from: the trace's calibration (costs.json ``lc_write_gbps``), else the
    bandwidth the capture measured (manifest machine ``write_bytes_per_s``), else
    the scenario's cost model."""
    if trace.costs is not None:
        figure = checked(trace.costs).figures["lc_write_gbps"]
        return figure.value * 1e9, f"costs.json lc_write_gbps ({figure.source})"
    measured = (trace.manifest.get("machine") or {}).get("write_bytes_per_s")
    if isinstance(measured, (int, float)) and measured > 0:
        return float(measured), "the capture's measured disk write bandwidth (manifest machine)"
    if scenario is not None:
        return scenario.costs.lc_write_gbps * 1e9, f"cost model {scenario.costs.name} lc_write_gbps"
    raise SimError(f"trace {trace.name!r} records no write bandwidth (no costs.json, no "
                   "machine.write_bytes_per_s): give a cost model with --costs")


@dataclass(frozen=True)
class Evaluation:
    """Every setting's numbers (``table``, one row per config, in order) and the
    replay they come from."""

    table: pd.DataFrame
    configs: tuple[LayerCheckConfig, ...]
    lanes: Lanes
    trace: Trace
    seconds: float
    """Wall time of the replay and the measurements."""

    @cached_property
    def _writes(self) -> np.ndarray:
        return self.lanes.writes          # computed from the reasons once, not per row

    def written(self, row: int) -> np.ndarray:
        """Boolean steps x layers: what setting ``row`` writes."""
        return self._writes[:, self.lanes.lane_of[row]]

    def detail(self, rows: Sequence[int]) -> pd.DataFrame:
        """For ``rows``: checkpoints (steps that write any layer) and the peak of the
        parameter-weighted staleness (``layercheck.contract.trace.weighted_staleness``)."""
        out = []
        for row in rows:
            written = self.written(int(row))
            series = self.trace.weighted_staleness(written)
            defined = series[~np.isnan(series)]
            out.append({"checkpoints": int(written.any(axis=1).sum()),
                        "peak_weighted_staleness": float(defined.max()) if defined.size else 0.0})
        return pd.DataFrame(out, index=list(rows))

    def layer_writes(self, row: int) -> LayerWrites:
        """Setting ``row``'s writes as the simulator takes them, with those of its runs
        resumed after a restore (at the budget factor the replay had at each step)."""
        return LayerWrites.replayed(self.trace, policy_for(self.trace, self.configs[row]),
                                    self.written(row), self.lanes.k_scale[:, row])


def evaluate(trace: Trace, configs: Sequence[LayerCheckConfig], *,
             bandwidth: float | None = None) -> Evaluation:
    """Replay ``configs`` on ``trace`` (its per-layer threshold overrides kept) and
    measure each: layer writes, bytes, the largest staleness of any layer, the
    parameter-weighted staleness (its mean from the base checkpoint on), the
    share of ``bandwidth`` (bytes/s, default ``write_bandwidth``) the writes take
    over the job's compute time, and whether the setting is on the Pareto front of
    bytes against mean weighted staleness."""
    start = time.perf_counter()
    if not configs:
        raise SimError("evaluate needs at least one setting")
    lanes = _replay(_policies(trace, configs), trace.drift_matrix(), lr_ratio(trace))
    table = pd.DataFrame({c: [getattr(cfg, c) for cfg in configs] for c in SETTING_COLUMNS})
    table["write_budget"] = [cfg.write_budget for cfg in configs]
    table = table.assign(**_measure(trace, lanes))
    bandwidth = write_bandwidth(trace)[0] if bandwidth is None else bandwidth
    table["write_share"] = table["bytes_written"] / bandwidth / trace.compute_seconds().sum()
    table["pareto"] = pareto(table["bytes_written"].to_numpy(),
                             table["mean_weighted_staleness"].to_numpy())
    table["effective_ratio"] = np.nan
    table["ci95"] = np.nan
    return Evaluation(table, tuple(configs), lanes, trace, time.perf_counter() - start)


def _replay(policies: list[Policy], drift: np.ndarray, ratio: np.ndarray) -> Lanes:
    """``layercheck.contract.lanes.replay_many``, the same lanes and decisions; its walk
    compiled (``sim.kernel.lanes_walk``) where the engine loaded the compiled loops and no
    policy has a write budget (the budgets' accounts stay with the library's walk)."""
    kernel = sys.modules.get(f"{__package__}.kernel")    # loaded by the engine, never here
    if kernel is None or any(p.write_budget is not None for p in policies) or not policies \
            or any(p.num_layers != policies[0].num_layers for p in policies):
        return replay_many(policies, drift, ratio)
    drift, ratio = run_arrays(policies[0].num_layers, drift, ratio)
    table = LaneTable.build(policies)
    reasons = np.full((drift.shape[0], len(table.layer)), NO_WRITE, dtype=np.int8)
    with np.errstate(invalid="ignore"):
        kernel.lanes_walk(np.ascontiguousarray(drift.T), ratio, table.layer, table.base,
                          table.smax, table.interval, table.base_step, table.scaled, reasons)
    return Lanes(reasons=reasons, lane_of=table.lane_of,
                 k_scale=np.ones((drift.shape[0], len(policies))),
                 base_steps=np.array([p.base_step for p in policies], dtype=np.int64))


def _policies(trace: Trace, configs: Sequence[LayerCheckConfig]) -> list[Policy]:
    """``layercheck.contract.decision.policy_for`` of every config: the library's Policy on the
    trace's layers, with the per-layer overrides the trace was recorded with."""
    return [policy_for(trace, config) for config in configs]


def _measure(trace: Trace, lanes: Lanes) -> dict[str, np.ndarray]:
    """Per setting, from the lanes' writes. Staleness is ``layercheck.contract.trace``'s
    definition; its parameter-weighted mean over the steps from the base checkpoint
    on is linear in the layers, so it is the weighted sum of each lane's own mean:
    one pass over the lanes, not over settings x layers (tests check it against
    ``weighted_staleness`` itself)."""
    writes, lane_of = lanes.writes, lanes.lane_of
    steps = np.arange(1, writes.shape[0] + 1, dtype=np.int32)
    counts = writes.sum(axis=0)[lane_of]                         # settings x layers
    last = np.maximum.accumulate(np.where(writes, steps[:, None], 0), axis=0)
    base = lanes.base_steps[_setting_of_lane(lane_of)]
    stale = np.where(steps[:, None] >= base[None, :], steps[:, None] - last, 0)
    lane_max = stale.max(axis=0, initial=0)
    after = np.maximum(len(steps) - base + 1, 0)
    lane_mean = np.divide(stale.sum(axis=0, dtype=np.float64), after,
                          out=np.zeros(len(base)), where=after > 0)
    params = trace.layers["params"].to_numpy(dtype=np.float64)
    weights = params / params.sum() if params.sum() > 0 else np.full(len(params), 1 / len(params))
    return {"layer_writes": counts.sum(axis=1),
            "bytes_written": (counts * trace.layer_bytes).sum(axis=1).astype(np.float64),
            "max_staleness": lane_max[lane_of].max(axis=1),
            "mean_weighted_staleness": lane_mean[lane_of] @ weights,
            "host_bytes": _largest_step(lanes, trace.layer_bytes)}


def _largest_step(lanes: Lanes, nbytes: np.ndarray) -> np.ndarray:
    """Per setting, the most bytes one step writes: what its writer holds in host memory
    (the next snapshot waits until the writer is idle). A setting that takes its base
    checkpoint writes every layer in that step, the most any step can: the whole state."""
    out = np.full(len(lanes.lane_of), float(nbytes.sum()))
    for s in np.flatnonzero(lanes.base_steps > lanes.writes.shape[0]):   # no base in the run
        out[s] = float((lanes.writes[:, lanes.lane_of[s]] @ nbytes).max(initial=0.0))
    return out


def _setting_of_lane(lane_of: np.ndarray) -> np.ndarray:
    """For every lane, one setting that uses it (equal lanes share a base step)."""
    owner = np.empty(lane_of.max() + 1, dtype=np.int64)
    owner[lane_of.ravel()] = np.repeat(np.arange(len(lane_of)), lane_of.shape[1])
    return owner


def pareto(cost: np.ndarray, staleness: np.ndarray) -> np.ndarray:
    """True where no other point has both fewer bytes and less staleness (and no
    earlier point the very same pair): the lower-left front."""
    order = np.lexsort((staleness, cost))
    best = np.minimum.accumulate(staleness[order])
    keep = np.empty(len(order), dtype=bool)
    keep[0] = True
    keep[1:] = staleness[order][1:] < best[:-1]
    out = np.zeros(len(cost), dtype=bool)
    out[order[keep]] = True
    return out


def fronts(table: pd.DataFrame, ok: np.ndarray) -> np.ndarray:
    """Rows worth simulating among ``ok``: for each interval and Smax, the front of bytes
    against mean weighted staleness. Within one interval and one Smax (so one base step
    and one cadence of forced writes) a setting off the front writes more and is staler
    than one on it, so it cannot lose less; across Smax values it can (a smaller Smax
    takes its base checkpoint sooner and writes in bursts), so each keeps its own front."""
    keep = np.zeros(len(table), dtype=bool)
    groups = table[["interval", "smax"]].to_numpy()
    for key in np.unique(groups[ok], axis=0):
        rows = np.flatnonzero(ok & (groups == key).all(axis=1))
        keep[rows[pareto(table["bytes_written"].to_numpy()[rows],
                         table["mean_weighted_staleness"].to_numpy()[rows])]] = True
    return np.flatnonzero(keep)


RATE_CHUNK = 48
"""Settings simulated per engine run: each carries its table of resumed writes (about
5 MB on the 7B preset), which the engine stacks."""


def rate(result: Evaluation, scenario: Scenario, *, rows: Sequence[int], mtbf_s: float,
         seeds: int = 10, window_s: float | None = None) -> pd.DataFrame:
    """``result.table`` with ``effective_ratio`` and ``ci95`` (LayerCheck, the
    scenario's costs and failures at ``mtbf_s``) filled in for ``rows``, all
    simulated on the same failures (in pieces of ``RATE_CHUNK``: the same numbers)."""
    rows = [int(r) for r in rows]
    table = result.table.copy()
    for at in range(0, len(rows), RATE_CHUNK):
        part = rows[at:at + RATE_CHUNK]
        ran = simulate_writes(scenario, [result.layer_writes(r) for r in part], mtbf_s=mtbf_s,
                              seeds=seeds, window_s=window_s)
        table.loc[part, "effective_ratio"] = ran["effective_ratio"].to_numpy()
        table.loc[part, "ci95"] = ran["ci95"].to_numpy()
    return table


def describe(row: Any) -> dict[str, Any]:
    """A table row as plain JSON-ready values."""
    out = {}
    for key, value in dict(row).items():
        value = value.item() if hasattr(value, "item") else value
        out[key] = None if isinstance(value, float) and math.isnan(value) else value
    return out
