"""The FSDP2 job: the plain job under PyTorch's ``fully_shard``, one process per rank.

Contract (``zero.ZeroJob``'s, which this extends): every rank calls
``FsdpJob.prepare(zero)`` under torchrun (it starts torch.distributed with
gloo), then the same sequence of ``step(position)`` and ``evaluate()``: each
forward gathers a unit's parameters from every rank, so these are
collectives.

Same job as ``PlainJob`` (model, seed, data, AdamW on layer-aligned groups,
LR schedule, loss) and the same batch split, loss scaling and
``MaskedOnlyBert`` as ``ZeroJob``; what differs, and why:

- The model is built whole on every rank from the same seed (its weights
  are the plain job's, bit for bit); ``fully_shard`` then wraps each block
  of the layer map (so each block unit is one layer) and the root, on a 1-D
  CPU mesh over all ranks, and each rank keeps its shard of every parameter.
- AdamW is built after ``fully_shard``, over the sharded parameters (an
  optimizer made before it would hold the unsharded ones).
- FSDP2 averages gradients over the ranks, as DeepSpeed does, so the
  ``ranks x (summed token losses) / (predicted tokens of the whole batch)``
  a rank back-propagates makes the update the plain job's.
- ``engine`` is the FSDP2 root module: called, and switched between train
  and eval, as DeepSpeed's engine is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import ZeroConfig
from .job import adamw
from ..models import ModelSource
from .zero import ZeroJob

__all__ = ["FsdpJob", "init_fsdp"]


def init_fsdp() -> tuple[int, int]:
    """Start torch.distributed for a rank under torchrun (gloo); returns (rank,
    world size). Idempotent."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


@dataclass(kw_only=True, eq=False)
class FsdpJob(ZeroJob):
    adam: torch.optim.Optimizer

    kind = "fsdp"
    setup = "FSDP2"
    integration = "FsdpLayerCheck"
    sources_key = "fsdp"

    @staticmethod
    def start() -> tuple[int, int]:
        return init_fsdp()

    @staticmethod
    def wrap(model: nn.Module, zero: ZeroConfig, source: ModelSource) -> dict[str, Any]:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from layercheck.backends.layermap import LayerMap
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in LayerMap.auto(model):
            if layer.kind == "block":
                fully_shard(model.get_submodule(layer.name), mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer, scheduler = adamw(model, zero.capture, source)
        return {"engine": model, "adam": optimizer, "scheduler": scheduler}

    @property
    def model(self) -> nn.Module:
        return self.engine

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.adam

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def update(self) -> None:
        self.adam.step()
        self.scheduler.step()
        self.adam.zero_grad(set_to_none=True)

    def make_layercheck(self, directory: Any, config: Any) -> Any:
        from layercheck.fsdp import FsdpLayerCheck
        return FsdpLayerCheck(self.engine, self.adam, str(directory), config,
                              scheduler=self.scheduler)

    def describe_setup(self) -> tuple[str, str, dict[str, Any]]:
        from layercheck.backends.dtensorshards import units
        from layercheck.backends.layermap import LayerMap
        zero = self.zero
        return "PyTorch FSDP2", "; fully_shard per block, then the root", {
            "capture": f"PyTorch FSDP2 (fully_shard), {zero.ranks} ranks", "ranks": zero.ranks,
            "backend": "gloo", "device": "cpu", "version": torch.__version__,
            "mesh": [zero.ranks], "units": units(self.engine, LayerMap.auto(self.engine)),
            "integration": "layercheck.fsdp.FsdpLayerCheck"}
