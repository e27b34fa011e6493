"""``layercheck.trace``, the name users read and write traces by: the trace lives in
``layercheck.contract.trace`` (the contract the profiler, the simulator and the
dashboard share); this module re-exports its public names so that code written
against ``from layercheck.trace import read_trace`` keeps working."""
from __future__ import annotations

from .contract.trace import *  # noqa: F401,F403
from .contract.trace import __all__  # noqa: F401
