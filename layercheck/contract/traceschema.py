"""The trace's schema: every column of every table, with its type and range, checked on read.

Importable without torch (numpy and pandas only). One ``Column`` per column of
the trace's Parquet tables (``SCHEMA``) and of the manifest's layer table
(``LAYER_SCHEMA``); ``check_table`` and ``check_layers`` hold a table to it and
raise ``TraceError`` naming the file, the table, the column and the (0-based)
row of the first bad cell, with what the column must hold. Relations between
tables (a step index within the steps table, a layer index within the
manifest's layers, one drift row per step and layer) are ``layercheck.contract.trace``'s.

Why each range: a trace feeds the simulator and the tuner, which divide by
learning rates, weight staleness by parameter counts and add up bytes; a
negative, non-finite or fractional figure there does not fail, it recommends.
Sizes and counts stay at or below ``MAX_COUNT`` (2**53,
9.0e15): exact in float64, where they are summed, and far above any model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from .policy import Reason

__all__ = ["Column", "SCHEMA", "LAYER_SCHEMA", "TABLES", "WRITE_REASONS", "MAX_COUNT",
           "TraceError", "check_table", "check_layers"]

MAX_COUNT = 2 ** 53
"""The largest byte or parameter count a trace may hold (exact in float64)."""
WRITE_REASONS = tuple(reason.label for reason in Reason)


class TraceError(ValueError):
    """A trace folder is missing, malformed or inconsistent; the message says which part."""


@dataclass(frozen=True, kw_only=True)
class Column:
    """One column: its type and the values it may hold."""

    dtype: str
    """int64 (whole numbers), float64 or str."""
    holds: str
    """What the column must hold, completing "COLUMN must be ..." in an error."""
    low: float | None = 0.0
    """Smallest value (None: any)."""
    positive: bool = False
    """The value must be above ``low``, not equal to it."""
    high: float | None = None
    """Largest value (None: any finite one)."""
    unmeasured: bool = False
    """NaN allowed in a synthetic trace: a figure only a capture measures."""
    any_number: bool = False
    """Any float, NaN and infinities included (nothing is computed from it)."""
    choices: tuple[str, ...] | None = None
    optional: bool = False
    """A layer key that may be left out (only in ``LAYER_SCHEMA``)."""


_SECONDS = "a finite number of seconds >= 0"
_STEP = Column(dtype="int64", holds="a step number (an integer >= 1)", low=1.0, high=MAX_COUNT)
_LAYER = Column(dtype="int64", holds="a layer index (an integer >= 0)", high=MAX_COUNT)
_BYTES = Column(dtype="int64", holds="a byte count (an integer from 0 to 2**53)", high=MAX_COUNT)
_TIME = Column(dtype="float64", holds=_SECONDS)
_MEASURED = Column(dtype="float64", holds=_SECONDS + " (NaN only in a synthetic trace: not "
                   "measured)", unmeasured=True)

SCHEMA: dict[str, dict[str, Column]] = {
    "steps": {"step": _STEP, "forward_s": _TIME, "backward_s": _TIME, "optimizer_s": _TIME,
              "drift_s": _TIME, "stall_s": _MEASURED,
              "loss": Column(dtype="float64", holds="a number (NaN or infinite where training "
                             "diverged)", low=None, any_number=True),
              "lr": Column(dtype="float64", holds="a finite learning rate >= 0"),
              "k_scale": Column(dtype="float64", holds="a positive number (the write budget's "
                                "factor on every threshold)", positive=True)},
    "drift": {"step": _STEP, "layer": _LAYER,
              "drift": Column(dtype="float64", holds="a finite relative change >= 0"),
              "accumulator": Column(dtype="float64", holds="a finite sum of drift >= 0")},
    "writes": {"step": _STEP, "layer": _LAYER, "bytes": _BYTES,
               "reason": Column(dtype="str", holds=f"one of {WRITE_REASONS}", low=None,
                                choices=WRITE_REASONS),
               "stall_s": _MEASURED, "persist_s": _MEASURED},
    "recovery": {"step": Column(dtype="int64", holds="a step number (an integer >= 0)",
                                high=MAX_COUNT),
                 "plan_s": _TIME, "load_s": _TIME, "restore_s": _TIME, "bytes": _BYTES},
}
"""Every column of every Parquet table. steps: compute time per phase, the
training-thread stall for checkpointing, loss, the step's learning rate and
``k_scale``; drift: d_l(t) and the accumulator A_l after it; writes: one row
per layer version written; recovery: one row per measured restore."""

_NAME = "a non-empty string"
LAYER_SCHEMA: dict[str, Column] = {
    "name": Column(dtype="str", holds=_NAME, low=None),
    "kind": Column(dtype="str", holds=_NAME, low=None),
    "params": Column(dtype="int64", holds="a parameter count (an integer from 0 to 2**53)",
                     high=MAX_COUNT),
    "bytes": Column(dtype="int64", holds="a positive byte count (an integer up to 2**53)",
                    positive=True, high=MAX_COUNT),
    "state_bytes": Column(dtype="int64", holds="a byte count (an integer from 0 to 2**53)",
                          high=MAX_COUNT, optional=True),
    "base_bytes": Column(dtype="int64", holds="a byte count (an integer from 0 to 2**53)",
                         high=MAX_COUNT, optional=True),
}
"""The manifest's ``layers``: one object per layer. ``bytes`` is one version on
disk (with the file's header); ``state_bytes`` (optional) its tensor bytes, what
a write budget counts (0 for a layer that trains nothing: its versions after the
base hold no tensor); ``base_bytes`` (optional) its base checkpoint's version,
larger where the layer has frozen parameters, which only that version holds."""

TABLES: dict[str, dict[str, str]] = {table: {name: c.dtype for name, c in columns.items()}
                                     for table, columns in SCHEMA.items()}
"""Required columns and their types (the Parquet tables' dtypes)."""


def check_table(frame: pd.DataFrame, table: str, where: str, *, synthetic: bool) -> pd.DataFrame:
    """``frame`` with every column of ``table`` in its type, or ``TraceError`` naming the first
    bad cell (``where``: the file, for the message). ``synthetic`` allows unmeasured NaNs."""
    out = {}
    for name, column in SCHEMA[table].items():
        values = frame[name].to_numpy(dtype=object if frame[name].dtype == object else None)
        out[name] = _checked(values, column, _Cell(where, table, name), synthetic)
    return pd.DataFrame(out, index=frame.index).assign(
        **{c: frame[c] for c in frame.columns if c not in SCHEMA[table]})


def check_layers(layers: Any, where: str) -> None:
    """The manifest's layer table: a non-empty list of objects, each column as
    ``LAYER_SCHEMA`` says, their bytes together within ``MAX_COUNT``."""
    if not isinstance(layers, list) or not layers:
        raise TraceError(f"{where}: layers must be a non-empty list")
    for row, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise TraceError(f"{where}: layers table, row {row}: expected an object with keys "
                             f"{[k for k, c in LAYER_SCHEMA.items() if not c.optional]}")
        missing = [k for k, c in LAYER_SCHEMA.items() if not c.optional and k not in layer]
        if missing:
            raise TraceError(f"{where}: layers table, row {row}: missing keys {missing}")
    for name, column in LAYER_SCHEMA.items():
        given = [(row, layer[name]) for row, layer in enumerate(layers) if name in layer]
        if given:
            rows, values = zip(*given)
            _checked(np.array(values, dtype=object), column, _Cell(where, "layers", name),
                     False, rows=rows)
    total = sum(layer["bytes"] for layer in layers)
    if total > MAX_COUNT:
        raise TraceError(f"{where}: layers table: the layers' bytes add up to {total:.3g}, more "
                         f"than 2**53 ({MAX_COUNT:.3g}); a layer's bytes count one version of it")


@dataclass(frozen=True)
class _Cell:
    where: str
    table: str
    column: str

    def error(self, row: int, value: Any, problem: str, holds: str) -> TraceError:
        shown = repr(value.item() if isinstance(value, np.generic) else value)
        return TraceError(f"{self.where}: {self.table} table, column {self.column}, row {row}: "
                          f"{shown[:60]} {problem}; {self.column} must be {holds}")


def _checked(values: np.ndarray, column: Column, cell: _Cell, synthetic: bool,
             rows: Sequence[int] | None = None) -> np.ndarray:
    """``values`` as the column's type, range-checked (``rows``: the row of each value)."""
    at = (lambda i: i) if rows is None else (lambda i: rows[i])
    if column.dtype == "str":
        bad = [i for i, v in enumerate(values) if not isinstance(v, str)
               or (column.choices is None and not v) or (column.choices and v not in column.choices)]
        if bad:
            v = values[bad[0]]
            problem = ("is not a string" if not isinstance(v, str) else "is empty" if not v
                       else "is not allowed")
            raise cell.error(at(bad[0]), v, problem, column.holds)
        return values.astype(object)
    numbers = _as_floats(values, column, cell, at)
    if column.dtype == "int64":
        fractional = np.flatnonzero(~np.isfinite(numbers) | (numbers != np.floor(numbers)))
        if fractional.size:
            raise cell.error(at(int(fractional[0])), values[fractional[0]], "is not an integer",
                             column.holds)
    elif not column.any_number:
        nan_ok = column.unmeasured and synthetic
        finite = np.isfinite(numbers) | (nan_ok & np.isnan(numbers))
        bad = np.flatnonzero(~finite)
        if bad.size:
            raise cell.error(at(int(bad[0])), values[bad[0]], "is not a finite number", column.holds)
    _in_range(values, numbers, column, cell, at)
    if column.dtype == "int64":
        return np.array([int(v) for v in values], dtype=np.int64) if values.dtype == object \
            else numbers.astype(np.int64)
    return numbers


def _as_floats(values: np.ndarray, column: Column, cell: _Cell, at) -> np.ndarray:
    """The values as float64, or the first one that is not a number (booleans are not)."""
    if values.dtype.kind in "iuf":
        return values.astype(np.float64)
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            problem = "is not an integer" if column.dtype == "int64" else "is not a number"
            raise cell.error(at(i), v, problem, column.holds)
    # an integer too large for float64 is far beyond any bound; inf keeps it comparable
    return np.array([float(v) if not isinstance(v, int) or abs(v) < 2 ** 1000 else math.inf
                     for v in values], dtype=np.float64)


def _in_range(values, numbers: np.ndarray, column: Column, cell: _Cell, at) -> None:
    with np.errstate(invalid="ignore"):
        checks = []
        if column.low is not None:
            low = numbers <= column.low if column.positive else numbers < column.low
            word = ("is not positive" if column.positive and column.low == 0
                    else "is negative" if column.low == 0 else f"is below {column.low:g}")
            checks.append((low, word))
        if column.high is not None:
            checks.append((numbers > column.high, f"is more than {column.high:.3g}"))
        for bad, word in checks:
            hit = np.flatnonzero(bad)
            if hit.size:
                raise cell.error(at(int(hit[0])), values[hit[0]], word, column.holds)
