"""The reference engine: the same model, event by event, as SimPy processes.

Slow (every step is an event) and plain: the yardstick the fast engine
(``sim.engine``) is tested against on small scenarios, lane by lane. Processes:

- ``_train``: recover if needed, then step through jobs: compute, checkpoint
  (a persisting snapshot first waits until the background writer is idle),
  hand the persist to the writer; at the job's end start the next job.
- ``_persist`` / ``_backup``: the background writer and the backup tier; a
  copy counts only if it completes before the next failure.
- ``_inject``: interrupts training at each failure time, whatever it is doing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from .strategies import Schedule

__all__ = ["run_reference"]


@dataclass
class _State:
    schedule: Schedule
    uniforms: np.ndarray
    pos: int = 0
    reached: int = 0
    primary: int = 0
    """Newest durable primary-tier position in the current job."""
    backup: int = 0
    pending: float = 0.0
    generation: int = 0
    writer_free: float = 0.0
    activity: tuple = ("stall", 0.0)
    tot: dict = field(default_factory=lambda: dict.fromkeys(
        ("useful_s", "stale_s", "checkpoint_stall_s", "lost_work_s", "recovery_s", "failures",
         "bytes_written", "jobs", "rolled_back_steps", "events"), 0.0))
    """``events``: failures + completed recoveries + checkpoints taken + jobs finished."""


def run_reference(schedule: Schedule, failure_times: np.ndarray, uniforms: np.ndarray,
                  window_s: float) -> dict[str, float]:
    """Totals of one run of ``schedule`` against ``failure_times`` (ascending, < window_s);
    ``uniforms[k] < schedule.backup_probability`` means failure k destroyed the primary tier."""
    env = simpy.Environment()
    st = _State(schedule=schedule, uniforms=np.asarray(uniforms))
    trainer = env.process(_train(env, st))
    env.process(_inject(env, trainer, failure_times))
    env.run(until=window_s)
    kind, start = st.activity[0], st.activity[1]
    key = {"compute": "useful_s", "stall": "checkpoint_stall_s", "recovery": "recovery_s"}[kind]
    st.tot[key] += window_s - start
    return st.tot


def _inject(env, trainer, failure_times):
    for k, t in enumerate(failure_times):
        yield env.timeout(t - env.now)
        trainer.interrupt(k)


def _train(env, st: _State):
    while True:
        try:
            yield from _recover(env, st)
            yield from _jobs(env, st)
        except simpy.Interrupt as failure:
            _fail(env, st, failure.cause)


def _recover(env, st: _State):
    if st.pending > 0:
        st.activity = ("recovery", env.now)
        yield env.timeout(st.pending)
        st.tot["recovery_s"] += st.pending
        st.tot["events"] += 1
        st.pending = 0.0


def _jobs(env, st: _State):
    p, n = st.schedule, st.schedule.steps
    while True:
        for i in range(st.pos + 1, n + 1):
            st.activity = ("compute", env.now, i)
            yield env.timeout(p.compute[i])
            st.tot["useful_s"] += p.compute[i]
            st.tot["bytes_written"] += p.bytes[i]
            st.reached = i
            if i < n:
                st.tot["events"] += _takes_checkpoint(p, i)  # counted once its step is done
                yield from _checkpoint(env, st, i)
        st.tot["jobs"] += 1
        st.tot["events"] += 1
        st.generation += 1          # the job's own final save; in-flight copies are moot
        st.pos = st.reached = st.primary = st.backup = 0
        st.writer_free = env.now


def _takes_checkpoint(p: Schedule, i: int) -> bool:
    """Whether step i checkpoints: a snapshot, a persist, a commit or a backup."""
    return bool(p.snap[i] > 0 or p.persist[i] > 0 or p.commit[i]
                or (p.backup is not None and np.isfinite(p.backup[i])))


def _checkpoint(env, st: _State, i: int):
    p = st.schedule
    start = env.now
    st.activity = ("stall", start)
    if p.persist[i] > 0 and st.writer_free > env.now:
        yield env.timeout(st.writer_free - env.now)
    yield env.timeout(p.snap[i])
    st.tot["checkpoint_stall_s"] += env.now - start
    if p.persist[i] > 0:
        st.writer_free = env.now + p.persist[i]
        env.process(_persist(env, st, i, p.persist[i], st.generation, "primary"))
    elif p.commit[i]:
        st.primary = i
    if p.backup is not None and np.isfinite(p.backup[i]):
        env.process(_persist(env, st, i, p.backup[i], st.generation, "backup"))


def _persist(env, st: _State, i: int, seconds: float, generation: int, tier: str):
    yield env.timeout(seconds)
    if st.generation != generation:
        return  # a failure (or the job's end) came first
    if tier == "backup":
        st.backup = max(st.backup, i)
    elif st.schedule.commit[i]:
        st.primary = max(st.primary, i)


def _fail(env, st: _State, k: int) -> None:
    p = st.schedule
    kind, start = st.activity[0], st.activity[1]
    partial = env.now - start
    in_recovery = kind == "recovery"
    st.tot[{"compute": "lost_work_s", "stall": "checkpoint_stall_s",
            "recovery": "recovery_s"}[kind]] += partial
    st.tot["failures"] += 1
    st.tot["events"] += 1
    lost_primary = st.uniforms[k] < p.backup_probability
    cb = st.backup
    c = cb if lost_primary else max(st.primary, cb)
    from_backup = lost_primary or cb > st.primary
    recover = (p.recover_backup if from_backup and p.recover_backup is not None else p.recover)[c]
    st.tot["stale_s"] += p.stale_s(c, st.pos)
    work = np.cumsum(p.compute)
    redone = work[st.reached] - work[c]
    st.tot["useful_s"] -= redone
    st.tot["lost_work_s"] += redone
    st.tot["rolled_back_steps"] += st.reached - c
    if not in_recovery or c != st.pos:
        st.pending = float(recover)
    st.pos = st.reached = st.primary = c
    st.backup = cb
    st.generation += 1
    st.writer_free = env.now
