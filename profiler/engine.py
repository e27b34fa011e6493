"""DeepSpeed's own checkpoint for any job: the ZeRO job's engine, or a world-size-1 engine.

The "deepspeed" strategy's save is ``engine.save_checkpoint`` (and its load
``engine.load_checkpoint``) when DeepSpeed is installed. A plain job has no
engine, so ``engine_for`` wraps its model, optimizer and scheduler in one:
ZeRO stage 0, fp32, no gradient clipping, on a one-rank gloo process group
over an in-memory store (no port, nothing to clash with another process).
Training goes on through the job's own loop; the engine only holds the same
module, optimizer and scheduler objects, and ``save_checkpoint`` writes
their state (module, optimizer state dict, scheduler, client state) with
``torch.save``.
"""
from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["deepspeed_available", "engine_for", "one_rank_group"]


def deepspeed_available() -> bool:
    from importlib.util import find_spec
    return find_spec("deepspeed") is not None


def one_rank_group() -> None:
    """Start torch.distributed with one rank where it is not running. It stays up for
    the life of the process (DeepSpeed keeps its own handles on the group, so an
    engine made later in the same process needs the same group)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


@contextmanager
def _launcher_env() -> Iterator[None]:
    """What a launcher would have set, for DeepSpeed's checks, and only while they run
    (left set, it would make this process look like a rank under torchrun)."""
    saved = {k: os.environ.get(k) for k in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    os.environ.update({k: os.environ.get(k) or v for k, v in
                       (("LOCAL_RANK", "0"), ("RANK", "0"), ("WORLD_SIZE", "1"))})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def engine_for(job: Any) -> Any:
    """The DeepSpeed engine whose ``save_checkpoint`` saves ``job``'s state (made
    once, then kept as ``job.engine``)."""
    if getattr(job, "engine", None) is not None:
        return job.engine
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    one_rank_group()
    import deepspeed
    from deepspeed.utils import logger as ds_logger
    ds_logger.setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`torch\.distributed\.\w+` is deprecated")
    batch = job.config.batch_size
    config = {"train_batch_size": batch, "train_micro_batch_size_per_gpu": batch,
              "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "steps_per_print": 10 ** 9, "zero_optimization": {"stage": 0}}
    with _launcher_env():
        deepspeed.init_distributed(dist_backend="gloo")
        engine, _, _, _ = deepspeed.initialize(model=job.model, optimizer=job.optimizer,
                                               lr_scheduler=job.scheduler, config=config)
    if engine.optimizer is not job.optimizer:
        raise RuntimeError("DeepSpeed wrapped the job's optimizer: its checkpoint would not "
                           "be the job's state; report this with the DeepSpeed version")
    job.engine = engine
    return engine
