"""LayerCheck: adaptive layer-wise checkpointing for LLM post-training.

    from layercheck import LayerCheck, LayerCheckConfig

``LayerCheckConfig`` imports without torch; ``LayerCheck`` and the rest of the
library need torch and are imported on first use, so the simulator and the
dashboard never pull torch. The rooms, each a floor that imports only those
below it (docs/architecture.md):

- ``contract/``: torch-free, shared with the profiler, the simulator and the
  dashboard: the decision model (config, policy, budget), the errors, the trace,
  the calibration, the replays;
- ``storage/``: the on-disk format and its I/O: layer files, the manifest, the
  stores, the writer, the commit, retention;
- ``backends/``: where a layer's tensors live (a plain module, ZeRO partitions,
  FSDP2 shards) and what ranks agree on;
- ``drift/``: d_l(t) on the optimizer's update path, and its fused kernels;
- here: the lifecycle a user imports (``LayerCheck``, its ZeRO and FSDP2 forms,
  the Trainer callback) and what it runs (recovery, snapshots, the directory);
- ``tools/``: offline: ``python -m layercheck``, inspection, export, cleanup.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .contract.config import ConfigError, LayerCheckConfig

__all__ = ["LayerCheck", "LayerCheckConfig", "ConfigError", "LayerMap", "LayerCheckError",
           "ZeroLayerCheck", "FsdpLayerCheck", "LayerCheckCallback", "layer_aligned_param_groups"]
__version__ = "0.1.0"

_LAZY = {
    "LayerCheck": "layercheck.checkpoint",
    "LayerMap": "layercheck.backends.layermap",
    "LayerCheckError": "layercheck.contract.errors",
    "ZeroLayerCheck": "layercheck.zero",
    "FsdpLayerCheck": "layercheck.fsdp",
    "LayerCheckCallback": "layercheck.trainer",
    "layer_aligned_param_groups": "layercheck.groups",
}

if TYPE_CHECKING:
    from .checkpoint import LayerCheck
    from .contract.errors import LayerCheckError
    from .fsdp import FsdpLayerCheck
    from .groups import layer_aligned_param_groups
    from .backends.layermap import LayerMap
    from .trainer import LayerCheckCallback
    from .zero import ZeroLayerCheck


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'layercheck' has no attribute {name!r}")
