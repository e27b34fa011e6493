"""Closed forms the simulator must agree with (exponential failures).

- Young (1974): tau ~ sqrt(2 C M).
- Daly (2006): tau = sqrt(2 C M) [1 + (1/3) sqrt(C / 2M) + (1/9) (C / 2M)] - C
  for C < 2M, else M.
- Expected time to finish a segment of work T followed by a checkpoint C, with
  restart R after each failure, failures at rate 1/M striking anywhere
  (work, checkpoint, restart): E = e^(R/M) M (e^((T + C)/M) - 1).
- Meta ("Revisiting Reliability in Large-Scale Machine Learning Research Clusters",
  arXiv 2410.21680): for N nodes failing at rate r each, restart overhead u0,
  checkpoint stall w every dt of training, ETTR ~ (1 - N r (u0 + dt/2)) / (1 + w/dt),
  best dt* = sqrt(2 w / (N r)). First order in N r (u0 + dt): it holds where a failure
  during a recovery or a second failure within one interval is rare.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["young_interval_s", "daly_interval_s", "segment_time_s", "periodic_ratio",
           "limit_ratio_exponential", "meta_ettr", "meta_best_interval_s"]


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    c, m = checkpoint_s, mtbf_s
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def segment_time_s(work_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """E = e^(R/M) M (e^((T + C)/M) - 1): the expected wall time of one segment."""
    lam = 1.0 / mtbf_s
    return math.exp(lam * restart_s) * mtbf_s * math.expm1(lam * (work_s + checkpoint_s))


def periodic_ratio(*, step_s: float, steps: int, interval: int, checkpoint_s: float,
                   restart_s: float, mtbf_s: float) -> float:
    """Expected effective ratio of a job of ``steps`` equal steps that checkpoints
    synchronously after every ``interval`` steps (not after the last, which the
    job's own final save commits), run back to back under exponential failures.
    By renewal-reward, ratio = useful per job / expected wall time per job."""
    n_ckpt = len(range(interval, steps, interval))
    tail = steps - n_ckpt * interval
    wall = n_ckpt * segment_time_s(interval * step_s, checkpoint_s, restart_s, mtbf_s)
    if tail:
        wall += segment_time_s(tail * step_s, 0.0, restart_s, mtbf_s)
    return steps * step_s / wall


def limit_ratio_exponential(restart_s: float, mtbf_s: float | np.ndarray) -> float | np.ndarray:
    """The perfect checkpointer (free checkpoints, restart cost only): every failure
    costs a restart, itself subject to failures, so the ratio is e^(-R/M)."""
    return np.exp(-restart_s / np.asarray(mtbf_s, dtype=float)) if not np.isscalar(mtbf_s) \
        else math.exp(-restart_s / mtbf_s)


def meta_ettr(*, nodes: int, node_rate: float, restart_s: float, stall_s: float,
              interval_s: float) -> float:
    """Meta's ETTR ~ (1 - N r (u0 + dt/2)) / (1 + w/dt): ``node_rate`` r per second per node,
    u0 ``restart_s`` (everything a failure costs before training resumes), w ``stall_s`` per
    checkpoint, dt ``interval_s`` of training between checkpoints."""
    return (1.0 - nodes * node_rate * (restart_s + interval_s / 2.0)) / (1.0 + stall_s / interval_s)


def meta_best_interval_s(*, nodes: int, node_rate: float, stall_s: float) -> float:
    """dt* = sqrt(2 w / (N r)), the interval that maximises ``meta_ettr``."""
    return math.sqrt(2.0 * stall_s / (nodes * node_rate))
