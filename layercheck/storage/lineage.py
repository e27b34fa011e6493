"""Timelines and the lineage: which step of which timeline a copy may be restored from. Torch-free.

Every restore opens a new *timeline* (``LayerCheck._begin_timeline``): the
``resume`` record it appends to the manifest names it, ``{"kind": "resume",
"step": s, "timeline": id}`` (``id``: random, ``new_timeline``), and every step
trained after it belongs to it (its first own step is s+1). Copies kept outside
the durable directory (the memory tier's slots, a buddy's ward copies, on nodes
a restore may not reach) record the timeline that wrote them. The manifest is
the authority on which of them are live.

The *lineage* is the manifest's resume records replayed in order
(``Lineage.opened``): a timeline opened at step s abandons every timeline
opened at s or later (their steps after s are no longer the job's), so the
branches left have strictly increasing starts s_1 < s_2 < ... < s_n, and
timeline i *owns* the steps (s_i, s_{i+1}] (the last one, every step after
s_n). The rule, in one place (``Lineage.holds``): a copy of step t written in
timeline j is usable only if j owns t. So a copy of the current timeline is
usable; one of an ancestor only up to the step where the lineage left it (a
restore of that step or a later one); one of an abandoned timeline, or of one
this directory never recorded, never. A copy once refused is refused for good
(a new branch changes the owner of no step at or before its start, and a
timeline abandoned never comes back), so dropping refused copies is safe.

Directories from before timelines had ids stay readable: a resume record
without ``timeline`` opens an anonymous branch (id None), and a copy without
one is taken as written in whichever anonymous branch owns its step (as
before, these cannot tell one anonymous timeline from another); before the
first resume record, the root (None) owns every step. A manifest compaction
or ``gc`` keeps the lineage's branches as resume records (``encode_manifest``).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

__all__ = ["Branch", "Lineage", "new_timeline", "TIMELINE"]

TIMELINE = r"[0-9a-f]{1,64}"
"""What a timeline id is (a resume record's ``timeline`` field; ``format`` checks it)."""


def new_timeline() -> str:
    """A fresh timeline id: random, so no two restores, on any node, share one."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class Branch:
    """Timeline ``timeline`` (None: anonymous, recorded without an id), opened by a
    restore of step ``start``: it owns the steps after ``start`` up to where the next
    branch of the lineage starts."""

    timeline: str | None
    start: int


@dataclass(frozen=True)
class Lineage:
    """The live branches, oldest first, their starts strictly increasing (see the module doc)."""

    branches: tuple[Branch, ...] = ()

    def opened(self, timeline: str | None, start: int) -> "Lineage":
        """The lineage after a restore of ``start`` opened ``timeline``: every branch
        opened at ``start`` or later is abandoned."""
        kept = tuple(b for b in self.branches if b.start < start)
        return Lineage(kept + (Branch(timeline, start),))

    @property
    def current(self) -> str | None:
        """The timeline steps are trained in now (None: anonymous, or nothing recorded)."""
        return self.branches[-1].timeline if self.branches else None

    def owner(self, step: int) -> Branch | None:
        """The branch that owns ``step`` (None: the root, before every branch)."""
        return next((b for b in reversed(self.branches) if b.start < step), None)

    def holds(self, timeline: str | None, step: int) -> bool:
        """Whether a copy of ``step`` written in ``timeline`` is on the lineage (the
        rule: ``timeline`` owns ``step``; see the module doc)."""
        owner = self.owner(step)
        return (owner.timeline if owner is not None else None) == timeline

    def refusal(self, timeline: str | None, step: int) -> str | None:
        """None where ``holds``; else why not, in words that start with "abandoned"."""
        if self.holds(timeline, step):
            return None
        name = timeline or "(unnamed)"
        mine = [n for n, b in enumerate(self.branches) if b.timeline == timeline]
        if timeline is not None and not mine:
            return (f"abandoned: timeline {name} is not on the directory's lineage (a "
                    "restore went back to before it began)")
        if mine and mine[-1] + 1 < len(self.branches) \
                and step > self.branches[mine[-1] + 1].start:
            return (f"abandoned: a restore of step {self.branches[mine[-1] + 1].start} "
                    f"left timeline {name}, which wrote it")
        owner = self.owner(step)
        return (f"abandoned: step {step} of the lineage is timeline "
                f"{(owner.timeline if owner is not None else None) or '(unnamed)'}'s, "
                f"not {name}'s")
