"""What a checkpointing setting may cost besides time: the budgets of ``tune`` and of the
fair comparison.

    Budgets(max_bytes=500e9, max_write_share=0.05, max_host_bytes=400e9)

Each is a property of a setting on the failure-free job (what it writes over one job,
what share of the storage's write bandwidth that takes over the job's compute, the most
host memory its checkpoints hold, LayerCheck's largest staleness), so a setting meets
them or not before any failure is drawn. None: no limit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from .errors import SimError

__all__ = ["Budgets", "COLUMNS"]

COLUMNS = {"max_bytes": "bytes_written", "max_staleness": "max_staleness",
           "max_write_share": "write_share", "max_host_bytes": "host_bytes"}
"""Budget -> the table column it limits (``sim.frontier``'s table and the fair comparison's)."""
FLAGS = {"max_bytes": ("--max-gb", "GB", 1e9), "max_staleness": ("--max-staleness", "steps", 1),
         "max_write_share": ("--max-write-share", "", 1), "max_host_bytes": ("--max-host-gb", "GB", 1e9)}


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """What a setting may cost. None: no limit."""

    max_bytes: float | None = None
    """Bytes written to durable storage over the job, base checkpoint included
    (``--max-gb`` x 1e9)."""
    max_staleness: int | None = None
    """No layer's newest copy older than this many steps (LayerCheck's largest staleness;
    a rollback strategy has no stale layers)."""
    max_write_share: float | None = None
    """Share of the storage's write bandwidth the writes may take over the job's compute time."""
    max_host_bytes: float | None = None
    """Host memory the checkpoints may hold at once (``--max-host-gb`` x 1e9)."""

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_staleness", "max_host_bytes"):
            flag, what, unit = FLAGS[name]
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                shown = value / unit if isinstance(value, (int, float)) else value
                raise SimError(f"{flag} must be a positive number of {what}, got {shown!r}")
        share = self.max_write_share
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0 < share <= 1):
            raise SimError(f"--max-write-share must be a fraction in (0, 1], e.g. 0.05 for 5%, "
                           f"got {share!r}")

    @classmethod
    def from_flags(cls, *, max_gb: float | None = None, max_staleness: float | None = None,
                   max_write_share: float | None = None,
                   max_host_gb: float | None = None) -> "Budgets":
        """From the command line's units (GB, steps, a fraction)."""
        return cls(max_bytes=None if max_gb is None else max_gb * 1e9, max_staleness=max_staleness,
                   max_write_share=max_write_share,
                   max_host_bytes=None if max_host_gb is None else max_host_gb * 1e9)

    def limits(self) -> dict[str, tuple[str, str, float]]:
        """Given budgets: table column -> (flag, unit, limit in the column's unit)."""
        out = {}
        for name, column in COLUMNS.items():
            value = getattr(self, name)
            if value is not None:
                flag, unit, _ = FLAGS[name]
                out[column] = (flag, unit, float(value))
        return out

    def within(self, table: pd.DataFrame, *, columns: Mapping[str, str] | None = None) -> np.ndarray:
        """True for the rows that meet every budget. ``columns``: a table's own name for a
        budget's column, where it differs (a missing or NaN value meets the budget: a
        strategy without stale layers has no staleness)."""
        rename = dict(columns or {})
        ok = np.ones(len(table), dtype=bool)
        for column, (_, _, limit) in self.limits().items():
            name = rename.get(column, column)
            if name not in table:
                continue
            values = table[name].to_numpy(dtype=np.float64)
            ok &= np.isnan(values) | (values <= limit)
        return ok

    def any(self) -> bool:
        return bool(self.limits())

    def text(self) -> str:
        """``--max-gb 500, --max-host-gb 400`` (or ``none``)."""
        return ", ".join(f"{flag} {limit / 1e9:g}" if unit == "GB" else f"{flag} {limit:g}"
                         for flag, unit, limit in self.limits().values()) or "none"

    def to_dict(self) -> dict[str, Any]:
        return {"max_gb": None if self.max_bytes is None else self.max_bytes / 1e9,
                "max_staleness": self.max_staleness, "max_write_share": self.max_write_share,
                "max_host_gb": None if self.max_host_bytes is None else self.max_host_bytes / 1e9}
