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

from layercheck.contract.decision import recorded_config

from .api import COLUMNS, Scenario, simulate_schedules
from .budgets import Budgets
from .dollars import BILL_COLUMNS, Prices, bill
from .engine import compiled_kernel
from .errors import SimError
from .frontier import Evaluation, evaluate, fronts, pareto
from .settings import Setting, layercheck_grid, rollback_space
from .strategies import Footprint, Schedule, get_strategy
from .workload import LayerWrites

__all__ = ["FairResult", "compare", "fixed", "rate_schedules", "search_kernel", "spelled", "EXACT",
           "LAYERCHECK", "FIELD_COLUMNS", "SCREEN_SEEDS", "CHUNK"]

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
FIELD_COLUMNS = ("strategy", "setting", "origin", "exact", "within", "job_bytes", "moved_bytes",
                 "write_share", "host_bytes", "point_bytes", "base_bytes", "max_staleness",
                 "mean_staleness")
"""Per rated setting, before the result columns: ``job_bytes`` durable bytes over one
failure-free job (``moved_bytes`` with its copies to a peer's memory), ``write_share``
of the storage's write bandwidth over the job's compute,
``host_bytes`` the most host memory its checkpoints hold, ``point_bytes`` and
``base_bytes`` what one recovery point and its retention's base occupy on storage,
``max_staleness`` and ``mean_staleness`` LayerCheck's (NaN for the others); ``exact``
False for a LayerCheck screen, ``within`` whether it meets the budgets."""


@dataclass(frozen=True, kw_only=True)
class FairResult:
    """Every setting rated (``field``), and each strategy's best within the budgets."""

    scenario: Scenario
    protocol: str
    """'fair' (``compare``), or the fixed cadence rule every strategy ran at (``fixed``)."""
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
    layers: tuple[LayerWrites | None, ...]
    """Per row, the LayerCheck writes it ran with (None for the other strategies)."""

    def footprint(self, row: int) -> Footprint:
        """Row ``row``'s footprint (``sim.strategies.Footprint``)."""
        f = self.field
        return Footprint(durable_bytes=float(f.at[row, "job_bytes"]),
                         moved_bytes=float(f.at[row, "moved_bytes"]),
                         host_bytes=float(f.at[row, "host_bytes"]),
                         point_bytes=float(f.at[row, "point_bytes"]),
                         base_bytes=float(f.at[row, "base_bytes"]))

    def bills(self, prices: Prices) -> pd.DataFrame:
        """``table()`` with each strategy's bill (``sim.dollars.BILL_COLUMNS``) beside it."""
        table = self.table()
        rows = []
        for (name, row), (_, line) in zip(self.best_rows().items(), table.iterrows()):
            if row is None:
                rows.append({c: math.nan for c in BILL_COLUMNS})
            else:
                rows.append(bill(line, self.footprint(row), prices, window_s=self.window_s,
                                 restart_s=self.scenario.costs.restart_s).row())
        return pd.concat([table, pd.DataFrame(rows, columns=list(BILL_COLUMNS))], axis=1)

    def schedule(self, row: int, scenario: Scenario | None = None) -> Schedule:
        """Row ``row``'s setting on ``scenario``'s job and costs (default: the compared one)."""
        return _schedule(scenario or self.scenario, self.settings[row], self.layers[row])

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
        return {"protocol": self.protocol, "budgets": self.budgets.to_dict(),
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
    run = dict(mtbf_s=mtbf_s, seeds=seeds, window_s=window, workers=workers, scheduler=scheduler,
               kernel=search_kernel())
    parts: list[_Part] = []
    plain = [s for n in names if n not in LAYERCHECK for s in _settings(scenario, n, mtbf)]
    if plain:
        parts.append(_rate(scenario, plain, [_schedule(scenario, s) for s in plain], True, run))
    lc = [n for n in names if n in LAYERCHECK]
    if lc:
        parts += _layercheck(scenario, lc, budgets, exact, front, bandwidth, run)
    screened = {p.settings[0].strategy: len(p.settings) for p in parts if not p.exact}
    parts = [p for p in parts if p.exact]
    return _result(scenario, "fair", parts, mtbf_s=mtbf_s, seeds=seeds, window=window,
                   budgets=budgets, names=names, screened=screened)


def fixed(scenario: Scenario, *, mtbf_s: float | None, strategies: str | Sequence[str] | None = None,
          seeds: int = 10, window_s: float | None = None, workers: int | None = None,
          scheduler: str | None = None) -> FairResult:
    """Every strategy at the cadence its protocol (``scenario.protocol``, or the interval
    override) gives it, LayerCheck as recorded: ``sim.api.simulate``'s table, run by the
    comparison's machinery so that a verdict reads it the same way."""
    names = scenario.strategy_names(strategies)
    window = float(scenario.window_s if window_s is None else window_s)
    origin = (scenario.protocol,) if scenario.interval is None else (f"every {scenario.interval}",)
    trace = scenario.workload.trace
    recorded = recorded_config(trace) if trace is not None else None
    settings = []
    for name in names:
        cadence = scenario.cadence(name, mtbf_s)
        if cadence is not None:
            settings.append(spelled(Setting(strategy=name, cadence=cadence, origin=origin),
                                     scenario))
        else:
            settings.append(Setting(strategy=name, origin=("recorded",),
                                    config=recorded if name in LAYERCHECK else None))
    layers = [scenario.workload.layers if s.strategy in LAYERCHECK else None for s in settings]
    run = dict(mtbf_s=mtbf_s, seeds=seeds, window_s=window, workers=workers, scheduler=scheduler,
               kernel=None)
    part = _rate(scenario, settings, [_schedule(scenario, s, l) for s, l in zip(settings, layers)],
                 True, run, layers=layers)
    protocol = scenario.protocol if scenario.interval is None else f"interval {scenario.interval}"
    return _result(scenario, protocol, [part], mtbf_s=mtbf_s, seeds=seeds, window=window,
                   budgets=Budgets(), names=names, screened={})


def _result(scenario: Scenario, protocol: str, parts: list["_Part"], *, mtbf_s, seeds, window,
            budgets, names, screened) -> FairResult:
    field = pd.concat([p.frame for p in parts], ignore_index=True)
    bandwidth = scenario.costs.lc_write_gbps * 1e9
    field["write_share"] = field["job_bytes"] / bandwidth / float(scenario.workload.compute_s.sum())
    field["within"] = budgets.within(field, columns={"bytes_written": "job_bytes"})
    return FairResult(scenario=scenario, protocol=protocol, mtbf_s=mtbf_s, seeds=seeds,
                      window_s=window, budgets=budgets, bandwidth=bandwidth,
                      strategies=tuple(names), screened=screened,
                      field=field[[*FIELD_COLUMNS, *COLUMNS[1:]]],
                      settings=tuple(s for p in parts for s in p.settings),
                      useful=np.concatenate([p.useful for p in parts]),
                      stale=np.concatenate([p.stale for p in parts]),
                      layers=tuple(x for p in parts for x in p.layers))


@dataclass(frozen=True)
class _Part:
    frame: pd.DataFrame
    settings: list[Setting]
    useful: np.ndarray
    stale: np.ndarray
    exact: bool
    layers: list[LayerWrites | None]


def search_kernel() -> str | None:
    """The compiled loops where numba imports: a search's grids are large enough to gain
    (loaded here, the timelines and the resumed writes take their walks too)."""
    return "compiled" if compiled_kernel(load=True) is not None else None


def _settings(scenario: Scenario, name: str, mtbf_s: float) -> list[Setting]:
    if get_strategy(name).rollback:
        return _unique([spelled(s, scenario) for s in rollback_space(scenario, name, mtbf_s=mtbf_s)])
    return [Setting(strategy=name)]


def spelled(setting: Setting, scenario: Scenario) -> Setting:
    """``setting`` with what its cadence leaves to the cost model spelled out
    (``Strategy.spelled``: LowDiff's batch): one cadence, one point."""
    if setting.cadence is None:
        return setting
    return dataclasses.replace(setting, cadence=get_strategy(setting.strategy).spelled(
        setting.cadence, scenario.costs))


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
          run: dict[str, Any], staleness: list[tuple[float, float]] | None = None, *,
          layers: list[LayerWrites | None] | None = None) -> _Part:
    """Simulate ``schedules`` (one per setting, LayerCheck's with ``layers``) on the
    scenario's failures."""
    frame, useful, stale_s = rate_schedules(scenario, schedules, run)
    seeds = run["seeds"]
    stale = staleness or [(math.nan, math.nan)] * len(settings)
    frame.insert(0, "setting", [s.label() for s in settings])
    frame["origin"] = [", ".join(s.origin) for s in settings]
    frame["exact"] = exact
    for key in ("job_bytes", "moved_bytes", "host_bytes", "point_bytes", "base_bytes"):
        attr = "durable_bytes" if key == "job_bytes" else key
        frame[key] = [float(getattr(s.footprint, attr)) for s in schedules]
    frame["max_staleness"] = [a for a, _ in stale]
    frame["mean_staleness"] = [b for _, b in stale]
    return _Part(frame, settings, useful.reshape(len(settings), seeds),
                 stale_s.reshape(len(settings), seeds), exact, list(layers or [None] * len(settings)))


def rate_schedules(scenario: Scenario, schedules: list[Schedule],
                   run: dict[str, Any]) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """``simulate_schedules`` of any number of schedules, in order: its rows, and each
    lane's useful and stale seconds (schedule-major). The engine stacks the LayerCheck
    composites of a run, and a consistent one (~5 MB on the 7B preset) for every other
    schedule beside them, so those with a composite run apart from the rest, in pieces
    of ``CHUNK``."""
    groups = [[i for i, s in enumerate(schedules) if (s.composite is None) == plain]
              for plain in (True, False)]
    frames, useful, stale = [None] * len(schedules), [None] * len(schedules), [None] * len(schedules)
    seeds = run["seeds"]
    for group in groups:
        for at in range(0, len(group), CHUNK):
            part = group[at:at + CHUNK]
            frame, res = simulate_schedules(scenario, [schedules[i] for i in part], **run)
            for k, i in enumerate(part):
                frames[i] = frame.iloc[[k]]
                useful[i] = res.useful_s[k * seeds:(k + 1) * seeds]
                stale[i] = res.stale_s[k * seeds:(k + 1) * seeds]
    return (pd.concat(frames, ignore_index=True), np.concatenate(useful), np.concatenate(stale))


def _layercheck(scenario: Scenario, names: list[str], budgets: Budgets, exact: int, front: bool,
                bandwidth: float, run: dict[str, Any]) -> list[_Part]:
    """LayerCheck's settings: a screen of each interval's bytes/staleness front within the
    budgets, then the best of it simulated exactly (module doc)."""
    trace = scenario.workload.trace
    if trace is None:
        settings = [Setting(strategy=n, origin=("recorded",)) for n in names]
        return [_rate(scenario, settings, [_schedule(scenario, s) for s in settings], True, run,
                      layers=[scenario.workload.layers] * len(settings))]
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
                                True, run, [_staleness(table, r) for r in chosen],
                                layers=[exact_layers[r] for r in chosen])]
    return parts


def _staleness(table: pd.DataFrame, row: int) -> tuple[float, float]:
    return float(table.at[row, "max_staleness"]), float(table.at[row, "mean_weighted_staleness"])


def _front(table: pd.DataFrame, budgets: Budgets, grid_size: int) -> list[int]:
    """Rows worth simulating: each interval's and Smax's front of the grid settings within
    the budgets (``sim.frontier.fronts``), and the references."""
    grid = np.arange(len(table)) < grid_size
    keep = set(fronts(table, budgets.within(table) & grid).tolist())
    return sorted(keep | set(range(grid_size, len(table))))


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
