"""profiler: real training with LayerCheck attached, recorded as traces; recovery drills.

    python -m profiler capture [--model minilm|tiny|PATH] [--steps N] ...
    python -m profiler capture --deepspeed zero3 [--ranks 2] ...   (starts torchrun)
    torchrun --nproc_per_node 2 -m profiler capture --deepspeed zero3 ...
    python -m profiler capture --fsdp [--ranks 2] ...              (PyTorch FSDP2)
    python -m profiler drill   [same options] [--failures N] [--from TRACE]
    python -m profiler calibrate --trace TRACE [--repeats N]
    python -m profiler validate  --trace TRACE [--window 600] [--mtbf 150] [--seed 0]

``capture`` writes ``traces/<name>/`` in the format of ``layercheck.contract.trace``
and, unless ``--no-calibrate``, ``costs.json`` (``layercheck.contract.calibration``:
what each checkpointing strategy's mechanism costs on this model and
machine); ``calibrate`` measures it for an existing capture; ``drill`` adds
``drill.json`` (recovery fidelity, measured with real SIGKILLs); ``validate``
adds ``validation.json`` (the simulator's predictions against real runs
SIGKILLed at the times of a failure log).
With ``--deepspeed zero3`` the same job trains inside a DeepSpeed ZeRO-3
engine, one process per rank, with ``layercheck.zero.ZeroLayerCheck``, and
with ``--fsdp`` under PyTorch FSDP2 with ``layercheck.fsdp.FsdpLayerCheck``;
rank 0 writes the trace, in the same format.
"""
from __future__ import annotations

from .config import CaptureConfig, DrillConfig, ValidationConfig, ZeroConfig
from .errors import ProfilerError

__all__ = ["CaptureConfig", "DrillConfig", "ValidationConfig", "ZeroConfig", "ProfilerError"]
