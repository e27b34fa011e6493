"""The Recorder: what a capture measures, step by step, turned into trace tables.

Contract: per step call ``step()`` with the step's phase times, loss, the
LayerCheck ``StepReport`` and the accumulators as they were before that
step; ``writes()`` with every committed ``WriteRecord`` (in any order, any
time); ``restore()`` with measured restores. ``tables()`` returns the four
tables of ``layercheck.contract.trace.TABLES`` exactly.

Derived columns: ``drift.accumulator`` is A_l after adding d_l(t) and before
a write at t resets it; ``writes.stall_s`` is the step's training-thread
stall shared among that step's layer writes by their bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import pandas as pd

from layercheck.contract.trace import TABLES

from .jobs.job import PhaseTimes

__all__ = ["Recorder"]


@dataclass
class Recorder:
    num_layers: int
    _steps: list[dict[str, float]] = field(default_factory=list)
    _drift: list[np.ndarray] = field(default_factory=list)
    _acc: list[np.ndarray] = field(default_factory=list)
    _writes: list[dict[str, Any]] = field(default_factory=list)
    _restores: list[dict[str, Any]] = field(default_factory=list)

    def step(self, times: PhaseTimes, loss: float, report: Any,
             accumulators_before: np.ndarray, *, drift_in_optimizer_s: float) -> None:
        """Record step ``report.step`` (steps must arrive as 1, 2, 3, ...).
        ``drift_in_optimizer_s``: the part of ``report.drift_s`` that ran inside
        ``times.optimizer_s``: the drift hook's own seconds
        (``lc.drift.hook_seconds()`` read before ``lc.step()``); the rest of ``drift_s``, the reduce of the
        sums, runs in ``lc.step()``, outside the optimizer phase."""
        if report.step != len(self._steps) + 1:
            raise ValueError(f"step {report.step} recorded after {len(self._steps)} steps")
        self._steps.append({
            "step": report.step, "forward_s": times.forward_s, "backward_s": times.backward_s,
            # the drift hook runs inside optimizer.step(): it is LayerCheck's cost, not compute
            "optimizer_s": max(0.0, times.optimizer_s - drift_in_optimizer_s),
            "drift_s": report.drift_s, "stall_s": report.stall_s, "loss": loss, "lr": report.lr,
            "k_scale": report.k_scale})
        self._drift.append(np.asarray(report.drift, dtype=np.float64))
        self._acc.append(np.asarray(accumulators_before, dtype=np.float64) + report.drift)

    def writes(self, records: Iterable[Any]) -> None:
        self._writes.extend({"step": r.step, "layer": r.layer, "bytes": r.bytes,
                             "reason": r.reason, "persist_s": r.persist_s} for r in records)

    def restore(self, report: Any) -> None:
        self._restores.append({"step": report.step, "plan_s": report.plan_s,
                               "load_s": report.load_s, "restore_s": report.restore_s,
                               "bytes": report.bytes})

    @property
    def num_steps(self) -> int:
        return len(self._steps)

    def tables(self) -> dict[str, pd.DataFrame | None]:
        return {"steps": self._steps_table(), "drift": self._drift_table(),
                "writes": self._writes_table(),
                "recovery": _frame(self._restores, "recovery") if self._restores else None}

    def layer_bytes(self) -> dict[int, int]:
        """Committed bytes of one version of each written layer: the largest seen after
        the base checkpoint, where there is one (a layer with frozen parameters writes
        them with the base only: its later versions are what a write costs), else the
        base's."""
        out: dict[int, int] = {}
        for w in self._writes:
            if w["reason"] != "base":
                out[w["layer"]] = max(out.get(w["layer"], 0), int(w["bytes"]))
        return {**self.base_bytes(), **out}

    def base_bytes(self) -> dict[int, int]:
        """Committed bytes of each layer's base-checkpoint version (the largest seen)."""
        out: dict[int, int] = {}
        for w in self._writes:
            if w["reason"] == "base":
                out[w["layer"]] = max(out.get(w["layer"], 0), int(w["bytes"]))
        return out

    # -- tables ----------------------------------------------------------------
    def _steps_table(self) -> pd.DataFrame:
        return _frame(self._steps, "steps")

    def _drift_table(self) -> pd.DataFrame:
        n = self.num_steps
        drift, acc = np.vstack(self._drift), np.vstack(self._acc)
        step, layer = np.divmod(np.arange(n * self.num_layers), self.num_layers)
        return _frame({"step": step + 1, "layer": layer, "drift": drift.ravel(),
                       "accumulator": acc.ravel()}, "drift")

    def _writes_table(self) -> pd.DataFrame:
        writes = pd.DataFrame(self._writes, columns=["step", "layer", "bytes", "reason", "persist_s"])
        writes = writes.sort_values(["step", "layer"], kind="stable").reset_index(drop=True)
        stall = pd.Series({s["step"]: s["stall_s"] for s in self._steps}, dtype=np.float64)
        step_bytes = writes.groupby("step")["bytes"].transform("sum").astype(np.float64)
        share = writes["bytes"] / step_bytes.where(step_bytes > 0, 1.0)
        writes["stall_s"] = writes["step"].map(stall).fillna(0.0).to_numpy() * share.to_numpy()
        return _frame(writes, "writes")


def _frame(data: Any, table: str) -> pd.DataFrame:
    columns = TABLES[table]
    frame = pd.DataFrame(data)
    if frame.empty:
        frame = pd.DataFrame({c: pd.Series(dtype=object if t == "str" else t)
                              for c, t in columns.items()})
    return frame[list(columns)].astype({c: (object if t == "str" else t)
                                        for c, t in columns.items()})
