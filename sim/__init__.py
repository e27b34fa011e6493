"""sim: the failure simulator. How much wall-clock time goes to useful training
with LayerCheck and with each alternative, at a given failure rate?

Torch-free: needs numpy, pandas, pyarrow, scipy, plotly (and simpy for the
reference engine). See docs/sim.md.

    from sim import Scenario, simulate, sweep, sweep_figure, PRESETS
"""
from __future__ import annotations

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

__all__ = ["Scenario", "simulate", "sweep", "simulate_writes", "sweep_figure", "limit_ratio", "PRESETS", "COLUMNS",
           "LIMIT", "DAY", "ENGINES", "PROTOCOLS", "COST_MODELS", "CostModel", "FailureModel", "SimError", "STRATEGIES", "REGIMES",
           "Workload", "job_mtbf", "read_failure_log", "parse_duration", "NodeFailures", "Domain",
           "FailureEvents"]
