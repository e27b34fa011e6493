"""Whether GEMINI's in-memory copy survives a failure event, derived from where the copies are.

GEMINI (Wang et al., SOSP 2023) keeps each node's checkpoint in its own CPU memory
and in one peer's; a recovery reads it from memory unless the failure also took
the peer. A failure event takes the contiguous nodes ``first_node ..
first_node + nodes_lost - 1`` (a node, a rack, the racks behind a switch:
``sim.nodes``); a domain event cuts its nodes off (power, top-of-rack switch), so
their memory is out of reach for the restart. The copy is lost **exactly when the
event takes some node and that node's peer**. This replaces the assumed
``peer_loss_probability`` for a job of several nodes.

On one node the peer is another rank's region of the same host's memory (the
paper's server): then the copy is lost when the failure takes the host's memory,
``sim.placement.HOST_LOSS_SHARE`` of failures (Llama 3 405B, Table 5: host
maintenance, 32 of 419), drawn per event.

Placements:

- ``cross-rack`` (GEMINI places peers to avoid a shared failure domain,
  shared/design/SCALE.md): node i's peer is node i + rack_nodes, the same slot of
  the next rack, in a ring of racks; a rack event never takes both, a switch event
  over several racks does;
- ``group``: GEMINI's group placement of consecutive nodes, pairs (2k, 2k+1): a rack
  holding both takes both.

Not modelled: a second failure taking the peer before the copy is re-made (a later
event of the run only sees the copy as the engine's recovery point).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.placement import HOST_LOSS_SHARE

from .errors import SimError

__all__ = ["ReplicaPlacement", "PLACEMENTS"]

PLACEMENTS = ("cross-rack", "group")


@dataclass(frozen=True, kw_only=True)
class ReplicaPlacement:
    """Where each of ``nodes`` nodes keeps its peer copy."""

    nodes: int
    rack_nodes: int = 1
    """Nodes per rack (the rack domain's size; 1: no racks)."""
    kind: str = "cross-rack"

    def __post_init__(self) -> None:
        for name in ("nodes", "rack_nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise SimError(f"placement {name}={value!r}: a whole number of nodes >= 1")
        if self.kind not in PLACEMENTS:
            raise SimError(f"placement {self.kind!r}: use one of {', '.join(PLACEMENTS)}")

    def peers(self) -> np.ndarray:
        """peer[i]: the node holding node i's copy (i itself on a one-node job)."""
        i = np.arange(self.nodes)
        if self.nodes == 1:
            return i
        if self.kind == "cross-rack" and self.nodes > self.rack_nodes:
            return (i + self.rack_nodes) % self.nodes
        pair = i ^ 1
        return np.where(pair < self.nodes, pair, i - 1)

    def lost(self, first_node: np.ndarray, nodes_lost: np.ndarray,
             rng: np.random.Generator) -> np.ndarray:
        """Per event: True where it took the peer copy of a node it took (module docstring);
        ``rng`` draws whether a one-node job's failure took the host's memory."""
        first = np.asarray(first_node, dtype=np.int64)
        count = np.asarray(nodes_lost, dtype=np.int64)
        if first.shape != count.shape or (count < 1).any() or (first < 0).any() \
                or (first + count > self.nodes).any():
            raise SimError(f"failure events must take nodes within the job's {self.nodes}")
        if self.nodes == 1:
            return rng.random(first.size) < HOST_LOSS_SHARE
        peer = self.peers()
        out = np.zeros(first.size, dtype=bool)
        for k, (f, n) in enumerate(zip(first.tolist(), count.tolist())):
            p = peer[f:f + n]
            out[k] = bool(((p >= f) & (p < f + n)).any())
        return out
