"""The profiler's training jobs, and which one a config asks for: ``open_job`` builds it.

``job`` is the protocol every kind implements (what a capture, a calibration or a
worker asks of a training job); the kinds build on it: ``plain`` (one process),
``zero`` (DeepSpeed ZeRO-3, one process per rank), ``fsdp`` (PyTorch FSDP2); the
data they train on is ``corpus`` and ``dataset``. Each kind is imported only when
asked for: the ZeRO and FSDP2 kinds pull in DeepSpeed and torch.distributed.
"""
from __future__ import annotations

from typing import Callable

from ..config import CaptureConfig, ZeroConfig
from .job import Job

__all__ = ["open_job"]


def open_job(spec: CaptureConfig | ZeroConfig, *, say: Callable[[str], None] = print) -> Job:
    """Build the job ``spec`` asks for (a ZeroConfig: a ZeRO or, with ``fsdp``, an
    FSDP2 job, under torchrun). Threads are resolved (torch's default when not
    given) before anything is built."""
    if isinstance(spec, ZeroConfig) and spec.fsdp:
        from .fsdp import FsdpJob
        return FsdpJob.prepare(spec, say=say)
    if isinstance(spec, ZeroConfig):
        from .zero import ZeroJob
        return ZeroJob.prepare(spec, say=say)
    from .plain import PlainJob
    return PlainJob.prepare(spec, say=say)
