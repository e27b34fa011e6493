"""The frontier of effective ratio against durable bytes, across strategies.

    result = compare(scenario, mtbf_s=1800, front=True)    # sim.fair
    table = front_table(result)           # every setting rated, on its strategy's front or not
    bands = best_by_budget(result)        # which strategy is best under each bytes budget

A byte budget is where writing layers as they drift can win: a rollback strategy
writes a whole checkpoint at every interval, so under a tight budget it must
checkpoint rarely and lose more per failure. Each strategy's **front** is its
settings that no other setting of the same strategy beats with as few bytes or
fewer (durable bytes over one failure-free job, against the effective ratio at the
cost model's phi). **Best by budget** walks the budget up: at each budget the best
setting is the one with the highest ratio among those that write at most that much,
over every strategy; the result is the budget ranges over which one strategy (at one
setting) stays best.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .fair import FairResult
from .frontier import pareto
from .tables import WIDTH, Column, render

__all__ = ["front_table", "best_by_budget", "budget_text", "front_text", "FRONT_COLUMNS"]

FRONT_COLUMNS = ("strategy", "setting", "origin", "job_bytes", "effective_ratio", "ci95",
                 "ratio_at_phi_low", "ratio_at_phi_high", "write_share", "host_bytes", "within",
                 "front")
"""``front_table``'s columns: every exact setting rated, ``front`` True on its strategy's
frontier (``job_bytes``: durable bytes over one failure-free job)."""


def front_table(result: FairResult) -> pd.DataFrame:
    """Every setting the comparison rated exactly (within the budgets or not), with
    ``front``: whether it is on its strategy's front of ratio against durable bytes;
    sorted by strategy, then bytes."""
    field = result.field[result.field["exact"]].copy()
    field["front"] = False
    for name in field["strategy"].unique():
        rows = field.index[field["strategy"] == name]
        on = pareto(field.loc[rows, "job_bytes"].to_numpy(),
                    -field.loc[rows, "effective_ratio"].to_numpy())
        field.loc[rows[on], "front"] = True
    order = {n: i for i, n in enumerate(result.strategies)}
    field = field.assign(_order=field["strategy"].map(order))
    field = field.sort_values(["_order", "job_bytes", "effective_ratio"], kind="stable")
    return field[list(FRONT_COLUMNS)].reset_index(drop=True)


def best_by_budget(result: FairResult, *, strategies: tuple[str, ...] | None = None
                   ) -> list[dict[str, Any]]:
    """The budget ranges over which one setting is best (module doc): per range, from and
    to (durable bytes per job; ``to`` None: no limit), strategy, setting, effective ratio.
    Below the first range nothing meets the budget. ``strategies``: those to choose among
    (default every strategy but 'none', which writes nothing and trains almost nothing)."""
    table = front_table(result)
    names = strategies or tuple(n for n in result.strategies if n != "none")
    table = table[table["front"] & table["within"] & table["strategy"].isin(names)]
    table = table.dropna(subset=["effective_ratio"]).sort_values(["job_bytes", "effective_ratio"],
                                                                 ascending=[True, False])
    out: list[dict[str, Any]] = []
    best = -np.inf
    for row in table.to_dict("records"):
        if row["effective_ratio"] <= best:
            continue
        best = row["effective_ratio"]
        if out and out[-1]["from_bytes"] == row["job_bytes"]:
            out.pop()
        if out:
            out[-1]["to_bytes"] = row["job_bytes"]
        out.append({"from_bytes": float(row["job_bytes"]), "to_bytes": None,
                    "strategy": row["strategy"], "setting": row["setting"],
                    "effective_ratio": float(row["effective_ratio"]), "ci95": float(row["ci95"])})
    return out


def budget_text(ranges: list[dict[str, Any]]) -> str:
    """The ranges in words, one line each."""
    lines = []
    if ranges:
        lines.append(f"  under {_tb(ranges[0]['from_bytes'])} a job: no setting of any strategy")
    for r in ranges:
        to = "and more" if r["to_bytes"] is None else f"to {_tb(r['to_bytes'])}"
        lines.append(f"  {_tb(r['from_bytes'])} {to}: {r['strategy']} ({r['setting']}), "
                     f"{r['effective_ratio']:.4f}")
    return "\n".join(lines)


def _tb(nbytes: float) -> str:
    return f"{nbytes / 1e12:.3g} TB" if nbytes >= 1e11 else f"{nbytes / 1e9:.3g} GB"


def front_text(table: pd.DataFrame, *, width: int | None = WIDTH) -> str:
    """Each strategy's front, fewest bytes first: bytes a job, ratio, setting (in blocks of
    ``width`` columns, ``sim.tables``; None: one line a row)."""
    rows = [[row["strategy"], _tb(row["job_bytes"]), f"{row['effective_ratio']:.4f}",
             f"{row['ci95']:.4f}", row["setting"]] for row in table[table["front"]].to_dict("records")]
    return render([Column("strategy", 15, left=True), Column("durable a job", 14),
                   Column("ratio", 7), Column("+-95%", 7), Column("setting", left=True)], rows,
                  width=width)
