"""What a failure takes from a strategy with a memory tier on its node, played on one machine.

A strategy whose checkpointer keeps a memory tier on the node
(``RealStrategy.node_memory``: tiered) loses, at each failure, one of:

- ``PROCESS``: only processes (the workers SIGKILLed; the node's memory tier survives
  and the restore reads it);
- ``NODE``: the node (its memory tier wiped); the buddy's copy on another node survives;
- ``NODE_AND_BUDDY``: the node and its buddy's copy (the restore falls back to the
  durable composite).

``losses`` draws which from the simulator's own uniforms (``sim.api.primary_loss_draws``):
below ``tier_buddy_loss_share`` (the strategy's ``backup_probability``: the engines take
the durable composite there) the node and its buddy; then, over the next
``1 - tier_process_share - tier_buddy_loss_share``, the node; the rest processes only.

``NodeMemory`` is the node's memory-tier folder (on tmpfs), which the supervisor owns, so
that it outlives the workers as a node's memory outlives its processes. One machine has
no second node and the validation's job one rank (``layercheck.tiers.buddy`` needs ranks
on two nodes), so the buddy is played here: the buddy keeps the rank's last two committed
slots (the library sends each committed slot and keeps two), so at a node's loss the
rank's committed slots (``rank<r>/slot<k>/`` with its marker ``slot<k>.json``,
``layercheck.tiers.slots``) become the ward copy ``ward<r>/`` the library keeps for a
buddy's rank and reads at a restore, and everything else of the node is wiped. What
this does not run: the transfer of that copy over a network at the restore (the
prediction prices it at ``peer_gbps``, ``CostModel.peer_load_s``), nor the buddy's lag
(a kill within the exchange after a commit leaves the buddy the slot before).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

__all__ = ["PROCESS", "NODE", "NODE_AND_BUDDY", "KINDS", "losses", "NodeMemory"]

PROCESS, NODE, NODE_AND_BUDDY = "process", "node", "node+buddy"
KINDS = (PROCESS, NODE, NODE_AND_BUDDY)


def losses(uniforms: Sequence[float], *, process_share: float,
           buddy_loss_share: float) -> tuple[str, ...]:
    """Per failure, what it took (module doc), from its uniform draw."""
    node_share = max(0.0, 1.0 - process_share - buddy_loss_share)
    return tuple(NODE_AND_BUDDY if u < buddy_loss_share
                 else NODE if u < buddy_loss_share + node_share else PROCESS
                 for u in uniforms)


class NodeMemory:
    """The node's memory-tier folder: under ``/dev/shm`` where it is writable (the
    library's default place), else under ``fallback``."""

    def __init__(self, fallback: Path) -> None:
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK):
            self.folder = Path(tempfile.mkdtemp(prefix="layercheck-validate-node-", dir=shm))
        else:
            fallback.mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix="node-", dir=fallback))

    def lose(self, kind: str) -> None:
        """Play a failure of ``kind`` on the folder, its processes already killed."""
        if kind not in KINDS:
            raise ValueError(f"a failure takes one of {', '.join(KINDS)}, not {kind!r}")
        if kind == PROCESS:
            return
        for job in [p for p in self.folder.iterdir() if p.is_dir()]:
            if kind == NODE:
                _keep_buddy_copies(job)
            else:
                shutil.rmtree(job)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _keep_buddy_copies(tier: Path) -> None:
    """Of one job's tier, only what the buddies hold: each rank's two newest committed
    slots (its own and those a buddy already held for it) as its ward copy."""
    for rank in sorted(tier.glob("rank*")):
        r = rank.name[4:]
        ward = tier / f"ward{r}"
        copies, steps = [], set()
        for folder, marker, step in sorted(_committed(rank) + _committed(ward),
                                           key=lambda c: c[2], reverse=True):
            if step not in steps and len(copies) < 2:
                copies.append((folder, marker))
                steps.add(step)
        staging = tier / f"buddy{r}.tmp"
        staging.mkdir()
        for k, (folder, marker) in enumerate(copies):
            os.rename(folder, staging / f"slot{k}")
            os.rename(marker, staging / f"slot{k}.json")
        shutil.rmtree(rank)
        shutil.rmtree(ward, ignore_errors=True)
        os.rename(staging, ward)
    for other in tier.iterdir():  # anything else the node held
        if not other.name.startswith("ward"):
            shutil.rmtree(other) if other.is_dir() else other.unlink()


def _committed(root: Path) -> list[tuple[Path, Path, int]]:
    """(slot folder, marker, step) of every committed slot under ``root``."""
    out = []
    for k in (0, 1):
        marker = root / f"slot{k}.json"
        try:
            step = int(json.loads(marker.read_text())["step"])
        except (OSError, ValueError, KeyError):
            continue
        if (root / f"slot{k}").is_dir():
            out.append((root / f"slot{k}", marker, step))
    return out
