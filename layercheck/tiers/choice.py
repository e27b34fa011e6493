"""Which copy each layer of each rank is restored from: local memory, the buddy's, storage.

Torch-free and pure: every rank computes the same choice from the same
gathered inventory. A ``Copy`` is one committed memory-tier slot of rank
``of``'s shard, held by rank ``holder`` (itself: its own memory tier; another:
that rank keeps it as its ward's buddy), with which of its items verified.

The restored step T is the newest step whose training state every rank can
get intact from memory (its own or a holder's): a consistent state, restored
exactly, even where storage has committed a newer step (a kill between the
durable writer's commit and the memory tier's): a composite of that newer
step would discard its stale layers' updates. Only where memory holds no such
step is T storage's newest training state every rank verified
(``durable_state``). Each layer of each rank comes from its freshest copy at
or before T: its own memory's, else a holder's (at a tie, its own), else
storage's where storage holds a newer version of it than memory does (a
damaged memory file: the durable composite's version, which the restore reads
and verifies). None where no tier holds a step.

For a sharded source (``aligned``: FSDP2, ZeRO), a layer's shards must all be of
one version: each layer comes from the newest step at or before T whose copy of
it every rank can get intact (each rank its own, else a holder's), and from
storage on every rank where storage holds a newer version or no such step
exists. A replicated job (plain data-parallel ranks) takes each rank's freshest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["Copy", "Choice", "choose", "MEMORY", "BUDDY", "STORAGE"]

MEMORY, BUDDY, STORAGE = "memory", "buddy", "storage"


@dataclass(frozen=True)
class Copy:
    """One committed slot of rank ``of``'s shard, on rank ``holder``."""

    of: int
    holder: int
    kind: str
    """Its folder: ``rank`` (the holder's own) or ``ward`` (kept for rank ``of``)."""
    k: int
    step: int
    state: bool
    """Whether its training state verified."""
    layers: tuple[bool, ...]
    """Per layer, whether its file verified."""
    marker: dict[str, Any] = field(hash=False, compare=False)

    def tier(self) -> str:
        return MEMORY if self.holder == self.of else BUDDY


@dataclass
class Choice:
    step: int
    state: dict[int, Copy | None]
    """Per rank, the copy its training state comes from (of step ``step``; None:
    storage's)."""
    layers: dict[int, list[Copy | None]]
    """Per rank, per layer, its copy (None: storage)."""

    def sources(self, rank: int) -> list[tuple[str, int | None]]:
        """Per layer of ``rank``: (tier, step; None for storage, whose step the
        durable read decides)."""
        return [(c.tier(), c.step) if c is not None else (STORAGE, None)
                for c in self.layers[rank]]

    def from_storage(self) -> bool:
        """Whether every piece comes from storage (then the durable restore does it)."""
        return all(c is None for c in self.state.values()) and all(
            c is None for layers in self.layers.values() for c in layers)


def choose(copies: list[Copy], world: int, num_layers: int, durable_state: int | None,
           durable_layers: Sequence[Sequence[int]], *, aligned: bool = False) -> Choice | None:
    """The choice (see the module doc); ``durable_layers[i]``: the steps of layer i's
    committed durable versions; ``aligned``: every layer of one step on every rank."""
    by_rank: dict[int, list[Copy]] = {r: [] for r in range(world)}
    for copy in copies:
        if 0 <= copy.of < world and len(copy.layers) == num_layers:
            by_rank[copy.of].append(copy)
    steps = None
    for r in range(world):
        have = {c.step for c in by_rank[r] if c.state}
        steps = have if steps is None else steps & have
    step = max(steps) if steps else durable_state
    if step is None:
        return None

    def rank_of(copy: Copy) -> tuple[int, int]:
        return copy.step, copy.holder == copy.of  # fresher first; at a tie, own memory

    usable = {r: sorted((c for c in by_rank[r] if c.step <= step), key=rank_of, reverse=True)
              for r in range(world)}
    state = {r: next((c for c in usable[r] if c.step == step and c.state), None)
             for r in range(world)}
    layers: dict[int, list[Copy | None]] = {r: [] for r in range(world)}
    for i in range(num_layers):
        stored = max((s for s in durable_layers[i] if s <= step), default=None)
        picks = {r: next((c for c in usable[r] if c.layers[i]), None) for r in range(world)}
        if aligned:
            common = set.intersection(*({c.step for c in usable[r] if c.layers[i]}
                                        for r in range(world)))
            newest = max(common, default=None)
            picks = {r: next((c for c in usable[r] if c.layers[i] and c.step == newest), None)
                     for r in range(world)}
        for r in range(world):
            copy = picks[r]
            layers[r].append(copy if copy is not None and (stored is None or copy.step >= stored)
                             else None)
    return Choice(step, state, layers)
