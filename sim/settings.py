"""Every strategy's settings, the space the fair comparison searches.

    space = rollback_space(scenario, "gemini", mtbf_s=1800)   # Setting(cadence=...) per point
    Setting(strategy="layercheck", config=LayerCheckConfig(...)).label()

A rollback strategy's setting is its cadence (``sim.strategies.Cadence``): DeepSpeed
and CheckFreq an interval, GEMINI its memory and storage intervals, LowDiff its
full-checkpoint interval and its batch. Each space is a ladder of intervals a fixed
ratio apart around the optimum theory gives (Young's and Daly's for the synchronous
full checkpoint, GEMINI's copies as often as its transfer keeps up, LowDiff's sqrt(2 C M
/ (s r))), wide enough that the best lies inside it, with the protocols' own cadences
(the paper's matched one, each system's native one) always among the points, so the
best found is never worse than either on the same failures. LayerCheck's settings are
its configs (threshold, embedding threshold, Smax below the paper's too, interval),
replayed on the trace's drift (``layercheck_grid``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from layercheck.contract.config import LayerCheckConfig
from layercheck.contract.decision import paper_default, recorded_config
from layercheck.contract.trace import Trace

from .api import Scenario
from .errors import SimError
from .frontier import BASE_THRESHOLDS, EMBEDDING_THRESHOLDS, Grid, config_line
from .intervals import resolve_interval
from .strategies import STRATEGIES, Cadence, get_strategy
from .strategies.base import LADDER, ladder

__all__ = ["Setting", "rollback_space", "layercheck_grid", "ladder", "centres", "near", "LADDER",
           "SMAX_DECADES", "INTERVALS"]

SMAX_DECADES = 2
"""LayerCheck's Smax searched over this many decades below the larger of the recorded
and the paper's (1,000 on the 7B preset: 10 to 1,000, seven values)."""
INTERVALS = (1, 2, 4)
"""LayerCheck's checkpoint intervals searched."""


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One strategy at one setting: a cadence (rollback strategies), a LayerCheck config,
    or neither (a strategy with nothing to set)."""

    strategy: str
    cadence: Cadence | None = None
    config: LayerCheckConfig | None = None
    origin: tuple[str, ...] = ()
    """Where the point comes from besides the search: 'matched', 'native', 'young',
    'daly', 'recorded', 'paper default'."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise SimError(f"unknown strategy {self.strategy!r}; choose from {', '.join(STRATEGIES)}")

    def label(self) -> str:
        """The setting in words: 'every 14', 'memory every 5, storage every 80',
        'full every 330, batches of 1', 'K 1e-4, embeddings 1e-3, Smax 100, every 4'."""
        c = self.cadence
        if self.config is not None:
            k = self.config
            return (f"K {_g(k.base_threshold)}, embeddings {_g(k.embedding_threshold)}, "
                    f"Smax {k.smax}, every {k.interval}")
        if c is None:
            return "-"
        if c.storage_every is not None:
            return f"memory every {c.every}, storage every {c.storage_every}"
        if c.batch is not None:
            return f"full every {c.every}, batches of {c.batch}"
        return f"every {c.every}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"strategy": self.strategy, "label": self.label(),
                               "origin": list(self.origin)}
        if self.cadence is not None:
            out["cadence"] = {"every": self.cadence.every,
                              "storage_every": self.cadence.storage_every,
                              "batch": self.cadence.batch}
        if self.config is not None:
            out["config"] = self.config.to_dict()
        return out


def _g(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}"


def rollback_space(scenario: Scenario, strategy: str, *, mtbf_s: float) -> list[Setting]:
    """The cadences of rollback ``strategy`` the fair comparison tries (module doc); the
    matched and native cadences first, marked."""
    spec = get_strategy(strategy)
    if not spec.rollback:
        raise SimError(f"{strategy} has no cadence to search")
    w, c = scenario.workload, scenario.costs
    marked: dict[Cadence, list[str]] = {}
    for protocol in ("matched", "native"):
        if protocol == "matched" and w.staleness is None:
            continue
        marked.setdefault(spec.cadence(protocol, w, c, mtbf_s=mtbf_s), []).append(protocol)
    for rule in ("young", "daly"):
        every = resolve_interval(rule, w, c, mtbf_s)
        marked.setdefault(spec.cadence("matched", w, c, mtbf_s=mtbf_s, interval=every), []).append(rule)
    points = [Setting(strategy=strategy, cadence=k, origin=tuple(v)) for k, v in marked.items()]
    seen = set(marked)
    for cadence in _ladder_cadences(strategy, scenario, mtbf_s):
        if cadence not in seen:
            seen.add(cadence)
            points.append(Setting(strategy=strategy, cadence=cadence))
    return points


def centres(strategy: str, scenario: Scenario, mtbf_s: float) -> tuple[int, int | None]:
    """Where theory puts ``strategy``'s interval (and GEMINI's storage interval): Daly's
    for a synchronous full checkpoint (DeepSpeed, CheckFreq), GEMINI's copies as often
    as its transfer keeps up with Daly's interval for its persist behind them, LowDiff's
    native full-checkpoint interval."""
    return get_strategy(strategy).search_centres(scenario.workload, scenario.costs, mtbf_s)


def _ladder_cadences(strategy: str, scenario: Scenario, mtbf_s: float) -> list[Cadence]:
    """The search's own points around ``centres``: GEMINI's memory ladder times its storage
    ladder, LowDiff's full-checkpoint ladder times its two batch sizes (1, the cost
    model's)."""
    centre, storage = centres(strategy, scenario, mtbf_s)
    return get_strategy(strategy).search_cadences(centre, storage, scenario.workload,
                                                  scenario.costs)


def near(settings: list[Setting], scenario: Scenario, mtbf_s: float, *,
         factor: float = 2 ** 0.5) -> list[Setting]:
    """Of a rollback strategy's ``settings``, the marked ones and those within ``factor``
    of where theory puts its interval on ``scenario`` (GEMINI: at its storage centre): the
    points worth trying again once a cost figure moved."""
    if not settings:
        return []
    centre, storage = centres(settings[0].strategy, scenario, mtbf_s)
    out = []
    for s in settings:
        c = s.cadence
        close = centre / factor <= c.every <= centre * factor and (
            storage is None or c.storage_every == max(c.every, storage))
        if s.origin or close:
            out.append(s)
    return out


def layercheck_grid(trace: Trace) -> tuple[Grid, list[tuple[LayerCheckConfig, tuple[str, ...]]]]:
    """LayerCheck's settings on ``trace``: the frontier's thresholds and embedding
    thresholds, Smax over ``SMAX_DECADES`` decades up to the larger of the recorded and the
    paper's (below 100 on the presets), ``INTERVALS``; and the references always tried
    beside the grid (the recorded setting, the paper's default), marked."""
    recorded, paper = recorded_config(trace), paper_default(trace.num_steps)
    high = max(recorded.smax, paper.smax, 1)
    low = max(1.0, high / 10 ** SMAX_DECADES)
    smax = tuple(int(s) for s in np.unique(np.round(np.geomspace(low, high, 3 * SMAX_DECADES + 1))))
    grid = Grid(base_thresholds=BASE_THRESHOLDS, embedding_thresholds=EMBEDDING_THRESHOLDS,
                smax=smax, intervals=tuple(i for i in INTERVALS if i <= min(smax)) or (1,),
                warmup_steps=recorded.warmup_steps, lr_scaling=recorded.lr_scaling)
    if config_line(recorded) == config_line(paper):      # the same decisions: one point
        return grid, [(recorded, ("recorded", "paper default"))]
    return grid, [(recorded, ("recorded",)), (paper, ("paper default",))]
