"""LayerCheck: adaptive layer-wise checkpointing for LLM post-training.

    from layercheck import LayerCheck, LayerCheckConfig

``LayerCheckConfig``, ``layercheck.policy`` and ``layercheck.trace`` import
without torch; ``LayerCheck`` and the rest of the library need torch and are
imported on first use, so the simulator and the dashboard never pull torch.
``layercheck.contract`` is what the profiler hands the simulator and the
dashboard (the trace, the calibration, the replays), torch-free;
``layercheck.trace`` stays importable as the name users read traces by.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import ConfigError, LayerCheckConfig

__all__ = ["LayerCheck", "LayerCheckConfig", "ConfigError", "LayerMap", "LayerCheckError",
           "ZeroLayerCheck", "FsdpLayerCheck", "LayerCheckCallback", "layer_aligned_param_groups"]
__version__ = "0.1.0"

_LAZY = {
    "LayerCheck": "layercheck.checkpoint",
    "LayerMap": "layercheck.layermap",
    "LayerCheckError": "layercheck.errors",
    "ZeroLayerCheck": "layercheck.zero",
    "FsdpLayerCheck": "layercheck.fsdp",
    "LayerCheckCallback": "layercheck.trainer",
    "layer_aligned_param_groups": "layercheck.groups",
}

if TYPE_CHECKING:
    from .checkpoint import LayerCheck
    from .errors import LayerCheckError
    from .fsdp import FsdpLayerCheck
    from .groups import layer_aligned_param_groups
    from .layermap import LayerMap
    from .trainer import LayerCheckCallback
    from .zero import ZeroLayerCheck


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'layercheck' has no attribute {name!r}")
