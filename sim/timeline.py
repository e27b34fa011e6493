"""A schedule's failure-free timeline, laid out as prefix sums for the fast engine.

One pass over the job's steps (the background writer's recurrence) gives,
for every position i (steps 1..i done): when step i's compute ends
(``ready``), when training resumes after its checkpoint (``resume``), the
time spent waiting for the writer, and when each commit becomes durable.

A run resumed at position j (after a failure, writer idle) is this timeline
from ``resume[j]`` on, except that the first persisting snapshot q after j does
not wait for the writer: afterwards the writer's state is the same in both, so
every event of step q and later is shifted by exactly that wait (``wait_skip``),
while an event of a step before q keeps its failure-free time, a backup copy still
in flight after q's snapshot included (``backup_after_skip`` tells the two apart).
This is what lets the engine jump from failure to failure without walking the
steps in between.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from .strategies import Schedule

__all__ = ["Timeline"]


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """Failure-free timeline of one job under one schedule (arrays indexed by position 0..N)."""

    schedule: Schedule
    ready: np.ndarray
    resume: np.ndarray
    work: np.ndarray
    """Prefix sum of compute: useful seconds in steps 1..i."""
    checkpoints: np.ndarray
    """Prefix count of steps that checkpoint (snapshot, persist or backup)."""
    written: np.ndarray
    """Prefix sum of bytes written."""
    skip_at: np.ndarray
    """ready[q] of the first persisting snapshot q after j (inf if none)."""
    wait_skip: np.ndarray
    """The wait of that snapshot in the failure-free run, which a run resumed at j
    does not have (0 when it did not wait)."""
    job_end: np.ndarray
    """Seconds from resuming at j (after recovery) to the end of the job."""
    commit_time: np.ndarray
    commit_pos: np.ndarray
    """Primary tier: durable times ascending, and the newest position durable by then."""
    backup_time: np.ndarray
    backup_pos: np.ndarray
    backup_after_skip: np.ndarray
    """For each j: the earliest failure-free time a backup of the first persisting
    snapshot q after j or of a later step is durable (inf if none). In a run resumed at
    j, until the failure-free clock (shifted past q) reaches it, every durable backup is
    of a step before q, durable at its unshifted failure-free time."""

    @property
    def steps(self) -> int:
        return self.schedule.steps

    @classmethod
    def build(cls, schedule: Schedule) -> "Timeline":
        ready, resume, wait, durable = _walk(schedule)
        n = schedule.steps
        skip_at, skip_pos, wait_skip = _first_persist_after(ready, wait, schedule.persist)
        job_end = ready[n] - resume - wait_skip
        commit = schedule.commit.copy()
        commit[n] = False
        at = np.flatnonzero(commit)
        commit_time, commit_pos = _newest_by_time(durable[at], at)
        backup_time, backup_pos = np.empty(0), np.empty(0, dtype=np.int64)
        backup_after_skip = np.full(n + 1, np.inf)
        if schedule.backup is not None:
            b_at = np.flatnonzero(np.isfinite(schedule.backup))
            b_done = ready[b_at] + wait[b_at] + schedule.snap[b_at] + schedule.backup[b_at]
            backup_time, backup_pos = _newest_by_time(b_done, b_at)
            # the earliest of the backups of steps i..n, for i = 0..n + 1
            done = np.full(n + 2, np.inf)
            done[b_at] = b_done
            backup_after_skip = np.minimum.accumulate(done[::-1])[::-1][skip_pos]
        takes = (schedule.snap > 0) | (schedule.persist > 0) | schedule.commit
        if schedule.backup is not None:
            takes |= np.isfinite(schedule.backup)
        takes[0] = takes[n] = False
        return cls(schedule=schedule, ready=ready, resume=resume, work=np.cumsum(schedule.compute),
                   checkpoints=np.cumsum(takes), written=np.cumsum(schedule.bytes),
                   skip_at=skip_at, wait_skip=wait_skip, job_end=job_end,
                   commit_time=commit_time, commit_pos=commit_pos,
                   backup_time=backup_time, backup_pos=backup_pos,
                   backup_after_skip=backup_after_skip)


def _walk(schedule: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The writer recurrence: a snapshot that persists waits until the writer is idle.
    Where the compiled walks are loaded (``sim.engine.compiled_kernel``) they run it: the
    same additions in the same order (tested equal)."""
    kernel = sys.modules.get(f"{__package__}.kernel")    # loaded by the engine, never here
    if kernel is not None:
        return kernel.timeline_walk(np.ascontiguousarray(schedule.compute, dtype=np.float64),
                                    np.ascontiguousarray(schedule.snap, dtype=np.float64),
                                    np.ascontiguousarray(schedule.persist, dtype=np.float64))
    n = schedule.steps
    ready, resume, wait, durable = (np.zeros(n + 1) for _ in range(4))
    compute, snap, persist = schedule.compute.tolist(), schedule.snap.tolist(), schedule.persist.tolist()
    t, writer_free = 0.0, 0.0
    for i in range(1, n + 1):
        t += compute[i]
        ready[i] = t
        if persist[i] > 0:
            w = writer_free - t if writer_free > t else 0.0
            wait[i] = w
            t += w + snap[i]
            writer_free = t + persist[i]
            durable[i] = writer_free
        else:
            t += snap[i]
            durable[i] = t
        resume[i] = t
    return ready, resume, wait, durable


def _first_persist_after(ready: np.ndarray, wait: np.ndarray,
                         persist: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each j: ready[q], q and wait[q] of the first q > j that persists (inf, n + 1
    and 0 where none). A run resumed at j finds the writer idle there, so q does not
    wait; after q's snapshot the writer is busy until the same moment (shifted) in
    both runs."""
    n = len(ready) - 1
    persists = np.flatnonzero(persist > 0)
    if persists.size == 0:
        return np.full(n + 1, np.inf), np.full(n + 1, n + 1, dtype=np.int64), np.zeros(n + 1)
    nxt = np.searchsorted(persists, np.arange(n + 1), side="right")
    has = nxt < persists.size
    q = persists[np.minimum(nxt, persists.size - 1)]
    return (np.where(has, ready[q], np.inf), np.where(has, q, n + 1).astype(np.int64),
            np.where(has, wait[q], 0.0))


def _newest_by_time(times: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(times, kind="stable")
    return times[order], np.maximum.accumulate(positions[order]) if order.size else positions
