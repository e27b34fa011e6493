"""Flat tensors assembled from the pieces of a version written in another layout.

A restore at another world size gives a source ``read(rank, key,
start, stop)``: elements [start, stop) of the flat tensor ``key`` in rank
``rank``'s verified file of the version (``LayerSource.apply_elastic``). Here,
with the arithmetic of ``layercheck.backends.partitioning``, such pieces become the
tensors a live layout holds: a ZeRO partition of the new world size
(``zero.Partitions.apply_elastic``, via ``gather``, ``moment_fields`` and
``step_of``) or, for one process, whole parameters with their Adam state
(``zero_layer_tensors``, N -> 1). Each call reads only the pieces it needs.

Optimizer state: Adam's (torch's Adam and AdamW, DeepSpeed's): the moments
``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` under amsgrad) are laid out
as the masters are; the step count is one per flat tensor, and every flat
tensor a parameter group's members come from must count the same.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import torch

from .elastic import ElasticRead
from ..contract.errors import LayerCheckError, ModelMismatch
from ..storage.format import optimizer_fields, sub_group, tensor_key
from .partitioning import PLAIN, Partitioning, Piece

__all__ = ["Read", "gather", "moment_fields", "saved_fields", "step_of", "whole_pieces",
           "partition_tensors", "zero_layer_tensors", "read_buffers"]

Read = Callable[[int, str, int, int], torch.Tensor]
"""``read(rank, key, start, stop)``: elements [start, stop) of flat tensor ``key`` in rank
``rank``'s file of the version being restored (see ``LayerSource.apply_elastic``)."""


def moment_fields(optimizer: torch.optim.Optimizer, group: Mapping[str, Any]) -> tuple[str, ...]:
    """The optimizer-state tensors laid out as the masters (Adam's moments); ModelMismatch
    for an optimizer whose state an elastic restore cannot reshard."""
    if "Adam" not in type(optimizer).__name__:
        raise ModelMismatch(f"resuming at another world size reshards Adam's state (exp_avg, "
                              f"exp_avg_sq, step); this optimizer is {type(optimizer).__name__}: "
                              "resume at the world size that wrote the checkpoint")
    return ("exp_avg", "exp_avg_sq", *(("max_exp_avg_sq",) if group.get("amsgrad") else ()))


def gather(read: Read, source: Partitioning, pieces: Iterable[Piece], kind: str,
           field: str | None, numel: int, dtype: torch.dtype, layer: str) -> torch.Tensor:
    """A new flat tensor of ``numel`` elements of ``dtype``: ``pieces`` of the master
    (``kind`` "master") or of optimizer state ``field`` (``kind`` "optim") read from
    ``source``'s files, zeros elsewhere (padding). ModelMismatch where a piece comes
    back short or in another dtype (a copy would cast it silently)."""
    out = torch.zeros(numel, dtype=dtype)
    for piece in pieces:
        key = source.key(kind, piece.owner, field)
        data = read(piece.rank, key, piece.start, piece.stop).reshape(-1)
        n = piece.stop - piece.start
        if data.numel() != n:
            raise ModelMismatch(f"layer {layer}: rank {piece.rank}'s {key} holds no elements "
                                f"[{piece.start}, {piece.stop}) (the recorded layout and the "
                                "files disagree)")
        if data.dtype != dtype:
            raise ModelMismatch(f"layer {layer}: {key} is {data.dtype} in the checkpoint but "
                                f"{dtype} here: load the model in the dtype it was trained in "
                                "(its optimizer state was saved for that dtype)")
        out[piece.offset:piece.offset + n].copy_(data)
    return out


def step_of(read: Read, source: Partitioning, params: Iterable[str],
            layer: str) -> torch.Tensor | None:
    """The Adam step count of the flat tensors ``params`` come from (a 0-d tensor, as
    saved), None where they hold none; ModelMismatch where they count differently
    (one flat partition has one count)."""
    counts = []
    for rank, owner in source.owners(params):
        counts.append(read(rank, tensor_key("optim", owner, "step"), 0, 1).reshape(()))
    if not counts:
        return None
    if any(not torch.equal(c, counts[0]) for c in counts):
        raise ModelMismatch(f"layer {layer}: the version's parameters come from flat tensors "
                            f"with different Adam step counts ({sorted({float(c) for c in counts})})"
                            ": they cannot share one partition; resume at the world size that "
                            "wrote it")
    return counts[0].clone()


def read_buffers(read: Read, buffers: Iterable[tuple[str, torch.Tensor]],
                 layer: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(live buffer, its saved value) of each of ``buffers``, from rank 0's file (every
    rank saves the layer's whole buffers), checked as a same-size restore checks them."""
    out = []
    for name, live in buffers:
        key = tensor_key("buffer", name)
        saved = read(0, key, 0, live.numel())
        if saved.numel() != live.numel() or saved.dtype != live.dtype:
            raise ModelMismatch(f"layer {layer}: {key} is {saved.dtype} of {saved.numel()} "
                                f"elements in the checkpoint, {live.dtype} of {live.numel()} here")
        out.append((live, saved.reshape(live.shape)))
    return out


def zero_layer_tensors(written: Any, layer: str, params: Iterable[tuple[str, torch.Tensor]],
                       buffers: Iterable[tuple[str, torch.Tensor]], read: Read,
                       optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Layer ``layer`` of a version written by ZeRO (``written``: its ``format.Layout``,
    world size and ``zero`` facts) as one process holds it, for ``ModuleSource``
    (N -> 1): per parameter of ``params`` (name, live tensor) its whole weight
    ``param/<name>`` (the fp32 master), ``optim/exp_avg/<name>``,
    ``optim/exp_avg_sq/<name>`` and ``optim/step/<name>``, assembled from the ranks'
    pieces; ``buffer/<name>`` of each of ``buffers``. A parameter the version does
    not hold (frozen: ZeRO's optimizer does not step it) keeps its live value, as
    on a same-size ZeRO restore. Give the result to ``ModuleSource.check`` and
    ``apply`` as a same-size version's tensors."""
    source = Partitioning.from_facts(written.facts, written.world_size)
    if source.kind == PLAIN:
        raise LayerCheckError("zero_layer_tensors reads versions written by ZeRO; this one was "
                              "written by a single process")
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    out: dict[str, torch.Tensor] = {}
    for name, live in params:
        if not source.holds(name):
            out[tensor_key("param", name)] = live.detach()
            continue
        if source.numel(name) != live.numel():
            raise ModelMismatch(f"layer {layer}: {name} has {source.numel(name)} elements in the "
                                f"checkpoint but {live.numel()} here (a different model)")
        pieces = whole_pieces(source, name, live.numel())
        master = gather(read, source, pieces, "master", None, live.numel(), torch.float32, layer)
        out[tensor_key("param", name)] = master.view(live.shape)
        for field in moment_fields(optimizer, groups.get(id(live), {})):
            out[tensor_key("optim", name, field)] = gather(
                read, source, pieces, "optim", field, live.numel(), torch.float32,
                layer).view(live.shape)
        step = step_of(read, source, [name], layer)
        if step is not None:
            out[tensor_key("optim", name, "step")] = step
    buffers = list(buffers)
    for (name, _), (_, saved) in zip(buffers, read_buffers(read, buffers, layer)):
        out[tensor_key("buffer", name)] = saved
    return out


def whole_pieces(source: Partitioning, name: str, numel: int) -> list[Piece]:
    """The pieces of ``source``'s files that make up all ``numel`` elements of parameter
    ``name``, placed as one whole flat tensor."""
    return [Piece(rank=w.rank, owner=w.owner, start=w.start, stop=w.stop, offset=w.at)
            for w in source.locate(name, 0, numel)]


def saved_fields(read: ElasticRead, source: Partitioning, params: Iterable[str]) -> tuple[str, ...]:
    """The optimizer-state tensors laid out as the masters that ``source``'s files hold
    for ``params`` (Adam's moments, as saved: no live optimizer to ask), in file order;
    () where they hold no optimizer state."""
    owners = source.owners(params)
    if not owners:
        return ()
    rank, owner = owners[0]
    return tuple(f for f in optimizer_fields(read.tensors(rank), owner) if f != "step")


def partition_tensors(read: ElasticRead, source: Partitioning, target: Partitioning, rank: int,
                      ks: Iterable[int], layer: str) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s partitions of sub-groups ``ks`` of ``target`` (the layout of a
    checkpoint being written offline: an export) read from a version of ``source``: per
    sub-group its fp32 ``master/sg<k>``, the moments the version saved under
    ``optim/<field>/sg<k>`` and its step count ``optim/step/sg<k>``, padding zero, as a
    version written in ``target`` would hold them. New tensors."""
    out: dict[str, torch.Tensor] = {}
    for k in ks:
        group = target.groups[k]
        names, owner = [n for n, _ in group.params], sub_group(k)
        pieces = source.pieces(target, rank, k)
        out[tensor_key("master", owner)] = gather(read, source, pieces, "master", None,
                                                  group.partition_numel, torch.float32, layer)
        step = step_of(read, source, names, layer)
        if step is not None:
            out[tensor_key("optim", owner, "step")] = step
        for field in saved_fields(read, source, names):
            out[tensor_key("optim", owner, field)] = gather(
                read, source, pieces, "optim", field, group.partition_numel, torch.float32,
                layer)
    return out

