"""A fixed interval for every rollback strategy: a number of steps, or Young's or Daly's.

Without one, each strategy's cadence follows the protocol (``Strategy.cadence``).
"""
from __future__ import annotations

import math

from .costs import CostModel
from .errors import SimError
from .theory import daly_interval_s, young_interval_s
from .workload import Workload

__all__ = ["resolve_interval", "INTERVAL_RULES", "parse_interval"]

INTERVAL_RULES = ("young", "daly")
"""The optimal interval for the failure rate, with C = the time one synchronous full
checkpoint takes (``CostModel.save_s``)."""


def parse_interval(value: str | int | None) -> str | int | None:
    """``100`` -> 100 steps; ``young`` and ``daly`` pass through; None: no override."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise SimError(f"interval={value} must be at least 1 step")
        return value
    text = str(value).strip().lower()
    if text in INTERVAL_RULES:
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise SimError(f"interval={value!r}: give a number of steps (e.g. 100), young or daly "
                   "(or leave it out and choose --protocol matched or native)")


def resolve_interval(rule: str | int, workload: Workload, costs: CostModel,
                     mtbf_s: float | None) -> int:
    """Steps between full checkpoints under ``rule``."""
    rule = parse_interval(rule)
    if isinstance(rule, int):
        if rule > workload.steps:
            raise SimError(f"interval={rule} steps is longer than the job's {workload.steps} steps: "
                           "a checkpoint every that many steps is never taken; give at most "
                           f"{workload.steps} (one checkpoint a job)")
        return rule
    if mtbf_s is None:
        raise SimError(f"interval {rule!r} needs an MTBF")
    checkpoint_s = costs.save_s(workload.full_bytes)
    tau = (young_interval_s if rule == "young" else daly_interval_s)(checkpoint_s, mtbf_s)
    step_s = float(workload.compute_s.mean())
    return max(1, min(workload.steps, math.floor(tau / step_s + 0.5)))
