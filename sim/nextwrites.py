"""What the policy writes after a restore (``layercheck.contract.resumed.next_writes``),
by the compiled walk where it is loaded.

The fair comparison re-decides every LayerCheck setting it simulates, and each needs
the table of its resumed runs' writes. The contract's walk takes one numpy pass over
the whole (steps + 1) x layers table per step of the longest wait, about 0.2 s for a
setting whose Smax is 1,000 on the 7B preset; ``sim.kernel.next_writes_walk`` runs each
entry's own loop in machine code and stops at its write. Same numbers: each entry sums
its drift left to right from 0.0 in float64 and compares it with the same threshold, as
the contract's walk does element by element (``tests/sim/test_nextwrites.py`` checks the
two equal, NaN and inf included). Without numba, or before anything loaded it (a
single table does not pay for the import), the contract's walk runs.
"""
from __future__ import annotations

import sys

import numpy as np

from layercheck.contract.replayed import run_arrays
from layercheck.contract.resumed import next_writes as contract_next_writes
from layercheck.contract.policy import Policy

__all__ = ["next_writes"]


def next_writes(policy: Policy, drift: np.ndarray, lr_ratio: np.ndarray,
                k_scale: np.ndarray | None = None) -> np.ndarray:
    """``layercheck.contract.resumed.next_writes``, the same table (module doc)."""
    kernel = sys.modules.get(f"{__package__}.kernel")    # loaded by the engine, never here
    if kernel is None:
        return contract_next_writes(policy, drift, lr_ratio, k_scale)
    drift, ratio = run_arrays(policy.num_layers, drift, lr_ratio)
    scale = np.ones(drift.shape[0]) if k_scale is None else np.asarray(k_scale, dtype=np.float64)
    if scale.shape != (drift.shape[0],):
        raise ValueError(f"k_scale must hold one value per step ({drift.shape[0]}), got shape "
                         f"{scale.shape}")
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, inf * 0: the policy's NaN
        thresholds = np.asarray(policy.thresholds(ratio, scale), dtype=np.float64)
        # a layer whose threshold is never finite and whose drift cannot sum to inf writes
        # only at Smax: its waits need no sums (the walk's own answer, without them)
        only_smax = np.isposinf(thresholds).all(axis=0) & np.isfinite(drift).all(axis=0) \
            & (np.abs(drift).sum(axis=0) < 1e300)
    thresholds = np.broadcast_to(thresholds, drift.shape)
    return kernel.next_writes_walk(np.ascontiguousarray(drift.T), np.ascontiguousarray(thresholds.T),
                                   int(policy.smax), int(policy.interval), only_smax)
