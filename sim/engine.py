"""The fast engine: jumps from failure to failure, never walks steps one by one.

Many runs ("lanes": strategy x failure sequence) advance together, one failure
per loop turn, as numpy arrays. Between two failures a lane's progress follows
from its strategy's ``Timeline`` (prefix sums and binary searches): how many
jobs finished, which step was reached, which commit was the newest durable
one. Lanes are sorted by failure count so that the active ones are always a
suffix (views, updated in place). ``sim.reference`` is the event-by-event
SimPy yardstick this engine is tested against.

Time accounting per lane (exact): window = useful + checkpoint stall + lost
work + recovery, where useful is compute that was never rolled back, lost is
compute rolled back by a failure, stall is everything else the job did while
running (snapshots, synchronous writes, waiting for the writer), recovery is
restart and loading (including recoveries cut short by another failure).
``stale_s`` is the part of useful whose updates recoveries discarded through
stale layers (``Schedule.stale_s``); the caller decides whether it counts.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from .composite import Composite
from .errors import SimError
from .timeline import Timeline

__all__ = ["ENGINES", "LaneResults", "run_lanes", "run_limit", "resolve_kernel", "compiled_kernel",
           "RESULT_FIELDS", "KERNELS", "AUTO_COMPILED_TURNS"]

ENGINES = ("fast", "simpy")
"""fast: jumps from failure to failure (this module); simpy: every step an event
(``sim.reference``, the model to read and extend; slower)."""
RESULT_FIELDS = ("useful_s", "stale_s", "checkpoint_stall_s", "lost_work_s", "recovery_s",
                 "failures", "bytes_written", "events", "jobs", "rolled_back_steps")
KERNELS = ("auto", "compiled", "numpy")
"""How ``run_lanes`` loops: see its docstring."""
AUTO_COMPILED_TURNS = 5_000
"""'auto' takes the compiled loop from this many numpy loop turns (failures of the lane
with the most) on, or once numba is loaded: below, the numpy loop (about 0.1 ms a turn)
finishes before importing numba and loading the compiled loop from its cache would
(0.5 to 1 s)."""
_KERNEL = None
"""``sim.kernel`` once imported; False where numba is missing."""


@dataclass(frozen=True)
class LaneResults:
    """Per-lane totals (arrays in lane order)."""

    useful_s: np.ndarray
    stale_s: np.ndarray
    """Part of useful_s whose updates a recovery discarded through stale layers."""
    checkpoint_stall_s: np.ndarray
    lost_work_s: np.ndarray
    recovery_s: np.ndarray
    failures: np.ndarray
    bytes_written: np.ndarray
    events: np.ndarray
    """Failures + completed recoveries + checkpoints taken + jobs finished."""
    jobs: np.ndarray
    rolled_back_steps: np.ndarray
    """Completed steps that a failure rolled back (and so were redone)."""


class _Stack:
    """Timelines of several strategies concatenated; block s is shifted by s*big in
    time so that one searchsorted serves every lane."""

    def __init__(self, timelines: Sequence[Timeline]) -> None:
        sizes = [t.steps + 1 for t in timelines]
        self.offset = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        horizon = max(float(np.max(np.concatenate((t.ready, t.commit_time, t.backup_time))))
                      for t in timelines)
        self.big = 2.0 * horizon + 10.0
        _check_resolution(timelines, self.big * len(timelines))
        cat = lambda f: np.concatenate([f(t) for t in timelines])  # noqa: E731
        self.ready, self.resume, self.work = cat(lambda t: t.ready), cat(lambda t: t.resume), cat(lambda t: t.work)
        self.checkpoints = cat(lambda t: t.checkpoints).astype(np.float64)
        self.written = cat(lambda t: t.written)
        self.skip_at, self.wait_skip = cat(lambda t: t.skip_at), cat(lambda t: t.wait_skip)
        self.job_end = cat(lambda t: t.job_end)
        self.recover = cat(lambda t: t.schedule.recover)
        self.recover_backup = cat(lambda t: t.schedule.recover_backup
                                  if t.schedule.recover_backup is not None else t.schedule.recover)
        self._timelines = timelines
        shift = lambda s: s * self.big  # noqa: E731
        self.ready_key = np.concatenate([t.ready + shift(s) for s, t in enumerate(timelines)])
        self.commit_key, self.commit_pos = self._tier(timelines, "commit")
        self.backup_key, self.backup_pos = self._tier(timelines, "backup")
        # shifted like backup_key: the same order, so the same comparisons with a key
        self.backup_after_skip_key = np.concatenate(
            [t.backup_after_skip + shift(s) for s, t in enumerate(timelines)])

    @cached_property
    def composite(self) -> Composite | None:
        """Every timeline's composite stacked (``_composites``); None where none has one."""
        return _composites(self._timelines)

    def stale_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The stacked composite's ``last``, ``restarted`` and weights, what the compiled
        loop reads (None where no timeline has a composite), without its other levels."""
        parts = _composite_parts(self._timelines)
        if parts is None:
            return None
        last, restarted = Composite.stack_tables(parts)
        return last, restarted, parts[0].weights

    def stale(self, off: np.ndarray, c: np.ndarray, j: np.ndarray) -> np.ndarray:
        """``Schedule.stale_s(c, j)`` for every lane at once (0 where no layer is stale)."""
        if self.composite is None:
            return np.zeros(len(c))
        return self.composite.stale_s(self.work, c, j, off)

    def _tier(self, timelines, name):
        keys, pos = [], []
        for s, t in enumerate(timelines):
            keys.append(np.concatenate(([-1.0], getattr(t, f"{name}_time"))) + s * self.big)
            pos.append(np.concatenate(([0], getattr(t, f"{name}_pos"))))
        # where each timeline's block starts and ends (the compiled loop searches one block)
        bounds = np.cumsum([0] + [len(k) for k in keys]).astype(np.int64)
        setattr(self, f"{name}_bounds", bounds)
        return np.concatenate(keys), np.concatenate(pos).astype(np.int64)


def _check_resolution(timelines: Sequence[Timeline], span: float) -> None:
    """Refuse timelines whose stacked keys (up to ``span`` seconds) float64 cannot resolve
    to a millionth of the shortest step: past that, positions found by searchsorted are
    wrong and the totals garbage (ratios above 1, NaN rows)."""
    steps = [t.schedule.compute[t.schedule.compute > 0] for t in timelines]   # position 0: none
    shortest = min(float(c.min()) for c in steps if c.size)
    if np.spacing(span) > 1e-6 * shortest:
        raise SimError(f"the strategies' timelines span {span:.3g}s (a job with its checkpoints, "
                       f"one block per strategy) and float64 cannot resolve its shortest step "
                       f"({shortest:.3g}s) there: give longer steps, a shorter job or faster "
                       "checkpoints (the cost figures)")


def run_lanes(timelines: Sequence[Timeline], strategy: np.ndarray, failures: Sequence[np.ndarray],
              row: np.ndarray, uniforms: Sequence[np.ndarray], window_s: float,
              downtime: Sequence[np.ndarray] | None = None, *,
              kernel: str | None = None) -> LaneResults:
    """Run lane i = timeline ``strategy[i]`` against failure times ``failures[row[i]]``
    (ascending, < window_s) for ``window_s`` seconds; ``uniforms[row[i]][k]`` decides
    whether failure k destroys the primary tier (GEMINI's peer copy). ``downtime[row[i]][k]``
    (optional, seconds) is added to the recovery failure k starts: its detection and
    rescheduling (``sim.recovery``), paid again by each failure that interrupts it.

    ``kernel`` (``KERNELS``; None: the environment's ``LAYERCHECK_SIM_KERNEL``, else
    'auto'): 'compiled' runs each lane's loop in machine code (``sim.kernel``, needs
    numba), 'numpy' the vectorised loop below, 'auto' the compiled one where numba
    imports and the call is long enough (``AUTO_COMPILED_TURNS``). Both give the same
    totals bit for bit, and a lane's totals never depend on the other lanes of the call."""
    st = _Stack(timelines)
    counts = np.array([len(f) for f in failures], dtype=np.int64)
    segs = [np.diff(np.concatenate(([0.0], f, [window_s]))) for f in failures]
    seg_off = np.concatenate(([0], np.cumsum([len(s) for s in segs])[:-1])).astype(np.int64)
    seg_flat = np.concatenate(segs)
    u_flat = np.concatenate([np.concatenate((u[: len(f)], [1.0])) for u, f in zip(uniforms, failures)])
    d_flat = np.zeros(seg_flat.size) if downtime is None else np.concatenate(
        [np.concatenate((np.asarray(d, dtype=float)[: len(f)], [0.0])) for d, f in zip(downtime, failures)])
    strategy, row = np.asarray(strategy, dtype=np.int64), np.asarray(row, dtype=np.int64)
    if resolve_kernel(kernel, turns=int(counts[row].max()) + 1 if len(row) else 0) == "compiled":
        out = _KERNEL.run(st, _Lanes(st, timelines, strategy, row, counts, seg_off), seg_flat, u_flat,
                          d_flat)
        return LaneResults(**{f: out[i] for i, f in enumerate(RESULT_FIELDS)})
    order = np.argsort(counts[row], kind="stable")
    lanes = _Lanes(st, timelines, strategy[order], row[order], counts, seg_off)
    k_sorted = counts[lanes.row]
    for k in range(int(k_sorted.max()) + 1 if len(k_sorted) else 0):
        first = int(np.searchsorted(k_sorted, k, side="left"))
        lanes.advance(slice(first, None), k, seg_flat, u_flat, d_flat)
    out = lanes.results()
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return LaneResults(**{f: getattr(out, f)[inverse] for f in RESULT_FIELDS})


def resolve_kernel(kernel: str | None, *, turns: int | None = None) -> str:
    """The loop ``kernel`` names: 'compiled' or 'numpy' (None: the environment's
    ``LAYERCHECK_SIM_KERNEL``, else 'auto': 'compiled' where numba imports, unless the
    call's ``turns`` are fewer than ``AUTO_COMPILED_TURNS`` and numba is not loaded yet)."""
    kernel = kernel or os.environ.get("LAYERCHECK_SIM_KERNEL") or "auto"
    if kernel not in KERNELS:
        raise SimError(f"kernel {kernel!r} (argument or LAYERCHECK_SIM_KERNEL): use one of "
                       f"{', '.join(KERNELS)}")
    global _KERNEL
    if kernel == "numpy":
        return kernel
    if kernel == "auto" and turns is not None and turns < AUTO_COMPILED_TURNS and not _KERNEL:
        return "numpy"
    if _KERNEL is None:
        try:
            _KERNEL = importlib.import_module(".kernel", __package__)
        except ImportError:
            _KERNEL = False
    if _KERNEL is False and kernel == "compiled":
        raise SimError("the compiled engine loop needs numba: pip install 'layercheck[sim-fast]', "
                       "or use kernel='numpy' (LAYERCHECK_SIM_KERNEL=numpy)")
    return "compiled" if _KERNEL else "numpy"


def compiled_kernel(load: bool = False):
    """``sim.kernel`` where it is loaded (or, with ``load``, where numba imports), else
    None: the compiled walks' callers take them only once the import is paid for."""
    if _KERNEL is None and load:
        resolve_kernel(None)          # the environment's choice: 'numpy' loads nothing
    return _KERNEL or None


def _composites(timelines) -> Composite | None:
    """Every timeline's composite stacked like the timelines (a consistent schedule's:
    every layer from c, ``Composite.consistent``); None where no timeline has one."""
    parts = _composite_parts(timelines)
    return None if parts is None else Composite.stack(parts)


def _composite_parts(timelines) -> list[Composite] | None:
    """Every timeline's composite, a consistent one's where it has none; None where no
    timeline has one."""
    parts = [t.schedule.composite for t in timelines]
    known = [p for p in parts if p is not None]
    if not known:
        return None
    weights = known[0].weights
    return [p if p is not None else Composite.consistent(t.steps, weights.size, weights)
            for t, p in zip(timelines, parts)]


class _Lanes:
    """State and totals of every lane; ``advance`` processes segment k of a slice."""

    def __init__(self, st: _Stack, timelines, strategy, row, counts, seg_off) -> None:
        n = len(strategy)
        self.st, self.row = st, row
        self.off = st.offset[strategy]
        self.key = strategy * st.big
        steps = np.array([t.steps for t in timelines])[strategy]
        self.end = self.off + steps
        self.job_s = st.job_end[self.off]
        self.prob = np.array([t.schedule.backup_probability for t in timelines])[strategy]
        self.seg_off, self.count = seg_off[row], counts[row]
        self.pos = np.zeros(n, dtype=np.int64)
        self.backup = np.zeros(n, dtype=np.int64)
        self.pending = np.zeros(n)
        self.base = np.zeros(n)
        """The recovery in progress without its downtime (what a repeat of it costs)."""
        self.tot = {f: np.zeros(n) for f in RESULT_FIELDS}
        # what the compiled loop needs besides: each lane's blocks of the stacked keys
        self.ready_hi = self.end + 1
        self.commit_lo, self.commit_hi = st.commit_bounds[strategy], st.commit_bounds[strategy + 1]
        self.backup_lo, self.backup_hi = st.backup_bounds[strategy], st.backup_bounds[strategy + 1]
        self.has_stale = np.array([t.schedule.composite is not None for t in timelines],
                                  dtype=np.bool_)[strategy]

    def advance(self, a: slice, k: int, seg_flat: np.ndarray, u_flat: np.ndarray,
                d_flat: np.ndarray) -> None:
        st, tot, off = self.st, self.tot, self.off[a]
        g = seg_flat[self.seg_off[a] + k]
        fail = self.count[a] > k
        pending, j = self.pending[a].copy(), self.pos[a].copy()
        rec = np.minimum(g, pending)
        tau = g - rec
        gj = off + j
        # whole jobs finished within the gap (rare when failures are frequent: skip then)
        first_end = st.job_end[gj]
        finish = tau >= first_end
        if finish.any():
            left, whole, useful, stall, ck, nbytes = self._whole_jobs(a, tau, gj, first_end, finish)
            js = np.where(finish, 0, j)
            gs = off + js
        else:
            left, whole, js, gs = tau, 0.0, j, gj
            useful = stall = ck = nbytes = 0.0
        # where the partial job stands when the segment ends, on the failure-free clock
        at = st.resume[gs] + left
        p = at + np.where(at > st.skip_at[gs], st.wait_skip[gs], 0.0)
        key = p + self.key[a]
        reached = np.searchsorted(st.ready_key, key, side="right") - 1
        done = st.work[reached] - st.work[gs] + np.maximum(p - st.resume[reached], 0.0)
        c, recover_next, backup = self._commit(a, key, js, gs, finish, u_flat, k, at)
        kept = np.where(fail, st.work[off + c] - st.work[gs], done)
        tot["useful_s"][a] += useful + kept
        stale = np.zeros(fail.shape)
        if fail.any():  # the composite's walk, for the lanes that failed
            stale[fail] = st.stale(off[fail], c[fail], np.broadcast_to(js, fail.shape)[fail])
        tot["stale_s"][a] += stale
        tot["lost_work_s"][a] += done - kept
        tot["checkpoint_stall_s"][a] += stall + left - done
        tot["recovery_s"][a] += rec
        tot["failures"][a] += fail
        tot["jobs"][a] += finish + whole
        tot["bytes_written"][a] += nbytes + st.written[reached] - st.written[gs]
        tot["rolled_back_steps"][a] += np.where(fail, reached - off - c, 0)
        # counts, not flags: bool + bool is an or in numpy, which counted a failure and
        # the recovery it ended in the same segment as one event
        recovered = (pending > 0) & (g >= pending)
        tot["events"][a] += fail.astype(np.int64) + recovered.astype(np.int64) + ck + finish + whole \
            + st.checkpoints[reached] - st.checkpoints[gs]
        trained = g >= pending
        self.pos[a] = np.where(fail, c, j)
        self.backup[a] = np.where(fail, backup, self.backup[a])
        # a failure during recovery repeats it, unless it also forced a deeper rollback;
        # either way after this failure's own downtime
        base = np.where(fail & (trained | (c != j)), recover_next, self.base[a])
        self.base[a] = np.where(fail, base, self.base[a])
        self.pending[a] = np.where(fail, base + d_flat[self.seg_off[a] + k], pending)

    def _whole_jobs(self, a, tau, gj, first_end, finish):
        """Time left after finishing the current job and any whole jobs after it, and
        what those jobs added (useful, stall, checkpoints, bytes)."""
        st, off, end, job_s = self.st, self.off[a], self.end[a], self.job_s[a]
        left = np.where(finish, tau - first_end, tau)
        whole = np.where(finish, np.floor(left / job_s), 0.0)
        left = np.maximum(left - whole * job_s, 0.0)
        work_job = st.work[end] - st.work[off]
        rest = st.work[end] - st.work[gj]
        useful = np.where(finish, rest, 0.0) + whole * work_job
        stall = np.where(finish, first_end - rest, 0.0) + whole * (job_s - work_job)
        ck = np.where(finish, st.checkpoints[end] - st.checkpoints[gj], 0.0) \
            + whole * (st.checkpoints[end] - st.checkpoints[off])
        nbytes = np.where(finish, st.written[end] - st.written[gj], 0.0) \
            + whole * (st.written[end] - st.written[off])
        return left, whole, useful, stall, ck, nbytes

    def _commit(self, a, key, js, gs, finish, u_flat, k, at):
        """Newest durable position (primary tier unless this failure destroyed it),
        what recovering from it costs, and the newest durable backup position.

        ``key`` is the segment's end on the failure-free clock (past the first persist
        after the resume, shifted by the writer wait the resume skipped there), ``at``
        the same end unshifted. Until a backup of that persist's step or a later one is
        durable by ``key`` (``Timeline.backup_after_skip``), the newest durable backup
        is of a step before it, which keeps its failure-free time: looked up at ``at``."""
        st, off = self.st, self.off[a]
        cp = np.maximum(st.commit_pos[np.searchsorted(st.commit_key, key, side="right") - 1], js)
        early = key < st.backup_after_skip_key[gs]
        b_key = np.where(early, at + self.key[a], key)
        look = st.backup_pos[np.searchsorted(st.backup_key, b_key, side="right") - 1]
        cb = np.where(look > js, look, np.where(finish, 0, self.backup[a]))
        lost_primary = u_flat[self.seg_off[a] + k] < self.prob[a]
        c = np.where(lost_primary, cb, np.maximum(cp, cb))
        from_backup = lost_primary | (cb > cp)
        recover = np.where(from_backup, st.recover_backup[off + c], st.recover[off + c])
        return c, recover, cb

    def results(self) -> LaneResults:
        return LaneResults(**self.tot)


def run_limit(failures: Sequence[np.ndarray], window_s: float, restart_s: float,
              downtime: Sequence[np.ndarray] | None = None) -> LaneResults:
    """The perfect checkpointer: checkpoints are free and every instant is durable, so a
    failure costs only the restart (which failures may interrupt too), after its
    ``downtime`` where given (as ``run_lanes``)."""
    cols = {f: [] for f in RESULT_FIELDS}
    for r, times in enumerate(failures):
        seg = np.diff(np.concatenate(([0.0], times, [window_s])))
        pending = np.full(seg.size, restart_s)
        if downtime is not None:
            pending[1:] += np.asarray(downtime[r], dtype=float)[: len(times)]
        pending[0] = 0.0
        rec = np.minimum(seg, pending)
        values = {"useful_s": float((seg - rec).sum()), "recovery_s": float(rec.sum()),
                  "failures": float(len(times)),
                  "events": float(len(times) + ((seg[1:] >= pending[1:]) & (pending[1:] > 0)).sum())}
        for f in RESULT_FIELDS:
            cols[f].append(values.get(f, 0.0))
    return LaneResults(**{f: np.array(v) for f, v in cols.items()})
