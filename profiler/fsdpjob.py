"""The FSDP2 training job: the plain capture's job under ``fully_shard``, one rank each.

Contract (``zerojob.ZeroTrainer``'s, which this extends): every rank calls
``FsdpTrainer.prepare(zero)`` once torch.distributed is up (``init_fsdp``),
then the same sequence of ``step(position)`` and ``evaluate()``: each
forward gathers a unit's parameters from every rank, so these are
collectives.

Same job as ``trainer.Trainer`` (model, seed, data, AdamW and its two
groups, LR schedule, loss); what differs, and why:

- The model is built whole on every rank from the same seed (its weights
  are the plain capture's, bit for bit); ``fully_shard`` then wraps each
  block of the layer map (so each block unit is one layer) and the root, on
  a 1-D CPU mesh over all ranks, and each rank keeps its shard of every
  parameter.
- AdamW is built after ``fully_shard`` (over the sharded parameters), with
  the plain capture's groups: matrices decay, biases and norm weights do not.
- Each step's batch is split evenly over the ranks and a rank back-propagates
  ``ranks x (its summed token losses) / (predicted tokens of the whole
  batch)``: FSDP2 averages gradients over the ranks, so the update is the
  plain capture's.
- BERT masked LMs run as ``MaskedOnlyBert``, the whole loss inside the root
  unit's forward (FSDP2 gathers the root's parameters in its forward hook).
- ``engine`` is the FSDP2 root module: it is called, and switched between
  train and eval, as DeepSpeed's engine is.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .config import ZeroConfig
from .corpus import load_corpus
from .dataset import Dataset
from .models import ModelSource, resolve_model
from .trainer import PhaseTimes, _has_bert_head, _param_groups, _predicted_tokens, _schedule
from .zerojob import MaskedOnlyBert, ZeroTrainer

__all__ = ["FsdpTrainer", "init_fsdp"]


def init_fsdp() -> tuple[int, int]:
    """Start torch.distributed for a rank under torchrun (gloo); returns (rank,
    world size). Idempotent."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


@dataclass(kw_only=True)
class FsdpTrainer(ZeroTrainer):
    optimizer: torch.optim.Optimizer

    @classmethod
    def prepare(cls, zero: ZeroConfig, *, source: ModelSource | None = None) -> "FsdpTrainer":
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from layercheck.layermap import LayerMap
        config = zero.capture
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        source = source or resolve_model(config.model)
        model, tokenizer = source.build(seed=config.seed, max_len=config.seq_len)
        architecture = type(model).__name__
        num_params = sum(p.numel() for p in model.parameters())
        if source.objective == "masked" and _has_bert_head(model):
            model = MaskedOnlyBert(model)
        dataset = Dataset.build(corpus := load_corpus(), tokenizer, objective=source.objective,
                                seq_len=config.seq_len, batch_size=config.batch_size,
                                seed=config.seed)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in LayerMap.auto(model):
            if layer.kind == "block":
                fully_shard(model.get_submodule(layer.name), mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(_param_groups(model, config.weight_decay),
                                      lr=config.lr or source.default_lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config))
        return cls(zero=zero, rank=dist.get_rank(), source=source, corpus=corpus,
                   dataset=dataset, engine=model, optimizer=optimizer,
                   architecture=architecture, num_params=num_params, scheduler=scheduler)

    @property
    def model(self) -> nn.Module:
        return self.engine

    def step(self, position: int) -> tuple[float, PhaseTimes]:
        """One optimizer step on the batch at data ``position``; returns this rank's
        share of the batch's mean loss and this rank's phase times (``optimizer_s``:
        the optimizer and LR scheduler steps and zeroing the gradients)."""
        batch = self.dataset.batch_at(position)
        total = _predicted_tokens(batch["labels"], self.source.objective)
        t0 = time.perf_counter()
        summed = self._token_loss_sum(self._share(batch))
        t1 = time.perf_counter()
        (summed * (self.zero.ranks / total)).backward()
        t2 = time.perf_counter()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        return float(summed.detach()) / total, PhaseTimes(t1 - t0, t2 - t1, t3 - t2)

    def make_layercheck(self, directory: Any, config: Any) -> Any:
        from layercheck.fsdp import FsdpLayerCheck
        return FsdpLayerCheck(self.engine, self.optimizer, str(directory), config,
                              scheduler=self.scheduler)

    def setup(self) -> tuple[str, str, dict[str, Any]]:
        from layercheck.fsdp import units
        from layercheck.layermap import LayerMap
        zero = self.zero
        return (f"PyTorch FSDP2 capture on {zero.ranks} ranks (processes, gloo, CPU; "
                f"{self.config.threads} thread(s) each; fully_shard per block, then the root), "
                "FsdpLayerCheck writing one shard per rank", "fsdp",
                {"capture": f"PyTorch FSDP2 (fully_shard), {zero.ranks} ranks",
                 "ranks": zero.ranks, "backend": "gloo", "device": "cpu",
                 "version": torch.__version__, "mesh": [zero.ranks],
                 "units": units(self.engine, LayerMap.auto(self.engine)),
                 "integration": "layercheck.fsdp.FsdpLayerCheck",
                 "micro_batch_per_rank": zero.micro_batch})
