"""What the ranks of a job agree on: sums, gathers, a barrier. Nothing at world size 1.

One capture pipeline serves one process and many (torch.distributed.checkpoint's
``_DistWrapper`` does the same): every collective here returns the local
answer without touching torch.distributed when the world has one rank, so a
plain job never needs a process group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["Ranks"]


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @property
    def leader(self) -> bool:
        """Rank 0: the one that prints, writes the trace and its costs."""
        return self.rank == 0

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over the ranks (float64)."""
        if self.world == 1:
            return [float(v) for v in values]
        import torch
        import torch.distributed as dist
        out = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(out)
        return out.tolist()

    def max(self, value: float) -> float:
        return max(self.gather(float(value)))

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def from_leader(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        return self.gather(obj)[0]

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist
            dist.barrier()
