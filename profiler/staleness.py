"""Parameter-weighted staleness of a run's checkpoint, and where a drill strikes.

Staleness of layer l at step t is t minus the step of its newest write at or
before t (writes at t count: the failure strikes after them). Weighted by
parameters, S(t) = sum_l params_l * staleness_l(t) / sum_l params_l: the
average age, in steps, of a parameter that a recovery at t would load. It is
defined from the base checkpoint on (NaN before). Pure numpy.
"""
from __future__ import annotations

import numpy as np

__all__ = ["weighted_staleness", "failure_steps"]


def weighted_staleness(written: np.ndarray, params: np.ndarray) -> np.ndarray:
    """S(t) for t = 1..T from a steps x layers boolean write matrix."""
    written = np.asarray(written, dtype=bool)
    steps = np.arange(1, written.shape[0] + 1)
    last = np.maximum.accumulate(np.where(written, steps[:, None], 0), axis=0)
    weights = np.asarray(params, dtype=np.float64) / float(np.sum(params))
    out = ((steps[:, None] - last) * weights).sum(axis=1)
    return np.where((last > 0).all(axis=1), out, np.nan)


def failure_steps(staleness: np.ndarray, failures: int) -> list[int]:
    """Steps (1-based) to fail at: the steps from the base checkpoint to T-1
    (a failure must leave a step to resume) cut into ``failures`` equal
    windows, in each the first step of highest staleness."""
    defined = np.flatnonzero(~np.isnan(staleness[:-1]))
    if len(defined) < failures:
        raise ValueError(f"{failures} failures need {failures} steps after the base checkpoint "
                         f"and before the last step; the run has {len(defined)}")
    windows = np.array_split(defined, failures)
    return [int(w[np.argmax(staleness[w])]) + 1 for w in windows]
