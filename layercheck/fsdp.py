"""LayerCheck under PyTorch FSDP2 (``fully_shard``, DTensor shards), one object per rank.

    mesh = init_device_mesh("cuda", (world_size,))
    for block in model.model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    lc = FsdpLayerCheck(model, optimizer, "ckpt/", LayerCheckConfig(...), scheduler=scheduler)
    step = lc.restore()                 # every rank, same directory
    for step in range(step + 1, total + 1):
        loss = model(**batch).loss; loss.backward()
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
        lc.step(extra={"position": position})   # every rank, after every optimizer step
    lc.close()

``FsdpLayerCheck`` is ``LayerCheck`` (one lifecycle) with two adapters: the
layer source is this rank's DTensor shards (``DTensorShards``: the local
tensors of each parameter and of its Adam moments, no gather), and the ranks
are the process group's (``ranks.ProcessGroupRanks``). So on every rank: the
drift tracker reads the local shards (``backends.source.local``) with the fused kernel,
and the sums are all-reduced (each rank sees the drift of whole layers and
makes the same decisions); each rank writes its own shard of a layer version
and rank 0 commits the version once every rank's shard is durable; a restore
agrees on each layer's version across ranks, falling back together past a
shard damaged on any rank.

Layers are the layer map's (auto-detected or explicit), not the
``fully_shard`` units: FSDP2 shards every parameter on its own (dim 0, or
the dim its ``shard_placement_fn`` chose), so a layer's shard is its
parameters' local tensors whatever unit holds them. With one unit per block
(the usual recipe) each block unit is one layer; the root unit, which holds
the embedding, the final norm and the head, is split into those layers, at
no cost in bytes or copies. ``units()`` lists which layers each unit holds;
the directory's header records it.

At another world size (or from one process's plain versions) a restore
reshards on read (``apply_elastic``, docs/elastic.md): each rank reads the
old slices that hold its new rows of each parameter (dim 0 only). The DCP
export (``python -m layercheck export --format dcp``) reshards offline. Supported: a 1-D device mesh over all ranks (FSDP, not
HSDP or tensor parallelism), every parameter managed by ``fully_shard``.

``tiers=TierConfig(...)`` adds the memory tier and buddy (``layercheck.tiers``):
each rank keeps, and sends its buddy, the shard it owns; restarted at another
world size on one node, the node's copies are resharded (``tiers.reshard``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import torch

from .backends.dtensorshards import DTensorShards
from .backends.layermap import LayerMap
from .backends.ranks import ProcessGroupRanks
from .checkpoint import LayerCheck
from .contract.config import LayerCheckConfig

if TYPE_CHECKING:
    from .tiers.config import TierConfig

__all__ = ["FsdpLayerCheck"]


class FsdpLayerCheck(LayerCheck):
    """Layer-wise checkpointing of an FSDP2 model and its optimizer (see the module doc).

    Every rank constructs one with the same directory and config, after
    ``fully_shard`` and after the optimizer, calls ``restore()`` once,
    ``step()`` after every optimizer step and ``close()``: they are
    collectives."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 directory: str, config: LayerCheckConfig | None = None, *,
                 scheduler: Any = None, layer_map: LayerMap | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 timeout_s: float = 1800.0, tiers: "TierConfig | None" = None) -> None:
        with ProcessGroupRanks(timeout_s).closed_on_failure() as ranks:
            config = config or LayerCheckConfig()
            layer_map = layer_map or LayerMap.for_model(model, config.layers)
            super().__init__(model, optimizer, directory, config, scheduler=scheduler,
                             layer_map=layer_map, storage_options=storage_options,
                             source=DTensorShards(model, optimizer, layer_map, ranks.world_size),
                             ranks=ranks, tiers=tiers)
