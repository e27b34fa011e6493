"""Real failure records: one row per node failure, for replay onto a job of N nodes
(``sim.nodes``) and for fitting a per-node law (``sim.fitting``).

``NodeRecord`` is what every loader returns and what a replay reads: the record's
nodes, each failure's start time and node, the span it was observed over, and the
attribution its publisher asks for (carried into every report that uses it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import SimError

__all__ = ["NodeRecord"]


@dataclass(frozen=True, kw_only=True, eq=False)
class NodeRecord:
    """Failures of the nodes of one system, in seconds from the start of its record."""

    name: str
    """What the record is, e.g. 'LANL system 18'."""
    nodes: int
    """Nodes in the system (those that never failed included)."""
    times_s: np.ndarray
    """Each failure's start, seconds from the record's start, ascending (float64)."""
    node: np.ndarray
    """Each failure's node, 0 .. nodes - 1 (int64)."""
    span_s: float
    """Seconds the record covers: a failure at t is in [0, span_s)."""
    attribution: str
    """Who published the record and how to credit them."""

    def __post_init__(self) -> None:
        times = np.asarray(self.times_s, dtype=np.float64)
        node = np.asarray(self.node, dtype=np.int64)
        object.__setattr__(self, "times_s", times)
        object.__setattr__(self, "node", node)
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, (int, np.integer)) \
                or self.nodes < 1:
            raise SimError(f"record {self.name}: nodes={self.nodes!r} must be a positive integer")
        object.__setattr__(self, "nodes", int(self.nodes))
        if times.ndim != 1 or times.shape != node.shape or times.size == 0:
            raise SimError(f"record {self.name}: give one node per failure time, at least one")
        if not (math.isfinite(self.span_s) and self.span_s > 0):
            raise SimError(f"record {self.name}: span_s={self.span_s!r} must be positive seconds")
        if not np.all(np.isfinite(times)) or times[0] < 0 or times[-1] >= self.span_s \
                or (np.diff(times) < 0).any():
            raise SimError(f"record {self.name}: failure times must be ascending, in [0, span_s)")
        if node.min() < 0 or node.max() >= self.nodes:
            raise SimError(f"record {self.name}: node numbers must be 0 .. {self.nodes - 1}")
        if not self.attribution.strip():
            raise SimError(f"record {self.name}: a record needs its attribution (who to credit)")

    @property
    def failures(self) -> int:
        return int(self.times_s.size)

    @property
    def node_mtbf_s(self) -> float:
        """One node's mean time between failures: nodes x span / failures."""
        return self.nodes * self.span_s / self.failures
