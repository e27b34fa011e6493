"""The flat-range arithmetic of ZeRO partitions, from the facts recorded with a version. Torch-free.

A version written by ``ZeroLayerCheck`` holds, per rank r and sub-group k, the
flat fp32 partition ``master/sg<k>`` (and ``optim/<field>/sg<k>``, laid out
alike). Which elements of which parameter each partition holds follows from
the header's ``zero`` facts (``zero.Partitions.header_facts``) and the world
size W, by DeepSpeed's rules:

- **ZeRO-3** partitions every parameter on its own: with p = ceil(numel / W),
  rank r holds its elements [r*p, min(numel, (r+1)*p)); a sub-group's
  partition is those slices of its members back to back, p elements each, the
  tail of the last ranks' slices padding (zero). The recorded
  ``partition_numel`` is the sum of the members' p.
- **ZeRO-1/2** partition a parameter group's flat concatenation (its members in
  order, then padding to DeepSpeed's alignment): rank r holds [r*P, (r+1)*P),
  P the recorded ``partition_numel``; what lies past the members is padding.
  Round-robin gradients reorder the members and parameter alignment pads
  between them, neither of which the facts spell out: such a layout is refused.
- **plain** (one process, ``ModuleSource``; facts without ``zero``): each
  parameter whole, ``param/<name>`` (optimizer state ``optim/<field>/<name>``)
  in the one file of rank 0.

``Partitioning`` maps a rank's partition to ``Segment`` s (which parameter
elements lie where in it, ``segments``) and a parameter's element range back
to where it lies (``locate``); ``pieces`` joins the two: what one rank's
partition under a new layout must read from the files of an old one. Sizes
come from the recorded facts of the old layout and from the live engine of
the new one, never from today's DeepSpeed's rules applied to old facts:
``Partitioning.from_facts`` only checks that the facts agree with them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..contract.errors import ModelMismatch
from ..storage.format import sub_group, tensor_key

__all__ = ["FlatGroup", "Segment", "Located", "Piece", "Partitioning", "PLAIN", "ZERO3", "ZERO12"]

PLAIN, ZERO3, ZERO12 = "plain", "zero3", "zero12"
"""The kinds of layout: one process; ZeRO-3's per-parameter partitions; ZeRO-1/2's
partitions of a group's flat concatenation."""


@dataclass(frozen=True, kw_only=True)
class FlatGroup:
    """One sub-group: its flat partitions' members and each rank's partition size."""

    index: int
    layer: str
    params: tuple[tuple[str, int], ...]
    """(name, element count) of the parameters flattened into it, in order."""
    partition_numel: int
    """Elements of each rank's partition, padding included."""


@dataclass(frozen=True, kw_only=True)
class Segment:
    """Elements [start, stop) of ``param`` lie at ``offset`` of a partition."""

    param: str
    start: int
    stop: int
    offset: int


@dataclass(frozen=True, kw_only=True)
class Located:
    """Elements [start, stop) of the flat tensor of ``owner`` in rank ``rank``'s file
    hold a parameter's elements from ``at`` on, ``at`` counted from the start of
    the range asked of ``locate``."""

    rank: int
    owner: str
    """``sg<k>`` (a ZeRO sub-group) or the parameter's name (plain)."""
    start: int
    stop: int
    at: int


@dataclass(frozen=True, kw_only=True)
class Piece:
    """Read elements [start, stop) of ``owner``'s flat tensor in rank ``rank``'s file
    into the new partition at ``offset``."""

    rank: int
    owner: str
    start: int
    stop: int
    offset: int


@dataclass(frozen=True, kw_only=True)
class Partitioning:
    """How one job laid its layers' flat partitions over ``world_size`` ranks."""

    kind: str
    world_size: int
    groups: tuple[FlatGroup, ...] = ()
    """The sub-groups (ZeRO); empty for plain."""
    _where: dict[str, tuple[int, int, int]] = field(default_factory=dict, init=False,
                                                    repr=False, compare=False)
    """Per parameter: its sub-group, its offset there (span units), its numel."""

    def __post_init__(self) -> None:
        if self.kind not in (PLAIN, ZERO3, ZERO12):
            raise ValueError(f"kind={self.kind!r}: use {PLAIN}, {ZERO3} or {ZERO12}")
        if self.world_size < 1 or (self.kind == PLAIN and self.world_size != 1):
            raise ValueError(f"world_size={self.world_size} for a {self.kind} layout")
        where: dict[str, tuple[int, int, int]] = {}
        for g in self.groups:  # per parameter: its sub-group, its offset there, its numel
            offset = 0
            for name, numel in g.params:
                if name in where:
                    raise ModelMismatch(f"parameter {name} is in two sub-groups of the layout")
                where[name] = (g.index, offset, numel)
                offset += self._span(numel)
            need = offset if self.kind == ZERO3 else math.ceil(offset / self.world_size)
            if (self.kind == ZERO3 and need != g.partition_numel) or \
                    (self.kind == ZERO12 and g.partition_numel < need):
                raise ModelMismatch(f"sub-group {g.index} ({g.layer}): its parameters need "
                                    f"partitions of {need} elements on {self.world_size} ranks "
                                    f"under {self.kind}, the facts say {g.partition_numel}")
        object.__setattr__(self, "_where", where)  # derived, not a field

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any], world_size: int) -> "Partitioning":
        """The layout that ``facts`` (a job's ``LayerSource.header_facts()``: ``zero`` for
        ZeRO, none for a single process) and ``world_size`` describe; ModelMismatch
        saying why where its flat layout cannot be read back, or the facts are
        malformed or contradict themselves."""
        zero = facts.get("zero")
        if zero is None:
            if world_size != 1:
                raise ModelMismatch(f"a layout of {world_size} ranks without ZeRO facts: only "
                                      "ZeRO and single-process versions are read as flat ranges")
            return cls(kind=PLAIN, world_size=1)
        try:
            stage = int(zero["stage"])
            options = (zero.get("checkpoint") or {}).get("layout") or {}
            groups = tuple(FlatGroup(index=int(s["sub_group"]), layer=str(s["layer"]),
                                     params=tuple((str(n), math.prod(int(d) for d in shape))
                                                  for n, shape in s["params"]),
                                     partition_numel=int(s["partition_numel"]))
                           for s in zero["sub_groups"])
            mp = int((zero.get("checkpoint") or {}).get("mp_world_size", 1))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelMismatch(f"malformed ZeRO facts in the layout ({exc!r}): it was not "
                                "written by ZeroLayerCheck") from None
        if stage not in (1, 2, 3):
            raise ModelMismatch(f"the layout records ZeRO stage {stage}: only 1, 2 and 3 exist")
        reordered = [name for name in ("round_robin_gradients", "parameter_alignment")
                     if options.get(name)]
        if reordered:
            raise ModelMismatch(
                f"the version was written under ZeRO-{stage} with {' and '.join(reordered)}, "
                "which reorder or pad its flat partitions in ways the header does not record: "
                "resume it at its own world size, or train without them to resume elsewhere")
        if mp != 1:
            raise ModelMismatch(f"the version was written with model parallelism ({mp} ways): "
                                  "only pure data-parallel ZeRO partitions are resharded")
        if [g.index for g in groups] != list(range(len(groups))):
            raise ModelMismatch("malformed ZeRO facts in the layout (sub-groups out of order)")
        return cls(kind=ZERO3 if stage == 3 else ZERO12, world_size=int(world_size), groups=groups)

    # -- the arithmetic --------------------------------------------------------------
    def _span(self, numel: int) -> int:
        """Elements a member takes in a sub-group's partition (ZeRO-3) or flat (1/2)."""
        return math.ceil(numel / self.world_size) if self.kind == ZERO3 else numel

    def segments(self, rank: int, k: int) -> list[Segment]:
        """Where each parameter's elements lie in rank ``rank``'s partition of sub-group
        ``k``, in partition order; the rest of the partition is padding."""
        self._rank(rank)
        group, out, offset = self.groups[k], [], 0
        low = rank * group.partition_numel
        for name, numel in group.params:
            if self.kind == ZERO3:
                part = self._span(numel)
                start, stop = min(numel, rank * part), min(numel, (rank + 1) * part)
                if start < stop:
                    out.append(Segment(param=name, start=start, stop=stop, offset=offset))
                offset += part
                continue
            start, stop = max(offset, low), min(offset + numel, low + group.partition_numel)
            if start < stop:
                out.append(Segment(param=name, start=start - offset, stop=stop - offset,
                                   offset=start - low))
            offset += numel
        return out

    def locate(self, param: str, start: int, stop: int) -> list[Located]:
        """Where elements [start, stop) of ``param`` lie in this layout's files, in
        element order; ModelMismatch if it holds no such parameter or range."""
        if self.kind == PLAIN:
            return [Located(rank=0, owner=param, start=start, stop=stop, at=0)] \
                if start < stop else []
        if param not in self._where:
            raise ModelMismatch(f"parameter {param} is in no sub-group of the layout that wrote "
                                "the version (another model or parameter grouping)")
        k, offset, numel = self._where[param]
        if not 0 <= start <= stop <= numel:
            raise ModelMismatch(f"parameter {param}: elements [{start}, {stop}) asked, it has "
                                f"{numel} in the layout that wrote the version")
        owner, size = sub_group(k), self.groups[k].partition_numel
        out, at = [], start
        while at < stop:
            if self.kind == ZERO3:
                part = self._span(numel)
                rank, inside = divmod(at, part)
                n = min(stop - at, part - inside)
                where = offset + inside
            else:
                rank, where = divmod(offset + at, size)
                n = min(stop - at, size - where)
            out.append(Located(rank=rank, owner=owner, start=where, stop=where + n, at=at - start))
            at += n
        return out

    def pieces(self, target: "Partitioning", rank: int, k: int) -> list[Piece]:
        """What rank ``rank``'s partition of sub-group ``k`` of ``target`` (the new
        layout) reads from this layout's files."""
        return [Piece(rank=where.rank, owner=where.owner, start=where.start, stop=where.stop,
                      offset=seg.offset + where.at)
                for seg in target.segments(rank, k)
                for where in self.locate(seg.param, seg.start, seg.stop)]

    def owners(self, params: Iterable[str]) -> list[tuple[int, str]]:
        """(a rank holding it, owner) of every flat tensor holding some of ``params``:
        where their step counts are read."""
        seen: dict[str, int] = {}
        for name in params:
            numel = self._where[name][2] if name in self._where else 1
            for where in self.locate(name, 0, numel if self.kind != PLAIN else 1):
                seen.setdefault(where.owner, where.rank)
        return [(rank, owner) for owner, rank in seen.items()]

    def key(self, kind: str, owner: str, field: str | None = None) -> str:
        """The tensor key of ``owner``'s master (``kind`` "master") or optimizer state
        ``field`` (``kind`` "optim") in this layout's files: a single process keeps
        no separate master, its ``param/<name>`` is one."""
        if kind == "master":
            return tensor_key("param" if self.kind == PLAIN else "master", owner)
        return tensor_key(kind, owner, field)

    def holds(self, param: str) -> bool:
        """Whether a ZeRO layout's sub-groups hold ``param`` (plain: every one)."""
        return self.kind == PLAIN or param in self._where

    def numel(self, param: str) -> int:
        """``param``'s element count as the layout records it (ZeRO)."""
        return self._where[param][2]

    def _rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} of a layout of {self.world_size} ranks")
