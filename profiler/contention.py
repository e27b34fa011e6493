"""Whether another job shared the machine while we measured it.

A capture's step times become the simulator's compute; a validation's runs
become its measured side. Both are only this job's if nothing else ran on the
machine meanwhile: a shipped trace captured while another job used the cores
had 42 of its 200 steps 2-10x slower than the rest, and every prediction
replayed from it inherited them. The meter says so at the time.

Contract: ``ContentionMeter.start()``, then ``lap()`` at the end of each
measured interval (a step) returns the seconds the interval lasted, the CPU
seconds the whole machine was busy in it and the CPU seconds this process
(plus, with ``children=True``, its reaped children) used. Busy is Linux's
``/proc/stat`` (user, nice, system, irq, softirq and steal: a hypervisor's
steal is a core someone else had); on a system without it the meter reads
nothing and ``summarize`` says the check was not made. Resolution is the
kernel's clock tick (10 ms on Linux), so an interval reads to ~0.02 cores per
second measured; ``summarize`` looks at cores, not single ticks.

``summarize(laps, job_cpu)`` turns the laps (and, for a job of several ranks,
every rank's own CPU seconds per lap summed: what the job itself used) into
the record a trace's manifest keeps under ``machine.contention``: the other
processes' mean and peak cores, and the laps where they used at least
``THRESHOLD_CORES`` (a whole-core competitor on a 2-core machine is a 2x
slower step). ``warning()`` is the one line a user sees when it matters.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

__all__ = ["THRESHOLD_CORES", "WARN_SHARE", "ContentionMeter", "Descendants", "Lap", "summarize",
           "warning"]

THRESHOLD_CORES = 0.5
"""Other processes' cores over which an interval counts as contended."""
WARN_SHARE = 0.05
"""The share of contended intervals above which a capture warns."""
_STAT = Path("/proc/stat")
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""user, nice, system, irq, softirq, steal (``guest`` is inside ``user``)."""


@dataclass(frozen=True)
class Lap:
    """One measured interval: its wall seconds, the machine's busy CPU seconds
    (None where ``/proc/stat`` cannot be read) and this process's own."""

    wall_s: float
    busy_s: float | None
    own_s: float


class ContentionMeter:
    """Laps of wall time, machine CPU and this process's CPU (see the module doc)."""

    def __init__(self, *, children: bool = False, stat: Path = _STAT) -> None:
        self._children = children
        self._stat = stat
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last: tuple[float, float | None, float] | None = None

    def start(self) -> None:
        """Begin the first lap now."""
        self._last = self._read()

    def lap(self) -> Lap:
        """End the current lap, begin the next; ``start()`` must have been called."""
        if self._last is None:
            raise RuntimeError("ContentionMeter.lap() before start()")
        now = self._read()
        (w0, b0, o0), (w1, b1, o1) = self._last, now
        self._last = now
        busy = None if b0 is None or b1 is None else b1 - b0
        return Lap(wall_s=w1 - w0, busy_s=busy, own_s=o1 - o0)

    def _read(self) -> tuple[float, float | None, float]:
        import time
        t = os.times()
        own = t.user + t.system + ((t.children_user + t.children_system) if self._children else 0.0)
        return time.perf_counter(), self._busy(), own

    def _busy(self) -> float | None:
        try:
            first = self._stat.read_text().split("\n", 1)[0].split()
        except OSError:
            return None
        if not first or first[0] != "cpu":
            return None
        values = [int(v) for v in first[1:]]
        return sum(values[i] for i in _BUSY_FIELDS if i < len(values)) / self._tick


class Descendants:
    """The CPU seconds of processes this one cannot reap: the members of given process
    groups whose parent is not this process (a worker's own children, as LowDiff's
    writer, are orphaned when the worker is SIGKILLed with its group, so their CPU never
    reaches ``os.times().children_*``). ``sample(groups)`` reads ``/proc`` and keeps each
    such process's newest total; ``cpu_s`` is their sum (a process's time up to its last
    sample: call ``sample`` often, every half second or so, and just before a kill)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._seen: dict[tuple[int, int], float] = {}
        """(pid, start time in ticks) -> CPU seconds: a reused pid is another process."""

    def sample(self, groups: set[int]) -> None:
        me = os.getpid()
        try:
            entries = list(self._proc.iterdir())
        except OSError:
            return
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                # fields after the command's closing parenthesis: state ppid pgrp ...
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            ppid, pgrp = int(fields[1]), int(fields[2])
            if pgrp in groups and ppid != me:
                cpu = (int(fields[11]) + int(fields[12])) / self._tick
                self._seen[(int(entry.name), int(fields[19]))] = cpu

    @property
    def cpu_s(self) -> float:
        return sum(self._seen.values())


def summarize(laps: Sequence[Lap], job_cpu_s: Sequence[float] | None = None) -> dict[str, Any]:
    """The manifest's record of ``laps`` (see the module doc). ``job_cpu_s``: per lap,
    the CPU seconds of every process of the job (all ranks); default each lap's own."""
    method = ("/proc/stat busy CPU (user, nice, system, irq, softirq, steal) minus the "
              "job's own CPU (os.times of every rank), per step")
    if not laps or any(lap.busy_s is None for lap in laps):
        return {"checked": False, "method": method,
                "reason": "the machine's CPU counters (/proc/stat) could not be read"}
    job = [lap.own_s for lap in laps] if job_cpu_s is None else list(job_cpu_s)
    if len(job) != len(laps):
        raise ValueError(f"{len(job)} job CPU figures for {len(laps)} laps")
    other = [max(0.0, (lap.busy_s - j) / lap.wall_s) if lap.wall_s > 0 else 0.0
             for lap, j in zip(laps, job)]
    wall = sum(lap.wall_s for lap in laps)
    contended = [i + 1 for i, cores in enumerate(other) if cores >= THRESHOLD_CORES]
    return {"checked": True, "method": method, "threshold_cores": THRESHOLD_CORES,
            "laps": len(laps),
            "other_cores_mean": sum(o * lap.wall_s for o, lap in zip(other, laps)) / wall
            if wall > 0 else 0.0,
            "other_cores_max": max(other), "contended": len(contended),
            "contended_ranges": _ranges(contended)}


def warning(record: dict[str, Any] | None, what: str) -> str | None:
    """The one-line warning for a contention ``record`` of ``what`` (``"the capture of
    traces/x"``), or None when it was quiet enough (or never checked: nothing to say)."""
    if not record or not record.get("checked") or not record.get("laps"):
        return None
    share = record["contended"] / record["laps"]
    if share <= WARN_SHARE:
        return None
    ranges = ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in record["contended_ranges"][:6])
    more = ", ..." if len(record["contended_ranges"]) > 6 else ""
    return (f"{what}: other processes used {record['other_cores_mean']:.2f} cores on average "
            f"(peak {record['other_cores_max']:.2f}) and at least {record['threshold_cores']:g} "
            f"in {record['contended']} of {record['laps']} steps ({ranges}{more}); those step "
            "times are not this job's alone: measure again on a quiet machine")


def _ranges(indices: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out
