"""The decisions of a whole replayed run, as one steps x layers array.

What ``layercheck.contract.fastreplay`` (one setting) and ``layercheck.contract.lanes`` (many
settings at once) both return, so that neither imports the other for it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .policy import Reason

__all__ = ["NO_WRITE", "REPLAYED_REASONS", "Replayed", "run_arrays"]

NO_WRITE = -1
"""``Replayed.reasons`` value where a layer is not written at a step."""
REPLAYED_REASONS = (Reason.BASE, Reason.THRESHOLD, Reason.SMAX)
"""The reasons a replay decides (``Reason.RETRY`` follows failed writes, which
a replay has none of)."""
_LABELS = np.array([reason.label for reason in Reason], dtype=object)


def run_arrays(num_layers: int, drift: np.ndarray, lr_ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A replay's inputs as float64, checked: ``drift`` steps x ``num_layers``, ``lr_ratio``
    one value per step; ValueError that says which is wrong."""
    drift = np.asarray(drift, dtype=np.float64)
    lr_ratio = np.asarray(lr_ratio, dtype=np.float64)
    if drift.ndim != 2 or drift.shape[1] != num_layers:
        raise ValueError(f"drift must be steps x {num_layers} layers, got {drift.shape}")
    if lr_ratio.shape != (drift.shape[0],):
        raise ValueError(f"lr_ratio must hold one value per step ({drift.shape[0]}), "
                         f"got shape {lr_ratio.shape}")
    return drift, lr_ratio


@dataclass(frozen=True, kw_only=True)
class Replayed:
    """The decisions of a whole run.

    ``reasons[t-1, l]`` is ``NO_WRITE`` (-1) or a ``layercheck.contract.policy.Reason``
    value: the same as ``Decision.reasons`` of the reference replay, laid out
    as steps x layers.
    ``method`` says which method produced it.
    """

    reasons: np.ndarray
    method: str = "certified"
    k_scale: np.ndarray | None = None
    """Per step, the write budget's factor on every threshold (``Decision.k_scale``);
    None without a budget (then 1 throughout)."""

    @property
    def writes(self) -> np.ndarray:
        """Boolean steps x layers: True where the layer is written."""
        return self.reasons != NO_WRITE

    def labels(self, step: np.ndarray, layer: np.ndarray) -> np.ndarray:
        """The reason labels ('base', 'threshold', 'smax') of the writes at rows
        ``step`` (0-based) and columns ``layer``."""
        return _LABELS[self.reasons[step, layer]]

    def decisions(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """``(step, layers, reasons)`` for every step, as ``Decision`` fields (for tests)."""
        out = []
        for t, row in enumerate(self.reasons, start=1):
            layers = np.flatnonzero(row != NO_WRITE)
            out.append((t, layers, row[layers].astype(np.int64)))
        return out

    def k_scales(self) -> np.ndarray:
        """``k_scale`` per step, ones without a budget."""
        return np.ones(len(self.reasons)) if self.k_scale is None else self.k_scale
