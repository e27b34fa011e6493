"""The result table: the engine's lanes (one run each) averaged into one row per key.

A key is ``(mtbf index, strategy, cadence)``: ``sim.api`` keys its lanes by MTBF and
strategy, ``sim.scale`` by strategy at one job size, ``simulate_writes`` by write
pattern. Every row carries the same columns (``COLUMNS``), whoever ran the lanes.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from layercheck.contract.calibration import Figure

from .engine import LaneResults

__all__ = ["COLUMNS", "LIMIT", "aggregate", "stale_lost", "t_quantile"]

LIMIT = "limit"
"""The strategy name of the perfect checkpointer's rows in ``sweep``."""
COLUMNS = ("strategy", "effective_ratio", "ci95", "ratio_at_phi_low", "ratio_at_phi_high",
           "useful_s", "stale_s", "stale_lost_s", "checkpoint_stall_s", "lost_work_s",
           "recovery_s", "failures", "bytes_written", "interval", "storage_interval")
"""The result columns (and the keys of every JSON row), in order. ``effective_ratio`` is
at the stale cost factor phi in force (``Scenario.stale_figure``), ``ratio_at_phi_low``
and ``ratio_at_phi_high`` at its interval's bounds, on the same lanes; ``useful_s`` is
net of ``stale_lost_s`` = phi x ``stale_s``."""


def stale_lost(res: LaneResults, phi: float) -> np.ndarray:
    """Each lane's stale time counted as lost, phi x stale_s, but never more than the
    lane's useful time: a run whose recoveries cost more steps than it trains between
    them makes no progress; it does not train backwards (phi above useful_s / stale_s,
    e.g. at a high bound)."""
    return np.minimum(phi * res.stale_s, res.useful_s)


def aggregate(res: LaneResults, keys: list, mtbfs: list, window: float,
              phi: Figure) -> pd.DataFrame:
    """One row per key (``keys[i]`` is lane i's), in the keys' first-seen order, columns
    ``mtbf_s`` + ``COLUMNS``: the mean over the key's lanes and the ratio's 95% confidence
    half-width (NaN for one lane). phi x stale_s is lost, the rest of stale_s useful; the
    ratio at phi's bounds is the same arithmetic on the same lanes (stale_s is per lane)."""
    low, high = phi.interval
    lost = stale_lost(res, phi.value)
    useful = res.useful_s - lost
    columns = {"ratio": useful / window, "useful_s": useful,
               "ratio_at_phi_low": (res.useful_s - stale_lost(res, low)) / window,
               "ratio_at_phi_high": (res.useful_s - stale_lost(res, high)) / window,
               "stale_lost_s": lost,
               **{f: getattr(res, f) for f in ("stale_s", "checkpoint_stall_s", "lost_work_s",
                                               "recovery_s", "failures", "bytes_written")}}
    first: dict = {}
    for lane, key in enumerate(keys):
        first.setdefault(key, []).append(lane)
    rows = []
    for size, group in _by_size(first).items():
        lanes = np.array([first[k] for k in group], dtype=np.int64)        # keys x lanes
        means = {f: _mean(np.asarray(v, dtype=np.float64)[lanes], skip_nan=f != "ratio")
                 for f, v in columns.items()}
        if size > 1:
            spread = np.asarray(columns["ratio"], dtype=np.float64)[lanes].std(axis=1, ddof=1)
            half = t_quantile(0.975, size - 1) * spread / math.sqrt(size)
        else:
            half = np.full(len(group), math.nan)
        for g, key in enumerate(group):
            mi, name, cadence = key
            row = {"mtbf_s": mtbfs[mi], "strategy": name, "effective_ratio": float(means["ratio"][g]),
                   "ci95": float(half[g])}
            for f in COLUMNS[3:-2]:
                row[f] = float(means[f][g])
            row["interval"] = cadence.every if cadence else None
            row["storage_interval"] = cadence.storage_every if cadence else None
            rows.append((first[key][0], row))
    rows.sort(key=lambda r: r[0])
    return pd.DataFrame([r for _, r in rows], columns=["mtbf_s", *COLUMNS])


def _mean(values: np.ndarray, *, skip_nan: bool) -> np.ndarray:
    """Each row's mean, summed as numpy sums a row (pairwise): the ratio's as numpy's
    ``mean``, the other columns' as pandas' (NaN lanes left out), to the bit."""
    missing = np.isnan(values)
    if not skip_nan or not missing.any():
        return values.sum(axis=1) / values.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(missing, 0.0, values).sum(axis=1) / (~missing).sum(axis=1)


def _by_size(groups: dict) -> dict[int, list]:
    """The keys by their number of lanes (each size's keys in first-seen order)."""
    out: dict[int, list] = {}
    for key, lanes in groups.items():
        out.setdefault(len(lanes), []).append(key)
    return out


def t_quantile(q: float, df: int) -> float:
    """Student's t quantile: ``scipy.stats.t.ppf(q, df)`` to the bit (its ``_ppf`` is this
    ``stdtrit``), without importing ``scipy.stats`` (1-2 s): ``scipy.special`` only."""
    from scipy.special import stdtrit
    return float(stdtrit(df, q))
