"""A first-order closed form of a strategy's effective ratio, Young/Daly-style, to explain
what the simulator says (and what a paper's figure implies) term by term.

    ratio ~ (1 - s) (1 - (W + R) / M) - phi S / M      (clamped at 0)

- ``s``: the stall share of the failure-free job (checkpointing time the job runs but
  does not compute), from the strategy's failure-free timeline;
- ``W``: the wall time a failure throws away, from the recovery point it resumes at
  (training resumed there) to the failure: lost compute and the stalls spent on it;
- ``R``: the recovery (restart + load, + LowDiff's replay) of that recovery point;
- ``S``: the compute whose updates the composite recovery's stale layers discard
  (LayerCheck only; 0 for a consistent recovery point), counted as lost at phi.

Each failure costs ``W + R`` of wall time; failures arrive at rate 1/M per wall second, so
a share ``(W + R) / M`` of the wall time is spent redoing and recovering, and the rest
progresses at the failure-free pace, of which ``1 - s`` is compute. ``W``, ``R`` and ``S``
are means over where failures strike in the failure-free job: a renewal's failures fall
on phase t of the job in proportion to how often the run passes t, which is
e^((d - t)/M) for a phase whose newer recovery point becomes durable at d (attempts that
must get from their recovery point past d repeat that often). What it leaves out:
failures during a recovery (they repeat it), the exact exponential shape within a
segment, and the writer's state after a restart; the simulator has them, so the two
differ by second-order terms (tests/sim/test_firstorder.py states by how much).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import SimError
from .strategies import Schedule
from .timeline import Timeline

__all__ = ["FirstOrder", "first_order", "GRID", "RESUME_QUANTILES"]

GRID = 4000
"""Phases of the failure-free job the means are taken over (a 12,000 s job: 3 s apart,
under half a step of the presets)."""
RESUME_QUANTILES = 16
"""Quantiles of the exponential gap since the run's last resume, over which ``S`` is
averaged (a restored layer is stale only since that resume)."""


@dataclass(frozen=True, kw_only=True)
class FirstOrder:
    """The terms of the first-order ratio of one strategy at one MTBF (module docstring)."""

    strategy: str
    mtbf_s: float
    stall_share: float
    """s: the failure-free job's stall share."""
    rework_s: float
    """W: wall seconds a failure throws away since its recovery point."""
    recovery_s: float
    """R: seconds a failure's recovery takes."""
    stale_s: float
    """S: compute seconds a failure's composite recovery discards through stale layers."""
    start_share: float = 0.0
    """The share of failures with no recovery point yet in their job (they resume at its
    start: LayerCheck before its base checkpoint, a rollback before its first)."""
    start_rework_s: float = 0.0
    """W of those failures alone (0 when there are none)."""

    def ratio(self, phi: float = 0.0) -> float:
        """(1 - s)(1 - (W + R)/M) - phi S/M, clamped at 0 (a run that loses more than it
        trains makes no progress; it does not train backwards, as in the simulator)."""
        m = self.mtbf_s
        value = (1 - self.stall_share) * (1 - (self.rework_s + self.recovery_s) / m) \
            - phi * self.stale_s / m
        return max(0.0, value)

    def to_dict(self) -> dict[str, float | str]:
        return {"strategy": self.strategy, "mtbf_s": self.mtbf_s, "stall_share": self.stall_share,
                "rework_s": self.rework_s, "recovery_s": self.recovery_s, "stale_s": self.stale_s,
                "start_share": self.start_share, "start_rework_s": self.start_rework_s}


def first_order(schedule: Schedule, mtbf_s: float) -> FirstOrder:
    """The first-order terms of ``schedule`` (a strategy on a job: ``Scenario.schedule``)
    under failures every ``mtbf_s`` seconds on average."""
    if not (isinstance(mtbf_s, (int, float)) and math.isfinite(mtbf_s) and mtbf_s > 0):
        raise SimError(f"mtbf_s={mtbf_s!r} must be a positive number of seconds, e.g. 1800")
    tl = Timeline.build(schedule)
    n = schedule.steps
    job = float(tl.ready[n])
    stall = 1.0 - float(tl.work[n]) / job
    t = (np.arange(GRID) + 0.5) * job / GRID
    primary = _newest(tl.commit_time, tl.commit_pos, t)
    backup = _newest(tl.backup_time, tl.backup_pos, t)
    recover_backup = schedule.recover_backup if schedule.recover_backup is not None \
        else schedule.recover
    # the newer tier, unless the failure destroyed the primary (GEMINI's peer copy)
    c = np.maximum(primary, backup)
    recover = np.where(backup > primary, recover_backup[c], schedule.recover[c])
    both = np.concatenate((tl.commit_time, tl.backup_time))
    terms = _terms(schedule, tl, t, c, recover, _next_durable(both, t, job), mtbf_s)
    p = schedule.backup_probability
    if p > 0:
        lost = _terms(schedule, tl, t, backup, recover_backup[backup],
                      _next_durable(tl.backup_time, t, job), mtbf_s)
        terms = tuple((1 - p) * a + p * b for a, b in zip(terms, lost))
    rework, recovery, stale, start, start_rework = terms
    return FirstOrder(strategy=schedule.strategy, mtbf_s=float(mtbf_s), stall_share=stall,
                      rework_s=rework, recovery_s=recovery, stale_s=stale, start_share=start,
                      start_rework_s=start_rework / start if start > 0 else 0.0)


def _newest(times: np.ndarray, positions: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The newest position durable by each phase t (0, the job's start, before any)."""
    if times.size == 0:
        return np.zeros(t.size, dtype=np.int64)
    i = np.searchsorted(times, t, side="right") - 1
    return np.where(i >= 0, positions[np.maximum(i, 0)], 0)


def _next_durable(times: np.ndarray, t: np.ndarray, job: float) -> np.ndarray:
    """When the next recovery point after phase t becomes durable (the job's end commits
    the last)."""
    times = np.sort(times)
    k = np.searchsorted(times, t, side="right")
    nxt = np.where(k < times.size, times[np.minimum(k, max(times.size - 1, 0))], job) \
        if times.size else np.full(t.size, job)
    return np.minimum(nxt, job)


def _terms(schedule: Schedule, tl: Timeline, t: np.ndarray, c: np.ndarray, recover: np.ndarray,
           durable: np.ndarray, mtbf_s: float) -> tuple[float, ...]:
    """Mean W, R and S over the phases t, each weighted by how often the run passes it, the
    weight of the phases that resume at the job's start and their W times that weight
    (both linear, so the two tiers of ``first_order`` mix them as they mix the rest)."""
    exponent = (durable - t) / mtbf_s
    weight = np.exp(exponent - exponent.max())     # relative weights: no overflow at a tiny M
    weight /= weight.sum()
    lost = t - tl.resume[c]
    start = c == 0
    return (float(weight @ lost), float(weight @ recover),
            _stale(schedule, tl, t, c, recover, weight, mtbf_s), float(weight[start].sum()),
            float(weight[start] @ lost[start]))


def _stale(schedule, tl, t, c, recover, weight, mtbf_s) -> float:
    """Mean S: a composite recovery at c discards, per layer, the compute since its copy or
    since the run's last resume, whichever is later (``Composite.stale_s``); the last resume is one exponential
    gap (less its recovery) before the failure, averaged over the gap's quantiles."""
    if schedule.composite is None:
        return 0.0
    q = -np.log1p(-(np.arange(RESUME_QUANTILES) + 0.5) / RESUME_QUANTILES) * mtbf_s
    back = np.maximum(q[None, :] - recover[:, None], 0.0)
    j = np.searchsorted(tl.ready, np.maximum(t[:, None] - back, 0.0), side="right") - 1
    j = np.clip(j, 0, c[:, None])
    lost = schedule.composite.stale_s(tl.work, c[:, None], j)
    return float(weight @ lost.mean(axis=1))
