"""profiler: real training with LayerCheck attached, recorded as traces; recovery drills.

    python -m profiler capture [--model minilm|tiny|PATH] [--steps N] ...
    python -m profiler capture --deepspeed zero3 [--ranks 2] ...   (starts torchrun)
    torchrun --nproc_per_node 2 -m profiler capture --deepspeed zero3 ...
    python -m profiler drill   [same options] [--failures N] [--from TRACE]

``capture`` writes ``traces/<name>/`` in the format of ``layercheck.trace``;
``drill`` adds ``drill.json`` (recovery fidelity, measured with real SIGKILLs).
With ``--deepspeed zero3`` the same job trains inside a DeepSpeed ZeRO-3
engine, one process per rank, with ``layercheck.zero.ZeroLayerCheck``; rank 0
writes the trace, in the same format.
"""
from __future__ import annotations

from .config import CaptureConfig, DrillConfig, ZeroConfig
from .errors import ProfilerError

__all__ = ["CaptureConfig", "DrillConfig", "ZeroConfig", "ProfilerError"]
