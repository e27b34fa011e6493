"""Tables as a person reads them: headers in words with their units, seconds as hours (or
seconds, or milliseconds), bytes as TB, GB or MB, thousands separators, a sensible number
of digits, no floating-point dust (``0.0000000000000002`` reads 0.0).

The one place every page's table goes through (``ui.table`` shows ``styled``). Pure
pandas, so it is tested without a browser. Downloads keep the raw columns (SI units,
full precision): they are for programs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
from pandas.io.formats.style import Styler

__all__ = ["Readable", "readable", "styled", "header", "TIME_UNITS", "BYTE_UNITS"]

TIME_UNITS = (("h", 3600.0), ("s", 1.0), ("ms", 1e-3))
"""A table's time columns share one unit: the largest whose value of the column maxima is >= 1."""
BYTE_UNITS = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("B", 1.0))

WORDS = {
    "effective_ratio": "effective ratio", "ci95": "± 95%", "+-95%": "± 95%",
    "ratio_at_phi_low": "ratio at phi's low end", "ratio_at_phi_high": "ratio at phi's high end",
    "useful_s": "useful training", "stale_s": "stale training", "stale_lost_s": "stale, counted lost",
    "checkpoint_stall_s": "checkpoint stall", "lost_work_s": "lost work", "recovery_s": "recovery",
    "bytes_written": "written", "storage_interval": "storage interval (steps)",
    "interval": "interval (steps)", "params": "parameters", "mean_drift": "mean drift per step",
    "max_drift": "largest drift in a step", "steps_per_write": "steps per write",
    "base_threshold": "base threshold K", "embedding_threshold": "embedding threshold",
    "smax": "Smax (steps)", "warmup_steps": "warm-up (steps)", "max_staleness": "max staleness (steps)",
    "mean_weighted_staleness": "mean weighted staleness (steps)", "layer_writes": "layer writes",
    "write_share": "share of write bandwidth", "job_mtbf_s": "job MTBF", "mtbf_s": "MTBF",
    "gpus": "GPUs", "failure_step": "failure at step", "recovery_seconds": "recovery",
    "usd_gpu": "GPU", "usd_storage": "storage", "usd_writes": "writes", "usd_total": "total",
    "gpu_h_stall": "stall", "gpu_h_lost_work": "lost work", "gpu_h_stale_work": "stale work",
    "gpu_h_restart": "restart", "gpu_h_recovery": "recovery", "bytes": "size",
    "host_bytes": "host memory", "job_bytes": "durable bytes a job",
    "against": "ahead of", "winner_ratio": "whose ratio there",
}
"""Header words of the columns the simulator and the trace name in code (the unit is added)."""

RATIOS = ("ratio", "ci95", "95%", "share", "phi")
"""Columns (by name part) that are fractions or factors: four decimals, never a unit."""


def _kind(name: str) -> str:
    """'time', 'bytes', 'usd', 'gpu_h' or '' from a raw column name."""
    if name.startswith("usd_") or name.endswith("_usd"):
        return "usd"
    if name.startswith("gpu_h_"):
        return "gpu_h"
    if name.endswith("_s") or name == "recovery_seconds":
        return "time"
    if name == "bytes" or name.endswith("_bytes") or name.startswith("bytes_"):
        return "bytes"
    return ""


def header(name: str, unit: str = "") -> str:
    """A column's header in words, with its unit in brackets."""
    words = WORDS.get(name)
    if words is None:
        words = name.replace("_", " ")
        for raw, nice in ((" gbps", " (GB/s)"), ("mtbf", "MTBF"), ("gpu", "GPU"), ("usd", "$")):
            words = words.replace(raw, nice)
    return f"{words} ({unit})" if unit else words


def _unit(maximum: float, units) -> tuple[str, float]:
    for name, scale in units:
        if maximum >= scale:
            return name, scale
    return units[-1]


def _number(values: pd.Series, name: str, peak: float | None = None) -> Callable[[object], str]:
    """A formatter for a numeric column: integers with separators; fractions with four
    decimals; other floats with digits for the size of the column (or of ``peak``, the
    largest value its unit was chosen for), so dust below them reads 0."""
    if pd.api.types.is_bool_dtype(values):
        return lambda v: "yes" if v else "no"
    finite = values[np.isfinite(values.astype(float))] if len(values) else values
    big = float(np.abs(finite).max()) if len(finite) else 0.0
    big = max(big, peak or 0.0)
    whole = pd.api.types.is_integer_dtype(values) or (
        len(finite) and np.all(np.mod(finite, 1) == 0) and big >= 1)
    if any(part in name for part in RATIOS) and not whole:
        spec = ",.4f"
    elif whole or big >= 1000:
        spec = ",.0f"
    elif big >= 10:
        spec = ",.1f"
    elif big >= 0.01:
        spec = ",.3f"
    else:
        spec = ".3g"

    def text(v) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "–"
        if isinstance(v, float) and math.isinf(v):
            return "∞" if v > 0 else "-∞"
        return format(v, spec)
    return text


@dataclass(kw_only=True)
class Readable:
    """A table converted for reading: ``frame`` (numbers in the headers' units) and a
    text formatter per column."""
    frame: pd.DataFrame
    formats: dict[str, Callable[[object], str]] = field(default_factory=dict)

    def strings(self) -> pd.DataFrame:
        """Every cell as the reader sees it (what ``styled`` shows)."""
        return pd.DataFrame({c: [self.formats[c](v) if c in self.formats else str(v)
                                 for v in self.frame[c]] for c in self.frame.columns},
                            index=self.frame.index)


def readable(frame: pd.DataFrame) -> Readable:
    """``frame`` with headers in words and units: the table's time columns in one unit (h,
    s or ms), its byte columns in one (TB ... B), dollars and GPU hours named as such;
    numbers formatted for reading. Column names already in words are kept."""
    out = pd.DataFrame(index=frame.index)
    kinds = {c: _kind(str(c)) for c in frame.columns}
    numeric = {c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])
               and not pd.api.types.is_bool_dtype(frame[c])}
    units = {}
    for kind, table in (("time", TIME_UNITS), ("bytes", BYTE_UNITS)):
        cols = [c for c in frame.columns if kinds[c] == kind and c in numeric]
        peak = max((np.nanmax(np.abs(frame[c].to_numpy(float)), initial=0.0) for c in cols), default=0.0)
        units[kind] = (*_unit(peak, table), peak)
    formats = {}
    for c in frame.columns:
        kind, values = kinds[c], frame[c]
        unit, peak = "", None
        if c in numeric and kind in units:
            unit, scale, peak = units[kind]
            values, peak = values.astype(float) / scale, peak / scale
        elif kind == "usd":
            unit = "$"
        elif kind == "gpu_h":
            unit = "GPU hours"
        words = isinstance(c, str) and (c in WORDS or "_" in c or unit)
        if words and c not in numeric and WORDS.get(c, "").endswith("(steps)"):
            words = False                 # e.g. a cost figure's band, also called interval
        name = header(str(c), unit) if words else str(c)
        if name in out.columns:           # two raw columns with the same words: keep both
            name = str(c)
        out[name] = values
        if c in numeric or pd.api.types.is_bool_dtype(frame[c]):
            formats[name] = _number(values, str(c), peak)
    return Readable(frame=out, formats=formats)


def styled(frame: pd.DataFrame) -> Styler:
    """``readable(frame)`` as a Styler: the numbers stay numbers (a column still sorts by
    value), the reader sees the formatted text."""
    table = readable(frame)
    return table.frame.style.format(table.formats)
