"""Where GEMINI's in-memory copy lives, and so how often a failure takes it too.

GEMINI (Wang et al., SOSP 2023) keeps each machine's checkpoint in its own CPU
memory and in a peer's (group placement, m = 2 replicas), and recovers from
memory unless every replica of the failed machine's group is gone. A failure
destroys a CPU-memory copy only when it takes the host's memory with it: a
GPU, HBM or NIC fault, a software bug or a network fault stops the job but
leaves the hosts' memory (and the GEMINI agent holding it) intact.

``PeerPlacement.loss_probability`` is the chance that one failure takes the
failed node's replicas all at once, the figure the simulator calls
``peer_loss_probability`` (the paper-a100 cost model's, and a calibration's, whose
peer is a second process on the capture's own host). Pure: no torch, so the
simulator imports it too.

- the replicas share a host (one server, the paper's setup: GEMINI's "peer"
  is another rank's region of the same host memory): every host-level failure
  takes them all, p = host share;
- the replicas are on different hosts (GEMINI's own placement): a host-level
  failure takes the other replica only if its host fails before the copy is
  re-made from the survivor, p = host share x (window / node MTBF); a failure
  domain that takes both hosts at once (a rack's power) adds its share.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PeerPlacement", "PlacementError", "HOST_LOSS_SHARE", "HOST_LOSS_SOURCE"]


class PlacementError(ValueError):
    """A placement whose shares or times are out of range; the message says which."""

HOST_LOSS_SHARE = 32 / 419
"""Share of failures that take a host's memory: Llama 3 405B (Meta 2024, Table 5), host
maintenance, 32 of 419 unexpected interruptions; the other large causes (faulty GPU
148, HBM3 72, software 54, network 35) leave host memory intact. A lower bound: the
table's small host-level causes (power supply, chassis, CPU, memory: a few each) are
not in our design notes (shared/design/SCALE.md) and are left out."""
HOST_LOSS_SOURCE = ("Llama 3 herd of models (Meta 2024), Table 5: host maintenance, 32 of 419 "
                    "unexpected interruptions, the causes that take a host's memory")


@dataclass(frozen=True, kw_only=True)
class PeerPlacement:
    """Where the replicas of one node's in-memory checkpoint are."""

    same_host: bool
    """The replicas share one host's memory (a single server)."""
    host_loss_share: float = HOST_LOSS_SHARE
    """Share of failures that take a host's memory."""
    window_s: float = 0.0
    """Different hosts: seconds the survivor is the only replica after a failure."""
    node_mtbf_s: float = float("inf")
    """Different hosts: one node's mean time between host-level failures."""
    domain_share: float = 0.0
    """Different hosts: share of host-level failures that take both hosts at once."""

    def __post_init__(self) -> None:
        for name in ("host_loss_share", "domain_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise PlacementError(f"PeerPlacement.{name}={getattr(self, name)!r}: a share in [0, 1]")
        if self.window_s < 0 or not self.node_mtbf_s > 0:
            raise PlacementError("PeerPlacement: window_s >= 0 and node_mtbf_s > 0 (seconds)")

    @property
    def loss_probability(self) -> float:
        """The chance one failure also takes every other replica (see the module)."""
        if self.same_host:
            return self.host_loss_share
        second = min(1.0, self.window_s / self.node_mtbf_s)
        return self.host_loss_share * min(1.0, self.domain_share + second)
