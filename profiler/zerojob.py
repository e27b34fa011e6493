"""The ZeRO training job: the plain capture's job inside a DeepSpeed ZeRO-3 engine, one rank each.

Contract: every rank calls ``ZeroTrainer.prepare(config)`` once
torch.distributed is up (``deepspeed.init_distributed``), then the same
sequence of ``step(position)`` and ``evaluate()``: under ZeRO-3 each forward
gathers the partitioned parameters from every rank, so these are collectives.

Same job as ``trainer.Trainer`` (model, seed, data, AdamW hyper-parameters,
LR schedule, loss); what differs, and why:

- The model is built whole on every rank from the same seed (so its weights
  are the plain capture's, bit for bit) and DeepSpeed partitions it when the
  engine is created (``deepspeed.initialize`` converts parameters that
  ``zero.Init`` did not). The models here fit in one process's memory; a
  model that does not would be built inside ``deepspeed.zero.Init``.
- The optimizer's parameter groups are layer-aligned
  (``layercheck.groups.layer_aligned_param_groups``, two per layer), which
  ZeroLayerCheck needs to find a layer's optimizer shard. The decay rule is
  the plain capture's: matrices decay, biases and norm weights do not.
- Each step's batch (the plain capture's batch at that data position, masks
  included) is split evenly over the ranks. A rank back-propagates
  ``ranks x (its summed token losses) / (predicted tokens of the whole
  batch)``: DeepSpeed averages gradients over the ranks, so the update is the
  plain capture's (the mean loss over the whole batch's predicted tokens),
  not a mean of per-rank means.
- BERT masked LMs run as ``MaskedOnlyBert``: the same modules under the same
  names, projecting onto the vocabulary only at the masked positions, as the
  plain capture does (``trainer._masked_only_loss``); ZeRO-3 restarts its
  parameter-fetch schedule in a forward hook of the module it wraps, so the
  whole loss belongs inside that module's forward.
"""
from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .config import CaptureConfig, ZeroConfig
from .corpus import Corpus, load_corpus
from .dataset import Dataset
from .models import ModelSource, resolve_model
from .trainer import PhaseTimes, _has_bert_head, _predicted_tokens, _schedule

__all__ = ["ZeroTrainer", "MaskedOnlyBert", "init_distributed"]


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
        hidden = self.bert(input_ids=input_ids).last_hidden_state
        chosen = labels != -100
        logits = self.cls(hidden[chosen])
        return nn.functional.cross_entropy(logits, labels[chosen], reduction="sum")


@dataclass(kw_only=True)
class ZeroTrainer:
    zero: ZeroConfig
    rank: int
    source: ModelSource
    corpus: Corpus
    dataset: Dataset
    engine: Any
    """The DeepSpeed engine; ``engine.module`` is what LayerCheck maps into layers."""
    architecture: str
    """Class name of the Hugging Face model that was built."""
    num_params: int
    scheduler: torch.optim.lr_scheduler.LambdaLR
    device: str = "cpu"

    @classmethod
    def prepare(cls, zero: ZeroConfig, *, source: ModelSource | None = None) -> "ZeroTrainer":
        import deepspeed
        import torch.distributed as dist

        from layercheck.groups import layer_aligned_param_groups
        config = zero.capture
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        source = source or resolve_model(config.model)
        model, tokenizer = source.build(seed=config.seed, max_len=config.seq_len)
        architecture = type(model).__name__
        num_params = sum(p.numel() for p in model.parameters())
        if source.objective == "masked" and _has_bert_head(model):
            model = MaskedOnlyBert(model)
        corpus = load_corpus()
        dataset = Dataset.build(corpus, tokenizer, objective=source.objective,
                                seq_len=config.seq_len, batch_size=config.batch_size,
                                seed=config.seed)
        optimizer = torch.optim.AdamW(
            layer_aligned_param_groups(model, weight_decay=config.weight_decay),
            lr=config.lr or source.default_lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config))
        engine, _, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer,
                                                       lr_scheduler=scheduler,
                                                       config=zero.ds_config())
        return cls(zero=zero, rank=dist.get_rank(), source=source, corpus=corpus,
                   dataset=dataset, engine=engine, architecture=architecture,
                   num_params=num_params, scheduler=scheduler)

    @property
    def config(self) -> CaptureConfig:
        return self.zero.capture

    @property
    def model(self) -> nn.Module:
        return self.engine.module

    @property
    def lr_peak(self) -> float:
        return float(self.config.lr or self.source.default_lr)

    def step(self, position: int) -> tuple[float, PhaseTimes]:
        """One optimizer step on the batch at data ``position``; returns this rank's
        share of the batch's mean loss (the shares of all ranks sum to it) and
        this rank's phase times (``optimizer_s``: ``engine.step()``, which also
        steps the LR scheduler and zeroes the gradients)."""
        batch = self.dataset.batch_at(position)
        total = _predicted_tokens(batch["labels"], self.source.objective)
        mine = self._share(batch)
        t0 = time.perf_counter()
        summed = self._token_loss_sum(mine)
        t1 = time.perf_counter()
        self.engine.backward(summed * (self.zero.ranks / total))
        t2 = time.perf_counter()
        self.engine.step()
        t3 = time.perf_counter()
        return float(summed.detach()) / total, PhaseTimes(t1 - t0, t2 - t1, t3 - t2)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per predicted token over the held-out blocks (the plain
        capture's blocks and masks). Every rank evaluates all of them (the same
        forwards everywhere, as ZeRO-3 needs) and gets the same number."""
        self.engine.eval()
        total = count = 0.0
        try:
            for batch in self.dataset.heldout_batches(self.config.eval_sequences):
                total += float(self._token_loss_sum(batch))
                count += _predicted_tokens(batch["labels"], self.source.objective)
        finally:
            self.engine.train()
        return total / count

    def make_layercheck(self, directory: Any, config: Any) -> Any:
        """The LayerCheck of this kind of job, on every rank (a collective)."""
        from layercheck.zero import ZeroLayerCheck
        return ZeroLayerCheck(self.engine, str(directory), config, scheduler=self.scheduler)

    def setup(self) -> tuple[str, str, dict[str, Any]]:
        """What a trace says about the setup: its description's words, the key of
        ``manifest.sources`` that details it, and the details."""
        import deepspeed
        zero = self.zero
        return (f"DeepSpeed ZeRO-{zero.stage} capture on {zero.ranks} ranks (processes, gloo, "
                f"CPU; {self.config.threads} thread(s) each), ZeroLayerCheck writing one shard "
                "per rank", "deepspeed",
                {"capture": f"DeepSpeed ZeRO-{zero.stage}, {zero.ranks} ranks",
                 "stage": zero.stage, "ranks": zero.ranks, "backend": "gloo",
                 "accelerator": "cpu", "version": deepspeed.__version__,
                 "ds_config": zero.ds_config(), "integration": "layercheck.zero.ZeroLayerCheck",
                 "micro_batch_per_rank": zero.micro_batch})

    @property
    def metric_name(self) -> str:
        kind = "masked-LM" if self.source.objective == "masked" else "next-token"
        return f"held-out {kind} loss ({min(self.config.eval_sequences, len(self.dataset.heldout))} sequences)"

    def _share(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        rows = slice(self.rank * self.zero.micro_batch, (self.rank + 1) * self.zero.micro_batch)
        return {k: v[rows] for k, v in batch.items()}

    def _token_loss_sum(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Sum of the token losses of ``batch`` (a forward of the engine)."""
        if isinstance(self.model, MaskedOnlyBert):
            return self.engine(input_ids=batch["input_ids"], labels=batch["labels"])
        if self.source.objective == "masked":
            logits = self.engine(input_ids=batch["input_ids"]).logits
            return nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                               ignore_index=-100, reduction="sum")
        out = self.engine(input_ids=batch["input_ids"], labels=batch["labels"])
        return out.loss * _predicted_tokens(batch["labels"], "causal")
