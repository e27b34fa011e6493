"""Which copy each layer of each rank is restored from: local memory, the buddy's, storage.

Torch-free and pure: every rank computes the same choice from the same
gathered inventory. A ``Copy`` is one committed memory-tier slot of rank
``of``'s shard, held by rank ``holder`` (itself: its own memory tier; another:
that rank keeps it as its ward's buddy), with which of its items verified.

The restored step T is the newest step whose training state every rank can
get intact from memory (its own or a holder's). Each layer of each rank comes
from its freshest intact copy at or before T: at T from its own memory, else
at T from a holder, else an older slot (own first), else storage (the durable
composite's version, chosen by the restore). None where memory has no step
every rank can get, or where storage holds a newer step than T: then the
restore is the durable one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    state: dict[int, Copy]
    """Per rank, the copy its training state comes from (of step ``step``)."""
    layers: dict[int, list[Copy | None]]
    """Per rank, per layer, its copy (None: storage)."""

    def sources(self, rank: int) -> list[tuple[str, int | None]]:
        """Per layer of ``rank``: (tier, step; None for storage, whose step the
        durable plan decides)."""
        return [(c.tier(), c.step) if c is not None else (STORAGE, None)
                for c in self.layers[rank]]


def choose(copies: list[Copy], world: int, num_layers: int,
           durable_latest: int | None) -> Choice | None:
    """The choice (see the module doc), or None for a durable restore."""
    by_rank: dict[int, list[Copy]] = {r: [] for r in range(world)}
    for copy in copies:
        if 0 <= copy.of < world and len(copy.layers) == num_layers:
            by_rank[copy.of].append(copy)
    steps = None
    for r in range(world):
        have = {c.step for c in by_rank[r] if c.state}
        steps = have if steps is None else steps & have
    if not steps:
        return None
    step = max(steps)
    if durable_latest is not None and durable_latest > step:
        return None

    def rank_of(copy: Copy) -> tuple[int, int]:
        return copy.step, copy.holder == copy.of  # fresher first; at a tie, own memory

    state, layers = {}, {}
    for r in range(world):
        usable = sorted((c for c in by_rank[r] if c.step <= step), key=rank_of, reverse=True)
        state[r] = next(c for c in usable if c.step == step and c.state)
        layers[r] = [next((c for c in usable if c.layers[i]), None) for i in range(num_layers)]
    return Choice(step, state, layers)
