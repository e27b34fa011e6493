"""The simulator's work bound: what a call will draw and run, estimated before anything is allocated.

A call's cost grows with the failures its runs draw, not with its options one
by one: a tiny MTBF, a huge GPU count, a long window, a clustering Weibull
shape or a failure log of tiny gaps all mean many failures. So the bound is
one estimate, checked in one place (``bound_work``, called by every entry of
``sim.api`` before it draws a failure), and ``FailureModel.failure_times``
stops drawing at ``MAX_RUN_FAILURES`` whatever the estimate said. Each limit
is refused with the estimate, the limit and the fix.

The limits (docs/sim.md, "Work limits"), each with what it protects:

- ``MAX_RUN_FAILURES``: the fast engine takes one loop turn per failure of the
  run with the most (about 70 us a turn on one core): about a minute.
- ``MAX_FAILURES``: failure times held at once over all runs of a call (times,
  uniforms and the engine's segments, about 50 bytes each): about 1 GB.
- ``MAX_LANE_FAILURES``: the engine's vector work, lanes (strategies x runs)
  times their failures: about half a minute.
- ``MAX_SIMPY_STEPS``: the SimPy engine's events, one per step of every lane
  (5 to 8 us each): four to seven minutes.
- ``MAX_JOB_STEPS``: steps of one job; every strategy's timeline holds about
  fifteen float arrays of that length (about 120 MB a strategy at the limit).
- ``MAX_STREAMS``: a job of nodes (``sim.nodes``) opens a random stream per 64
  nodes a run, 55-80 us each on the shared development machine, failures or
  not: about a minute over a call.
- ``MAX_DRAINED_WRITES``: the shared file system's fluid model (``sim.storage``)
  drains a strategy's writes and those of ``--tenants`` other jobs together, one
  loop turn per start or end over the writes in flight: its time grows about
  with the square of the writes (docs/sim.md, "Work limits").
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from .errors import SimError
from .failures import MAX_RUN_FAILURES, FailureModel
from .nodes import NodeFailures
from .units import format_duration

__all__ = ["MAX_RUN_FAILURES", "MAX_FAILURES", "MAX_LANE_FAILURES", "MAX_SIMPY_STEPS",
           "MAX_JOB_STEPS", "MAX_STREAMS", "MAX_DRAINED_WRITES", "bound_work", "check_runs",
           "check_job_steps", "check_drained_writes"]

MAX_FAILURES = 20_000_000
MAX_LANE_FAILURES = 200_000_000
MAX_SIMPY_STEPS = 50_000_000
MAX_JOB_STEPS = 1_000_000
MAX_STREAMS = 1_000_000
MAX_DRAINED_WRITES = 100_000

_WHERE = "docs/sim.md, Work limits"


def bound_work(failures: FailureModel | NodeFailures, mtbfs: Sequence[float | None], *, seeds: int,
               window_s: float, strategies: int, engine: str, mean_step_s: float) -> None:
    """Refuse (``SimError``) a call whose estimated work passes a limit: ``seeds`` runs at
    each MTBF of ``mtbfs`` (None: a log at its own rate) over ``window_s``, each run against
    ``strategies`` strategies, on ``engine`` with steps of ``mean_step_s`` on average."""
    check_runs(len(mtbfs) * seeds, seeds=seeds, points=len(mtbfs))
    per_run = [failures.expected_failures(mtbf_s=m, window_s=window_s) for m in mtbfs]
    worst = max(range(len(mtbfs)), key=lambda i: per_run[i])
    if not per_run[worst] <= MAX_RUN_FAILURES:
        raise SimError(_too_many_per_run(failures, mtbfs[worst], window_s, per_run[worst]))
    streams = getattr(failures, "streams", 0) * seeds * len(mtbfs)
    if streams > MAX_STREAMS:
        raise SimError(f"{_runs(seeds, len(mtbfs))} of {failures.nodes:,} nodes would open "
                       f"{streams:,} random streams (one per 64 nodes a run), more than the "
                       f"simulator's limit of {MAX_STREAMS:,} ({_WHERE}): use fewer nodes, seeds "
                       "or MTBF points")
    drawn = seeds * sum(f + 1 for f in per_run)      # a run without failures is one segment
    if drawn > MAX_FAILURES:
        raise SimError(f"{_runs(seeds, len(mtbfs))} would draw about {drawn:.3g} failures in "
                       f"all, more than the simulator's limit of {MAX_FAILURES:,} held at once "
                       f"({_WHERE}): use fewer seeds or MTBF points, a higher MTBF or a shorter "
                       "window")
    if drawn * strategies > MAX_LANE_FAILURES:
        raise SimError(f"{strategies} strategies x {_runs(seeds, len(mtbfs))} would advance "
                       f"about {drawn * strategies:.3g} lane-failures, more than the simulator's "
                       f"limit of {MAX_LANE_FAILURES:,} ({_WHERE}): use fewer strategies, seeds "
                       "or MTBF points, a higher MTBF or a shorter window")
    if engine == "simpy":
        steps = strategies * seeds * len(mtbfs) * (window_s / mean_step_s)
        if steps > MAX_SIMPY_STEPS:
            raise SimError(f"the simpy engine would step through about {steps:.3g} steps "
                           f"({strategies} strategies x {_runs(seeds, len(mtbfs))} x "
                           f"{format_duration(window_s)} of {mean_step_s:.3g}s steps), more than "
                           f"its limit of {MAX_SIMPY_STEPS:,} ({_WHERE}): use the fast engine, a "
                           "shorter window or fewer seeds")


def check_runs(runs: int, *, seeds: int, points: int) -> None:
    """Refuse more runs than ``MAX_FAILURES`` (each run holds at least one segment): what a
    caller checks before it allocates one entry per run (a sweep's MTBF points)."""
    if runs > MAX_FAILURES:
        raise SimError(f"{_runs(seeds, points)} are more than the simulator's limit of "
                       f"{MAX_FAILURES:,} failures in all ({_WHERE}): use fewer seeds or points")


def check_job_steps(steps: int, what: str = "a job") -> None:
    """Refuse a job longer than ``MAX_JOB_STEPS`` steps (before its arrays are made)."""
    if steps > MAX_JOB_STEPS:
        raise SimError(f"{what} of {steps:,} steps is more than the simulator's limit of "
                       f"{MAX_JOB_STEPS:,} steps a job ({_WHERE}): every strategy's timeline "
                       "holds arrays of the job's length; simulate a shorter job (the window "
                       "runs jobs back to back)")


def check_drained_writes(writes: int, tenants: int) -> None:
    """Refuse a fluid model of more than ``MAX_DRAINED_WRITES`` writes (a job's ``writes``
    and as many for each of ``tenants`` other jobs, at random phases, so that they overlap),
    before their times are drawn. A job alone (no tenants) is not bounded here: its
    writes seldom overlap, and its steps are (``MAX_JOB_STEPS``)."""
    total = writes * (1 + tenants)
    if tenants and total > MAX_DRAINED_WRITES:  # a job alone: its writes seldom overlap
        most = max(0, MAX_DRAINED_WRITES // max(writes, 1) - 1)
        raise SimError(f"{tenants:,} tenants writing this job's {writes:,} writes (of its strategy "
                       f"that writes most) each would make the shared file system drain "
                       f"{total:,} writes, more than the "
                       f"simulator's limit of {MAX_DRAINED_WRITES:,} ({_WHERE}): give at most "
                       f"--tenants {most:,} for this job (or a job with fewer writes)")


def _runs(seeds: int, points: int) -> str:
    return f"{seeds:,} seeds x {points:,} MTBFs"


def _too_many_per_run(failures: FailureModel | NodeFailures, mtbf_s: float | None, window_s: float,
                      expected: float) -> str:
    mean = mtbf_s if mtbf_s is not None else failures.own_mtbf_s
    limit = f"more than the simulator's limit of {MAX_RUN_FAILURES:,} failures per run ({_WHERE})"
    if failures.kind == "weibull" and window_s / mean <= MAX_RUN_FAILURES:
        # the rate fits: the shape's clustering, (CV^2 - 1)/2, is what passes the limit
        cv = failures.coefficient_of_variation
        least = _least_shape(failures, mtbf_s, window_s)
        least = math.ceil(least * 1000 / 10 ** math.floor(math.log10(least))) \
            * 10 ** math.floor(math.log10(least)) / 1000   # rounded up: the shape named fits
        return (f"Weibull shape {failures.shape:g} spreads the gaps between failures so unevenly "
                f"(coefficient of variation {cv:.3g}) that a run is expected to draw about "
                f"{expected:.3g} failures (the renewal estimate window/MTBF + (CV^2 - 1)/2), "
                f"{limit}: use a shape of at least {least:.4g} at this MTBF and window (field "
                "studies of large clusters report 0.5 to 0.8)")
    source, raise_it = (("MTBF", "raise the MTBF") if mtbf_s is not None else
                        ("the nodes' job MTBF", "use fewer nodes or a node MTBF giving a job MTBF")
                        if failures.kind == "nodes" else
                        ("the failure log's mean gap", "rescale the log to an MTBF"))
    return (f"about {expected:.3g} failures per run (window {format_duration(window_s)} / {source} "
            f"{format_duration(mean)}), {limit}: {raise_it} of at least "
            f"{format_duration(window_s / MAX_RUN_FAILURES * 1.0001)} or shorten the window to at "
            f"most {format_duration(MAX_RUN_FAILURES * mean * 0.9999)}")


def _least_shape(failures: FailureModel, mtbf_s: float | None, window_s: float) -> float:
    """The smallest Weibull shape whose estimate fits ``MAX_RUN_FAILURES`` (bisection on log k;
    the estimate falls as the shape rises towards 1)."""
    low, high = math.log(failures.shape), 0.0
    for _ in range(60):
        mid = (low + high) / 2
        model = dataclasses.replace(failures, shape=math.exp(mid))
        if model.expected_failures(mtbf_s=mtbf_s, window_s=window_s) <= MAX_RUN_FAILURES:
            high = mid
        else:
            low = mid
    return math.exp(high)
