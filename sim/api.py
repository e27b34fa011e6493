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

from layercheck.contract.calibration import Figure
from layercheck.contract.figure import SIGNED_RANGE
from layercheck.contract.trace import Trace
from layercheck.contract.traceschema import MAX_COUNT

from .costs import GB, CostModel
from .engine import ENGINES, RESULT_FIELDS, LaneResults, run_limit
from .errors import SimError
from .failures import FailureModel
from .grid import run_grid
from .intervals import parse_interval, resolve_interval
from .nodes import NodeFailures
from .reference import run_reference
from .results import COLUMNS, LIMIT, aggregate
from .strategies import PROTOCOLS, STRATEGIES, Cadence, LayerCheck, Schedule, Strategy, get_strategy
from .theory import limit_ratio_exponential
from .timeline import Timeline
from .units import DURATION_RANGE, is_duration
from .workbound import bound_work
from .workload import LayerWrites, Workload

__all__ = ["Scenario", "simulate", "sweep", "simulate_writes", "simulate_schedules", "limit_ratio",
           "PRESETS", "COLUMNS", "LIMIT", "DAY", "ENGINES", "cadences", "primary_loss_draws"]

DAY = 86400.0


def _presets() -> tuple[str, ...]:
    from .presets import PRESET_NAMES
    return PRESET_NAMES


PRESETS: tuple[str, ...] = _presets()


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Everything a run needs except the MTBF: the job, the costs, the failure
    distribution, the protocol, the window, the seed and the accounting."""

    name: str
    workload: Workload
    costs: CostModel = field(default_factory=CostModel.paper_a100)
    failures: FailureModel | NodeFailures = field(default_factory=FailureModel)
    """The job's failure process: one distribution of the job's gaps (``FailureModel``)
    or the superposition of its nodes' processes and failure domains (``NodeFailures``)."""
    protocol: str = "matched"
    """How often rollback strategies checkpoint (``strategies.PROTOCOLS``). 'matched'
    needs a trace; without one, 'native'."""
    interval: str | int | None = None
    """Override: every rollback strategy checkpoints every ``interval`` steps (or at
    Young's or Daly's interval), whatever the protocol."""
    stale_cost: float | None = None
    """The stale cost factor phi: the share of ``stale_s`` (training whose updates a
    composite recovery discarded through stale layers) counted as lost, the rest as
    useful. 0: the paper's accounting; 1: every stale update is lost work. None: the cost
    model's (``CostModel.stale_cost``, with its interval and provenance)."""
    stale_as_useful: bool = False
    """The alias of ``stale_cost=0`` (the paper's accounting)."""
    window_s: float = 30 * DAY
    """Wall-clock time each run covers (jobs run back to back within it)."""
    seed: int = 0
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "interval", parse_interval(self.interval))
        if not isinstance(self.failures, (FailureModel, NodeFailures)):
            raise SimError("failures must be a FailureModel (the job's gaps) or a NodeFailures "
                           "(a job of N nodes, sim.nodes)")
        if self.protocol not in PROTOCOLS:
            raise SimError(f"protocol {self.protocol!r}: use one of {', '.join(PROTOCOLS)}")
        if not is_duration(self.window_s):
            raise SimError(f"window_s={self.window_s!r} must be a positive number of seconds "
                           f"from {DURATION_RANGE}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise SimError(f"seed={self.seed!r} must be a non-negative integer")
        low, high = SIGNED_RANGE
        if self.stale_cost is not None and (isinstance(self.stale_cost, bool) or not isinstance(
                self.stale_cost, (int, float)) or not low <= self.stale_cost <= high):
            raise SimError(f"stale_cost={self.stale_cost!r} must be a finite number from {low:g} "
                           f"to {high:g} (0: the paper's accounting, 1: every stale update lost)")
        if self.stale_as_useful and self.stale_cost not in (None, 0):
            raise SimError(f"stale_as_useful is stale_cost=0, not {self.stale_cost!r}: give one of them")
        if self.protocol == "matched" and not self.workload.has_trace:
            object.__setattr__(self, "protocol", "native")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "Scenario":
        """A preset by name (see ``PRESETS``), fields overridable."""
        from .presets import preset_scenario_fields
        return cls(**{**preset_scenario_fields(name), **overrides})

    @classmethod
    def from_trace(cls, trace: Trace, *, costs: CostModel | None = None, **overrides: Any) -> "Scenario":
        """A scenario on any valid trace: compute per step from its steps table, layer
        bytes from its manifest, LayerCheck's writes from its writes table, and (unless
        ``costs`` is given) the trace's own calibration (costs.json)."""
        return cls(**{"name": trace.name, "workload": Workload.from_trace(trace),
                      "costs": costs or trace_costs(trace),
                      "description": str(trace.manifest.get("description", "")), **overrides})

    @classmethod
    def custom(cls, *, iteration_s: float, iterations: int, checkpoint_gb: float = 106.6,
               checkpoint_s: float | None = None, costs: CostModel | None = None,
               **overrides: Any) -> "Scenario":
        """A what-if job without a trace: equal steps, a full checkpoint of
        ``checkpoint_gb``; ``checkpoint_s`` (the time to write it) sets the storage write
        bandwidth. LayerCheck needs a trace, so it is not available here."""
        if not (math.isfinite(checkpoint_gb) and 0 < checkpoint_gb <= MAX_COUNT / GB):
            raise SimError(f"checkpoint size {checkpoint_gb!r} GB must be positive and at most "
                           f"{MAX_COUNT / GB:.3g} GB (2**53 bytes, a trace's largest size)")
        costs = costs or CostModel.paper_a100()
        if checkpoint_s is not None:
            gbps = checkpoint_gb / checkpoint_s
            costs = costs.with_overrides(save_gbps=gbps, persist_gbps=gbps)
        workload = Workload.custom(iteration_s=iteration_s, iterations=iterations,
                                   full_bytes=int(round(checkpoint_gb * GB)))
        return cls(**{"name": "custom", "workload": workload, "costs": costs,
                      "protocol": "native", **overrides})

    def available(self) -> tuple[str, ...]:
        """Strategies this scenario can run (LayerCheck needs a trace)."""
        return tuple(n for n, c in STRATEGIES.items() if self.workload.has_trace or not c.needs_trace)

    def strategy_names(self, strategies: str | Sequence[str] | None = None) -> list[str]:
        """The strategies a run of this scenario compares: ``strategies`` (names, or one
        comma list) checked and de-duplicated in order, else every ``compared`` one it can
        run. Unknown names and ones that need a trace this job lacks are refused."""
        if strategies is None:
            return [n for n in self.available() if STRATEGIES[n].compared]
        names = [s.strip() for s in (strategies.split(",") if isinstance(strategies, str) else strategies)]
        for name in names:
            get_strategy(name)
            if name not in self.available():
                raise SimError(f"{name} needs a trace of layer writes: use a preset or --trace")
        if not names:
            raise SimError("no strategies given; choose from " + ", ".join(STRATEGIES))
        return list(dict.fromkeys(names))

    def cadence(self, strategy: str, mtbf_s: float | None, *,
                interval: str | int | None = None) -> Cadence | None:
        """How often ``strategy`` checkpoints on this job at ``mtbf_s`` (None: the failures'
        own rate): by the protocol, or every ``interval`` steps (or Young's or Daly's;
        default the scenario's own override); None for a strategy that does not roll back."""
        spec = STRATEGIES[strategy]()
        if not spec.rollback:
            return None
        rule = self.interval if interval is None else parse_interval(interval)
        mtbf = mtbf_s if mtbf_s is not None else self.failures.own_mtbf_s
        steps = None if rule is None else resolve_interval(rule, self.workload, self.costs, mtbf)
        return spec.cadence(self.protocol, self.workload, self.costs, mtbf_s=mtbf, interval=steps)

    def schedule(self, strategy: str, mtbf_s: float | None) -> Schedule:
        """``strategy``'s schedule on this job at ``mtbf_s``: its cadence by the protocol or
        the interval override, as ``simulate`` runs it."""
        self.strategy_names([strategy])
        return get_strategy(strategy).schedule(self.workload, self.costs, self.cadence(strategy, mtbf_s))

    def stale_figure(self) -> Figure:
        """The stale cost factor phi in force, with its interval and provenance: the given
        one (``stale_cost``; no interval), else the cost model's."""
        if self.stale_cost is None and not self.stale_as_useful:
            return self.costs.provenance["stale_cost"]
        return Figure(value=float(self.stale_cost or 0.0), source="given",
                      method="given by the user (--stale-cost, or --stale-as-useful for 0)")

    def accounting(self) -> str:
        phi = self.stale_figure().value
        named = {0.0: " (the paper's accounting)", 1.0: " (every stale update is lost work)"}
        return (f"phi = {phi:g} of stale layers' discarded updates (stale_s) counted as lost, "
                f"the rest as useful{named.get(phi, '')}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (what a report prints under "scenario")."""
        w = self.workload
        return {"name": self.name, "kind": w.kind, "description": self.description,
                "steps_per_job": w.steps, "mean_step_s": float(w.compute_s.mean()),
                "full_checkpoint_bytes": int(w.full_bytes), "staleness_steps": w.staleness,
                "protocol": self.protocol, "interval": self.interval,
                "stale_as_useful": self.stale_figure().value == 0,
                "stale_cost": _stale_dict(self.stale_figure()), "accounting": self.accounting(),
                "window_s": self.window_s, "seed": self.seed,
                "failures": self.failures.to_dict(),
                "costs": self.costs.to_dict()}


def _stale_dict(phi: Figure) -> dict[str, Any]:
    low, high = phi.interval
    return {**phi.to_dict(), "low": low, "high": high}


def trace_costs(trace: Trace) -> CostModel:
    """The trace's own calibration; a synthetic trace without one uses paper-a100."""
    if trace.costs is not None:
        return CostModel.from_calibration(trace.costs)
    if trace.kind == "synthetic":
        return CostModel.paper_a100()
    raise SimError(f"trace {trace.name!r} has no costs.json (what each checkpointing mechanism "
                   f"costs on the machine it was captured on): measure it with `python -m profiler "
                   f"calibrate --trace traces/{trace.name}`, or choose a cost model with "
                   "--costs paper-a100 (or --costs FILE)")


def simulate(scenario: Scenario, *, mtbf_s: float | None, strategies: Sequence[str] | None = None,
             seeds: int = 10, window_s: float | None = None, interval: str | int | None = None,
             engine: str = "fast", workers: int | None = None,
             scheduler: str | None = None) -> pd.DataFrame:
    """One row per strategy (``COLUMNS``): the effective ratio (useful compute / wall
    clock) averaged over ``seeds`` runs with its 95% confidence half-width, and the mean
    seconds per run that went to each use. ``mtbf_s`` may be None only for a replayed
    failure log (played at its own rate). ``workers`` and ``scheduler``: where the fast
    engine's lanes run (``sim.grid``: a local process pool, or a Dask scheduler's
    address); the same numbers wherever."""
    frame = _run(scenario, [mtbf_s], strategies, seeds, window_s, interval, engine,
                 with_limit=False, workers=workers, scheduler=scheduler)
    return frame.drop(columns="mtbf_s").reset_index(drop=True)


def sweep(scenario: Scenario, *, mtbf_s: Sequence[float], strategies: Sequence[str] | None = None,
          seeds: int = 10, window_s: float | None = None, interval: str | int | None = None,
          limit: bool = True, engine: str = "fast", workers: int | None = None,
          scheduler: str | None = None) -> pd.DataFrame:
    """Long format: one row per (mtbf_s, strategy), columns ``mtbf_s`` + ``COLUMNS``. With
    ``limit`` the perfect checkpointer's rows (strategy 'limit': free checkpoints,
    restart cost only) are included, simulated on the same failures. ``workers`` and
    ``scheduler`` as in ``simulate``."""
    points = [float(m) for m in mtbf_s]
    if not points:
        raise SimError("sweep needs at least one MTBF")
    return _run(scenario, points, strategies, seeds, window_s, interval, engine, with_limit=limit,
                workers=workers, scheduler=scheduler)


def simulate_writes(scenario: Scenario, variants: Sequence[LayerWrites], *, mtbf_s: float,
                    seeds: int = 10, window_s: float | None = None,
                    strategy: str = "layercheck") -> pd.DataFrame:
    """LayerCheck under each of several write patterns (``variants``: what other
    settings would write on the scenario's job), all on the same failures: one row per
    variant, in order, columns ``COLUMNS`` (``strategy`` is the variant's index). The
    tuner's way to put an effective ratio on many settings in one engine run."""
    if not issubclass(STRATEGIES.get(strategy, Strategy), LayerCheck):
        raise SimError(f"simulate_writes runs LayerCheck's strategies, not {strategy!r}")
    if not variants:
        raise SimError("simulate_writes needs at least one write pattern")
    window = _check_run(scenario, [mtbf_s], seeds, window_s, "fast")
    _bound(scenario, [mtbf_s], seeds, window, len(variants), "fast")
    times, uniforms = _failure_rows(scenario, [mtbf_s], seeds, window)
    timelines = []
    for layers in variants:
        workload = dataclasses.replace(scenario.workload, layers=layers)
        timelines.append(Timeline.build(get_strategy(strategy).schedule(workload, scenario.costs)))
    lane_t = np.repeat(np.arange(len(variants)), seeds)
    res = run_grid(timelines, lane_t, times, np.tile(np.arange(seeds), len(variants)), uniforms,
                   window)
    frame = aggregate(res, [(0, int(v), None) for v in lane_t], [mtbf_s], window,
                       scenario.stale_figure())
    return frame.drop(columns="mtbf_s").reset_index(drop=True)


def simulate_schedules(scenario: Scenario, schedules: Sequence[Schedule], *, mtbf_s: float | None,
                       seeds: int = 10, window_s: float | None = None, workers: int | None = None,
                       scheduler: str | None = None,
                       kernel: str | None = None) -> tuple[pd.DataFrame, LaneResults]:
    """Any schedules on the scenario's job, all on the scenario's failures at ``mtbf_s``
    (the same as ``simulate``'s, seed for seed): one row per schedule, in order, columns
    ``COLUMNS`` (``strategy`` the schedule's), and the engine's per-lane totals (lane
    ``i * seeds + k``: schedule i, seed k) for statistics over the seeds. The fair
    comparison's way to rate many settings of many strategies in one engine run."""
    if not schedules:
        raise SimError("simulate_schedules needs at least one schedule")
    window = _check_run(scenario, [mtbf_s], seeds, window_s, "fast")
    _bound(scenario, [mtbf_s], seeds, window, len(schedules), "fast")
    times, uniforms = _failure_rows(scenario, [mtbf_s], seeds, window)
    timelines = [Timeline.build(s) for s in schedules]
    lane_t = np.repeat(np.arange(len(schedules)), seeds)
    res = run_grid(timelines, lane_t, times, np.tile(np.arange(seeds), len(schedules)), uniforms,
                   window, workers=workers, scheduler=scheduler, kernel=kernel)
    keys = [(0, (int(i), schedules[int(i)].strategy), None) for i in lane_t]
    frame = aggregate(res, keys, [mtbf_s], window, scenario.stale_figure())
    frame["strategy"] = [name for _, name in frame["strategy"]]
    frame["interval"] = [s.cadence.every if s.cadence else None for s in schedules]
    frame["storage_interval"] = [s.cadence.storage_every if s.cadence else None for s in schedules]
    return frame.drop(columns="mtbf_s").reset_index(drop=True), res


def limit_ratio(scenario: Scenario, mtbf_s: float | np.ndarray) -> float | np.ndarray:
    """Closed-form perfect-checkpointer ratio e^(-restart/MTBF) (exponential failures)."""
    return limit_ratio_exponential(scenario.costs.restart_s, mtbf_s)


# ---------------------------------------------------------------------------
def _failure_rows(scenario: Scenario, mtbfs: list[float | None], seeds: int, window_s: float):
    """Failure times and uniforms per (mtbf index, seed), seed i from SeedSequence([seed, i])."""
    times, uniforms = [], []
    for mtbf in mtbfs:
        for i in range(seeds):
            gap_seq, _ = np.random.SeedSequence([scenario.seed, i]).spawn(2)
            t = scenario.failures.failure_times(np.random.default_rng(gap_seq), mtbf_s=mtbf,
                                                window_s=window_s)
            times.append(t)
            uniforms.append(primary_loss_draws(scenario.seed, len(t), run=i))
    return times, uniforms


def primary_loss_draws(seed: int, count: int, *, run: int = 0) -> np.ndarray:
    """The uniforms run ``run`` of a ``Scenario`` with ``seed`` compares with a strategy's
    ``backup_probability`` at each of its ``count`` failures (below it: the failure took
    the primary tier too, GEMINI's peer copy). A real run replaying the same failures
    (``python -m profiler validate``) takes the same draws."""
    _, u_seq = np.random.SeedSequence([seed, run]).spawn(2)
    return np.random.default_rng(u_seq).random(count)


def cadences(scenario: Scenario, strategies: Sequence[str], *,
             mtbf_s: float | None = None) -> dict[str, Cadence | None]:
    """How often each strategy checkpoints in ``simulate(scenario, mtbf_s=...)``: what a
    real run of the same scenario must do to be compared with it."""
    return {name: scenario.cadence(name, mtbf_s) for name in strategies}


def _check_run(scenario, mtbfs, seeds, window_s, engine) -> float:
    if isinstance(seeds, bool) or not isinstance(seeds, (int, np.integer)) or seeds < 1:
        raise SimError(f"seeds={seeds!r} must be a positive integer")
    if engine not in ENGINES:
        raise SimError(f"engine {engine!r}: use one of {', '.join(ENGINES)}")
    window = scenario.window_s if window_s is None else window_s
    if not is_duration(window):
        raise SimError(f"window_s={window_s!r} must be positive, from {DURATION_RANGE}")
    window = float(window)
    for m in mtbfs:
        if m is None and scenario.failures.own_mtbf_s is None:
            raise SimError("mtbf is required (e.g. 0.5h) unless failures replay a log or come "
                           "from a job's nodes")
        if m is not None and not is_duration(m):
            raise SimError(f"mtbf={m!r} must be a positive duration from {DURATION_RANGE}, e.g. 0.5h")
    return window


def _bound(scenario, mtbfs, seeds, window, strategies, engine) -> None:
    """The work bound (``sim.workbound``): refused before a failure is drawn."""
    bound_work(scenario.failures, mtbfs, seeds=int(seeds), window_s=window, strategies=strategies,
               engine=engine, mean_step_s=float(scenario.workload.compute_s.mean()))


def _run(scenario, mtbfs, strategies, seeds, window_s, interval, engine, *, with_limit,
         workers=None, scheduler=None) -> pd.DataFrame:
    names = scenario.strategy_names(strategies)
    window = _check_run(scenario, mtbfs, seeds, window_s, engine)
    _bound(scenario, mtbfs, seeds, window, len(names), engine)
    rule = scenario.interval if interval is None else parse_interval(interval)
    times, uniforms = _failure_rows(scenario, mtbfs, seeds, window)
    timelines, index, lane_t, lane_row, lane_key = [], {}, [], [], []
    for mi, mtbf in enumerate(mtbfs):
        for name in names:
            cadence = scenario.cadence(name, mtbf, interval=rule)
            if (name, cadence) not in index:
                index[(name, cadence)] = len(timelines)
                schedule = get_strategy(name).schedule(scenario.workload, scenario.costs, cadence)
                timelines.append(Timeline.build(schedule))
            for i in range(seeds):
                lane_t.append(index[(name, cadence)])
                lane_row.append(mi * seeds + i)
                lane_key.append((mi, name, cadence))
    if engine == "simpy":
        res = _run_reference(timelines, lane_t, lane_row, times, uniforms, window)
    else:
        res = run_grid(timelines, np.array(lane_t), times, np.array(lane_row), uniforms, window,
                       workers=workers, scheduler=scheduler)
    frame = aggregate(res, lane_key, mtbfs, window, scenario.stale_figure())
    if with_limit:
        lim = run_limit(times, window, scenario.costs.restart_s)
        keys = [(mi, LIMIT, None) for mi in range(len(mtbfs)) for _ in range(seeds)]
        # the perfect checkpointer has no stale layers: every phi gives it the same ratio
        frame = pd.concat([frame, aggregate(lim, keys, mtbfs, window, scenario.stale_figure())],
                          ignore_index=True)
    frame.attrs["events"] = float(res.events.sum())
    return frame


def _run_reference(timelines, lane_t, lane_row, times, uniforms, window) -> LaneResults:
    """Every lane event by event in SimPy (``sim.reference``), as engine results."""
    totals = [run_reference(timelines[t].schedule, times[r], uniforms[r], window)
              for t, r in zip(lane_t, lane_row)]
    cols = {f: np.array([tot.get(f, 0.0) for tot in totals], dtype=np.float64) for f in RESULT_FIELDS}
    return LaneResults(**cols)
