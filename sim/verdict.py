"""The verdict of a comparison: who wins, by how much, and what could change that.

    verdict = judge(compare(scenario, mtbf_s=1800))      # or judge(fixed(...)) for a protocol
    print(verdict.text()); verdict.to_dict()

- **Winner and margin**: the strategy whose best setting has the highest effective
  ratio, and its lead over the runner-up with the 95% t-interval of the paired
  difference over the seeds (every strategy ran on the same failures, so the seeds'
  shared luck cancels).
- **phi**: at each end of the stale cost factor's interval each strategy's best is
  chosen again among the settings rated, on the same runs (stale time is kept per
  run, so another phi is arithmetic, not another simulation).
- **Every other figure's band** (the bands ``python -m sim sensitivity`` varies, the one
  rule ``sim.sensitivity.banded``): at each end, each strategy whose schedule the figure
  changes is rated again (the fair comparison: its best setting and the settings near
  where theory puts its interval at the new cost, LayerCheck's ``RERATED`` best; a
  protocol: its cadence at the new cost), the others keep their ratio, and the leader
  there is named. This check runs on its own, smaller set of runs (``CHECK_SEEDS`` seeds
  of ``CHECK_WINDOW_S``, sensitivity's), the point included, so a leader that differs
  there already at the cost model's own values says the margin is within its noise.
- **Fresh seeds**: each strategy's best setting rated again on seeds none of the
  search saw: a winner picked as the best of many settings on the same seeds is biased
  up by their noise, and the fresh ratios show by how much.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .calibrated import FIGURES

from .api import Scenario
from .fair import LAYERCHECK, FairResult, rate_schedules, search_kernel, spelled
from .paper import lowdiff_stall_note
from .results import t_quantile
from .sensitivity import SEEDS, WINDOW_S, at_value, banded
from .settings import Setting, near, rollback_space
from .strategies import LowDiff, Schedule, get_strategy

__all__ = ["Verdict", "Flip", "judge", "CHECK_SEEDS", "CHECK_WINDOW_S", "RERATED", "RERATED_CLOSE",
           "CLOSE", "FRESH_SEED"]

CHECK_SEEDS = SEEDS
CHECK_WINDOW_S = WINDOW_S
"""The band check's runs: sensitivity's (5 seeds x 14 days), or the comparison's own
where those are fewer."""
RERATED = 1
"""LayerCheck settings rated again at a band's end: its best at the cost model's values
(its writes do not depend on a cost), and where that comes within ``CLOSE`` of the
leader there, its best ``RERATED_CLOSE``."""
RERATED_CLOSE = 6
CLOSE = 0.02
FRESH_SEED = 1_000_003
"""Added to the scenario's seed for the fresh runs (seeds the search never saw)."""


@dataclass(frozen=True, kw_only=True)
class Flip:
    """A band end (or phi's) at which another strategy ranks first."""

    figure: str
    end: str
    value: float
    leader: str
    setting: str
    ratio: float
    """The leader's ratio there."""
    winner_ratio: float
    """The ratio there of ``against``."""
    against: str
    """The strategy it displaces: the verdict's winner for phi's ends; for a band end,
    the leader of the band check's own runs at the cost model's values (its smaller
    runs may rank a close race otherwise than the verdict's)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The outcome of a comparison (module doc)."""

    protocol: str
    winner: str
    setting: str
    ratio: float
    runner_up: str | None
    runner_setting: str | None
    runner_ratio: float
    margin: float
    margin_ci95: float
    phi: dict[str, Any]
    flips: tuple[Flip, ...]
    varied: tuple[str, ...]
    unvaried: tuple[dict[str, str], ...]
    check: dict[str, Any]
    fresh: dict[str, float]
    notes: tuple[str, ...] = ()

    @property
    def robust(self) -> bool:
        """No band end, no end of phi's interval and no fresh seeds put another first."""
        fresh_leader = max(self.fresh, key=self.fresh.get) if self.fresh else self.winner
        return not self.flips and self.check.get("leader", self.winner) == self.winner \
            and fresh_leader == self.winner

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "flips"}
        out["flips"] = [f.to_dict() for f in self.flips]
        out["robust"] = self.robust
        return out

    def text(self) -> str:
        """The lines under a table: the verdict, then what can flip it."""
        if self.runner_up is None:
            head = f"verdict ({self.protocol}): {self.winner} ({self.setting}) {self.ratio:.4f}, alone"
        else:
            head = (f"verdict ({self.protocol}): {self.winner} wins at {self.setting}, ratio "
                    f"{self.ratio:.4f}, {self.margin:+.4f} (95% {self.margin - self.margin_ci95:+.4f}"
                    f"..{self.margin + self.margin_ci95:+.4f}, paired over the seeds) ahead of "
                    f"{self.runner_up} ({self.runner_setting}) {self.runner_ratio:.4f}")
        lines = [head]
        if self.phi.get("checked"):
            lines.append(f"  phi {self.phi['low']:g}..{self.phi['high']:g}: first at its low end "
                         f"{self.phi['leader_low']}, at its high end {self.phi['leader_high']}")
        check = self.check
        if check:
            lines.append(f"  bands of {len(self.varied)} figures, each end ({check['seeds']} seeds x "
                         f"{check['window_s'] / 86400:g} days; at the cost model's values there "
                         f"{check['leader']} leads, {check['ratios'][check['leader']]:.4f}):")
            if self.flips:
                for f in self.flips:
                    if f.figure == "stale_cost":
                        continue
                    lines.append(f"    {f.figure} at its {f.end} end ({f.value:.3g}) puts {f.leader} "
                                 f"first ({f.setting}, {f.ratio:.4f} against {f.against}'s "
                                 f"{f.winner_ratio:.4f})")
            if not [f for f in self.flips if f.figure != "stale_cost"]:
                lines.append("    none changes the winner")
        if self.fresh:
            fresh = ", ".join(f"{n} {r:.4f}" for n, r in sorted(self.fresh.items(), key=lambda kv: -kv[1])[:3])
            lines.append(f"  on fresh seeds (none the search saw): {fresh}")
        if not check:
            lines.append("  bands of the cost figures: not checked (--no-bands)")
        lines.append("  the winner " + ("holds under every check above" if self.robust else
                                        "can change: see above"))
        return "\n".join(lines + list(self.notes))


def judge(result: FairResult, *, bands: bool = True, fresh: bool = True) -> Verdict:
    """The verdict of ``result`` (module doc); ``bands``, ``fresh``: run those checks."""
    best = {n: r for n, r in result.best_rows().items() if r is not None and n != "none"}
    if not best:
        best = {n: r for n, r in result.best_rows().items() if r is not None}
    ratios = result.ratios(result.scenario.stale_figure().value)
    order = sorted(best, key=lambda n: -ratios[best[n]].mean())
    winner, runner = order[0], (order[1] if len(order) > 1 else None)
    w = best[winner]
    margin, half = (math.nan, math.nan)
    if runner is not None:
        diff = ratios[w] - ratios[best[runner]]
        margin = float(diff.mean())
        half = float(t_quantile(0.975, diff.size - 1) * diff.std(ddof=1) / math.sqrt(diff.size)) \
            if diff.size > 1 else math.nan
    phi, phi_flips = _phi(result, winner)
    flips, varied, unvaried, check = list(phi_flips), (), (), {}
    if bands:
        band_flips, varied, unvaried, check = _bands(result, best, winner)
        flips += band_flips
    return Verdict(protocol=result.protocol, winner=winner, setting=result.settings[w].label(),
                   ratio=float(ratios[w].mean()), runner_up=runner,
                   runner_setting=None if runner is None else result.settings[best[runner]].label(),
                   runner_ratio=math.nan if runner is None else float(ratios[best[runner]].mean()),
                   margin=margin, margin_ci95=half, phi=phi, flips=tuple(flips), varied=varied,
                   unvaried=unvaried, check=check,
                   fresh=_fresh(result, best) if fresh else {}, notes=tuple(_notes(result, best)))


def _phi(result: FairResult, winner: str) -> tuple[dict[str, Any], list[Flip]]:
    """Each strategy's best again at the ends of phi's interval, on the same runs."""
    figure = result.scenario.stale_figure()
    low, high = figure.interval
    if not high > low:
        return {"checked": False, "value": figure.value, "why": "phi has no interval"}, []
    out: dict[str, Any] = {"checked": True, "value": figure.value, "low": low, "high": high}
    flips = []
    for end, value in (("low", low), ("high", high)):
        rows = {n: r for n, r in result.best_rows(value).items() if r is not None and n != "none"}
        mean = result.ratios(value).mean(axis=1)
        leader = max(rows, key=lambda n: mean[rows[n]])
        out[f"leader_{end}"] = leader
        out[f"ratios_{end}"] = {n: float(mean[r]) for n, r in rows.items()}
        if leader != winner:
            flips.append(Flip(figure="stale_cost", end=end, value=value, leader=leader,
                              setting=result.settings[rows[leader]].label(),
                              ratio=float(mean[rows[leader]]),
                              winner_ratio=float(mean[rows[winner]]) if winner in rows else math.nan,
                              against=winner))
    return out, flips


def _bands(result: FairResult, best: dict[str, int], winner: str):
    """Every banded figure but phi at each end of its band (module doc)."""
    scenario = result.scenario
    varied, unvaried = banded(scenario, [n for n in FIGURES if n != "stale_cost"])
    check = _Check(result, best, seeds=min(result.seeds, CHECK_SEEDS),
                   window_s=min(result.window_s, CHECK_WINDOW_S))
    ends = [(figure, end, value, at_value(scenario, figure, value))
            for figure, _, band in varied for end, value in (("low", band.low), ("high", band.high))]
    for figure, end, _, at in ends:
        for n in best:
            check.add((figure, end), n, at, RERATED)
    check.run()
    # a LayerCheck that comes within CLOSE of the leader at an end is searched wider there
    for figure, end, _, at in ends:
        there = check.at((figure, end))
        top = max(r for r, _ in there.values())
        for n in best:
            if n in LAYERCHECK and (figure, end, n) not in check.kept and there[n][0] > top - CLOSE:
                check.add((figure, end), n, at, RERATED_CLOSE, skip=1)
    check.run()
    leader0 = max(check.point, key=lambda n: check.point[n][0])
    flips = []
    for figure, end, value, _ in ends:
        there = check.at((figure, end))
        leader = max(there, key=lambda n: there[n][0])
        if leader != leader0:
            flips.append(Flip(figure=figure, end=end, value=value, leader=leader,
                              setting=there[leader][1], ratio=there[leader][0],
                              winner_ratio=there[leader0][0], against=leader0))
    summary = {"seeds": check.seeds, "window_s": check.window_s, "leader": leader0,
               "ratios": {n: r for n, (r, _) in check.point.items()},
               "schedules": check.count}
    return flips, tuple(f for f, _, _ in varied), tuple(unvaried), summary


class _Check:
    """The band check's runs: each strategy's best at the cost model's values, and the
    settings re-rated at each band end (``add``), rated in batches (``run``)."""

    def __init__(self, result: FairResult, best: dict[str, int], *, seeds: int,
                 window_s: float) -> None:
        self.result, self.best, self.seeds, self.window_s = result, best, seeds, window_s
        self.mtbf = result.mtbf_s if result.mtbf_s is not None else \
            result.scenario.failures.own_mtbf_s
        self.points = {n: result.schedule(r) for n, r in best.items()}
        self.kept: set[tuple[str, str, str]] = set()
        self.rated: dict[Any, list[tuple[float, str]]] = {}
        self.pending: list[tuple[Any, str, str, Schedule]] = [
            ("point", n, result.settings[r].label(), self.points[n]) for n, r in best.items()]
        self.count = 0

    def add(self, key: tuple[str, str], name: str, at: Scenario, top: int, skip: int = 0) -> None:
        """``name``'s ``top`` best settings (from the ``skip``-th) on scenario ``at``, unless
        the figure leaves its schedule alone (then its point stands there)."""
        if _untouched(self.result, self.best[name], at, self.points[name]):
            self.kept.add((*key, name))
            return
        for setting, layers in _rerated(self.result, name, at, self.mtbf, top)[skip:]:
            self.pending.append((key, name, setting.label(), _schedule_at(setting, at, layers)))

    def run(self) -> None:
        if not self.pending:
            return
        ratios = _rate(self.result.scenario, [p[3] for p in self.pending],
                       mtbf_s=self.result.mtbf_s, seeds=self.seeds, window_s=self.window_s)
        for (key, name, label, _), ratio in zip(self.pending, ratios):
            self.rated.setdefault((key, name), []).append((float(ratio), label))
        self.count += len(self.pending)
        self.pending = []

    @property
    def point(self) -> dict[str, tuple[float, str]]:
        return {n: self.rated[("point", n)][0] for n in self.best}

    def at(self, key: tuple[str, str]) -> dict[str, tuple[float, str]]:
        """Per strategy, its best (ratio, setting) at a band end."""
        out = {}
        for n in self.best:
            options = list(self.rated.get((key, n), []))
            if (*key, n) in self.kept:
                options.append(self.point[n])
            out[n] = max(options)
        return out


def _rerated(result: FairResult, name: str, at: Scenario, mtbf: float, top: int = RERATED):
    """(setting, LayerCheck writes) to rate ``name`` at on scenario ``at`` (a band's end):
    a protocol's cadence there; the fair comparison's best setting and those near where
    theory puts the interval there, or LayerCheck's ``top`` best, best first."""
    rows = [i for i, s in enumerate(result.settings) if s.strategy == name and result.field.at[i, "exact"]
            and result.field.at[i, "within"]]
    best = result.best_rows()[name]
    if result.protocol != "fair":
        setting = result.settings[best]
        if get_strategy(name).rollback:
            setting = spelled(dataclasses.replace(setting, cadence=at.cadence(name, result.mtbf_s)),
                               at)
        return [(setting, result.layers[best])]
    if name in LAYERCHECK:
        mean = result.ratios(result.scenario.stale_figure().value).mean(axis=1)
        ranked = sorted(rows, key=lambda r: -mean[r])[:top]
        return [(result.settings[r], result.layers[r]) for r in ranked]
    if not get_strategy(name).rollback:
        return [(result.settings[best], None)]
    space = [spelled(s, at) for s in near(rollback_space(at, name, mtbf_s=mtbf), at, mtbf)]
    settings = [result.settings[best]] + [s for s in space if s.cadence != result.settings[best].cadence]
    within = _within(result, at, settings)
    return [(s, None) for s, ok in zip(settings, within) if ok]


def _within(result: FairResult, at: Scenario, settings: list[Setting]) -> list[bool]:
    """Whether each setting meets the comparison's budgets on scenario ``at``."""
    rows = []
    compute = float(at.workload.compute_s.sum())
    for s in settings:
        fp = get_strategy(s.strategy).schedule(at.workload, at.costs, s.cadence).footprint
        rows.append({"job_bytes": fp.durable_bytes, "host_bytes": fp.host_bytes,
                     "write_share": fp.durable_bytes / result.bandwidth / compute})
    return list(result.budgets.within(pd.DataFrame(rows), columns={"bytes_written": "job_bytes"}))


def _untouched(result: FairResult, row: int, at: Scenario, point: Schedule) -> bool:
    """Whether scenario ``at`` (a band's end) leaves row ``row``'s schedule as it was: the
    figure is not one of its strategy's mechanism (its recovered composite, which no cost
    changes, left out of the comparison)."""
    layers = result.layers[row]
    if layers is not None:
        layers = dataclasses.replace(layers, restarted=None)
    schedule = _schedule_at(result.settings[row], at, layers)
    return _same(schedule, point)


def _schedule_at(setting: Setting, at: Scenario, layers) -> Schedule:
    workload = at.workload if layers is None else dataclasses.replace(at.workload, layers=layers)
    return get_strategy(setting.strategy).schedule(workload, at.costs, setting.cadence)


def _same(a: Schedule, b: Schedule) -> bool:
    """Whether two schedules cost the same everywhere (a figure that leaves a strategy alone)."""
    for field in ("compute", "snap", "persist", "commit", "bytes", "recover"):
        if not np.array_equal(getattr(a, field), getattr(b, field)):
            return False
    for field in ("backup", "recover_backup"):
        x, y = getattr(a, field), getattr(b, field)
        if (x is None) != (y is None) or (x is not None and not np.array_equal(x, y, equal_nan=True)):
            return False
    return a.backup_probability == b.backup_probability


def _rate(scenario: Scenario, schedules: list[Schedule], *, mtbf_s, seeds, window_s) -> np.ndarray:
    """Mean effective ratio of each schedule on the scenario's failures."""
    frame, _, _ = rate_schedules(scenario, schedules, dict(
        mtbf_s=mtbf_s, seeds=seeds, window_s=window_s, workers=None, scheduler=None,
        kernel=search_kernel()))
    return frame["effective_ratio"].to_numpy(dtype=np.float64)


def _fresh(result: FairResult, best: dict[str, int]) -> dict[str, float]:
    """Each strategy's best setting on seeds the search never saw."""
    scenario = dataclasses.replace(result.scenario, seed=result.scenario.seed + FRESH_SEED)
    names = list(best)
    ratios = _rate(scenario, [result.schedule(best[n]) for n in names], mtbf_s=result.mtbf_s,
                   seeds=result.seeds, window_s=result.window_s)
    return {n: float(r) for n, r in zip(names, ratios)}


def _notes(result: FairResult, best: dict[str, int]) -> list[str]:
    """What a reader of the ranking must know: LowDiff's stall, what it is made of."""
    out = []
    if LowDiff.name in best:
        row = best[LowDiff.name]
        out.append(lowdiff_stall_note(result.schedule(row), result.scenario.workload,
                                      result.scenario.costs,
                                      result.field.at[row, "checkpoint_stall_s"] / result.window_s))
    return out
