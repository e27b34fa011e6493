"""The interval of rollback strategies: fixed, Young, Daly, or matched freshness."""
from __future__ import annotations

import math

from .costs import CostModel
from .errors import SimError
from .theory import daly_interval_s, young_interval_s
from .workload import Workload

__all__ = ["resolve_interval", "INTERVAL_RULES", "parse_interval"]

INTERVAL_RULES = ("matched", "young", "daly")
"""matched: LayerCheck's parameter-weighted average staleness on the same trace
(the paper's comparison); young/daly: the optimal interval for the failure
rate, with C = the time one full checkpoint takes to reach storage."""


def parse_interval(value: str | int) -> str | int:
    """``100`` -> 100 steps; ``matched``, ``young``, ``daly`` pass through."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise SimError(f"interval={value} must be at least 1 step")
        return value
    text = str(value).strip().lower()
    if text in INTERVAL_RULES:
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise SimError(f"interval={value!r}: give a number of steps (e.g. 100) or one of "
                   f"{', '.join(INTERVAL_RULES)}")


def resolve_interval(rule: str | int, workload: Workload, costs: CostModel,
                     mtbf_s: float | None) -> int:
    """Steps between full checkpoints under ``rule``."""
    rule = parse_interval(rule)
    if isinstance(rule, int):
        return rule
    if rule == "matched":
        if workload.staleness is None:
            raise SimError("interval 'matched' needs a trace (LayerCheck's staleness): use a "
                           "preset or --trace, or give --interval STEPS, young or daly")
        return max(1, round(workload.staleness))
    if mtbf_s is None:
        raise SimError(f"interval {rule!r} needs an MTBF")
    checkpoint_s = costs.write_s(workload.full_bytes)
    tau = (young_interval_s if rule == "young" else daly_interval_s)(checkpoint_s, mtbf_s)
    step_s = float(workload.compute_s.mean())
    return max(1, min(workload.steps, math.floor(tau / step_s + 0.5)))
