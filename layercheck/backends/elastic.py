"""Reading a layer version written in another layout (``format``: layouts): the `read` callable.

A restore at another world size hands a backend, for each layer whose chosen
version is of another layout, an ``ElasticRead``: ``read(rank, key, start,
stop)`` gives the flat elements [start, stop) of tensor ``key`` in rank
``rank``'s file of that version (``LayerSource.apply_elastic``). It opens a
rank's file only when a call (or the plan, for the ranks the source says it
needs: ``LayerSource.elastic_ranks``) first touches it, verifies it whole as
every restore does (size, checksum, layout, identity, and for a partial
version its full version's file: ``recovery``), keeps it for the layer, and
raises CorruptVersion where it is damaged, so the planner falls back.

The row arithmetic of FSDP2 (``Shard(0)``: rank r holds chunk r of
``torch.chunk(w, world_size, 0)``, the trailing ranks an empty one) is here too:
``chunk_rows`` and ``rows``, which gathers rows [start, stop) of a whole tensor
from the old shards that hold them (or from a plain module's single file).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch

from ..contract.errors import CorruptVersion, LayerCheckError, ModelMismatch
from ..storage.format import Layout, Version, optimizer_fields, tensor_key
from ..storage.layerread import VerifiedFile
from ..storage.views import Loaded, tensor_views

__all__ = ["ElasticRead", "piece", "chunk_rows", "rows", "rows_ranks", "fsdp_params", "resharded",
           "needed_ranks"]


class ElasticRead:
    """``read(rank, key, start, stop)`` of one layer ``version`` written in ``layout``
    (see the module doc). ``fetch(rank)`` reads and verifies rank ``rank``'s file of
    it (completed by its frozen parameters); each rank's is fetched once."""

    def __init__(self, version: Version, layout: Layout,
                 fetch: Callable[[int], VerifiedFile]) -> None:
        self.version, self.layout, self._fetch = version, layout, fetch
        self.files: dict[int, VerifiedFile] = {}
        self._views: dict[int, Loaded] = {}
        self.held: Mapping[str, torch.Tensor] | None = None
        """What a source built from it in the plan (``check_elastic``), kept for its apply
        (``apply_elastic``) rather than built twice; counted in ``nbytes``."""

    def verified(self, rank: int) -> VerifiedFile:
        """Rank ``rank``'s file, verified (fetched on first use)."""
        if isinstance(rank, bool) or not isinstance(rank, int) or \
                not 0 <= rank < self.layout.world_size:
            raise LayerCheckError(f"rank {rank!r} of a version that {self.layout.describe()} "
                                  f"wrote: a rank from 0 to {self.layout.world_size - 1}")
        if rank not in self.files:
            self.files[rank] = self._fetch(rank)
        return self.files[rank]

    def tensors(self, rank: int) -> Loaded:
        """Every tensor of rank ``rank``'s file, as views of its verified bytes."""
        if rank not in self._views:
            self._views[rank] = tensor_views(self.verified(rank))
        return self._views[rank]

    def __call__(self, rank: int, key: str, start: int, stop: int) -> torch.Tensor:
        return piece(self.tensors(rank), key, start, stop,
                     f"layer {self.version.layer}: rank {rank}'s file of its version of step "
                     f"{self.version.step}")

    @property
    def nbytes(self) -> int:
        """The memory of the files fetched so far and of what a source holds from them."""
        held = sum(t.numel() * t.element_size() for t in (self.held or {}).values())
        return held + sum(file.nbytes for file in self.files.values())


def piece(tensors: Mapping[str, torch.Tensor], key: str, start: int, stop: int,
          whose: str) -> torch.Tensor:
    """Flat elements [start, stop) of tensor ``key`` of one old rank's copy of a layer
    (``tensors``: its file's, or its memory-tier slot's: ``layercheck.tiers.reshard``),
    a view: what every ``ElasticRead`` call returns. ModelMismatch where the copy holds
    no ``key``; LayerCheckError where it holds fewer elements (``whose`` names the copy
    in both)."""
    if key not in tensors:
        raise ModelMismatch(f"{whose} holds no {key}; the checkpoint was written for a "
                            "different model or optimizer")
    flat = tensors[key].reshape(-1)
    if not 0 <= start <= stop <= flat.numel():
        raise LayerCheckError(f"{whose} holds {flat.numel()} elements of {key}, not "
                              f"[{start}, {stop}): a source asked for what its layout does "
                              "not hold")
    return flat[start:stop]


def chunk_rows(n: int, world_size: int) -> list[tuple[int, int]]:
    """Per rank, the rows [start, stop) of a dim of ``n`` that FSDP2 gives it over
    ``world_size`` ranks: ``torch.chunk``'s chunks of ceil(n / world_size) rows, an
    empty one for each rank past the last chunk."""
    size = math.ceil(n / world_size) if n else 0
    return [(min(r * size, n), min((r + 1) * size, n)) for r in range(world_size)]


def fsdp_params(layout: Layout) -> Mapping[str, Any]:
    """Per parameter, the shape and shard dim an FSDP2 layout recorded; {} for a plain
    module's (one whole file); ModelMismatch for another backend's."""
    if layout.backend is None:
        return {}
    if layout.backend != "fsdp":
        raise ModelMismatch(f"it was written by {layout.describe()}, whose flat partitions "
                            "this source does not read")
    try:
        return layout.facts["fsdp"]["params"]
    except (KeyError, TypeError) as exc:
        raise CorruptVersion(f"layout {layout.id}'s fsdp facts record no parameters "
                             f"({exc!r})") from None


def rows_ranks(layout: Layout, name: str, shape: tuple[int, ...], start: int, stop: int
               ) -> list[tuple[int, int, int]]:
    """(old rank, first row, stop row) of each file of ``layout`` that holds rows of
    [start, stop) of parameter ``name`` (global ``shape``), the rows counted in the
    whole tensor; ModelMismatch where it cannot be read by rows (see ``rows``)."""
    params = fsdp_params(layout)
    if not params:
        return [(0, start, stop)] if stop > start else []
    recorded = params.get(name)
    if recorded is None:
        raise ModelMismatch(f"{name} is not among the parameters its layout recorded: another "
                            "model")
    if tuple(recorded["shape"]) != tuple(shape):
        raise ModelMismatch(f"{name} has shape {tuple(recorded['shape'])} in the checkpoint but "
                            f"{tuple(shape)} here (a different model)")
    if int(recorded["dim"]) != 0:
        raise ModelMismatch(f"{name} was sharded along dim {recorded['dim']} "
                            "(a shard_placement_fn): resharding reads rows of dim 0 only")
    out = []
    for rank, (a, b) in enumerate(chunk_rows(shape[0] if shape else 1, layout.world_size)):
        lo, hi = max(a, start), min(b, stop)
        if lo < hi:
            out.append((rank, lo, hi))
    return out


def rows(read: Callable[[int, str, int, int], torch.Tensor], layout: Layout, name: str,
         key: str, shape: tuple[int, ...], start: int, stop: int, *,
         empty_from: int = 0) -> torch.Tensor:
    """Rows [start, stop) along dim 0 of the whole tensor ``key`` (shaped like parameter
    ``name``, global ``shape``) of a version written in ``layout``: from each old
    rank's slice that holds some (FSDP2, dim 0), or from the one file of a plain
    module. A new tensor (a copy), shaped (stop - start, *shape[1:]); where no rows are
    asked for, its dtype is that of ``key`` in rank ``empty_from``'s file."""
    inner = math.prod(shape[1:])
    if not shape:  # a 0-d parameter: whole on every rank of a plain or FSDP2 file
        return read(empty_from, key, 0, 1).reshape(()).clone()
    parts = []
    chunks = chunk_rows(shape[0], layout.world_size) if fsdp_params(layout) else [(0, shape[0])]
    for rank, lo, hi in rows_ranks(layout, name, shape, start, stop):
        first = chunks[rank][0]
        parts.append(read(rank, key, (lo - first) * inner, (hi - first) * inner))
    flat = torch.cat(parts) if parts else read(empty_from, key, 0, 0)  # none: the dtype
    return flat.reshape(stop - start, *shape[1:]).clone()


RowsOf = Callable[[str, torch.Tensor], "tuple[int, int]"]
"""Per parameter (name, live tensor): the rows [start, stop) of dim 0 of the whole
tensor that this rank holds (all of them in one process)."""


def needed_ranks(layout: Layout, params: list[tuple[str, torch.Tensor]],
                 rows_of: RowsOf) -> list[int]:
    """The ranks of ``layout`` whose files hold rows this rank needs of ``params`` (at
    least one: where it needs none, rank 0's gives the scalars and buffers)."""
    ranks = {rank for name, p in params
             for rank, _, _ in rows_ranks(layout, name, tuple(p.shape), *rows_of(name, p))}
    return sorted(ranks) or [0]


def resharded(read: ElasticRead, params: list[tuple[str, torch.Tensor]],
              buffers: list[tuple[str, torch.Tensor]], rows_of: RowsOf) -> dict[str, torch.Tensor]:
    """A layer's tensors as this rank's layout would have saved them, read from a version
    of another (FSDP2 sharded along dim 0, or a plain module's): per parameter the rows
    ``rows_of`` names of its weight and of each optimizer-state tensor, its scalar state
    (Adam's step, the same on every rank) and the layer's buffers (whole on every rank),
    under the keys of ``format.tensor_key``. Copies, not views of the files."""
    layout = read.layout
    first = needed_ranks(layout, params, rows_of)[0]  # a file this rank reads anyway
    keys = read.tensors(first)
    out: dict[str, torch.Tensor] = {}
    for name, p in params:
        shape, (start, stop) = tuple(p.shape), rows_of(name, p)
        key = tensor_key("param", name)
        out[key] = rows(read, layout, name, key, shape, start, stop, empty_from=first)
        for field, value in optimizer_fields(keys, name).items():
            key = tensor_key("optim", name, field)
            out[key] = value.clone() if value.dim() == 0 else rows(
                read, layout, name, key, shape, start, stop, empty_from=first)
    for name, _ in buffers:
        key = tensor_key("buffer", name)
        if key in keys:
            out[key] = keys[key].clone()
    return out
