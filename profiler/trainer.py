"""The training job a capture or a drill runs: model, data, AdamW, LR schedule, timed steps.

Contract: ``Trainer.prepare(config, device)`` builds everything from the
config alone (so a new process builds the same job); ``step(position)``
trains on the batch at that data position and returns its loss and phase
times; ``evaluate()`` gives the held-out loss. The LR rises linearly over
``lr_warmup_fraction`` of the steps and decays linearly to zero at the end.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from .config import CaptureConfig
from .corpus import Corpus, load_corpus
from .dataset import Dataset
from .models import ModelSource, resolve_model

__all__ = ["Trainer", "PhaseTimes"]


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds of one step's phases; ``optimizer_s`` includes the LR
    scheduler and zeroing gradients, and still includes any drift hook that
    ran inside ``optimizer.step()`` (the caller subtracts it)."""

    forward_s: float
    backward_s: float
    optimizer_s: float


@dataclass(kw_only=True)
class Trainer:
    config: CaptureConfig
    device: str
    source: ModelSource
    corpus: Corpus
    dataset: Dataset
    model: Any
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR

    @classmethod
    def prepare(cls, config: CaptureConfig, device: str, *,
                source: ModelSource | None = None) -> "Trainer":
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        source = source or resolve_model(config.model)
        model, tokenizer = source.build(seed=config.seed, max_len=config.seq_len)
        corpus = load_corpus()
        dataset = Dataset.build(corpus, tokenizer, objective=source.objective,
                                seq_len=config.seq_len, batch_size=config.batch_size,
                                seed=config.seed)
        model.to(device)
        optimizer = torch.optim.AdamW(_param_groups(model, config.weight_decay),
                                      lr=config.lr or source.default_lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config))
        return cls(config=config, device=device, source=source, corpus=corpus, dataset=dataset,
                   model=model, optimizer=optimizer, scheduler=scheduler)

    @property
    def lr_peak(self) -> float:
        return float(self.config.lr or self.source.default_lr)

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def step(self, position: int) -> tuple[float, PhaseTimes]:
        """One optimizer step on the batch at data ``position``."""
        batch = {k: v.to(self.device) for k, v in self.dataset.batch_at(position).items()}
        t0 = self._now()
        loss = self._loss(batch)
        t1 = self._now()
        loss.backward()
        t2 = self._now()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        t3 = self._now()
        return float(loss.detach()), PhaseTimes(t1 - t0, t2 - t1, t3 - t2)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per predicted token over the held-out blocks (masks fixed)."""
        self.model.eval()
        total = count = 0.0
        try:
            for batch in self.dataset.heldout_batches(self.config.eval_sequences):
                batch = {k: v.to(self.device) for k, v in batch.items()}
                n = _predicted_tokens(batch["labels"], self.source.objective)
                total += float(self._loss(batch)) * n
                count += n
        finally:
            self.model.train()
        return total / count

    @property
    def metric_name(self) -> str:
        kind = "masked-LM" if self.source.objective == "masked" else "next-token"
        return f"held-out {kind} loss ({min(self.config.eval_sequences, len(self.dataset.heldout))} sequences)"

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.source.objective == "masked" and _has_bert_head(self.model):
            return _masked_only_loss(self.model, batch)
        return self.model(**batch).loss

    def _now(self) -> float:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter()


def _has_bert_head(model: Any) -> bool:
    return hasattr(model, "bert") and hasattr(model, "cls")


def _masked_only_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """BertForMaskedLM's loss, with the vocabulary projection applied only at the
    masked positions (15% of them): the same value, and on MiniLM about half
    the compute of projecting every position onto 30,522 words."""
    hidden = model.bert(input_ids=batch["input_ids"]).last_hidden_state
    chosen = batch["labels"] != -100
    logits = model.cls(hidden[chosen])
    return torch.nn.functional.cross_entropy(logits, batch["labels"][chosen])


def _param_groups(model: Any, weight_decay: float) -> list[dict[str, Any]]:
    """Decay on matrices, none on biases and norm weights (the usual AdamW recipe)."""
    decay, plain = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else plain).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": plain, "weight_decay": 0.0}]


def _schedule(config: CaptureConfig):
    total = config.steps
    warm = max(1, round(config.lr_warmup_fraction * total))

    def factor(done: int) -> float:  # done = optimizer steps already taken
        if done < warm:
            return (done + 1) / warm
        return max(0.0, (total - done) / max(1, total - warm + 1))
    return factor


def _predicted_tokens(labels: torch.Tensor, objective: str) -> int:
    if objective == "masked":
        return int((labels != -100).sum())
    return int(labels[:, 1:].numel())
