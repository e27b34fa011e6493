"""Resume at another world size from the memory tier: the old ranks' slots on this node, resharded.

A job whose ranks shared a node left every rank's slots in that node's folder
(``rank<r>/``; a buddy's ``ward<r>/`` too). Restarted with another number of
ranks, a source that reshards on read (``apply_elastic``: FSDP2's
``DTensorShards``, ZeRO's ``Partitions``) takes from them what the durable
restore takes from the old ranks' files, by the same code: the source's
``check_elastic`` and ``apply_elastic`` over a ``read(rank, key, start, stop)``
(``LayerSource.ElasticRead``), here a ``SlotRead`` of the slots rather than an
``elastic.ElasticRead`` of the files. Each new rank reads, from its own node's
folder only, the old ranks' copies of each layer that hold its new rows or
flat pieces (``LayerSource.elastic_ranks``), and the training state of old
rank r (rank 0's where r is beyond the old world, as a durable state is read).
A ZeRO stage change is read as any other layout, as the durable restore reads it.

The step is the newest one whose needed copies every new rank finds on its
node (``resume``); they are read, verified (each item's checksum) and checked
against the live objects (``check_elastic``) on every rank before the first
byte is copied in. Where no step qualifies, or a read or a check fails on any
rank, ``resume`` returns None having changed nothing, and the restore takes
storage (the caller says so in one log line). The layout's facts (each
parameter's global shape and shard dim) are the durable directory's record of
the job that wrote the copies (``shards.tier_layout``'s ``id``).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import torch

from ..backends.elastic import piece
from ..backends.ranks import together
from ..backends.source import LayerSource
from ..contract.errors import CorruptVersion, LayerCheckError
from ..frozen import trained_nbytes
from ..snapshot import check_state
from ..storage.format import read_state_document
from ..storage.layout import Layout
from ..storage.lineage import Lineage
from ..storage.manifest import ManifestView
from .shards import usable
from .slots import Slot, off_lineage, tensors_from

__all__ = ["SlotRead", "resume"]

log = logging.getLogger("layercheck")

Found = dict[int, dict[int, tuple[Slot, dict[str, Any]]]]
"""step -> old rank -> (its slot on this node, the slot's marker)."""


class SlotRead:
    """``read(rank, key, start, stop)`` over item ``item`` of the old ranks' slots of one
    step (``LayerSource.ElasticRead``'s interface, over memory-tier copies): each old
    rank's item is read and verified on first use (CorruptVersion where damaged)."""

    def __init__(self, item: str, copies: Mapping[int, tuple[Slot, dict[str, Any]]],
                 layout: Layout) -> None:
        self.item, self.copies, self.layout = item, copies, layout
        self._views: dict[int, dict[str, torch.Tensor]] = {}
        self.held: Mapping[str, torch.Tensor] | None = None

    def share(self, world_size: int) -> int:
        """This rank's bytes of the layer, about, where the source kept nothing of it
        (``held``: ZeRO's partitions): the old ranks' copies' bytes over ``world_size``
        ranks, as the durable restore counts a resharded version's (its total bytes over
        the world size)."""
        total = sum(int(t[4]) for _, marker in self.copies.values()
                    for t in marker["items"][self.item]["tensors"])
        return total // world_size

    def tensors(self, rank: int) -> dict[str, torch.Tensor]:
        if rank not in self._views:
            if rank not in self.copies:
                raise CorruptVersion(f"old rank {rank}'s copy of {self.item} is not on this node")
            slot, marker = self.copies[rank]
            entry = marker["items"][self.item]
            self._views[rank] = tensors_from(slot.read(self.item, entry), entry["tensors"])
        return self._views[rank]

    def __call__(self, rank: int, key: str, start: int, stop: int) -> torch.Tensor:
        return piece(self.tensors(rank), key, start, stop,
                     f"old rank {rank}'s memory copy of {self.item}")


def found(folder: str, job: str, own: Mapping[str, Any], lineage: Lineage
          ) -> tuple[Found, dict[int, Any]]:
    """The committed slots of run ``job`` under this node's ``folder`` written in another
    sharded layout of the same backend, on the directory's ``lineage``
    (``storage.lineage``), by step and old rank; and each step's recorded layout (the
    marker's)."""
    out: Found = {}
    layouts: dict[int, Any] = {}
    for where in sorted(Path(folder).glob("*")):
        for k in (0, 1):
            marker = Slot(where, k).marker()
            if marker is None or marker.get("document", {}).get("job") != job or \
                    off_lineage(lineage, marker) is not None:
                continue
            written = marker["document"].get("layout") or {}
            if usable(written, own) or written.get("backend") != own.get("backend"):
                continue
            step = int(marker["step"])
            old = int(marker.get("of", marker.get("rank", -1)))
            if layouts.setdefault(step, written) != written or not \
                    0 <= old < int(written.get("world_size", 0)):
                continue
            out.setdefault(step, {}).setdefault(old, (Slot(where, k), marker))
    return out, layouts


def resume(tiers: Any, lc: Any, view: ManifestView, start: float) -> int | None:
    """Restore the newest step every rank can take from its node's copies of another
    layout (see the module doc); None, nothing changed, where none qualifies."""
    source: LayerSource = lc.source
    if type(source).apply_elastic is LayerSource.apply_elastic:
        return None  # a source that cannot reshard on read (storage refuses it too)
    copies, layouts = found(tiers.folder, tiers.job, tiers.layout, view.lineage)
    rank, num = lc.ranks.rank, len(lc.layer_map)
    ready = []
    for step in sorted(copies, reverse=True):
        written = view.layouts.get(layouts[step].get("id"))
        if written is None or written.world_size != layouts[step]["world_size"]:
            continue
        old = written.world_size
        need = {rank if rank < old else 0} | {
            r for i in range(num) for r in source.elastic_ranks(i, written)}
        if need <= set(copies[step]):
            ready.append(step)
    agreed = set.intersection(*(set(r) for r in lc.ranks.gather(ready)))
    if not agreed:
        return None
    step = max(agreed)
    written = view.layouts[layouts[step]["id"]]
    lc.writer.flush()
    lc.drift.take()

    def load() -> tuple[list[SlotRead], dict[str, torch.Tensor], dict[str, Any]]:
        slot, marker = copies[step][rank if rank < written.world_size else 0]
        entry = marker["items"]["state"]
        tensors = tensors_from(slot.read("state", entry), entry["tensors"])
        doc = read_state_document(marker["document"])
        check_state(doc, source.optimizer, source.group_members(), lc.scheduler)
        reads = []
        for i in range(num):
            read = SlotRead(f"L{i}", copies[step], written)
            source.check_elastic(i, written, read)
            reads.append(read)
        return reads, tensors, doc
    try:
        reads, tensors, doc = together(lc.ranks, load)
    except LayerCheckError as exc:  # on every rank (together): nothing changed
        log.warning("layercheck: the memory tier's copies of step %d by %s cannot be "
                    "resharded here (%s)", step, written.describe(), exc)
        return None
    now = lc.ranks.world_size
    log.info("layercheck: resharding step %d from the memory tier: %s -> %s", step,
             written.describe(), "1 process" if now == 1 else f"{now} ranks")
    return tiers.finish(lc, view, step, lambda i: source.apply_elastic(i, written, reads[i]),
                        tensors, doc, [("memory", step)] * num,
                        [dict(read.held or {}) for read in reads], start,
                        sizes=[trained_nbytes(read.held, source.frozen(i))
                               if read.held is not None else read.share(now)
                               for i, read in enumerate(reads)])
