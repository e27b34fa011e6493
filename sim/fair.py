"""The fair comparison: every strategy at its own best setting, within the same budgets.

    result = compare(scenario, mtbf_s=1800, budgets=Budgets(max_bytes=2e12))
    result.table()         # one row per strategy: its best setting, its ratio, where time went
    result.field           # every setting rated: bytes, write share, host memory, ratio

The paper's matched protocol checkpoints every rollback strategy as often as
LayerCheck's mean staleness and runs LayerCheck at its default; ``compare`` instead
searches each strategy's own settings (``sim.settings``) and keeps, per strategy, the
one with the best effective ratio among those that meet the budgets
(``sim.budgets``: durable bytes over the job, share of the storage's write bandwidth,
host memory; LayerCheck's largest staleness). Every setting runs on the same failures
(common random numbers), so a rollback strategy's matched and native cadences, always
among its points, are beaten only by a better setting, never by luck of the draw: the
fair ratio is at least the matched one (``tests/sim/test_fair.py``).

LayerCheck's settings are replayed exactly on the trace's drift (``sim.frontier``);
the bytes/staleness front of each interval within the budgets is simulated in a
screen whose recoveries take a resumed run to write as the uninterrupted one (no
table of resumed writes to build), and the ``EXACT`` best of the screen at phi's
point and at each end of its interval are simulated again with the library's
restarted policy (``sim.nextwrites``), the model every other run uses; the best of
those wins. A job without a trace (a custom one) runs LayerCheck only as recorded.

The chosen setting's ratio is the maximum over many settings on the same seeds, so
it is biased up by the seeds' noise, more for a strategy with more settings; the
verdict (``sim.verdict``) says by how much a fresh set of seeds moves each winner.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .api import COLUMNS, Scenario, simulate_schedules
from .budgets import Budgets
from .engine import compiled_kernel
from .errors import SimError
from .frontier import Evaluation, evaluate, pareto
from .results import stale_lost
from .settings import Setting, layercheck_grid, rollback_space
from .strategies import Schedule, get_strategy
from .workload import LayerWrites

__all__ = ["FairResult", "compare", "EXACT", "LAYERCHECK", "FIELD_COLUMNS", "SCREEN_SEEDS"]

EXACT = 6
"""LayerCheck settings simulated with the restarted policy after the screen, per phi (its
point and its interval's ends)."""
CHUNK = 64
"""Schedules per engine run: the engine stacks every LayerCheck schedule's tables of
resumed writes (about 5 MB each on the 7B preset), so a long list runs in pieces."""
SCREEN_SEEDS = 4
"""Runs of the screen (the first of the comparison's seeds: the same failures), enough to
rank settings that differ by more than the chosen ones' spread."""
LAYERCHECK = ("layercheck", "layercheck-sync")
"""The strategies whose settings are LayerCheck configs."""
FIELD_COLUMNS = ("strategy", "setting", "origin", "exact", "within", "job_bytes", "write_share",
                 "host_bytes", "point_bytes", "base_bytes", "max_staleness", "mean_staleness")
"""Per rated setting, before the result columns: ``job_bytes`` durable bytes over one
failure-free job, ``write_share`` of the storage's write bandwidth over the job's compute,
``host_bytes`` the most host memory its checkpoints hold, ``point_bytes`` and
``base_bytes`` what one recovery point and its retention's base occupy on storage,
``max_staleness`` and ``mean_staleness`` LayerCheck's (NaN for the others); ``exact``
False for a LayerCheck screen, ``within`` whether it meets the budgets."""


@dataclass(frozen=True, kw_only=True)
class FairResult:
    """Every setting rated (``field``), and each strategy's best within the budgets."""

    scenario: Scenario
    mtbf_s: float | None
    seeds: int
    window_s: float
    budgets: Budgets
    bandwidth: float
    """The storage's write bytes/s the write share is of (the cost model's ``lc_write_gbps``)."""
    strategies: tuple[str, ...]
    screened: dict[str, int]
    """Per LayerCheck strategy, the settings its screen simulated (their ratios are not kept)."""
    field: pd.DataFrame
    """One row per rated setting: ``FIELD_COLUMNS`` then ``COLUMNS``."""
    settings: tuple[Setting, ...]
    useful: np.ndarray
    """rows x seeds: each run's useful seconds before stale time is charged."""
    stale: np.ndarray
    """rows x seeds: each run's stale seconds (``stale_s``)."""

    def ratios(self, phi: float) -> np.ndarray:
        """rows x seeds: each run's effective ratio at stale cost ``phi`` (the same runs)."""
        lost = np.minimum(phi * self.stale, self.useful)
        return (self.useful - lost) / self.window_s

    def best_rows(self, phi: float | None = None) -> dict[str, int | None]:
        """Per strategy, the row of its best exact setting within the budgets at ``phi``
        (default phi's point); None where no setting meets them. Ties: fewer bytes."""
        phi = self.scenario.stale_figure().value if phi is None else phi
        mean = self.ratios(phi).mean(axis=1)
        out: dict[str, int | None] = {}
        table = self.field
        for name in self.strategies:
            rows = np.flatnonzero((table["strategy"] == name).to_numpy() & table["exact"].to_numpy()
                                  & table["within"].to_numpy())
            if not rows.size:
                out[name] = None
                continue
            order = np.lexsort((table["job_bytes"].to_numpy()[rows], -mean[rows]))
            out[name] = int(rows[order[0]])
        return out

    def table(self) -> pd.DataFrame:
        """One row per strategy (its best): ``setting``, then ``COLUMNS``; a strategy no
        setting of which meets the budgets keeps its row, ratio NaN, setting 'none within
        the budgets'."""
        rows = []
        for name, row in self.best_rows().items():
            if row is None:
                rows.append({"strategy": name, "setting": "none within the budgets",
                             **{c: math.nan for c in COLUMNS[1:]}})
            else:
                rows.append({"setting": self.field.at[row, "setting"],
                             **{c: self.field.at[row, c] for c in COLUMNS}})
        return pd.DataFrame(rows, columns=["setting", *COLUMNS])

    def matched_rows(self) -> dict[str, int]:
        """Per rollback strategy, the row of its matched-protocol cadence (the paper's)."""
        out = {}
        for i, s in enumerate(self.settings):
            if "matched" in s.origin and s.strategy not in out:
                out[s.strategy] = i
        return out

    def to_dict(self) -> dict[str, Any]:
        best = self.best_rows()
        return {"protocol": "fair", "budgets": self.budgets.to_dict(),
                "write_bandwidth_bytes_per_s": self.bandwidth,
                "settings_rated": {n: int((self.field["strategy"] == n).sum()) for n in self.strategies},
                "best": {n: None if r is None else self.settings[r].to_dict() for n, r in best.items()}}


def compare(scenario: Scenario, *, mtbf_s: float | None, budgets: Budgets | None = None,
            strategies: str | Sequence[str] | None = None, seeds: int = 10,
            window_s: float | None = None, exact: int = EXACT, front: bool = False,
            workers: int | None = None, scheduler: str | None = None) -> FairResult:
    """Each strategy of ``strategies`` (default: the compared ones) at its best setting
    within ``budgets`` at ``mtbf_s`` (module doc). ``front``: also simulate exactly every
    LayerCheck setting on the screen's front of bytes against ratio (``sim.bytefront``)."""
    budgets = budgets or Budgets()
    names = scenario.strategy_names(strategies)
    if scenario.interval is not None:
        raise SimError("the fair comparison searches each strategy's own interval: drop "
                       "--interval, or give --protocol matched or native to fix one")
    mtbf = mtbf_s if mtbf_s is not None else scenario.failures.own_mtbf_s
    if mtbf is None:
        raise SimError("the fair comparison needs an MTBF to search intervals around (--mtbf)")
    window = float(scenario.window_s if window_s is None else window_s)
    bandwidth = scenario.costs.lc_write_gbps * 1e9
    compute = float(scenario.workload.compute_s.sum())
    run = dict(mtbf_s=mtbf_s, seeds=seeds, window_s=window, workers=workers, scheduler=scheduler,
               kernel=_kernel())
    parts: list[_Part] = []
    plain = [s for n in names if n not in LAYERCHECK for s in _settings(scenario, n, mtbf)]
    if plain:
        parts.append(_rate(scenario, plain, [_schedule(scenario, s) for s in plain], True, run))
    lc = [n for n in names if n in LAYERCHECK]
    if lc:
        parts += _layercheck(scenario, lc, budgets, exact, front, bandwidth, run)
    screened = {p.settings[0].strategy: len(p.settings) for p in parts if not p.exact}
    parts = [p for p in parts if p.exact]
    field = pd.concat([p.frame for p in parts], ignore_index=True)
    field["write_share"] = field["job_bytes"] / bandwidth / compute
    field["within"] = budgets.within(field, columns={"bytes_written": "job_bytes"})
    return FairResult(scenario=scenario, mtbf_s=mtbf_s, seeds=seeds, window_s=window,
                      budgets=budgets, bandwidth=bandwidth, strategies=tuple(names),
                      screened=screened,
                      field=field[[*FIELD_COLUMNS, *COLUMNS[1:]]],
                      settings=tuple(s for p in parts for s in p.settings),
                      useful=np.concatenate([p.useful for p in parts]),
                      stale=np.concatenate([p.stale for p in parts]))


@dataclass(frozen=True)
class _Part:
    frame: pd.DataFrame
    settings: list[Setting]
    useful: np.ndarray
    stale: np.ndarray
    exact: bool


def _kernel() -> str | None:
    """The compiled loops where numba imports: a search's grids are large enough to gain
    (loaded here, the timelines and the resumed writes take their walks too)."""
    return "compiled" if compiled_kernel(load=True) is not None else None


def _settings(scenario: Scenario, name: str, mtbf_s: float) -> list[Setting]:
    if get_strategy(name).rollback:
        space = rollback_space(scenario, name, mtbf_s=mtbf_s)
        if name == "lowdiff":          # the cost model's batch, spelled out: one cadence, one point
            batch = int(scenario.costs.diff_batch)
            space = _unique([dataclasses.replace(s, cadence=dataclasses.replace(
                s.cadence, batch=s.cadence.batch or batch)) for s in space])
        return space
    return [Setting(strategy=name)]


def _unique(settings: list[Setting]) -> list[Setting]:
    """Settings with one cadence each, the first's origins joined by the rest's."""
    out: dict[Any, Setting] = {}
    for s in settings:
        key = (s.strategy, s.cadence)
        if key in out:
            kept = out[key]
            out[key] = dataclasses.replace(kept, origin=tuple(dict.fromkeys(kept.origin + s.origin)))
        else:
            out[key] = s
    return list(out.values())


def _schedule(scenario: Scenario, setting: Setting, layers: LayerWrites | None = None) -> Schedule:
    workload = scenario.workload if layers is None else dataclasses.replace(scenario.workload,
                                                                             layers=layers)
    return get_strategy(setting.strategy).schedule(workload, scenario.costs, setting.cadence)


def _rate(scenario: Scenario, settings: list[Setting], schedules: list[Schedule], exact: bool,
          run: dict[str, Any], staleness: list[tuple[float, float]] | None = None) -> _Part:
    """Simulate ``schedules`` (one per setting) on the scenario's failures."""
    frames, useful, stale_s = [], [], []
    for at in range(0, len(schedules), CHUNK):      # bounded memory: a composite is ~5 MB
        frame, res = simulate_schedules(scenario, schedules[at:at + CHUNK], **run)
        frames.append(frame)
        useful.append(res.useful_s)
        stale_s.append(res.stale_s)
    frame = pd.concat(frames, ignore_index=True)
    seeds = run["seeds"]
    stale = staleness or [(math.nan, math.nan)] * len(settings)
    frame.insert(0, "setting", [s.label() for s in settings])
    frame["origin"] = [", ".join(s.origin) for s in settings]
    frame["exact"] = exact
    for key in ("job_bytes", "host_bytes", "point_bytes", "base_bytes"):
        attr = "durable_bytes" if key == "job_bytes" else key
        frame[key] = [float(getattr(s.footprint, attr)) for s in schedules]
    frame["max_staleness"] = [a for a, _ in stale]
    frame["mean_staleness"] = [b for _, b in stale]
    return _Part(frame, settings, np.concatenate(useful).reshape(len(settings), seeds),
                 np.concatenate(stale_s).reshape(len(settings), seeds), exact)


def _layercheck(scenario: Scenario, names: list[str], budgets: Budgets, exact: int, front: bool,
                bandwidth: float, run: dict[str, Any]) -> list[_Part]:
    """LayerCheck's settings: a screen of each interval's bytes/staleness front within the
    budgets, then the best of it simulated exactly (module doc)."""
    trace = scenario.workload.trace
    if trace is None:
        settings = [Setting(strategy=n, origin=("recorded",)) for n in names]
        return [_rate(scenario, settings, [_schedule(scenario, s) for s in settings], True, run)]
    grid, refs = layercheck_grid(trace)
    configs = [*grid.configs(), *(c for c, _ in refs)]
    origins = [()] * grid.size + [o for _, o in refs]
    result = evaluate(trace, configs, bandwidth=bandwidth)
    table = result.table
    rows = _front(table, budgets, grid.size)
    screen_layers = {r: _screen_writes(result, r) for r in rows}
    parts: list[_Part] = []
    exact_layers: dict[int, LayerWrites] = {}
    for name in names:
        settings = [Setting(strategy=name, config=configs[r], origin=origins[r]) for r in rows]
        screen = _rate(scenario, settings, [_schedule(scenario, s, screen_layers[r])
                                            for s, r in zip(settings, rows)], False,
                       {**run, "seeds": min(run["seeds"], SCREEN_SEEDS)},
                       [_staleness(table, r) for r in rows])
        chosen = _exact_rows(scenario, screen, rows, exact, front)
        exact_layers.update({r: result.layer_writes(r) for r in chosen if r not in exact_layers})
        settings = [Setting(strategy=name, config=configs[r], origin=origins[r]) for r in chosen]
        parts += [screen, _rate(scenario, settings, [_schedule(scenario, s, exact_layers[r])
                                                     for s, r in zip(settings, chosen)],
                                True, run, [_staleness(table, r) for r in chosen])]
    return parts


def _staleness(table: pd.DataFrame, row: int) -> tuple[float, float]:
    return float(table.at[row, "max_staleness"]), float(table.at[row, "mean_weighted_staleness"])


def _front(table: pd.DataFrame, budgets: Budgets, grid_size: int) -> list[int]:
    """Rows worth simulating: for each interval and Smax, the bytes/staleness front of the
    grid settings within the budgets, and the references. Within one interval and one
    Smax (so one base step and one cadence of forced writes) a setting off the front
    writes more and is staler than one on it, so it cannot lose less; across Smax values
    it can (a smaller Smax takes its base checkpoint sooner and writes in bursts), so
    each Smax keeps its own front."""
    ok = budgets.within(table)
    keep = np.zeros(len(table), dtype=bool)
    grid = np.arange(len(table)) < grid_size
    groups = table[["interval", "smax"]].to_numpy()
    for key in np.unique(groups[grid], axis=0):
        rows = np.flatnonzero(ok & grid & (groups == key).all(axis=1))
        if rows.size:
            keep[rows[pareto(table["bytes_written"].to_numpy()[rows],
                             table["mean_weighted_staleness"].to_numpy()[rows])]] = True
    keep[grid_size:] = True
    return [int(r) for r in np.flatnonzero(keep)]


def _screen_writes(result: Evaluation, row: int) -> LayerWrites:
    """Setting ``row``'s writes without the table of its resumed runs (a resumed run taken
    to write as the uninterrupted one): the screen's cheap stand-in."""
    trace = result.trace
    return LayerWrites(written=result.written(row), nbytes=trace.layer_bytes,
                       params=trace.layers["params"].to_numpy(dtype=np.float64),
                       interval=result.configs[row].interval)


def _exact_rows(scenario: Scenario, screen: _Part, rows: list[int], exact: int,
                front: bool) -> list[int]:
    """Evaluation rows to simulate exactly: the references, the ``exact`` best of the
    screen at phi's point and at each end of its interval, and with ``front`` every
    screened setting on the screen's front of bytes against ratio."""
    phi = scenario.stale_figure()
    picks: set[int] = {k for k, s in enumerate(screen.settings) if s.origin}
    for value in dict.fromkeys((phi.value, *phi.interval)):
        ratio = (screen.useful - np.minimum(value * screen.stale, screen.useful)).mean(axis=1)
        picks.update(int(k) for k in np.argsort(-ratio, kind="stable")[:exact])
        if front and value == phi.value:
            picks.update(int(k) for k in np.flatnonzero(pareto(screen.frame["job_bytes"].to_numpy(),
                                                                   -ratio)))
    return [rows[k] for k in sorted(picks)]
