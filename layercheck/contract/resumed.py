"""What the policy writes after a restore: each layer's next write from any step it was reset at.

A restore of step j begins a new timeline (``LayerCheck.restore``): every layer
equals its copy, so the policy continues from ``PolicyState.at(policy, j,
base_taken=True)``: every accumulator at 0, every layer counted as written at
j. Its writes from there are not the uninterrupted run's: a layer whose
accumulator was half full at j, or whose copy was old, waits a whole threshold
(or Smax) again. The simulator needs them to price a second recovery: the
layers it loads are those written since the first, and a layer that was not
rewritten discards everything since j.

Without a write budget a layer's decisions depend on its own drift, threshold,
Smax and the opportunities alone, so one table holds every resumed run:
``next_writes(...)[s, l]`` is the step at which layer l is next written when its
accumulator was reset at step s (a write, or the restore), and following it
from j gives the layer's writes after a restore of j
(``tests/layercheck/contract/test_resumed.py`` checks this against the policy
replayed from ``PolicyState.at``). A write budget couples the layers (one
account, restarted at a restore); the table then takes the budget's factor
the recorded run had at each step (``k_scale``): an approximation of a
budgeted run's resumed writes, not their replay.
"""
from __future__ import annotations

import numpy as np

from .policy import Policy
from .replayed import run_arrays

__all__ = ["next_writes"]


def next_writes(policy: Policy, drift: np.ndarray, lr_ratio: np.ndarray,
                k_scale: np.ndarray | None = None) -> np.ndarray:
    """(T+1) x layers, int64: row s, layer l: the first opportunity t > s at which the
    policy writes layer l after its accumulator was reset at step s (``A_l >= K_l(t)``,
    ``A_l`` the drift of steps s+1..t summed left to right from 0.0 as the policy sums
    it, or ``t - s >= smax``); T + 1 where the run of ``drift`` (T steps x layers) ends
    first. ``lr_ratio`` (T) and ``k_scale`` (T, default 1) scale the thresholds as
    ``Policy.thresholds`` does. Costs one pass over the table per step of the
    longest wait between writes (at most ``smax + interval - 1`` steps)."""
    drift, ratio = run_arrays(policy.num_layers, drift, lr_ratio)
    steps = drift.shape[0]
    scale = np.ones(steps) if k_scale is None else np.asarray(k_scale, dtype=np.float64)
    if scale.shape != (steps,):
        raise ValueError(f"k_scale must hold one value per step ({steps}), got shape {scale.shape}")
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, inf * 0: the policy's NaN
        thresholds = policy.thresholds(ratio, scale)
        return _walk(policy, drift, thresholds)


def _walk(policy: Policy, drift: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    steps = drift.shape[0]
    out = np.full((steps + 1, policy.num_layers), steps + 1, dtype=np.int64)
    open_ = np.ones(out.shape, dtype=bool)     # reset at s, not yet written
    acc = np.zeros(out.shape)
    start = np.arange(steps + 1)
    for wait in range(1, steps + 1):
        rows = steps + 1 - wait                # resets at s = 0 .. T - wait reach step s + wait
        live = open_[:rows]
        if not live.any():
            break
        t = start[:rows] + wait
        acc[:rows] += drift[t - 1]
        if wait < policy.smax:
            written = acc[:rows] >= thresholds[t - 1]
        else:
            written = np.ones((rows, policy.num_layers), dtype=bool)
        written &= live & (t % policy.interval == 0)[:, None]
        out[:rows][written] = np.broadcast_to(t[:, None], written.shape)[written]
        live &= ~written
    return out
