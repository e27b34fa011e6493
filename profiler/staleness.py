"""Where a drill strikes: the stalest steps of a run's checkpoint.

Staleness itself has one definition, ``layercheck.contract.trace.weighted_staleness``
(``Trace.weighted_staleness``): S(t) = sum_l params_l * (t - newest write of
l at or before t) / sum_l params_l, NaN before the base checkpoint. It is
re-exported here for the drill's callers.
"""
from __future__ import annotations

import numpy as np

from layercheck.contract.trace import weighted_staleness

__all__ = ["weighted_staleness", "failure_steps"]


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
