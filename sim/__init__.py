"""sim: the failure simulator. How much wall-clock time goes to useful training
with LayerCheck and with each alternative, at a given failure rate?

Torch-free: needs numpy, pandas, pyarrow, scipy, plotly (and simpy for the
reference engine). See docs/sim.md.

    from sim import Scenario, simulate, sweep, sweep_figure, PRESETS

The names below are imported on first use, so that ``python -m sim`` checks its
arguments before numpy, pandas and scipy load (a bad flag answers at once).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Scenario", "simulate", "sweep", "simulate_writes", "sweep_figure", "limit_ratio", "PRESETS", "COLUMNS",
           "LIMIT", "DAY", "ENGINES", "PROTOCOLS", "COST_MODELS", "CostModel", "FailureModel", "SimError", "STRATEGIES", "REGIMES",
           "Workload", "job_mtbf", "read_failure_log", "parse_duration", "NodeFailures", "Domain",
           "FailureEvents"]

_LAZY = {
    **dict.fromkeys(("COLUMNS", "DAY", "ENGINES", "LIMIT", "PRESETS", "Scenario", "limit_ratio",
                     "simulate", "simulate_writes", "sweep"), "sim.api"),
    **dict.fromkeys(("COST_MODELS", "CostModel"), "sim.costs"),
    "SimError": "sim.errors",
    **dict.fromkeys(("FailureModel", "job_mtbf", "read_failure_log"), "sim.failures"),
    **dict.fromkeys(("Domain", "FailureEvents", "NodeFailures"), "sim.nodes"),
    "REGIMES": "sim.presets",
    "sweep_figure": "sim.report",
    **dict.fromkeys(("PROTOCOLS", "STRATEGIES"), "sim.strategies"),
    "parse_duration": "sim.units",
    "Workload": "sim.workload",
}
_RENAMED = {"sweep_figure": "figure"}

if TYPE_CHECKING:
    from .api import (COLUMNS, DAY, ENGINES, LIMIT, PRESETS, Scenario, limit_ratio, simulate,
                      simulate_writes, sweep)
    from .costs import COST_MODELS, CostModel
    from .errors import SimError
    from .failures import FailureModel, job_mtbf, read_failure_log
    from .nodes import Domain, FailureEvents, NodeFailures
    from .presets import REGIMES
    from .report import figure as sweep_figure
    from .strategies import PROTOCOLS, STRATEGIES
    from .units import parse_duration
    from .workload import Workload


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name]), _RENAMED.get(name, name))
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
