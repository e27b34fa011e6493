"""profiler: real training with LayerCheck attached, recorded as traces; recovery drills.

    python -m profiler capture [--model minilm|tiny|PATH] [--steps N] ...
    python -m profiler drill   [same options] [--failures N] [--from TRACE]

``capture`` writes ``traces/<name>/`` in the format of ``layercheck.trace``;
``drill`` adds ``drill.json`` (recovery fidelity, measured with real SIGKILLs).
"""
from __future__ import annotations

from .config import CaptureConfig, DrillConfig
from .errors import ProfilerError

__all__ = ["CaptureConfig", "DrillConfig", "ProfilerError"]
