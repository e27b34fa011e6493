"""How a written job becomes committed: one process, or every rank together.

The writer writes a job's files itself (atomically, durably); a ``Commit``
then makes them exist by appending their manifest records. ``Commit`` is the
single-process case. ``ShardedCommit`` is for data-parallel jobs where every
rank writes its own shard of each version (DeepSpeed ZeRO): the ranks
exchange what they wrote over a dedicated process group, and rank 0 appends
one record per version naming every rank's shard, only once every rank's
shards are durable. If any rank failed, no rank commits, and every rank
raises the same failure, so the ranks' views never diverge.

Contract: every rank calls ``commit`` once per job, in the same job order
(the writer thread guarantees it), even for a job whose writes failed.
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Sequence

import torch

from ..contract.errors import LayerCheckError, WriteFailed, retryable
from .format import MANIFEST, Shard, Version, encode_record
from .store import Store

__all__ = ["Commit", "ShardedCommit", "all_gather_json"]


class Commit:
    """Single process: append the versions' records (layers first, state last)."""

    rank = 0
    world_size = 1

    def commit(self, store: Store, step: int, versions: list[Version],
               error: BaseException | None) -> list[Version]:
        """Commit ``versions`` (this process's files of job ``step``), or raise
        ``error`` (the reason this process's writes failed) committing nothing."""
        if error is not None:
            raise error
        if versions:
            store.append(MANIFEST, b"".join(encode_record(v.to_record()) for v in versions))
        return versions


class ShardedCommit(Commit):
    """Every rank writes a shard; rank 0 commits once all are durable (see module doc)."""

    def __init__(self, group: Any, rank: int, world_size: int) -> None:
        self.group, self.rank, self.world_size = group, rank, world_size

    def commit(self, store: Store, step: int, versions: list[Version],
               error: BaseException | None) -> list[Version]:
        mine = {"step": step, "error": None if error is None else f"{type(error).__name__}: {error}",
                "retryable": error is None or retryable(error),
                "versions": [{"layer": v.layer, "file": v.file, "bytes": v.bytes,
                              "checksum": v.checksum} for v in versions]}
        everyone = all_gather_json(mine, self.group, self.world_size)
        failed = [(r, d["error"]) for r, d in enumerate(everyone) if d["error"] is not None]
        if failed:
            # every rank must judge alike whether the job is retried (errors.retryable)
            final = [(r, d["error"]) for r, d in enumerate(everyone) if not d["retryable"]]
            if error is not None and (not final or not retryable(error)):
                raise error
            rank, reason = (final or failed)[0]
            raise (LayerCheckError if final else WriteFailed)(
                f"rank {rank} could not write its shard of step {step} ({reason})")
        merged = self._merge(step, versions, everyone)
        outcome = None
        if self.rank == 0:
            try:
                store.append(MANIFEST, b"".join(encode_record(v.to_record()) for v in merged))
            except Exception as exc:  # tell the other ranks before raising here
                outcome = f"{type(exc).__name__}: {exc}"
                error = exc
        outcome = all_gather_json({"error": outcome}, self.group, self.world_size)[0]["error"]
        if outcome is not None:
            if error is not None:
                raise error
            raise WriteFailed(f"rank 0 could not append the manifest records of step {step} "
                              f"({outcome})")
        return merged

    @staticmethod
    def _merge(step: int, versions: list[Version], everyone: Sequence[dict]) -> list[Version]:
        """This rank's versions, each with every rank's shard attached."""
        shapes = {tuple(v["layer"] for v in d["versions"]) for d in everyone}
        if len(shapes) != 1 or any(d["step"] != step for d in everyone):
            raise WriteFailed(f"the ranks disagree on what step {step} writes ({sorted(shapes)}); "
                              "every rank must call step() after every optimizer step")
        out = []
        for i, version in enumerate(versions):
            shards = tuple(Shard(d["versions"][i]["file"], d["versions"][i]["bytes"],
                                 d["versions"][i]["checksum"]) for d in everyone)
            out.append(replace(version, shards=shards))
        return out


def all_gather_json(obj: Any, group: Any, world_size: int) -> list[Any]:
    """Every rank's ``obj`` (JSON-serialisable), in rank order, over ``group``
    (a CPU/gloo process group). JSON in uint8 tensors: no pickle between ranks."""
    import torch.distributed as dist
    data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:data.numel()] = data
    chunks = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world_size)]
    dist.all_gather(chunks, padded, group=group)
    return [json.loads(bytes(c[:int(s.item())].tolist()).decode()) for c, s in zip(chunks, sizes)]
