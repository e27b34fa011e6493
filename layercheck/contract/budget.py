"""The write budget: a controller that scales every threshold to keep the bytes written
per step at a target. Pure, deterministic, torch-free.

``LayerCheckConfig(write_budget=B)`` asks for at most B bytes per optimizer step
on average, counted from the base checkpoint on (the base itself, one full
write, is not counted: every run writes it once whatever the budget). The
thresholds become

    K_l(t) = base_l * lr(t) / lr_peak * scale(level)

with one integer ``level`` per run, ``scale(level) = 2 ** (level / 8)``
(``STEPS_PER_DOUBLING``), level 0 at the base checkpoint. After each
opportunity's writes the run's account is settled:

    debt = spent - B * (t - base_step)      spent: bytes written after the base, through t
    level += 1 if debt > 0 else -1          clamped to [-MAX_LEVEL, MAX_LEVEL]

Over budget, thresholds rise by 9% per opportunity until writes stop; under
it they fall until layers that have drifted write again. The ``smax`` guard
is untouched: forced writes count against the budget but still happen, so
staleness stays bounded and a budget below what ``smax`` alone forces
(about the full checkpoint's bytes / smax per step) cannot be met (the level
then sits at ``MAX_LEVEL``).

Why this rule: every quantity is an exact integer or one IEEE operation
(``spent`` sums integer byte counts; ``B * (t - base)`` is one product), so a
scalar loop (``layercheck.contract.policy``) and the vectorised replays
(``layercheck.contract.lanes``) take bit-for-bit the same decisions, and ``scale``
is a table lookup, not a ``pow`` that vector and scalar code may round
differently. Measured on the shipped traces the realised rate lands within
3% of the budget (docs/tuning.md).
"""
from __future__ import annotations

import numpy as np

__all__ = ["STEPS_PER_DOUBLING", "MAX_LEVEL", "SCALES", "scale", "next_level", "debt"]

STEPS_PER_DOUBLING = 8
"""Levels per factor 2 of the thresholds: one level is 2**(1/8), about 9%."""
MAX_LEVEL = 160
"""Thresholds move at most 2**20 (about a million) times either way."""
SCALES = 2.0 ** (np.arange(-MAX_LEVEL, MAX_LEVEL + 1) / STEPS_PER_DOUBLING)
"""``SCALES[level + MAX_LEVEL]``: the threshold factor of each level (read-only)."""
SCALES.setflags(write=False)


def scale(level: "int | np.ndarray") -> "float | np.ndarray":
    """The threshold factor of ``level`` (one level or an array of them)."""
    return SCALES[np.asarray(level) + MAX_LEVEL]


def debt(spent: "float | np.ndarray", budget: "float | np.ndarray",
         elapsed: "int | np.ndarray") -> "float | np.ndarray":
    """Bytes written beyond the budget: ``spent - budget * elapsed`` (steps since the base)."""
    return spent - budget * elapsed


def next_level(level: "int | np.ndarray", over: "float | np.ndarray") -> "int | np.ndarray":
    """The level after an opportunity whose account stands at ``over`` (``debt``)."""
    return np.clip(np.where(over > 0, level + 1, level - 1), -MAX_LEVEL, MAX_LEVEL)
