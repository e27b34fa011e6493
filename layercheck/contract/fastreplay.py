"""A vectorised twin of ``layercheck.contract.policy.replay`` for one setting: the same decisions, fast.

The what-if view re-decides a whole run on every slider move, so the replay
must answer in well under 100 ms on a 31-layer x 10,000-step trace
(``benchmarks/bench_dashboard.py``). The reference replay walks the run step
by step in Python; this twin does the arithmetic on whole arrays. Torch-free,
next to the policy, so that the dashboard and the simulator's tuner
(``sim.frontier``) share it; ``layercheck.contract.lanes`` replays many settings at once.

Exactness is the contract: ``fast_replay`` returns, for every input, the
decisions ``layercheck.contract.policy.replay`` makes (``tests/layercheck/
test_fastreplay.py`` checks it on many random runs). The policy compares a
running float64 sum ``A_l`` (reset to 0.0 at a write, one step's drift added
at a time) with ``K_l(t) = base_l * lr(t) / lr_peak``. Two methods:

``certified`` (the fast one, for finite drift >= 0, as the policy's drift is).
Per layer, one cumulative sum ``G`` gives ``A`` approximately as
``G[t] - G[last write]``. With the threshold folded in, "the next write after
a write at q" is one ``searchsorted`` for every q at once, and following it
from the base checkpoint gives candidate writes. Then every decision of the
candidate is checked: where ``|G[t] - G[q] - K|`` exceeds a rigorous bound on
the rounding error (``_ROUNDING``), the approximate comparison *is* the exact
one; the rare steps within the bound get the exact running sum, summed left to
right as the policy sums. A candidate that passes every check is the
reference's answer (by induction over steps: each decision is the policy's,
given the earlier ones). One that fails falls back to:

``windowed`` (``layercheck.contract.replay_windows``): exact by construction for any
input (NaN, inf and negative drift too), slower.
"""
from __future__ import annotations

from typing import Literal

import numpy as np

from .lanes import replay_many
from .policy import Policy, Reason
from .replay_windows import windowed
from .replayed import NO_WRITE, Replayed, run_arrays

__all__ = ["base_step", "fast_replay"]

_U = np.finfo(np.float64).eps / 2
_ROUNDING = 4.0
"""Error bound factor: |approx - exact| <= _ROUNDING * (T + 2) * u * G[t]. The
sums are of at most T non-negative terms, each rounded once (a relative error
of at most u), so (3T + 2) u G bounds it; 4 leaves margin."""
_MAX_EXACT = 4_000_000  # elements of exact re-summing before the windowed method is cheaper


def base_step(policy: Policy, num_steps: int) -> int | None:
    """``policy.base_step``, or None when a run of ``num_steps`` ends before it."""
    return policy.base_step if policy.base_step <= num_steps else None


def fast_replay(policy: Policy, drift: np.ndarray, lr_ratio: np.ndarray, *,
                method: Literal["auto", "certified", "windowed"] = "auto",
                window: int = 16) -> Replayed:
    """Decide every step of a run exactly as ``layercheck.contract.policy.replay`` does.

    ``drift[t-1, l]`` is d_l(t) and ``lr_ratio[t-1]`` is lr(t) / lr_peak for
    steps t = 1..T (the reference's arguments). ``method="auto"`` tries the
    certified method and falls back to the windowed one; naming a method is for
    tests and benchmarks (``certified`` still falls back when it cannot certify).
    ``window`` (1..62) tunes the windowed method; it never changes the answer.
    A policy with a write budget is replayed by ``layercheck.contract.lanes`` (its
    thresholds depend on the writes before, so the steps are walked); ``method``
    is then ``lanes``.
    """
    drift, lr_ratio = run_arrays(policy.num_layers, drift, lr_ratio)
    drift = np.ascontiguousarray(drift)
    if method not in ("auto", "certified", "windowed"):
        raise ValueError(f"method={method!r}: use 'auto', 'certified' or 'windowed'")
    if not 1 <= window <= 62:
        raise ValueError(f"window={window} must be in 1..62 (window positions are bits of an int64)")
    if policy.write_budget is not None:
        return replay_many([policy], drift, lr_ratio).replayed(0)
    num_steps, num_layers = drift.shape
    reasons = np.full((num_steps, num_layers), NO_WRITE, dtype=np.int8)
    base = base_step(policy, num_steps)
    if base is None:
        return Replayed(reasons=reasons, method=method)
    reasons[base - 1] = Reason.BASE
    if base == num_steps:
        return Replayed(reasons=reasons, method=method)
    if method != "windowed":
        after = _certified(policy, drift[base:], lr_ratio[base:], base)
        if after is not None:
            reasons[base:] = after
            return Replayed(reasons=reasons, method="certified")
    windowed(policy, drift, lr_ratio, base, window, reasons)
    return Replayed(reasons=reasons, method="windowed")


def _certified(policy: Policy, d: np.ndarray, lr_ratio: np.ndarray, base: int) -> np.ndarray | None:
    """Reasons for steps base+1..T, or None when this method cannot certify them.

    Positions p = 0..n stand for steps base+p; every layer was written at p = 0.
    Arrays are layer-major (layers x positions): each layer's row is contiguous.
    """
    if not (np.isfinite(d).all() and (d >= 0).all()):
        return None
    d = np.ascontiguousarray(d.T)
    layers, n = d.shape
    g = np.zeros((layers, n + 1))
    np.cumsum(d, axis=1, out=g[:, 1:])
    if not np.isfinite(g[:, -1]).all():
        return None
    k = np.ascontiguousarray(policy.thresholds(lr_ratio).T)
    steps = np.arange(base + 1, base + n + 1)
    opp = steps % policy.interval == 0
    writes = _candidate(policy, g, k, opp, base)
    reasons = _verify(policy, d, g, k, opp, writes)
    return None if reasons is None else reasons.T


def _candidate(policy: Policy, g: np.ndarray, k: np.ndarray, opp: np.ndarray, base: int) -> np.ndarray:
    """Writes (layers x positions 1..n) by the approximate rule ``G[p] - K[p] >=
    G[q]``: after a write at q the next is the first opportunity p > q meeting
    it, or the Smax deadline if sooner."""
    layers, n = k.shape
    with np.errstate(invalid="ignore"):
        h = g[:, 1:] - k
    h[np.isnan(h) | ~opp] = -np.inf
    reach = np.maximum.accumulate(h, axis=1)  # non-decreasing: searchsorted applies
    q = np.arange(n + 1)
    interval = policy.interval

    def next_opp(p: np.ndarray) -> np.ndarray:
        return -(-(base + p) // interval) * interval - base

    deadline = np.minimum(next_opp(q + policy.smax), n + 1)
    later = q + 1
    writes = np.zeros((layers, n), dtype=bool)
    for layer in range(layers):
        # The first position whose running max reaches G[q]. It is before q+1 only
        # where a threshold is <= 0 or G is flat; then the next opportunity is the answer.
        first = reach[layer].searchsorted(g[layer], side="left") + 1
        by_drift = np.where(first <= n, next_opp(np.maximum(first, later)), n + 1)
        nxt = np.minimum(by_drift, deadline).tolist()
        p, column = 0, []
        while True:
            p = nxt[p]
            if p > n:
                break
            column.append(p - 1)
        writes[layer, column] = True
    return writes


def _verify(policy: Policy, d: np.ndarray, g: np.ndarray, k: np.ndarray, opp: np.ndarray,
            writes: np.ndarray) -> np.ndarray | None:
    """The candidate's reasons (layers x positions) if every decision is the
    policy's, else None."""
    layers, n = writes.shape
    pos = np.arange(1, n + 1)
    last = np.maximum.accumulate(np.where(writes, pos, 0), axis=1)
    prev = np.zeros_like(last)            # q(p): the write before position p
    prev[:, 1:] = last[:, :-1]
    row = (np.arange(layers) * (n + 1))[:, None]
    with np.errstate(invalid="ignore"):
        diff = (g[:, 1:] - g.reshape(-1).take(prev + row)) - k
        bound = (_ROUNDING * (n + 3) * _U) * g[:, 1:]
        # The exact sum is >= 0 (terms >= 0): a threshold <= 0 is always reached.
        by_drift = (diff >= bound) | (k <= 0)
        unsure = (np.abs(diff) < bound) & (k > 0) & opp
    if unsure.any():
        exact = _exact_sums(d, prev, unsure)
        if exact is None:
            return None
        by_drift[unsure] = exact >= k[unsure]
    want = (by_drift | ((pos - prev) >= policy.smax)) & opp
    if not np.array_equal(want, writes):
        return None
    reasons = np.full(writes.shape, NO_WRITE, dtype=np.int8)
    reasons[writes] = np.where(by_drift[writes], Reason.THRESHOLD, Reason.SMAX)
    return reasons


def _exact_sums(d: np.ndarray, prev: np.ndarray, where: np.ndarray) -> np.ndarray | None:
    """The policy's running sum at each True of ``where`` (layers x positions):
    d[q+1] + ... + d[p] left to right from 0.0, q = prev[p]; None if too much work."""
    layer, p = np.nonzero(where)
    p = p + 1
    q = prev[layer, p - 1]
    width = int((p - q).max())
    if len(p) * width > _MAX_EXACT:
        return None
    cols = q[:, None] + np.arange(width)         # position q+1+i lives in column q+i
    terms = np.where(cols < p[:, None], d[layer[:, None], np.minimum(cols, d.shape[1] - 1)], 0.0)
    # Zeros pad the end, after the last term: they do not change the sum's rounding.
    return np.cumsum(terms, axis=1)[:, -1]
