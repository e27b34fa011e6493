"""The plain job: one process, the model and AdamW as they are, ``LayerCheck`` attached.

``PlainJob.prepare(config)`` builds everything from the config alone (so a
new process builds the same job, bit for bit with the same thread count).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from layercheck.backends.ranks import Ranks

from ..config import CaptureConfig
from .corpus import Corpus
from .dataset import Dataset
from .job import (Job, PhaseTimes, adamw, build_model_and_data, has_bert_head,
                  masked_token_losses, predicted_tokens, timer)
from ..machine import resolve_device
from ..models import ModelSource

__all__ = ["PlainJob"]


@dataclass(kw_only=True, eq=False)
class PlainJob(Job):
    config: CaptureConfig
    device: str
    source: ModelSource
    corpus: Corpus
    dataset: Dataset
    module: torch.nn.Module
    adam: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    architecture: str
    num_params: int
    ranks: Ranks = Ranks()
    engine: Any = None
    """A world-size-1 DeepSpeed engine around the model, optimizer and scheduler,
    once ``profiler.engine.engine_for`` has made one (for DeepSpeed's own checkpoint)."""

    @classmethod
    def prepare(cls, config: CaptureConfig, *, source: ModelSource | None = None,
                say: Callable[[str], None] = print) -> "PlainJob":
        device, note = resolve_device(config.device)
        if note:
            print(note, file=sys.stderr)
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        config = config.replace(threads=config.threads or torch.get_num_threads())
        say(config.scaling_note)
        source, model, corpus, dataset = build_model_and_data(config, source)
        model.to(device)
        optimizer, scheduler = adamw(model, config, source)
        return cls(config=config, device=device, source=source, corpus=corpus, dataset=dataset,
                   module=model, adam=optimizer, scheduler=scheduler,
                   architecture=type(model).__name__,
                   num_params=sum(p.numel() for p in model.parameters()))

    @property
    def model(self) -> torch.nn.Module:
        return self.module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.adam

    def step(self, position: int) -> tuple[float, PhaseTimes]:
        """One optimizer step on the batch at data ``position``: its mean loss."""
        now = timer(self.device)
        batch = {k: v.to(self.device) for k, v in self.dataset.batch_at(position).items()}
        t0 = now()
        loss = self._loss(batch)
        t1 = now()
        loss.backward()
        t2 = now()
        self.adam.step()
        self.scheduler.step()
        self.adam.zero_grad(set_to_none=True)
        t3 = now()
        return float(loss.detach()), PhaseTimes(t1 - t0, t2 - t1, t3 - t2)

    def gradients(self, position: int) -> float:
        """Forward and backward on the batch at ``position``, leaving the gradients
        in ``p.grad`` (no optimizer step); returns the loss."""
        batch = {k: v.to(self.device) for k, v in self.dataset.batch_at(position).items()}
        self.adam.zero_grad(set_to_none=True)
        loss = self._loss(batch)
        loss.backward()
        return float(loss.detach())

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per predicted token over the held-out blocks (masks fixed)."""
        self.module.eval()
        total = count = 0.0
        try:
            for batch in self.dataset.heldout_batches(self.config.eval_sequences):
                batch = {k: v.to(self.device) for k, v in batch.items()}
                n = predicted_tokens(batch["labels"], self.source.objective)
                total += float(self._loss(batch)) * n
                count += n
        finally:
            self.module.train()
        return total / count

    @torch.no_grad()
    def heldout_losses(self, limit: int, *, group: int = 8) -> tuple[list[float], list[int]]:
        """Per held-out sequence (the first ``limit``): its summed token loss and its
        predicted tokens, with the masks of ``evaluate`` (a paired comparison of two
        models resamples these). ``group`` of evaluate's batches go through the model
        at once: the same masks, fewer and larger forward passes."""
        self.module.eval()
        sums: list[float] = []
        tokens: list[int] = []
        batches = list(self.dataset.heldout_batches(limit))
        try:
            for start in range(0, len(batches), group):
                chunk = batches[start:start + group]
                batch = {k: torch.cat([b[k] for b in chunk]).to(self.device) for k in chunk[0]}
                loss, count = self._sequence_losses(batch)
                sums.extend(loss.tolist())
                tokens.extend(count.tolist())
        finally:
            self.module.train()
        return sums, tokens

    def _sequence_losses(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        labels = batch["labels"]
        if self.source.objective == "masked":
            chosen = labels != -100
            if has_bert_head(self.module):
                logits = self.module.cls(self.module.bert(input_ids=batch["input_ids"])
                                         .last_hidden_state[chosen])
            else:
                logits = self.module(input_ids=batch["input_ids"]).logits[chosen]
            per_token = torch.nn.functional.cross_entropy(logits.float(), labels[chosen],
                                                          reduction="none")
            row = chosen.nonzero()[:, 0]
        else:  # next-token: position i predicts token i + 1
            logits = self.module(input_ids=batch["input_ids"]).logits[:, :-1]
            target = labels[:, 1:]
            chosen = target != -100
            per_token = torch.nn.functional.cross_entropy(logits[chosen].float(), target[chosen],
                                                          reduction="none")
            row = chosen.nonzero()[:, 0]
        n = len(labels)
        return (torch.zeros(n, dtype=torch.float64).index_add_(0, row, per_token.double()),
                torch.bincount(row, minlength=n))

    def make_layercheck(self, directory: Any, config: Any, *, tiers: Any = None) -> Any:
        """``tiers``: a ``layercheck.tiers.TierConfig`` (a memory tier over the directory)."""
        from layercheck import LayerCheck
        return LayerCheck(self.module, self.adam, directory, config, scheduler=self.scheduler,
                          tiers=tiers)

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.source.objective == "masked" and has_bert_head(self.module):
            return masked_token_losses(self.module, batch["input_ids"], batch["labels"], "mean")
        return self.module(**batch).loss
