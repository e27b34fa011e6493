"""How the versions of one job were laid out across ranks (``format``: layouts). Torch-free.

A ``Layout`` is a world size and the backend's facts (``LayerSource.header_facts``)
of a job that wrote versions into a directory. Layout 0 is the header's own (its
``world_size``, 1 where absent, and its backend facts); a job that restored at
another world size or backend records its own (``layout`` record, ids 1, 2, ...)
and every version it writes names it. ``format`` re-exports ``Layout``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["Layout", "BACKENDS"]

BACKENDS = ("zero", "fsdp")
"""The header facts that name a backend (``ZeroLayerCheck``, ``FsdpLayerCheck``); a job
with none of them is a plain module in one process."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How the versions of one job were laid out across ranks."""

    id: int
    """0: the header's own world size and backend facts (every directory written before
    layouts were recorded)."""
    world_size: int
    """Ranks that wrote shards; 1 for a single-process job."""
    facts: Mapping[str, Any] = field(default_factory=dict)
    """What ``LayerSource.header_facts()`` returned for that job ({} for a plain module)."""

    def __post_init__(self) -> None:
        if isinstance(self.id, bool) or not isinstance(self.id, int) or self.id < 0:
            raise ValueError(f"Layout(id={self.id!r}): an integer >= 0")
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) \
                or self.world_size < 1:
            raise ValueError(f"Layout(world_size={self.world_size!r}): an integer >= 1")

    @property
    def backend(self) -> str | None:
        """``zero`` or ``fsdp``, or None for a plain module."""
        return _backend(self.facts)

    def describe(self) -> str:
        """How an error names it: '2 ranks (fsdp)', '1 process (plain module)'."""
        ranks = "1 process" if self.world_size == 1 else f"{self.world_size} ranks"
        return f"{ranks} ({self.backend or 'plain module'})"

    def same_job(self, world_size: int, facts: Mapping[str, Any]) -> bool:
        """Whether a job of ``world_size`` ranks whose source gives ``facts`` writes in this
        layout: the same world size and backend (what a restore compared before layouts were recorded:
        other facts, a grouping say, are the source's ``check`` to refuse), and for ZeRO the
        same flat layout: ZeRO-3 cuts each parameter, ZeRO-1/2 a group's concatenation,
        into partitions of the same sizes but other contents."""
        return self.world_size == world_size and self.backend == _backend(facts) and \
            _zero3(self.facts) == _zero3(facts)

    def header(self) -> dict[str, Any]:
        """The layout as a header's fields (``world_size`` and the backend facts): what
        ``ZeroFacts.from_header`` and ``FsdpFacts.from_header`` read."""
        return {"world_size": self.world_size, **dict(self.facts)}

    def shards_problem(self, shards: int) -> str | None:
        """Why a version of this layout with ``shards`` shards (0: one unsharded file)
        cannot be one of it, or None: it holds one shard per rank, or, a world size of
        1, a single file."""
        if shards == self.world_size or (shards == 0 and self.world_size == 1):
            return None
        return (f"{shards or 'no'} shards in a version of layout {self.id}, which "
                f"{self.describe()} wrote: its records are damaged")

    def to_record(self) -> dict[str, Any]:
        return {"kind": "layout", "id": self.id, "world_size": self.world_size,
                "facts": json.loads(json.dumps(dict(self.facts)))}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "Layout":
        """The layout of a ``layout`` record that passed ``format.check_record``."""
        return cls(id=record["id"], world_size=record["world_size"], facts=record["facts"])

    @classmethod
    def of_header(cls, header: Mapping[str, Any] | None) -> "Layout":
        """Layout 0: the header's world size (1 where absent) and backend facts."""
        header = header or {}
        return cls(id=0, world_size=int(header.get("world_size", 1)),
                   facts={name: header[name] for name in BACKENDS if name in header})


def _zero3(facts: Mapping[str, Any]) -> bool:
    zero = facts.get("zero")
    return isinstance(zero, Mapping) and zero.get("stage") == 3


def _backend(facts: Mapping[str, Any]) -> str | None:
    return next((name for name in BACKENDS if name in facts), None)
