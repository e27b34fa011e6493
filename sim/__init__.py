"""sim: the failure simulator. How much wall-clock time goes to useful training
with LayerCheck and with each alternative, at a given failure rate?

Torch-free: needs numpy, pandas, pyarrow, scipy, plotly (and simpy for the
reference engine). See docs/sim.md.

    from sim import Scenario, simulate, sweep, sweep_figure, PRESETS
"""
from __future__ import annotations

from .api import COLUMNS, DAY, LIMIT, PRESETS, Scenario, limit_ratio, simulate, sweep, sweep_figure
from .costs import CostModel
from .errors import SimError
from .failures import FailureModel, job_mtbf, read_failure_log
from .presets import REGIMES
from .strategies import STRATEGIES
from .units import parse_duration
from .workload import Workload

__all__ = ["Scenario", "simulate", "sweep", "sweep_figure", "limit_ratio", "PRESETS", "COLUMNS",
           "LIMIT", "DAY", "CostModel", "FailureModel", "SimError", "STRATEGIES", "REGIMES",
           "Workload", "job_mtbf", "read_failure_log", "parse_duration"]
