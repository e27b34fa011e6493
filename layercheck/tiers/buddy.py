"""The buddy replica: each rank's committed memory-tier slot, kept by a rank on another node.

``placement`` gives each rank its buddy: ranks ordered by (rack, node), each
one's buddy is the rank as many places further as the largest node (or rack)
has ranks, round the ring, so that a buddy is never on its rank's node (and,
where racks are told and there are enough, not on its rack); ValueError where
no such placement exists (a node holding more than half the ranks).

``BuddyLink`` talks over a gloo group of its own, from one thread at a time:
``exchange`` (the memory tier's thread, once per step, on every rank: send this
rank's newest slot to its buddy while receiving its ward's into a ward slot,
double-buffered and committed by a marker as the rank's own slots are),
``gather`` and ``move`` (the training thread, at a restore, when the memory
tier's thread is idle).
"""
from __future__ import annotations

import datetime
import json
import os
from collections import Counter
from typing import Any, Sequence

import torch
import torch.distributed as dist

from .slots import Slot

__all__ = ["placement", "BuddyLink"]


def placement(nodes: Sequence[str], racks: Sequence[str | None] | None = None) -> list[int]:
    """buddy[r] for every rank r of a job whose rank r runs on ``nodes[r]`` (in
    ``racks[r]``, where told). See the module doc."""
    world = len(nodes)
    racks = list(racks) if racks is not None else [None] * world
    domains = []
    if all(racks) and len(set(racks)) > 1:  # told racks: try off-rack first
        domains.append([(str(racks[r]), nodes[r]) for r in range(world)])
    domains.append([("", nodes[r]) for r in range(world)])
    for domain in domains:
        keys = [rack or node for rack, node in domain]
        widest = max(Counter(keys).values())
        if 2 * widest > world:
            continue
        order = sorted(range(world), key=lambda r: (domain[r], r))
        position = {r: i for i, r in enumerate(order)}
        buddy = [order[(position[r] + widest) % world] for r in range(world)]
        if all(keys[buddy[r]] != keys[r] for r in range(world)):
            return buddy
    raise ValueError(f"no buddy placement puts every rank's buddy on another node: the nodes "
                     f"hold {dict(Counter(nodes))} ranks of {world}; give the job ranks on at "
                     "least two nodes, none holding more than half of them, or "
                     "TierConfig(buddy=False)")


class BuddyLink:
    """This rank's side of the buddy replica (see the module doc)."""

    def __init__(self, folder: str, node: str, rack: str | None, timeout_s: float) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.group = dist.new_group(backend="gloo",
                                    timeout=datetime.timedelta(seconds=timeout_s))
        places: list[Any] = [None] * self.world
        dist.all_gather_object(places, (node, rack), group=self.group)
        self.nodes = [p[0] for p in places]
        self.buddies = placement(self.nodes, [p[1] for p in places])
        self.buddy = self.buddies[self.rank]
        self.ward = self.buddies.index(self.rank)
        self.folder = folder
        self.ward_slots = self.slots_of(self.ward)
        self.sent_bytes = 0

    def slots_of(self, ward: int) -> list[Slot]:
        where = os.path.join(self.folder, f"ward{ward}")
        return [Slot(where, 0), Slot(where, 1)]

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    # -- every step ----------------------------------------------------------------
    def exchange(self, slot: Slot, record: dict[str, Any]) -> None:
        """Send ``slot`` (committed as ``record``) to the buddy; receive the ward's
        into the ward slot that does not hold its newest copy, and commit it."""
        text = torch.frombuffer(bytearray(json.dumps(record).encode()), dtype=torch.uint8)
        head = torch.tensor([record["step"], text.numel()], dtype=torch.int64)
        theirs = torch.zeros(2, dtype=torch.int64)
        self._both(head, theirs, tag=1)
        their_text = torch.empty(int(theirs[1]), dtype=torch.uint8)
        self._both(text, their_text, tag=2)
        their = json.loads(bytes(their_text.numpy()))
        marked = [(s, m) for s in self.ward_slots if (m := s.marker()) is not None]
        newest = max(marked, key=lambda sm: sm[1]["step"])[0] if marked else None
        into = self.ward_slots[1 - newest.k] if newest is not None else self.ward_slots[0]
        into.invalidate()
        works = []
        for tag, (name, item) in enumerate(record["items"].items(), start=3):
            works.append(dist.isend(slot.buffer(name, item["nbytes"]), self.buddy,
                                    group=self.group, tag=tag))
        for tag, (name, item) in enumerate(their["items"].items(), start=3):
            works.append(dist.irecv(into.buffer(name, item["nbytes"]), self.ward,
                                    group=self.group, tag=tag))
        for work in works:
            work.wait()
        into.commit({**their, "of": self.ward})
        self.sent_bytes += sum(item["nbytes"] for item in record["items"].values())

    def _both(self, out: torch.Tensor, into: torch.Tensor, tag: int) -> None:
        works = [dist.isend(out, self.buddy, group=self.group, tag=tag),
                 dist.irecv(into, self.ward, group=self.group, tag=tag)]
        for work in works:
            work.wait()

    # -- at a restore ----------------------------------------------------------------
    def move(self, moves: list[tuple[int, int, str, int, str, dict[str, Any]]],
             read: Any) -> dict[tuple[int, str], torch.Tensor]:
        """Carry out ``moves`` (holder, receiver, folder kind, slot, item, its marker
        entry), in the same order on every rank: a holder sends ``read(kind, of, k,
        name, item)``, the receiver gets the bytes. What this rank received, by
        (sequence number, item name)."""
        got = {}
        for n, (holder, receiver, kind, k, name, item) in enumerate(moves):
            if holder == self.rank:
                dist.send(read(kind, receiver, k, name, item), receiver, group=self.group, tag=n)
            elif receiver == self.rank:
                data = torch.empty(item["nbytes"], dtype=torch.uint8)
                dist.recv(data, holder, group=self.group, tag=n)
                got[(n, name)] = data
        return got

    def close(self) -> None:
        for slot in self.ward_slots:
            slot.close()
        if self.group in dist.distributed_c10d._world.pg_map:
            dist.destroy_process_group(self.group)
