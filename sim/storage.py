"""A file system that N nodes share: each node's own link, one aggregate bandwidth, over time.

Each node writes its shard of a checkpoint over its own link (``link_gbps``), and
every writer on the file system shares its aggregate bandwidth
(``aggregate_gbps``). At any moment the active writes share the bandwidth by
max-min fairness (a fluid model, ``drain``): a write from this job gets at most
its nodes' links, split among the job's own writes in flight, and at most a fair
share of the aggregate among every write in flight. So a write's time is set by
the slower of the two at that moment, and a full checkpoint that all ranks issue
at once (a burst) competes with whatever else is writing then: the next burst, a
trickle of layer writes, other jobs on the same file system (``tenants``).

``contended`` re-times a strategy's schedule through it: the writes of its
failure-free job (the tier ``Strategy.storage_tier`` names), with ``tenants`` other
jobs writing the same writes at times uniform over the job (other jobs' checkpoints are
not in step with this one's), drained by the fluid model; each write's
extra time over its uncontended one lands on the tier (a synchronous save stalls
training longer, a background write keeps the writer busy longer and the next
snapshot waits: the backlog follows). The engines then read it like any schedule.
Simplification (as ``sim.strategies.lowdiff_writer``): the writes are timed on the failure-free run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .errors import SimError
from .strategies import STRATEGIES, Schedule
from .timeline import Timeline
from .workbound import check_drained_writes

__all__ = ["SharedStorage", "drain", "contended", "storage_writes", "AGGREGATE_SOURCE"]

AGGREGATE_SOURCE = ("Llama 3's storage sustains about 2 TB/s (7 TB/s peak), second-hand in "
                    "shared/design/SCALE.md (Meta, The Llama 3 Herd of Models, 2024)")
GB = 1e9


@dataclass(frozen=True, kw_only=True)
class SharedStorage:
    """The file system one job of ``nodes`` nodes writes to and reads from."""

    nodes: int
    link_gbps: float
    """One node's write rate to the file system (paper-a100: its Lustre, 1.24 GB/s, derived)."""
    read_link_gbps: float
    """One node's read rate (paper-a100: 17.9 GB/s, fit to the paper's recoveries)."""
    aggregate_gbps: float = 2000.0
    """What all writers together get (``AGGREGATE_SOURCE``)."""
    read_aggregate_gbps: float = 2000.0
    """What all readers together get (the same sustained 2 TB/s; the 7 TB/s peak unused)."""
    tenants: int = 0
    """Other jobs writing what this one writes to the same file system, each write at a
    uniform time in the job (0: the job owns the file system, as Llama 3's did)."""

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, (int, np.integer)) \
                or self.nodes < 1:
            raise SimError(f"storage nodes={self.nodes!r}: a whole number >= 1")
        for name in ("link_gbps", "read_link_gbps", "aggregate_gbps", "read_aggregate_gbps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not (math.isfinite(value) and value > 0):
                raise SimError(f"storage {name}={value!r}: give a positive bandwidth in GB/s")
        if isinstance(self.tenants, bool) or not isinstance(self.tenants, (int, np.integer)) \
                or self.tenants < 0:
            raise SimError(f"tenants={self.tenants!r}: a whole number of other jobs >= 0")

    def write_gbps(self, link_gbps: float | None = None) -> float:
        """The job alone: the slower of its nodes' links and the aggregate."""
        return min(self.nodes * (self.link_gbps if link_gbps is None else link_gbps),
                   self.aggregate_gbps)

    def read_gbps(self, link_gbps: float | None = None) -> float:
        return min(self.nodes * (self.read_link_gbps if link_gbps is None else link_gbps),
                   self.read_aggregate_gbps)


def _fair_rates(caps: np.ndarray, total: float) -> np.ndarray:
    """Max-min fair shares of ``total`` among flows capped at ``caps`` (water-filling)."""
    rates = np.empty(caps.size)
    left = total
    for done, i in enumerate(np.argsort(caps, kind="stable")):
        share = left / (caps.size - done)
        rates[i] = min(caps[i], share)
        left -= rates[i]
    return rates


def drain(start_s: np.ndarray, nbytes: np.ndarray, job: np.ndarray, *, job_gbps: float,
          aggregate_gbps: float) -> np.ndarray:
    """When each write finishes: write i of ``nbytes[i]`` starts at ``start_s[i]`` from job
    ``job[i]``; a job's writes in flight share its links (``job_gbps``), all writes in
    flight share ``aggregate_gbps`` max-min fairly. Exact for piecewise-constant rates
    (the rates change only when a write starts or ends)."""
    start = np.asarray(start_s, dtype=float)
    size = np.asarray(nbytes, dtype=float) / GB
    if not (np.isfinite(start).all() and np.isfinite(size).all()):
        # a NaN start or size never drains: the loop below would not end
        raise SimError("shared storage: every write needs a finite start time and size; the "
                       "job's times overflowed (give shorter steps or checkpoint costs)")
    owner = np.asarray(job, dtype=np.int64)
    order = np.argsort(start, kind="stable")
    finish = np.full(start.size, np.nan)
    left = size.copy()
    active: list[int] = []
    t, nxt = 0.0, 0
    while nxt < order.size or active:
        if not active:
            t = max(t, start[order[nxt]])
        while nxt < order.size and start[order[nxt]] <= t:
            i = int(order[nxt])
            nxt += 1
            if left[i] <= 0:
                finish[i] = start[i]
            else:
                active.append(i)
        if not active:
            continue
        idx = np.array(active)
        counts = np.bincount(owner[idx])
        rates = _fair_rates(job_gbps / counts[owner[idx]], aggregate_gbps)
        until_end = left[idx] / rates
        step = float(until_end.min())
        if nxt < order.size:
            step = min(step, float(start[order[nxt]]) - t)
        left[idx] -= rates * step
        t += step
        gone = left[idx] <= 1e-12 * np.maximum(size[idx], 1e-30)
        finish[idx[gone]] = t
        active = [int(i) for i in idx[~gone]]
    return finish


def storage_writes(schedule: Schedule) -> int:
    """How many writes one failure-free job of ``schedule`` makes to shared storage (what
    ``contended`` drains for it and for each tenant)."""
    tier = STRATEGIES[schedule.strategy].storage_tier
    return 0 if tier is None else int(_positions(schedule, tier).size)


def _positions(schedule: Schedule, tier: str) -> np.ndarray:
    """The steps whose recovery point writes to shared storage on ``tier``."""
    if tier == "backup":
        return np.flatnonzero(np.isfinite(schedule.backup)) if schedule.backup is not None \
            else np.empty(0, dtype=np.int64)
    return np.flatnonzero(schedule.bytes > 0)


def _writes(schedule: Schedule, timeline: Timeline, tier: str, backup_bytes: float):
    """Start times, bytes and positions of the writes of one failure-free job on ``tier``."""
    at = _positions(schedule, tier)
    if tier == "backup":
        return timeline.resume[at], np.full(at.size, backup_bytes), at
    begin = timeline.resume[at] - (schedule.snap[at] if tier == "snap" else 0.0)
    return begin, schedule.bytes[at], at


def contended(schedule: Schedule, storage: SharedStorage, *, full_bytes: float,
              rng: np.random.Generator, passes: int = 4) -> Schedule:
    """``schedule`` with its storage writes re-timed by ``drain`` (module docstring): the
    same schedule when nothing it writes ever waits (no overlap, no tenants)."""
    tier = STRATEGIES[schedule.strategy].storage_tier
    if tier is None:
        return schedule
    check_drained_writes(storage_writes(schedule), int(storage.tenants))
    rate = storage.write_gbps()
    base = getattr(schedule, tier).copy()
    draws = None                          # each tenant's writes: when in the job, uniform
    extra = np.zeros_like(base)
    for _ in range(passes):
        current = _with_tier(schedule, tier, base + extra)
        timeline = Timeline.build(current)
        begin, size, at = _writes(current, timeline, tier, full_bytes)
        if at.size == 0:
            return schedule
        if draws is None:
            draws = rng.random((storage.tenants, at.size))
        period = float(timeline.ready[-1]) or 1.0
        starts = [begin] + [u * period for u in draws]
        sizes = [size] * (1 + storage.tenants)
        jobs = np.repeat(np.arange(1 + storage.tenants), at.size)
        end = drain(np.concatenate(starts), np.concatenate(sizes), jobs,
                    job_gbps=storage.nodes * storage.link_gbps,
                    aggregate_gbps=storage.aggregate_gbps)[: at.size]
        late = np.maximum(end - begin - size / (rate * GB), 0.0)
        late[late < 1e-9 * np.maximum(size / (rate * GB), 1.0)] = 0.0
        new = np.zeros_like(base)
        new[at] = late
        if np.allclose(new, extra, rtol=1e-6, atol=1e-9):
            extra = new
            break
        extra = new
    return _with_tier(schedule, tier, base + extra)


def _with_tier(schedule: Schedule, tier: str, values: np.ndarray) -> Schedule:
    return replace(schedule, **{tier: values})
