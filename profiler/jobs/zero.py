"""The ZeRO job: the plain job inside a DeepSpeed ZeRO-3 engine, one process per rank.

Contract: every rank calls ``ZeroJob.prepare(zero)`` under torchrun (it
starts torch.distributed: gloo, DeepSpeed's cpu accelerator), then the same
sequence of ``step(position)`` and ``evaluate()``: under ZeRO-3 each forward
gathers the partitioned parameters from every rank, so these are collectives.

Same job as ``PlainJob`` (model, seed, data, AdamW on layer-aligned groups,
LR schedule, loss); what differs, and why:

- The model is built whole on every rank from the same seed (so its weights
  are the plain job's, bit for bit) and DeepSpeed partitions it when the
  engine is created. The models here fit in one process's memory; a model
  that does not would be built inside ``deepspeed.zero.Init``.
- Each step's batch (the plain job's batch at that data position, masks
  included) is split evenly over the ranks. A rank back-propagates
  ``ranks x (its summed token losses) / (predicted tokens of the whole
  batch)``: DeepSpeed averages gradients over the ranks, so the update is the
  plain job's (the mean loss over the whole batch's predicted tokens), not a
  mean of per-rank means.
- BERT masked LMs run as ``MaskedOnlyBert``: the same modules under the same
  names, projecting onto the vocabulary only at the masked positions, as the
  plain job does; ZeRO-3 restarts its parameter-fetch schedule in a forward
  hook of the module it wraps, so the whole loss belongs inside that
  module's forward.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from layercheck.backends.ranks import DefaultGroupRanks, Ranks

from ..config import CaptureConfig, ZeroConfig
from .corpus import Corpus
from .dataset import Dataset
from ..errors import ProfilerError
from .job import (Job, PhaseTimes, adamw, build_model_and_data, has_bert_head,
                  masked_token_losses, predicted_tokens)
from ..launch import LAUNCHED_BY_PROFILER
from ..models import ModelSource, resolve_model

__all__ = ["ZeroJob", "MaskedOnlyBert", "init_distributed"]


def init_distributed() -> tuple[int, int]:
    """Start torch.distributed for a rank under torchrun (gloo, DeepSpeed's cpu
    accelerator); returns (rank, world size). Idempotent."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported
    import deepspeed
    import torch.distributed as dist
    from deepspeed.utils import logger as ds_logger
    ds_logger.setLevel(logging.WARNING)  # its config dump at initialize() is not ours to print
    # DeepSpeed 0.19 calls collectives torch 2.13 deprecates, once per call: not the user's concern
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`torch\.distributed\.\w+` is deprecated")
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo")
    return dist.get_rank(), dist.get_world_size()


class MaskedOnlyBert(nn.Module):
    """A ``BertForMaskedLM``'s own ``bert`` and ``cls`` modules (so parameter and
    layer names are the model's: ``bert.embeddings``, ``bert.encoder.layer.0``,
    ..., ``cls``) with a forward that returns the **sum** of the token losses,
    projecting onto the vocabulary only at the masked positions."""

    def __init__(self, mlm: nn.Module) -> None:
        super().__init__()
        self.bert, self.cls = mlm.bert, mlm.cls
        self.config = mlm.config  # ZeroLayerCheck saves it as model_config.json

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return masked_token_losses(self, input_ids, labels, "sum")


@dataclass(kw_only=True, eq=False)
class ZeroJob(Job):
    zero: ZeroConfig
    source: ModelSource
    corpus: Corpus
    dataset: Dataset
    engine: Any
    """The DeepSpeed engine; ``engine.module`` is what LayerCheck maps into layers."""
    architecture: str
    num_params: int
    scheduler: Any
    ranks: Ranks
    device: str = "cpu"

    kind = "zero3"
    setup = "ZeRO-3"
    integration = "ZeroLayerCheck"
    sources_key = "deepspeed"

    @classmethod
    def prepare(cls, zero: ZeroConfig, *, source: ModelSource | None = None,
                say: Callable[[str], None] = print) -> "ZeroJob":
        source = source or resolve_model(zero.capture.model)  # bad input fails before any collective
        rank, world = cls.start()
        if world != zero.ranks:
            raise ProfilerError(f"torchrun started {world} ranks but --ranks is {zero.ranks}: "
                                "drop --ranks, or give torchrun --nproc_per_node "
                                f"{zero.ranks}")
        config = zero.capture
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        zero = dataclasses.replace(zero, capture=config.replace(
            threads=config.threads or torch.get_num_threads()))
        if rank == 0:
            say(zero.capture.scaling_note)
        source, model, corpus, dataset = build_model_and_data(zero.capture, source)
        architecture = type(model).__name__
        num_params = sum(p.numel() for p in model.parameters())
        if source.objective == "masked" and has_bert_head(model):
            model = MaskedOnlyBert(model)
        return cls(zero=zero, source=source, corpus=corpus, dataset=dataset,
                   architecture=architecture, num_params=num_params,
                   ranks=Ranks() if world == 1 else DefaultGroupRanks(),
                   **cls.wrap(model, zero, source))

    @staticmethod
    def start() -> tuple[int, int]:
        """Start torch.distributed for this kind of job; (rank, world size)."""
        return init_distributed()

    @staticmethod
    def wrap(model: nn.Module, zero: ZeroConfig, source: ModelSource) -> dict[str, Any]:
        """The built model (the same on every rank) made into this kind of job: the
        fields that differ between kinds (here the DeepSpeed engine and its scheduler)."""
        import deepspeed
        optimizer, scheduler = adamw(model, zero.capture, source)
        engine, _, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer,
                                                       lr_scheduler=scheduler,
                                                       config=zero.ds_config())
        return {"engine": engine, "scheduler": scheduler}

    @property
    def config(self) -> CaptureConfig:
        return self.zero.capture

    @property
    def model(self) -> nn.Module:
        return self.engine.module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.engine.optimizer

    def default_name(self) -> str:
        return f"{self.source.label}-{self.zero.backend}-{self.config.steps}steps"

    def step(self, position: int) -> tuple[float, PhaseTimes]:
        """One optimizer step on the batch at data ``position``; returns this rank's
        share of the batch's mean loss and this rank's phase times (``optimizer_s``:
        ``update()``: under DeepSpeed ``engine.step()``, which also steps the LR scheduler
        and zeroes the gradients)."""
        batch = self.dataset.batch_at(position)
        total = predicted_tokens(batch["labels"], self.source.objective)
        mine = self._share(batch)
        t0 = time.perf_counter()
        summed = self._token_loss_sum(mine)
        t1 = time.perf_counter()
        self.backward(summed * (self.zero.ranks / total))
        t2 = time.perf_counter()
        self.update()
        t3 = time.perf_counter()
        return float(summed.detach()) / total, PhaseTimes(t1 - t0, t2 - t1, t3 - t2)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def update(self) -> None:
        """The optimizer and LR scheduler steps, and zeroing the gradients."""
        self.engine.step()

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per predicted token over the held-out blocks (the plain job's
        blocks and masks). Every rank evaluates all of them (the same forwards
        everywhere, as ZeRO-3 needs) and gets the same number."""
        self.engine.eval()
        total = count = 0.0
        try:
            for batch in self.dataset.heldout_batches(self.config.eval_sequences):
                total += float(self._token_loss_sum(batch))
                count += predicted_tokens(batch["labels"], self.source.objective)
        finally:
            self.engine.train()
        return total / count

    def make_layercheck(self, directory: Any, config: Any) -> Any:
        from layercheck.zero import ZeroLayerCheck
        return ZeroLayerCheck(self.engine, str(directory), config, scheduler=self.scheduler)

    def command(self, argv: list[str] | None) -> str | None:
        args = " ".join(argv or [])
        if os.environ.get(LAUNCHED_BY_PROFILER) == "1":
            return "python -m profiler " + args
        return self._torchrun(args)

    def manifest_parts(self, argv: list[str] | None) -> dict[str, Any]:
        zero, config = self.zero, self.config
        by_profiler = os.environ.get(LAUNCHED_BY_PROFILER) == "1"
        words, how, details = self.describe_setup()
        setup = (f"a {words} capture on {zero.ranks} ranks (processes, gloo, CPU; "
                 f"{config.threads} thread(s) each{how}), {self.integration} writing one shard "
                 "per rank. ")
        detail = (f", each step's {config.batch_size} sequences split {zero.micro_batch} per "
                  "rank. Step times are rank 0's; drift is each whole layer's; write bytes are "
                  "all ranks' shards together")
        source = {
            **details, "micro_batch_per_rank": zero.micro_batch,
            "launched_by": "python -m profiler (started torchrun)" if by_profiler else "torchrun",
            "torchrun_equivalent": self._torchrun(" ".join(argv or [])),
            "step_times": "rank 0's"}
        return {"setup": setup, "detail": detail, "sources": {self.sources_key: source},
                "machine": {"ranks": zero.ranks, "threads_per_rank": config.threads},
                "model": {"engine_module": type(self.model).__name__}}

    def describe_setup(self) -> tuple[str, str, dict[str, Any]]:
        """This kind of job in a trace: its name and how it shards (words of the
        description), and what ``manifest.sources[sources_key]`` records of it."""
        import deepspeed
        zero = self.zero
        return f"DeepSpeed ZeRO-{zero.stage}", "", {
            "capture": f"DeepSpeed ZeRO-{zero.stage}, {zero.ranks} ranks", "stage": zero.stage,
            "ranks": zero.ranks, "backend": "gloo", "accelerator": "cpu",
            "version": deepspeed.__version__, "ds_config": zero.ds_config(),
            "integration": "layercheck.zero.ZeroLayerCheck"}

    def _torchrun(self, args: str) -> str:
        return f"torchrun --nproc_per_node {self.zero.ranks} -m profiler {args}".rstrip()

    def _share(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        rank, micro = self.ranks.rank, self.zero.micro_batch
        return {k: v[rank * micro:(rank + 1) * micro] for k, v in batch.items()}

    def _token_loss_sum(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Sum of the token losses of ``batch`` (a forward of the engine)."""
        if isinstance(self.model, MaskedOnlyBert):
            return self.engine(input_ids=batch["input_ids"], labels=batch["labels"])
        if self.source.objective == "masked":
            logits = self.engine(input_ids=batch["input_ids"]).logits
            return nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                               ignore_index=-100, reduction="sum")
        out = self.engine(input_ids=batch["input_ids"], labels=batch["labels"])
        return out.loss * predicted_tokens(batch["labels"], "causal")
