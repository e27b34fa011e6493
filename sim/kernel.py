"""The fast engine's loop compiled (numba; optional): one lane at a time, failure by failure.

Contract. ``run(st, lanes, seg_flat, u_flat, d_flat)`` returns the totals that
``sim.engine._Lanes`` accumulates for the same lanes, field by field in
``RESULT_FIELDS`` order, as one ``(fields, lanes)`` float64 array.

Why it exists. The numpy loop takes one turn per failure of the lane with the
most and issues about eighty array calls a turn. In the issue's sweep the
lanes at MTBF 36 s see 72,000 failures each while only 70 lanes are still
running, so nine tenths of the sweep's time was the interpreter dispatching
calls on arrays of a few hundred elements (cProfile: ``advance`` 11.3 s of
12.1 s, for 72,685 turns). Here each lane runs its own loop in machine code:
the work is proportional to lane-failures, not to the longest lane's failures
times the calls per turn.

Same numbers. Every expression is the numpy loop's, scalar, in the same order
(float64, no fast-math, the same left-to-right sums; the stale layers' dot
product summed layer by layer in both), so every field is bit-identical to the
numpy loop's (``tests/sim/test_kernel.py``, on grids of the sweep's lanes).
Binary searches run over the lane's own block of the stacked keys
(``sim.engine._Stack``): the same float64 keys, so the same positions as
numpy's searchsorted over the whole array, whose other blocks lie entirely
below or above the key.

Three smaller walks live here for the same reason, each the same arithmetic as its
numpy or Python original (tested equal): the failure-free timeline's writer
recurrence (``sim.timeline``), LowDiff's queued writer (``sim.strategies.lowdiff_writer``) and the table
of a resumed policy's writes (``sim.nextwrites``), which a search over many settings
builds hundreds of times.

This module needs numba; ``sim.engine`` imports it on first use and keeps the
numpy loop where the import fails (the torch-free install does not need it).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .composite import UNKNOWN

__all__ = ["run", "timeline_walk", "next_writes_walk", "queued_writer_walk", "lanes_walk"]


def run(st, lanes, seg_flat: np.ndarray, u_flat: np.ndarray, d_flat: np.ndarray) -> np.ndarray:
    """Totals of ``lanes`` (``sim.engine._Lanes``, fresh) over every segment of each."""
    n = len(lanes.off)
    tables = st.stale_tables()
    if tables is None:
        stale_last = restarted = np.zeros((0, 0), dtype=np.int64)
        weights = np.zeros(0)
    else:
        stale_last, restarted, weights = tables
        restarted = np.ascontiguousarray(restarted)
        weights = np.ascontiguousarray(weights, dtype=np.float64)
    out = np.zeros((10, n))
    _lanes(lanes.off, lanes.key, lanes.end, lanes.job_s, lanes.prob, lanes.seg_off, lanes.count,
           lanes.ready_hi, lanes.commit_lo, lanes.commit_hi, lanes.backup_lo, lanes.backup_hi,
           seg_flat, u_flat, d_flat, st.ready_key, st.resume, st.work, st.checkpoints, st.written,
           st.skip_at, st.wait_skip, st.job_end, st.recover, st.recover_backup,
           st.commit_key, st.commit_pos, st.backup_key, st.backup_pos, st.backup_after_skip_key,
           stale_last, restarted, weights, lanes.has_stale, out)
    return out


@njit(cache=True, inline="always")
def _right(a, lo, hi, x):
    """numpy's searchsorted(a, x, side='right') within a[lo:hi] (ascending): the first
    index i in [lo, hi) with a[i] > x, else hi."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _lanes(off_a, key_a, end_a, job_a, prob_a, seg_off_a, count_a, ready_hi_a, commit_lo_a,
           commit_hi_a, backup_lo_a, backup_hi_a, seg_flat, u_flat, d_flat, ready_key, resume, work,
           checkpoints, written, skip_at, wait_skip, job_end, recover, recover_backup,
           commit_key, commit_pos, backup_key, backup_pos, backup_after_skip_key, stale_last,
           restarted, weights, has_stale, out):
    width = weights.shape[0]
    for lane in range(off_a.shape[0]):
        off, shift, end, job_s, prob = off_a[lane], key_a[lane], end_a[lane], job_a[lane], prob_a[lane]
        seg0, count = seg_off_a[lane], count_a[lane]
        pos, backup, pending, base = 0, 0, 0.0, 0.0
        useful_t = stale_t = stall_t = lost_t = rec_t = fail_t = bytes_t = events_t = 0.0
        jobs_t = rolled_t = 0.0
        for k in range(count + 1):
            # the numpy loop's advance(), one lane: same expressions, same order
            g = seg_flat[seg0 + k]
            fail = count > k
            j = pos
            rec = min(g, pending)
            tau = g - rec
            gj = off + j
            first_end = job_end[gj]
            finish = tau >= first_end
            if finish:
                left = tau - first_end
                whole = np.floor(left / job_s)
                left = max(left - whole * job_s, 0.0)
                work_job = work[end] - work[off]
                rest = work[end] - work[gj]
                useful = rest + whole * work_job
                stall = (first_end - rest) + whole * (job_s - work_job)
                ck = (checkpoints[end] - checkpoints[gj]) \
                    + whole * (checkpoints[end] - checkpoints[off])
                nbytes = (written[end] - written[gj]) + whole * (written[end] - written[off])
                js, gs = 0, off
            else:
                left, whole, js, gs = tau, 0.0, j, gj
                useful = stall = ck = nbytes = 0.0
            at = resume[gs] + left
            p = at + wait_skip[gs] if at > skip_at[gs] else at
            key = p + shift
            reached = _right(ready_key, off, ready_hi_a[lane], key) - 1
            done = work[reached] - work[gs] + max(p - resume[reached], 0.0)
            # _commit: the newest durable position, what recovering from it costs
            cp = max(commit_pos[_right(commit_key, commit_lo_a[lane], commit_hi_a[lane], key) - 1], js)
            # until a backup of the resume's first persist or later is durable, the
            # newest is of a step before it, on the unshifted clock
            b_key = key if key >= backup_after_skip_key[gs] else at + shift
            look = backup_pos[_right(backup_key, backup_lo_a[lane], backup_hi_a[lane], b_key) - 1]
            if look > js:
                cb = look
            elif finish:
                cb = 0
            else:
                cb = backup
            lost_primary = u_flat[seg0 + k] < prob
            c = cb if lost_primary else max(cp, cb)
            from_backup = lost_primary or cb > cp
            recover_next = recover_backup[off + c] if from_backup else recover[off + c]
            if fail:
                kept = work[off + c] - work[gs]
                if has_stale[lane]:
                    low = min(js, c)
                    dot = 0.0
                    # low == c: every layer's copy is at c or was restored there, each
                    # term 0.0 (a failure before any new commit): the sum is 0.0 unsummed
                    for layer in range(width if low != c else 0):
                        # sim.composite's Composite.since, one layer: after a restore of
                        # low > 0 the resumed run's writes, walked one by one up to c
                        if low > 0 and restarted[off + low, layer] != UNKNOWN:
                            since = low
                            while restarted[off + since, layer] <= c:
                                since = restarted[off + since, layer]
                        else:
                            since = max(stale_last[off + c, layer], low)
                        dot += (work[off + c] - work[off + since]) * weights[layer]
                    stale_t += dot
                rolled_t += (reached - off) - c
            else:
                kept = done
            useful_t += useful + kept
            lost_t += done - kept
            stall_t += stall + left - done
            rec_t += rec
            fail_t += fail
            jobs_t += finish + whole
            bytes_t += nbytes + written[reached] - written[gs]
            recovered = pending > 0 and g >= pending
            events_t += (int(fail) + int(recovered)) + ck + finish + whole \
                + checkpoints[reached] - checkpoints[gs]
            trained = g >= pending
            if fail:
                pos = c
                backup = cb
                # a failure during recovery repeats it, unless it also forced a deeper
                # rollback; either way after this failure's own downtime
                if trained or c != j:
                    base = recover_next
                pending = base + d_flat[seg0 + k]
        out[0, lane] = useful_t
        out[1, lane] = stale_t
        out[2, lane] = stall_t
        out[3, lane] = lost_t
        out[4, lane] = rec_t
        out[5, lane] = fail_t
        out[6, lane] = bytes_t
        out[7, lane] = events_t
        out[8, lane] = jobs_t
        out[9, lane] = rolled_t


@njit(cache=True)
def timeline_walk(compute, snap, persist):
    """``sim.timeline._walk``'s writer recurrence, the same float64 additions in order:
    ready, resume, wait and durable per position."""
    n = compute.shape[0] - 1
    ready = np.zeros(n + 1)
    resume = np.zeros(n + 1)
    wait = np.zeros(n + 1)
    durable = np.zeros(n + 1)
    t = 0.0
    writer_free = 0.0
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


@njit(cache=True)
def next_writes_walk(drift, thresholds, smax, interval, only_smax):
    """``layercheck.contract.resumed.next_writes``'s table, entry by entry: the drift of
    steps s+1..t summed left to right from 0.0 in float64 and compared with the same
    threshold, stopping at the write (``sim.nextwrites``). ``drift`` and ``thresholds``
    layer-major (layers x steps, each layer's steps contiguous); the table is steps + 1
    x layers. Opportunities (t a multiple of ``interval``) are counted, not divided."""
    layers, steps = drift.shape
    out = np.full((steps + 1, layers), steps + 1, dtype=np.int64)
    for layer in range(layers):
        row, limit = drift[layer], thresholds[layer]
        for s in range(steps + 1):
            if only_smax[layer]:
                t = s + smax + (-(s + smax)) % interval
                if t <= steps:
                    out[s, layer] = t
                continue
            acc = 0.0
            phase = (s + 1) % interval          # t % interval, for t = s + 1 on
            for t in range(s + 1, steps + 1):
                acc += row[t - 1]
                if phase == 0 and (t - s >= smax or acc >= limit[t - 1]):
                    out[s, layer] = t
                    break
                phase += 1
                if phase == interval:
                    phase = 0
    return out


@njit(cache=True)
def queued_writer_walk(compute, snap, write, full, full_s, slots):
    """``sim.strategies.lowdiff_writer.queued_writer``'s walk (``slots`` < 0: unbounded), its FIFO an array
    with a head index: the same float64 operations in order."""
    n = compute.shape[0]
    out = np.full(n + 1, np.nan)
    pending = np.empty(n + 1)
    head = 0
    tail = 0
    t = 0.0
    free = 0.0
    most = 0
    for i in range(1, n + 1):
        t += compute[i - 1]
        stall = 0.0
        if full[i]:
            stall = max(free - t, 0.0) + full_s
            free = t + stall
        stall += snap[i]
        end = t + stall
        if write[i] > 0:
            while tail > head and pending[head] <= end:
                head += 1
            if slots >= 0 and tail - head >= slots:
                wait = pending[tail - slots] - end
                stall = stall + wait
                end = end + wait
                while tail > head and pending[head] <= end:
                    head += 1
            free = max(free, end) + write[i]
            pending[tail] = free
            tail += 1
            most = max(most, tail - head)
            out[i] = free - end
        snap[i] = stall
        t = end
    return out, most


@njit(cache=True)
def lanes_walk(drift, lr_ratio, layer, base, smax, interval, base_step, scaled, reasons):
    """``layercheck.contract.lanes``' walk for lanes without a write budget, one lane at a
    time (``sim.frontier``): ``drift`` layer-major (layers x steps), per lane its layer,
    threshold, Smax, interval, base step and LR scaling; fills ``reasons`` (steps x lanes,
    ``NO_WRITE`` on entry) with 0 (base), 1 (threshold) or 2 (Smax) where the lane writes.
    The same float64 sums and products per step as the numpy walk (tested equal)."""
    steps = drift.shape[1]
    for lane in range(base.shape[0]):
        row, b, every, limit = drift[layer[lane]], base[lane], interval[lane], smax[lane]
        infinite, first = np.isinf(b), base_step[lane]
        acc = 0.0
        due = limit
        started = False
        for t in range(1, steps + 1):
            acc += row[t - 1]
            ratio = lr_ratio[t - 1]
            k = b * ratio if scaled[lane] else b
            if infinite and not ratio > 0:
                k = np.inf                      # inf * 0 -> nan: an infinite K stays infinite
            by_drift = acc >= k
            write = (by_drift or due <= t) and t % every == 0 and started
            if t == first:
                write = True
                started = True
            if write:
                reasons[t - 1, lane] = 1 if by_drift else 2
                acc = 0.0
                due = t + limit
        if first <= steps:
            reasons[first - 1, lane] = 0
