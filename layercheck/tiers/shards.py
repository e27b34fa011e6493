"""A sharded backend's memory copies (FSDP2, ZeRO): which layout wrote them, which are used.

A rank of ``FsdpLayerCheck`` or ``ZeroLayerCheck`` keeps in its memory tier, and
sends to its buddy, what its source's ``capture()`` holds: the shard it owns
(FSDP2: the local tensors of its DTensor parameters and moments; ZeRO: its flat
fp32 partitions and their Adam state). Such a copy means something only in the
layout that wrote it: a shard of 2 ranks is not one of 1, and ZeRO-3 cuts its
partitions otherwise than ZeRO-1/2. Every slot's document therefore records its
``layout`` (``tier_layout``: world size, backend, ZeRO-3 or not), and a restore
takes a copy as it is only where that layout is its own (``usable``). A plain
module's copies (every rank holds every layer whole) are usable at any world
size, as before layouts were recorded (a marker without one is a plain module's).

Copies of another sharded layout are left out of the choice: the restore
reshards them (``layercheck.tiers.reshard``) where it can, else takes storage,
saying so in one log line.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..storage.layout import Layout

__all__ = ["tier_layout", "usable", "sharded"]


def tier_layout(world_size: int, facts: Mapping[str, Any], id: int) -> dict[str, Any]:
    """The layout a slot records: ``world_size`` and the backend that ``facts`` (a
    source's ``header_facts()``) name, with ZeRO's stage where it cuts partitions
    otherwise (3), and the durable directory's ``id`` of it (whose facts a resharding
    restore reads)."""
    layout = Layout(id=0, world_size=world_size, facts=facts)
    zero = facts.get("zero")
    stage3 = isinstance(zero, Mapping) and zero.get("stage") == 3
    return {"world_size": world_size, "backend": layout.backend, "zero3": stage3, "id": id}


def sharded(layout: Mapping[str, Any]) -> bool:
    """Whether a layout's ranks each hold a shard (a backend), not every layer whole."""
    return layout.get("backend") is not None


def usable(written: Mapping[str, Any] | None, own: Mapping[str, Any]) -> bool:
    """Whether a copy written in ``written`` (its marker's layout; None: a plain
    module's, from before layouts were recorded) is one of this job's shards as
    it is."""
    written = written or {"backend": None}
    if not sharded(written) and not sharded(own):
        return True
    return all(written.get(k) == own.get(k) for k in ("world_size", "backend", "zero3"))
