"""Which job a config asks for: ``open_job`` builds it.

Apart from ``profiler.job`` (the protocol every kind implements) so that the
kinds, which build on that protocol, are not imported by it. Each kind is
imported only when asked for: the ZeRO and FSDP2 kinds pull in DeepSpeed and
torch.distributed.
"""
from __future__ import annotations

from typing import Callable

from .config import CaptureConfig, ZeroConfig
from .job import Job

__all__ = ["open_job"]


def open_job(spec: CaptureConfig | ZeroConfig, *, say: Callable[[str], None] = print) -> Job:
    """Build the job ``spec`` asks for (a ZeroConfig: a ZeRO or, with ``fsdp``, an
    FSDP2 job, under torchrun). Threads are resolved (torch's default when not
    given) before anything is built."""
    if isinstance(spec, ZeroConfig) and spec.fsdp:
        from .fsdpjob import FsdpJob
        return FsdpJob.prepare(spec, say=say)
    if isinstance(spec, ZeroConfig):
        from .zerojob import ZeroJob
        return ZeroJob.prepare(spec, say=say)
    from .plainjob import PlainJob
    return PlainJob.prepare(spec, say=say)
