"""LayerCheck inside DeepSpeed ZeRO (stages 1, 2 and 3), one object per rank.

    from layercheck import LayerCheckConfig
    from layercheck.groups import layer_aligned_param_groups
    from layercheck.zero import ZeroLayerCheck

    optimizer = torch.optim.AdamW(layer_aligned_param_groups(model, weight_decay=0.01), lr=2e-5)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    lc = ZeroLayerCheck(engine, "ckpt/", LayerCheckConfig(...))
    step = lc.restore()                 # every rank, same directory
    for step in range(step + 1, total + 1):
        loss = engine(batch).loss; engine.backward(loss); engine.step()
        lc.step()                       # every rank, after every engine.step()
    lc.close()

``ZeroLayerCheck`` is ``LayerCheck`` (one lifecycle) with two adapters: the
layer source is this rank's ZeRO partitions (``Partitions``: its fp32 masters,
Adam moments and step counts, one shard per rank, no gather), and the ranks
are the process group's (``ranks.ProcessGroupRanks``). So on every rank: the
drift sums of its partitions are all-reduced (each rank sees the drift of
whole layers and makes the same decisions); rank 0 commits a version once
every rank's shard is durable (``commit.ShardedCommit``); a restore agrees on
each layer's version across ranks (falling back together past a shard that
is damaged on any rank), then refreshes the module weights from the masters
(DeepSpeed's own ``safe_set_full_fp32_param`` would leave them stale). A version
of another world size, ZeRO stage or one process is resharded on read
(``Partitions.apply_elastic``; docs/elastic.md).

The optimizer's parameter groups must be layer-aligned (no group mixes two
layers; ``groups.layer_aligned_param_groups`` builds them) so that a layer's
optimizer state is whole flat partitions. The directory must be shared by
all ranks (one filesystem or object store). ``tiers=TierConfig(...)`` adds the
memory tier and buddy (``layercheck.tiers``): each rank keeps, and sends its
buddy, its partitions; at another world size or stage a restore takes storage.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from .backends.layermap import LayerMap
from .backends.ranks import ProcessGroupRanks
from .backends.zeropartitions import partitions_for
from .checkpoint import LayerCheck
from .contract.config import LayerCheckConfig

if TYPE_CHECKING:
    from .tiers.config import TierConfig

__all__ = ["ZeroLayerCheck"]


class ZeroLayerCheck(LayerCheck):
    """Layer-wise checkpointing of a DeepSpeed ZeRO engine (see the module doc).

    Every rank constructs one with the same directory and config, calls
    ``restore()`` once, ``step()`` after every ``engine.step()`` and
    ``close()``: they are collectives. ``scheduler`` defaults to the engine's."""

    def __init__(self, engine: Any, directory: str, config: LayerCheckConfig | None = None, *,
                 scheduler: Any = None, layer_map: LayerMap | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 timeout_s: float = 1800.0, tiers: "TierConfig | None" = None) -> None:
        with ProcessGroupRanks(timeout_s).closed_on_failure() as ranks:
            config = config or LayerCheckConfig()
            layer_map = layer_map or LayerMap.for_model(engine.module, config.layers)
            super().__init__(engine.module, engine.optimizer, directory, config,
                             scheduler=scheduler if scheduler is not None else engine.lr_scheduler,
                             layer_map=layer_map, storage_options=storage_options,
                             source=partitions_for(engine, layer_map), ranks=ranks,
                             tiers=tiers)
