"""Which code measured each figure of a ``costs.json``, and whether that code has changed since.

Torch-free (the simulator compares against it). ``python -m profiler calibrate``
records in each costs.json a ``code`` block: the library version and the
version of every mechanism of the code that timed the figures (``MECHANISM_VERSIONS``)
and which of them measured each figure
(``MEASURED_BY``). A calibration whose measured figures came from an older
version of a mechanism, or from a file that records none (written before this
existed), is out of date (``outdated``), and ``python -m sim`` says so in one
line (``age_warning``) with the command that re-measures it.

Each piece of measuring code is declared once, here, as data (``CODE``): its name,
its version, the figures it measures and where it lives. ``MECHANISM_VERSIONS`` and
``MEASURED_BY`` are derived from it, and so are the profiler's mechanisms: a
``profiler.mechanisms.Mechanism`` named here measures exactly the figures named here
(``Mechanism.figures``), and ``calibrate`` records these versions. The table lives in
the contract, not beside the code, because the simulator compares against it
without torch and the library imports nothing of the profiler.

Bump rules (for whoever changes a mechanism): raise its ``version`` here in the same
commit whenever a change to its code can change what it measures: what it times, how
(the API, the repeats, the state it copies), or the implementation under test (the
LayerCheck writer's or restore's speed). A refactor that leaves every timed call the
same keeps the version. Versions only grow.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["MeasuringCode", "CODE", "MECHANISM_VERSIONS", "MEASURED_BY", "MEASURES",
           "code_record", "outdated", "age_warning"]


@dataclass(frozen=True, kw_only=True)
class MeasuringCode:
    """One piece of code whose change can change what a figure measures."""

    name: str
    version: int
    """Its version (the bump rules above); what a costs.json records of it."""
    figures: tuple[str, ...]
    """The figures whose measured value it determines."""
    code: str
    """Where it lives, ``module:object`` (``tests/profiler/test_measurement.py`` resolves it)."""
    mechanism: bool = False
    """True: a ``profiler.mechanisms`` mechanism, which returns exactly ``figures``, each
    figure measured by one mechanism; False: an implementation a mechanism times (the
    code under test: a checkpointer, LayerCheck's writer or restore)."""

    def __post_init__(self) -> None:
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"measuring code {self.name!r}: version {self.version!r} must be a "
                             "whole number >= 1")
        if not self.figures or ":" not in self.code:
            raise ValueError(f"measuring code {self.name!r} must name its figures and its code "
                             "as module:object")


def _mechanism(name: str, version: int, code: str, *figures: str) -> MeasuringCode:
    return MeasuringCode(name=name, version=version, figures=figures, code=code, mechanism=True)


def _timed(name: str, version: int, code: str, *figures: str) -> MeasuringCode:
    return MeasuringCode(name=name, version=version, figures=figures, code=code)


CODE: tuple[MeasuringCode, ...] = (
    # 2: timed from the SIGKILL of a training worker, as the validation's supervisor kills
    _mechanism("restart", 2, "profiler.mechanisms.restart:Restart", "restart_s"),
    # 2: DeepSpeed's save timed inside a short run at the validation's interval
    _mechanism("full save", 2, "profiler.mechanisms.storage:FullSave",
               "save_gbps", "load_fixed_s", "load_gbps"),
    # 2: CheckFreq's snapshot timed in its background thread alongside the next step
    _mechanism("two-phase save", 2, "profiler.mechanisms.storage:TwoPhase",
               "snapshot_gbps", "persist_gbps", "async_load_gbps"),
    _mechanism("host copy", 1, "profiler.mechanisms.storage:HostCopy", "host_copy_gbps"),
    _mechanism("peer copy", 1, "profiler.mechanisms.peer:PeerCopy",
               "peer_gbps", "peer_loss_probability"),
    # 2: LowDiff's figures timed on the validation's own DiffCheckpointer (compression in
    # its optimizer pre-hook beside the writer process; the replay of its load)
    _mechanism("differential", 2, "profiler.mechanisms.lowdiff:Differential",
               "diff_fraction", "diff_batch", "diff_snapshot_gbps", "diff_replay_gbps"),
    _mechanism("layercheck", 1, "profiler.mechanisms.layerwise:LayerWise",
               "tracking_fraction", "lc_snapshot_gbps", "lc_write_gbps", "lc_commit_s",
               "lc_load_fixed_s", "lc_load_gbps"),
    _timed("deepspeed checkpointer", 1, "profiler.checkpointers.full:FullCheckpointer",
           "save_gbps", "load_fixed_s", "load_gbps"),
    # 2: CheckFreq's own snapshot, overlapped with the next step (was dcp.async_save)
    _timed("checkfreq checkpointer", 2, "profiler.checkpointers.twophase:TwoPhaseCheckpointer",
           "snapshot_gbps", "persist_gbps", "async_load_gbps"),
    _timed("lowdiff checkpointer", 1, "profiler.checkpointers.differential:DiffCheckpointer",
           "diff_fraction", "diff_snapshot_gbps", "diff_replay_gbps"),
    _timed("layercheck writer", 1, "layercheck.storage.writer:Writer", "lc_write_gbps", "lc_commit_s"),
    _timed("layercheck restore", 1, "layercheck.recovery:Planner",
           "lc_load_fixed_s", "lc_load_gbps"),
    _mechanism("jit detection", 1, "profiler.mechanisms.jit:JitDetection",
               "jit_detect_s", "jit_replica_loss_probability", "jit_overhead_fraction"),
    _mechanism("memory tier", 1, "profiler.mechanisms.tier:MemoryTierCopy",
               "tier_copy_gbps", "tier_process_share", "tier_buddy_loss_share"),
    _mechanism("memory tier restore", 1, "profiler.mechanisms.tier:MemoryTierRestore",
               "tier_restore_gbps"),
    _mechanism("memory tier thread", 1, "profiler.mechanisms.tier:MemoryTierThread",
               "tier_thread_gbps"),
    _timed("layercheck tiers", 1, "layercheck.tiers.tiered:Tiers",
           "tier_copy_gbps", "tier_restore_gbps", "tier_thread_gbps"),
)
"""Every piece of measuring code, declared once (stale_cost is measured by ``python -m
profiler staleness``, a study, not a mechanism: no code here measures it)."""

MECHANISM_VERSIONS: dict[str, int] = {c.name: c.version for c in CODE}
"""The installed library's version of each piece of measuring code."""

def _measured_by(code: tuple[MeasuringCode, ...]) -> dict[str, tuple[str, ...]]:
    by_kind = sorted(code, key=lambda c: not c.mechanism)       # stable: mechanisms first
    return {name: tuple(c.name for c in by_kind if name in c.figures)
            for name in dict.fromkeys(n for c in code for n in c.figures)}


MEASURED_BY: dict[str, tuple[str, ...]] = _measured_by(CODE)
"""Figure -> the measuring code that determines it: its mechanism first, then the
implementations that mechanism times, in ``CODE``'s order."""

MEASURES: dict[str, tuple[str, ...]] = {c.name: c.figures for c in CODE if c.mechanism}
"""Mechanism -> the figures it measures: ``profiler.mechanisms.Mechanism.figures``."""


def code_record(versions: Mapping[str, int], library: str) -> dict[str, Any]:
    """The ``code`` block of a costs.json: the library version, the mechanisms' versions
    that measured it, and which of them measured each figure."""
    return {"layercheck": library, "mechanisms": dict(versions),
            "figures": {name: list(units) for name, units in MEASURED_BY.items()}}


def outdated(code: Mapping[str, Any] | None, figures: Mapping[str, Any]) -> list[str]:
    """The measured figures of ``figures`` (name -> ``Figure``) whose measuring code is
    older than the installed library's: no ``code`` record at all, or one that gives any of
    the figure's mechanisms (``MEASURED_BY``) no version or a smaller one."""
    recorded = (code or {}).get("mechanisms") or {}
    out = []
    for name, units in MEASURED_BY.items():
        record = figures.get(name)
        if record is None or record.source != "measured":
            continue
        if any(not isinstance(recorded.get(u), int) or recorded[u] < MECHANISM_VERSIONS[u]
               for u in units):
            out.append(name)
    return out


def age_warning(code: Mapping[str, Any] | None, figures: Mapping[str, Any], trace: str) -> str | None:
    """One line for stderr when ``outdated`` names figures, else None; ``trace`` is the
    folder to re-measure."""
    old = outdated(code, figures)
    if not old:
        return None
    when = "records no mechanism versions (written before they were recorded)" if not code \
        else "was measured by older mechanisms"
    shown = ", ".join(old[:4]) + (f" and {len(old) - 4} more" if len(old) > 4 else "")
    return (f"warning: {trace}'s costs.json {when}: {shown} predate this library's; "
            f"re-measure with `python -m profiler calibrate --trace {trace}`")
