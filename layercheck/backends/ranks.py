"""What the ranks of a job agree on: one small wrapper, a no-op for one process.

LayerCheck runs one lifecycle whatever the world size (as
torch.distributed.checkpoint does with its ``_DistWrapper``), and so does the
profiler's capture. ``Ranks`` is one process: every answer is immediate and
local, torch.distributed untouched. ``DefaultGroupRanks`` is a data-parallel job
agreeing over its default process group: what a job's own code uses between its
collectives (the profiler's jobs). ``ProcessGroupRanks`` is what a LayerCheck of
such a job takes: every rank writes its own shard of each version, over two gloo
groups of its own. One vocabulary for all three: ``rank``, ``world_size``,
``is_coordinator``, ``all_reduce_sum``, ``agree_min``, ``gather``,
``from_coordinator``, ``max``, ``barrier``.
Contract: every rank calls the collectives in the same order, from the training
thread; the writer thread talks only through the ``Commit`` that ``commit()``
makes (over a group of its own). ``together(ranks, work)`` runs ``work`` on every
rank and, if it raises on any, raises on all (a restore, a timeline's record).
"""
from __future__ import annotations

import contextlib
import datetime
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from ..storage.commit import Commit, ShardedCommit
from ..contract.errors import LayerCheckError

__all__ = ["Ranks", "DefaultGroupRanks", "ProcessGroupRanks", "together", "raise_together",
           "FAILED"]

T = TypeVar("T")
FAILED = -3
"""What a rank proposes in an agreement when it failed: every rank then raises."""


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

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        return [obj]

    def from_coordinator(self, obj: Any) -> Any:
        """The coordinator's (rank 0's) ``obj`` on every rank."""
        return self.gather(obj)[0]

    def max(self, value: float) -> float:
        """The largest ``value`` of any rank (the slowest rank's time, say)."""
        return max(self.gather(float(value)))

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


class DefaultGroupRanks(Ranks):
    """The ranks of the default torch.distributed process group, agreeing over it (no
    groups of their own, nothing to close). Not for a LayerCheck, whose writer thread
    needs a group of its own: give it ``ProcessGroupRanks``."""

    sharded = True
    _group: Any = None
    """The group the collectives run over (None: the default group)."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise LayerCheckError("torch.distributed is not initialised: create ZeroLayerCheck "
                                  "after deepspeed.initialize(), FsdpLayerCheck after "
                                  "dist.init_process_group() and fully_shard")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def all_reduce_sum(self, values: Sequence[float] | np.ndarray) -> np.ndarray:
        t = torch.tensor(np.asarray(values, dtype=np.float64))  # a copy: the caller's stays its own
        dist.all_reduce(t, group=self._group)
        return t.numpy()

    def agree_min(self, values: np.ndarray) -> tuple[np.ndarray, bool]:
        low = torch.from_numpy(np.array(values, dtype=np.int64))
        high = low.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=self._group)
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=self._group)
        return low.numpy(), bool(torch.equal(low, high))

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self._group)

    def commit(self) -> Commit:
        raise LayerCheckError("DefaultGroupRanks commit nothing: a LayerCheck's writer thread "
                              "needs a group of its own; give it ProcessGroupRanks()")


class ProcessGroupRanks(DefaultGroupRanks):
    """The ranks of the default torch.distributed process group, as a LayerCheck needs
    them: collectives over two CPU groups of their own (``close`` destroys them)."""

    def __init__(self, timeout_s: float = 1800.0) -> None:
        super().__init__()
        timeout = datetime.timedelta(seconds=timeout_s)
        # two CPU groups: one for the training thread, one for the writer thread
        # (collectives of two threads must never share a group)
        self._step_group = dist.new_group(backend="gloo", timeout=timeout)
        self._commit_group = dist.new_group(backend="gloo", timeout=timeout)
        self._group = self._step_group

    def commit(self) -> Commit:
        return ShardedCommit(self._commit_group, self.rank, self.world_size)

    def close(self) -> None:
        # a gloo group still alive at interpreter exit can abort the process ("terminate
        # called without an active exception": its threads are torn down unjoined)
        for group in (self._step_group, self._commit_group):
            if group in dist.distributed_c10d._world.pg_map:
                dist.destroy_process_group(group)


def together(ranks: Ranks, work: Callable[[], T],
             elsewhere: Callable[[], BaseException] | None = None) -> T:
    """``work()`` on each of ``ranks``; if it raises on any, it raises on all (see
    ``recovery.Planner.together``)."""
    failure, result = None, None
    try:
        result = work()
    except Exception as exc:  # noqa: BLE001 - raised below, on every rank
        failure = exc
    agreed, _ = ranks.agree_min(np.array([FAILED if failure else 0], dtype=np.int64))
    raise_together(failure, agreed, elsewhere)
    return result  # type: ignore[return-value]


def raise_together(failure: BaseException | None, agreed: np.ndarray,
                   elsewhere: Callable[[], BaseException] | None = None) -> None:
    """After ranks agreed (``agree_min``) on what each proposed, FAILED where it failed:
    ``failure`` where it is this rank's, else ``elsewhere()`` (default: a
    LayerCheckError saying so) where another rank failed."""
    if failure is not None:
        raise failure
    if (agreed == FAILED).any():
        if elsewhere is not None:
            raise elsewhere()
        raise LayerCheckError("another rank failed to restore (its error says why); this "
                              "rank stops with it")
