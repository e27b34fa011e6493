"""What the ranks of a job agree on: one small wrapper, a no-op for one process.

LayerCheck runs one lifecycle whatever the world size (as
torch.distributed.checkpoint does with its ``_DistWrapper``). ``Ranks`` is
one process: every answer is immediate and local. ``ProcessGroupRanks`` is a
data-parallel job in which every rank writes its own shard of each version.
Contract: every rank calls ``all_reduce_sum``, ``agree_min`` and ``barrier``
in the same order, from the training thread; the writer thread talks only
through the ``Commit`` that ``commit()`` makes (over a group of its own).
"""
from __future__ import annotations

import contextlib
import datetime
from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist

from .commit import Commit, ShardedCommit
from .errors import LayerCheckError

__all__ = ["Ranks", "ProcessGroupRanks"]


class Ranks:
    """One process: nothing to agree with."""

    rank = 0
    world_size = 1
    sharded = False
    """Whether each rank writes its own shard of every version."""

    @property
    def is_coordinator(self) -> bool:
        """Whether this rank holds the directory's lock and writes the header."""
        return self.rank == 0

    def all_reduce_sum(self, values: np.ndarray) -> np.ndarray:
        """The elementwise sum over ranks (a new array)."""
        return np.array(values, dtype=np.float64)

    def agree_min(self, values: np.ndarray) -> tuple[np.ndarray, bool]:
        """(elementwise minimum over ranks, whether every rank had exactly it)."""
        return np.array(values, dtype=np.int64), True

    def barrier(self) -> None:
        """Return once every rank has called it."""

    def commit(self) -> Commit:
        """How the writer thread commits a job."""
        return Commit()

    def close(self) -> None:
        """Release what these ranks made for themselves (after the last collective)."""

    @contextlib.contextmanager
    def closed_on_failure(self) -> Iterator["Ranks"]:
        """These ranks, closed again if the block raises: a backend builds everything
        that can refuse its setup (layer map, source, ``LayerCheck.__init__``) inside
        it, so that a refused setup leaves none of their process groups open (a gloo
        group alive at exit can abort the process). ``close`` may then run twice."""
        try:
            yield self
        except BaseException:
            self.close()
            raise


class ProcessGroupRanks(Ranks):
    """The ranks of the default torch.distributed process group."""

    sharded = True

    def __init__(self, timeout_s: float = 1800.0) -> None:
        if not dist.is_initialized():
            raise LayerCheckError("torch.distributed is not initialised: create ZeroLayerCheck "
                                  "after deepspeed.initialize(), FsdpLayerCheck after "
                                  "dist.init_process_group() and fully_shard")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        timeout = datetime.timedelta(seconds=timeout_s)
        # two CPU groups: one for the training thread, one for the writer thread
        # (collectives of two threads must never share a group)
        self._step_group = dist.new_group(backend="gloo", timeout=timeout)
        self._commit_group = dist.new_group(backend="gloo", timeout=timeout)

    def all_reduce_sum(self, values: np.ndarray) -> np.ndarray:
        t = torch.tensor(values, dtype=torch.float64)  # a copy: the caller's array stays its own
        dist.all_reduce(t, group=self._step_group)
        return t.numpy()

    def agree_min(self, values: np.ndarray) -> tuple[np.ndarray, bool]:
        low = torch.from_numpy(np.array(values, dtype=np.int64))
        high = low.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=self._step_group)
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=self._step_group)
        return low.numpy(), bool(torch.equal(low, high))

    def barrier(self) -> None:
        dist.barrier(group=self._step_group)

    def commit(self) -> Commit:
        return ShardedCommit(self._commit_group, self.rank, self.world_size)

    def close(self) -> None:
        # a gloo group still alive at interpreter exit can abort the process ("terminate
        # called without an active exception": its threads are torn down unjoined)
        for group in (self._step_group, self._commit_group):
            if group in dist.distributed_c10d._world.pg_map:
                dist.destroy_process_group(group)
