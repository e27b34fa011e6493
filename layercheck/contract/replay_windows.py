"""The general exact method of ``layercheck.contract.fastreplay``: windowed tables.

Used for any input (negative, NaN or infinite drift included) and as the
fallback of the certified method. Steps after the base checkpoint are cut
into windows of ``w`` steps. For every window, layer and position ``i`` the
exact accumulator "had the layer last been written at ``i``" is a masked
cumulative sum; from it ``next[i]``, the next write inside the window, is one
``argmax`` (all windows at once). Following ``next`` from a window's first
write gives all its writes (a bit mask built right to left). Only each
window's first write, which depends on the running sum carried in from the
previous window, is found window by window.
"""
from __future__ import annotations

import numpy as np

from .policy import Policy, Reason

__all__ = ["windowed"]

_NEVER = 1 << 60  # a deadline past any run (positions in windows stay far below it)


def windowed(policy: Policy, drift: np.ndarray, lr_ratio: np.ndarray, base: int,
                w: int, reasons: np.ndarray) -> None:
    """Fill ``reasons`` for steps base+1..T (all layers were written at ``base``)."""
    num_steps, num_layers = drift.shape
    n = num_steps - base
    chunks = -(-n // w)
    pad = chunks * w - n
    steps = np.arange(base + 1, base + 1 + chunks * w).reshape(chunks, w)
    opp = (steps % policy.interval == 0) & (steps <= num_steps)
    # NaN where a step is no opportunity: ``acc >= nan`` is False even for acc = inf.
    k = np.pad(policy.thresholds(lr_ratio[base:]), ((0, pad), (0, 0)))
    k = np.where(opp.reshape(-1, 1), k, np.nan)
    # Chunk, layer, position: the cumulative sums run along the last (contiguous) axis.
    d = np.pad(drift[base:], ((0, pad), (0, 0))).reshape(chunks, w, num_layers)
    d = np.ascontiguousarray(d.transpose(0, 2, 1))
    k = np.ascontiguousarray(k.reshape(chunks, w, num_layers).transpose(0, 2, 1))
    deadline = _deadlines(steps, policy, num_steps)
    nxt, why, tail = _window_tables(d, k, steps, deadline, policy.smax)
    bits, last = _paths(nxt, w)
    entry, entry_why = _entries(d, k, steps, bits, last, tail, base, policy, num_steps)
    _emit(reasons, base, why, bits, entry, entry_why, w)


def _deadlines(steps: np.ndarray, policy: Policy, num_steps: int) -> np.ndarray:
    """For a write at each step: the opportunity at which Smax forces the next
    one (a step past the run where that is beyond its end)."""
    k = policy.interval
    due = -(-(steps + policy.smax) // k) * k
    return np.where(due <= num_steps, due, _NEVER)


def _window_tables(d: np.ndarray, k: np.ndarray, steps: np.ndarray, deadline: np.ndarray,
                   smax: int):
    """For every chunk c, layer l and position i: ``nxt[c, l, i]``, the position
    of the next write had l been written at i (``w``: none in this window),
    ``why`` its reason, and ``tail[c, l, i]``, the exact accumulator at the
    window's end had l last been written at i."""
    chunks, layers, w = d.shape
    nxt = np.full((chunks, layers, w), w, dtype=np.int64)
    why = np.full((chunks, layers, w), Reason.THRESHOLD, dtype=np.int8)
    tail = np.zeros((chunks, layers, w), dtype=np.float64)
    # Position of each row's Smax deadline inside its window (w or more: beyond it).
    forced = deadline - steps[:, :1]
    for i in range(w - 1):
        # 0.0 + d[i+1] + ... + d[j], summed left to right as the policy sums.
        acc = np.cumsum(d[:, :, i + 1:], axis=-1)
        by_drift = acc >= k[:, :, i + 1:]
        at = np.where(by_drift.any(axis=-1), by_drift.argmax(axis=-1) + (i + 1), w)
        age_at = forced[:, i:i + 1]
        np.minimum(at, age_at, out=nxt[:, :, i])
        why[:, :, i] = np.where(at <= age_at, Reason.THRESHOLD, Reason.SMAX)
        tail[:, :, i] = acc[..., -1]
    return nxt, why, tail


def _paths(nxt: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """``bits[..., i]``: the positions written from a write at i on (bit p set for
    position p); ``last[..., i]``: the last of them."""
    rows = nxt.reshape(-1, w)
    n = len(rows)
    flat = np.arange(n)[:, None] * (w + 1)
    bits = np.zeros((n, w + 1), dtype=np.int64)   # column w: "no further write"
    last = np.zeros((n, w + 1), dtype=np.int64)
    bits_flat, last_flat = bits.reshape(-1), last.reshape(-1)
    for i in range(w - 1, -1, -1):
        j = rows[:, i]
        target = flat[:, 0] + j
        bits[:, i] = bits_flat.take(target) | (np.int64(1) << i)
        last[:, i] = np.where(j < w, last_flat.take(target), i)
    return bits[:, :w].reshape(nxt.shape), last[:, :w].reshape(nxt.shape)


def _entries(d, k, steps, bits, last, tail, base: int, policy: Policy, num_steps: int):
    """Walk the windows in order: the first write of each window depends on the
    accumulator carried in, so this part is sequential (one small step per window)."""
    chunks, layers, w = d.shape
    interval, smax = policy.interval, policy.smax
    never = _NEVER
    buf = np.zeros((layers, w + 1), dtype=np.float64)
    acc = np.empty_like(buf)
    hit = np.empty((layers, w), dtype=bool)
    due = np.full(layers, _deadlines(np.array([base]), policy, num_steps)[0], dtype=np.int64)
    entry = np.full((chunks, layers), w, dtype=np.int64)
    entry_why = np.full((chunks, layers), Reason.THRESHOLD, dtype=np.int8)
    row_at = np.arange(layers) * w
    for c in range(chunks):
        # [carry, d...] summed left to right continues the running sum exactly.
        buf[:, 1:] = d[c]
        np.cumsum(buf, axis=1, out=acc)
        np.greater_equal(acc[:, 1:], k[c], out=hit)
        at = np.where(hit.any(axis=1), hit.argmax(axis=1), w)
        age_at = due - steps[c, 0]
        pos = np.minimum(at, age_at)
        found = pos < w
        if not found.any():
            buf[:, 0] = acc[:, -1]
            continue
        entry[c] = np.where(found, pos, w)
        entry_why[c] = np.where(at <= age_at, Reason.THRESHOLD, Reason.SMAX)
        end = last[c].reshape(-1).take(row_at + np.minimum(pos, w - 1))
        buf[:, 0] = np.where(found, tail[c].reshape(-1).take(row_at + end), acc[:, -1])
        written = steps[c, 0] + end
        nxt_due = -(-(written + smax) // interval) * interval
        due = np.where(found, np.where(nxt_due <= num_steps, nxt_due, never), due)
    return entry, entry_why


def _emit(reasons, base, why, bits, entry, entry_why, w) -> None:
    """Turn each window's entry write and ``bits`` into rows of ``reasons``."""
    cc, ll = np.nonzero(entry < w)
    mask = bits[cc, ll, entry[cc, ll]]
    written = ((mask[:, None] >> np.arange(w)) & 1).astype(bool)        # [hit, position]
    # A write's reason comes from its predecessor in the window (or is the entry's).
    pos = np.where(written, np.arange(w), -1)
    prev = np.maximum.accumulate(pos, axis=1)
    prev = np.concatenate([np.full((len(cc), 1), -1), prev[:, :-1]], axis=1)
    pred_why = why[cc, ll][np.arange(len(cc))[:, None], np.maximum(prev, 0)]
    is_entry = np.arange(w)[None, :] == entry[cc, ll][:, None]
    reason = np.where(is_entry, entry_why[cc, ll][:, None], pred_why)
    hit, p = np.nonzero(written)
    reasons[base + cc[hit] * w + p, ll[hit]] = reason[hit, p]
