"""Which code measured each figure of a ``costs.json``, and whether that code has changed since.

Torch-free (the simulator compares against it). ``python -m profiler calibrate``
records in each costs.json a ``code`` block: the library version and the
version of every mechanism of the code that timed the figures (``MECHANISM_VERSIONS``
as the profiler declares them) and which of them measured each figure
(``MEASURED_BY``). A calibration whose measured figures came from an older
version of a mechanism, or from a file that records none (written before this
existed), is out of date (``outdated``), and ``python -m sim`` says so in one
line (``age_warning``) with the command that re-measures it.

Bump rules (for whoever changes a mechanism): raise a mechanism's version here
AND where it is declared (the ``MECHANISM_VERSIONS`` of the module named below;
``tests/profiler/test_measurement.py`` checks they agree) in the same commit
whenever a change to its code can change what it measures: what it times, how
(the API, the repeats, the state it copies), or the implementation under test
(the LayerCheck writer's or restore's speed). A refactor that leaves every timed
call the same keeps the version. Versions only grow.
"""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["MECHANISM_VERSIONS", "MEASURED_BY", "code_record", "outdated", "age_warning"]

MECHANISM_VERSIONS: dict[str, int] = {
    "restart": 1,                  # profiler/mechanisms/restart.py (Restart)
    "full save": 2,                # profiler/mechanisms/storage.py (FullSave): 2, timed inside a short run
    "two-phase save": 1,           # profiler/mechanisms/storage.py (TwoPhase)
    "host copy": 1,                # profiler/mechanisms/storage.py (HostCopy)
    "differential": 1,             # profiler/mechanisms/lowdiff.py (Differential)
    "layercheck": 1,               # profiler/mechanisms/layerwise.py (LayerWise)
    "deepspeed checkpointer": 1,   # profiler/checkpointers.py (FullCheckpointer)
    "checkfreq checkpointer": 1,   # profiler/checkpointers.py (TwoPhaseCheckpointer)
    "layercheck writer": 1,        # layercheck/writer.py (the background writer)
    "layercheck restore": 1,       # layercheck/recovery.py (restore's plan and load)
    "jit detection": 1,            # profiler/mechanisms/jit.py (JitDetection)
}
"""The installed library's version of each mechanism (bump rules in the module doc)."""

_LC_WRITE = ("layercheck", "layercheck writer")
_LC_LOAD = ("layercheck", "layercheck restore")
MEASURED_BY: dict[str, tuple[str, ...]] = {
    "restart_s": ("restart",),
    "save_gbps": ("full save", "deepspeed checkpointer"),
    "load_fixed_s": ("full save", "deepspeed checkpointer"),
    "load_gbps": ("full save", "deepspeed checkpointer"),
    "snapshot_gbps": ("two-phase save", "checkfreq checkpointer"),
    "persist_gbps": ("two-phase save", "checkfreq checkpointer"),
    "async_load_gbps": ("two-phase save", "checkfreq checkpointer"),
    "host_copy_gbps": ("host copy",),
    "peer_gbps": ("host copy",),
    "peer_loss_probability": ("host copy",),
    "diff_fraction": ("differential",),
    "diff_batch": ("differential",),
    "diff_snapshot_gbps": ("differential",),
    "diff_replay_gbps": ("differential",),
    "tracking_fraction": ("layercheck",),
    "lc_snapshot_gbps": ("layercheck",),
    "lc_write_gbps": _LC_WRITE,
    "lc_commit_s": _LC_WRITE,
    "lc_load_fixed_s": _LC_LOAD,
    "lc_load_gbps": _LC_LOAD,
    "jit_detect_s": ("jit detection",),
    "jit_replica_loss_probability": ("jit detection",),
    "jit_overhead_fraction": ("jit detection",),
}
"""Figure -> the mechanisms whose code measures it (stale_cost is measured by
``python -m profiler staleness``, a study, not a mechanism: it has no entry)."""


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
